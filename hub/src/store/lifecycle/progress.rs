//! Running turns and their progress (`POST /v1/running`): a node says, in one request per pass,
//! which turns run now and forwards their harnesses' progress events; the hub keeps the events
//! with the delivery's run (`progress_events`, `turn_progress`, migration 0013), under the same
//! retention and purge as its attempts.
//!
//! A pass without events writes nothing: it is a read (the session check and each turn's
//! standing), and the session's contact the hub keeps in memory anyway. Only a pass that
//! carries events (or a changed count of the node's drops) is a write, one transaction for all
//! its turns.
//!
//! Invariant: a progress event is recorded only for the current run of a delivered delivery
//! held by the sending instance and claim token, whose outcome is not recorded yet: none after
//! its outcome (the report holds the same write lock, so one of the two comes first).
//! Invariant: `(delivery_id, attempt, seq)` is kept once, and only an event whose `seq` is
//! above every one processed for its run is considered: a resent request adds nothing.

use crate::store::Store;
use crate::store::engine::{Db, OptionalExtension, dialect, params};
use crate::store::registry::sessions;
use crate::store::registry::sessions::NodeAt;
use crate::store::views::feed;
use crate::store::{StoreError, StoreResult};
use baton_shared::wire::{RunningTurnItem, RunningTurnResult};

/// The hub's bounds on what it keeps of a run's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressBounds {
    /// Largest event kept (bytes of its JSON: `limits.progress_event_bytes_max`).
    pub event_bytes_max: u64,
    /// Most events of one run kept (`limits.progress_events_per_turn_max`).
    pub events_per_turn_max: u64,
}

impl Default for ProgressBounds {
    fn default() -> Self {
        ProgressBounds {
            event_bytes_max: baton_shared::limits::PROGRESS_EVENT_BYTES_MAX_DEFAULT,
            events_per_turn_max: baton_shared::limits::PROGRESS_EVENTS_PER_TURN_MAX_DEFAULT,
        }
    }
}

impl Store {
    /// A node's running turns and their progress (after the session check): a read when no
    /// turn carries events or drops, else one write transaction. One result per turn, in order.
    pub async fn running(
        &self,
        node: NodeAt,
        instance_id: String,
        turns: Vec<RunningTurnItem>,
        bounds: ProgressBounds,
    ) -> StoreResult<Vec<RunningTurnResult>> {
        let writes = turns.iter().any(|t| !t.events.is_empty() || t.dropped.is_some());
        if !writes {
            return self
                .conns
                .read(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    turns
                        .iter()
                        .map(|t| standing(c, &node.host, &instance_id, t).map(|running| result(t, running, 0, 0)))
                        .collect()
                })
                .await;
        }
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let now_ms = clock.now_ms();
                turns.iter().map(|t| record(c, &node.host, &instance_id, t, bounds, now_ms)).collect()
            })
            .await
    }
}

fn result(t: &RunningTurnItem, running: bool, kept: u64, dropped: u64) -> RunningTurnResult {
    RunningTurnResult { delivery_id: t.delivery_id.clone(), running, kept, dropped }
}

/// Whether the hub takes progress for the turn: the current run of a delivered delivery of
/// `host`, held by `instance_id` with the item's claim token, and no outcome recorded for it.
pub fn standing(conn: &dyn Db, host: &str, instance_id: &str, t: &RunningTurnItem) -> StoreResult<bool> {
    type Standing = (String, String, Option<String>, Option<String>, u32, bool);
    let row: Option<Standing> = conn
        .prepare_cached(
            "SELECT d.host, d.state, d.instance_id, d.claim_token, d.attempt,
                    EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
             FROM deliveries d WHERE d.id = $1",
        )?
        .query_row([&t.delivery_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?;
    Ok(row.is_some_and(|(h, state, inst, token, attempt, ended)| {
        h == host
            && state == "delivered"
            && inst.as_deref() == Some(instance_id)
            && token.as_deref() == Some(t.claim_token.as_str())
            && attempt == t.attempt
            && !ended
    }))
}

/// Records one turn's events and drop count, when the hub takes its progress.
pub fn record(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    t: &RunningTurnItem,
    bounds: ProgressBounds,
    now_ms: i64,
) -> StoreResult<RunningTurnResult> {
    if !standing(conn, host, instance_id, t)? {
        return Ok(result(t, false, 0, t.events.len() as u64));
    }
    let (kept_before, last_seq): (i64, i64) = conn
        .prepare_cached("SELECT events, last_seq FROM turn_progress WHERE delivery_id = $1 AND attempt = $2")?
        .query_row(params![t.delivery_id, t.attempt], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .unwrap_or((0, 0));
    let mut fresh: Vec<_> = t.events.iter().filter(|e| i64::try_from(e.seq).is_ok_and(|s| s > last_seq)).collect();
    fresh.sort_by_key(|e| e.seq);
    fresh.dedup_by_key(|e| e.seq);
    let room = bounds.events_per_turn_max.saturating_sub(u64::try_from(kept_before).unwrap_or(0));
    let (mut keep, mut dropped) = (Vec::new(), 0u64);
    for e in &fresh {
        let text = e.progress.as_str();
        if text.len() as u64 > bounds.event_bytes_max || !text.starts_with('{') || keep.len() as u64 >= room {
            dropped += 1;
        } else {
            keep.push(*e);
        }
    }
    let Some(newest) = fresh.last().map(|e| e.seq) else {
        if let Some(node_dropped) = t.dropped {
            upsert(conn, t, Counts { kept: 0, last_seq, last_at: None, node_dropped, hub_dropped: 0 })?;
        }
        return Ok(result(t, true, 0, 0));
    };
    if !keep.is_empty() {
        let first =
            feed::draw(conn, u32::try_from(keep.len()).map_err(|_| StoreError::Invalid("events: too many".into()))?)?;
        let mut insert = conn.prepare_cached(
            "INSERT INTO progress_events (n, delivery_id, attempt, seq, at, body) VALUES ($1, $2, $3, $4, $5, $6)",
        )?;
        for (i, e) in keep.iter().enumerate() {
            insert.execute(params![
                first + i as i64,
                t.delivery_id,
                t.attempt,
                i64::try_from(e.seq).unwrap_or(i64::MAX),
                now_ms,
                e.progress.as_str()
            ])?;
        }
    }
    let counts = Counts {
        kept: keep.len() as i64,
        last_seq: i64::try_from(newest).unwrap_or(i64::MAX),
        last_at: (!keep.is_empty()).then_some(now_ms),
        node_dropped: t.dropped.unwrap_or(0),
        hub_dropped: i64::try_from(dropped).unwrap_or(i64::MAX),
    };
    upsert(conn, t, counts)?;
    Ok(result(t, true, keep.len() as u64, dropped))
}

/// What one request adds to a run's `turn_progress` row.
struct Counts {
    kept: i64,
    last_seq: i64,
    last_at: Option<i64>,
    node_dropped: u64,
    hub_dropped: i64,
}

fn upsert(conn: &dyn Db, t: &RunningTurnItem, c: Counts) -> StoreResult<()> {
    conn.prepare_cached(dialect::TURN_PROGRESS_ADD.of(conn))?.execute(params![
        t.delivery_id,
        t.attempt,
        c.kept,
        c.last_seq,
        c.last_at,
        i64::try_from(c.node_dropped).unwrap_or(i64::MAX),
        c.hub_dropped
    ])?;
    Ok(())
}

/// The last progress of a delivery's current run: its `seq`, when the hub recorded it and the
/// event itself, with the run's counts; `None` when the run sent none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastProgress {
    /// Events kept for the run.
    pub events: i64,
    /// Events dropped (node and hub).
    pub dropped: i64,
    /// The newest kept event's `seq`, time (unix ms) and JSON, when one was kept.
    pub last: Option<(i64, i64, String)>,
}

/// The progress of run `attempt` of `delivery_id`, for the operator's views.
pub fn last_progress(conn: &dyn Db, delivery_id: &str, attempt: i64) -> StoreResult<Option<LastProgress>> {
    let counts: Option<(i64, i64)> = conn
        .prepare_cached(
            "SELECT events, node_dropped + hub_dropped FROM turn_progress WHERE delivery_id = $1 AND attempt = $2",
        )?
        .query_row(params![delivery_id, attempt], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((events, dropped)) = counts else { return Ok(None) };
    let last = conn
        .prepare_cached(
            "SELECT seq, at, body FROM progress_events WHERE delivery_id = $1 AND attempt = $2 ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![delivery_id, attempt], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(Some(LastProgress { events, dropped, last }))
}
