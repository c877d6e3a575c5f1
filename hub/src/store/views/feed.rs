//! The producers' events feeds: a message's, and a conversation's (the producer's own messages
//! in it), read from a cursor.
//!
//! An item is a delivery's state change (`delivery_events`), a progress event of a running turn
//! (`progress_events`) or a run's outcome (`attempts`). All three share one position counter,
//! the one `delivery_events.id` is drawn from (`draw`): a progress event and an outcome draw their
//! position when they are recorded. A feed answers the items after a cursor in position order,
//! and its cursor is the last position it answered, so a reader that resumes from any cursor
//! after any disconnect gets every item once, in order.
//!
//! Commit order (`horizon`). On SQLite the one writer draws and commits in order: every position
//! drawn is committed in the snapshot that sees the counter. On PostgreSQL a sequence is not
//! commit order, but everything except claims, holders' handoff steps, starts and reports is
//! written under the record's exclusive write lock; of those, starts write no feed item, claims
//! only move deliveries out of `queued`, steps from claimed or mirrored to mirrored or
//! delivered, and reports record outcomes and move a retried run from delivered to queued: the
//! highest position a snapshot sees among progress events and the other delivery events is a
//! horizon no later commit can go below (an exclusive writer drew it after every transaction
//! sharing the lock before it had ended). A feed answers only up to the horizon;
//! `pending_above` says when items of the feed wait above it (claims', steps' and reports'
//! events and outcomes), and the hub then moves the horizon with `barrier` (an exclusive
//! transaction that draws a position: every lower one has ended).
//!
//! Removal (`feed_removals`, written by the triggers of migration 0013): a cursor below the
//! highest position retention or a purge removed from the feed would skip what was removed,
//! and is answered `CursorExpired` (410).
//!
//! Invariant: a page's items are exactly the feed's items in `(after, next]`, in order, at
//! most `limit` of them; nothing at or below the horizon can be added later.

use crate::store::Store;
use crate::store::engine::{Db, DbError, DbErrorKind, DbResult, OptionalExtension, Row, ValueRef, dialect, params};
use crate::store::registry::producers;
use crate::store::{StoreError, StoreResult, corrupt, json_column, parse_column, state_column};
use baton_shared::states::Outcome;
use baton_shared::wire::{FeedEvent, FeedEventKind};

impl Store {
    /// One page of a feed, read in one snapshot, after the cursor `after` (none: from the
    /// start), up to the horizon (at least `known_horizon`, a barrier's), within `bounds`.
    pub async fn feed_page(
        &self,
        scope: FeedScope,
        after: Option<i64>,
        known_horizon: i64,
        bounds: PageBounds,
    ) -> StoreResult<FeedPage> {
        self.conns.read(move |c| page(c, &scope, after, known_horizon, bounds)).await
    }

    /// Moves the horizon (PostgreSQL; see the module documentation): one exclusive write
    /// transaction that draws a position. Once it committed, every position below the one it
    /// drew has ended; returns the highest of those. On SQLite, the counter as it is.
    pub async fn feed_barrier(&self) -> StoreResult<i64> {
        self.conns.write(barrier).await
    }
}

/// Whose items a feed carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedScope {
    /// One message's, read by its producer (`NotYours` for another).
    Message {
        /// The message.
        message_id: String,
        /// The producer reading it.
        producer: String,
    },
    /// The producer's own messages in one conversation its publish scope covers (`Forbidden`
    /// otherwise, whether or not the conversation exists).
    Conversation {
        /// The conversation.
        conversation: String,
        /// The producer reading it.
        producer: String,
    },
}

/// The bounds of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageBounds {
    /// Most items.
    pub limit: u32,
    /// Most bytes of the items' JSON (one item always goes).
    pub bytes_max: u64,
}

/// One page of a feed.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedPage {
    /// The items after the cursor, in order.
    pub events: Vec<FeedEvent>,
    /// Every item of the feed up to here is in this page or before it.
    pub next: i64,
    /// Items of the feed wait above the horizon (PostgreSQL: the events and outcomes of claims,
    /// holders' steps and reports; see `barrier`).
    pub pending_above: bool,
    /// The read stopped looking before the horizon (`FEED_SCAN_WINDOWS_MAX`): read on from
    /// `next` at once.
    pub more: bool,
    /// A message feed: whether the message is settled.
    pub settled: Option<bool>,
}

/// Most positions a conversation feed looks through in one window: its items are found by
/// position, among every conversation's, so one answer reads at most
/// `FEED_SCAN_WINDOWS_MAX` windows of this many positions, each by an index range.
pub const FEED_SCAN_POSITIONS_MAX: i64 = 20_000;
/// Most windows one conversation feed answer looks through before it answers what it found
/// (and a `next` past what it looked through).
pub const FEED_SCAN_WINDOWS_MAX: u32 = 8;

/// Draws `count` consecutive feed positions (at least one) from the counter `delivery_events.id`
/// is drawn from; returns the first. Must run in a write transaction that holds the record's
/// write lock exclusively (every writer but a claim and a holder's step does).
pub fn draw(conn: &dyn Db, count: u32) -> StoreResult<i64> {
    let count = i64::from(count.max(1));
    let bumped: Option<i64> =
        conn.prepare_cached(dialect::FEED_DRAW.of(conn))?.query_row([count], |r| r.get(0)).optional()?;
    let last = match (bumped, dialect::FEED_DRAW_FIRST.of(conn)) {
        (Some(last), _) => last,
        // No delivery event was ever written, so no number was drawn yet.
        (None, Some(first)) => {
            conn.prepare_cached(first)?.execute([count])?;
            count
        }
        (None, None) => return Err(DbError::new(DbErrorKind::NoRows, "the feed's counter drew nothing").into()),
    };
    Ok(last - count + 1)
}

/// The highest position drawn so far (what a valid cursor can be at most).
fn drawn(conn: &dyn Db) -> StoreResult<i64> {
    Ok(conn.prepare_cached(dialect::FEED_DRAWN.of(conn))?.query_row([], |r| r.get(0))?)
}

/// The horizon of this snapshot: no position at or below it can still be committed later.
pub fn horizon(conn: &dyn Db) -> StoreResult<i64> {
    Ok(conn.prepare_cached(dialect::FEED_HORIZON.of(conn))?.query_row([], |r| r.get(0))?)
}

/// The barrier's body: where positions are drawn out of commit order, draws one and returns the
/// one below it; else the counter as it is.
pub fn barrier(conn: &dyn Db) -> StoreResult<i64> {
    if dialect::FEED_DRAWN_OUT_OF_COMMIT_ORDER.of(conn) { Ok(draw(conn, 1)? - 1) } else { drawn(conn) }
}

/// Reads one page: the scope's check, the cursor's, then the items in `(after, next]`.
pub fn page(
    conn: &dyn Db,
    scope: &FeedScope,
    after: Option<i64>,
    known_horizon: i64,
    bounds: PageBounds,
) -> StoreResult<FeedPage> {
    let (floor_key, settled) = match scope {
        FeedScope::Message { message_id, producer } => {
            let row: Option<(String, Option<i64>)> = conn
                .prepare_cached("SELECT producer, settled_at FROM messages WHERE id = $1")?
                .query_row([message_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((owner, settled_at)) = row else {
                return Err(StoreError::NotFound(format!("no message {message_id}")));
            };
            if &owner != producer {
                return Err(StoreError::NotYours("that message belongs to another producer".into()));
            }
            (format!("m:{message_id}"), Some(settled_at.is_some()))
        }
        FeedScope::Conversation { conversation, producer } => {
            producers::check_may_post(conn, producer, conversation)?;
            (format!("c:{conversation}"), None)
        }
    };
    let start = match after {
        None => 0,
        Some(after) => {
            check_cursor(conn, &floor_key, after)?;
            after
        }
    };
    let top = horizon(conn)?.max(known_horizon).max(start);
    let mut from = start;
    let mut windows = 0;
    let (found, upto) = loop {
        let upto = match scope {
            FeedScope::Message { .. } => top,
            FeedScope::Conversation { .. } => top.min(from.saturating_add(FEED_SCAN_POSITIONS_MAX)),
        };
        let found = read_window(conn, scope, Window { after: from, upto, limit: bounds.limit })?;
        windows += 1;
        if !found.items.is_empty() || upto >= top || windows >= FEED_SCAN_WINDOWS_MAX {
            break (found, upto);
        }
        from = upto;
    };
    let (events, next) = cut(found, upto, bounds);
    let more = events.is_empty() && next < top;
    let pending_above =
        dialect::FEED_DRAWN_OUT_OF_COMMIT_ORDER.of(conn) && events.is_empty() && !more && pending(conn, scope, top)?;
    Ok(FeedPage { events, next, pending_above, more, settled })
}

/// Refuses a cursor this record never gave out, or one below what was removed from the feed.
fn check_cursor(conn: &dyn Db, floor_key: &str, after: i64) -> StoreResult<()> {
    let drawn = drawn(conn)?;
    if after < 0 || after > drawn {
        return Err(StoreError::BadCursor(format!(
            "after: {after} is not a cursor of this hub's record (its feeds' positions are 0..={drawn}); start \
             without `after`"
        )));
    }
    let floor: Option<i64> = conn
        .prepare_cached("SELECT removed_through FROM feed_removals WHERE scope = $1")?
        .query_row([floor_key], |r| r.get(0))
        .optional()?;
    if let Some(floor) = floor
        && after < floor
    {
        return Err(StoreError::CursorExpired(format!(
            "after: items after {after} were removed since (retention or a purge, up to {floor}); reading on from \
             it would skip them: start again without `after`"
        )));
    }
    Ok(())
}

/// One read of the three kinds in `(after, upto]`, each at most `limit` items.
#[derive(Debug, Clone, Copy)]
struct Window {
    after: i64,
    upto: i64,
    limit: u32,
}

/// What one window found: the items of every kind, and, per kind that hit the limit (it may
/// have more), the position of its last item.
#[derive(Debug, Default)]
struct Found {
    items: Vec<(i64, FeedEvent)>,
    full_at: Option<i64>,
}

/// How one kind's rows become items.
type ItemOf = fn(&Row<'_>) -> DbResult<FeedEvent>;

/// The items of the window, merged in position order.
fn read_window(conn: &dyn Db, scope: &FeedScope, w: Window) -> StoreResult<Found> {
    let (filter, key, who) = match scope {
        FeedScope::Message { message_id, .. } => ("d.message_id = $3", message_id.as_str(), ""),
        FeedScope::Conversation { conversation, producer } => (
            "d.conversation = $3 AND EXISTS (SELECT 1 FROM messages m WHERE m.id = d.message_id AND m.producer = $5)",
            conversation.as_str(),
            producer.as_str(),
        ),
    };
    let who = if who.is_empty() { None } else { Some(who) };
    let mut found = Found::default();
    let kinds: [(String, ItemOf); 3] = [
        (
            format!(
                "SELECT e.id, e.at, d.message_id, e.delivery_id, coalesce(d.host, ''), e.from_state, e.to_state, e.actor_kind, e.actor,
                        e.reason
                 FROM delivery_events e JOIN deliveries d ON d.id = e.delivery_id
                 WHERE e.id > $1 AND e.id <= $2 AND {filter} ORDER BY e.id LIMIT $4"
            ),
            state_item,
        ),
        (
            format!(
                "SELECT p.n, p.at, d.message_id, p.delivery_id, d.host, p.attempt, p.seq, p.body
                 FROM progress_events p JOIN deliveries d ON d.id = p.delivery_id
                 WHERE p.n > $1 AND p.n <= $2 AND {filter} ORDER BY p.n LIMIT $4"
            ),
            progress_item,
        ),
        (
            format!(
                "SELECT a.event_n, a.reported_at, d.message_id, a.delivery_id, d.host, a.attempt, a.outcome, a.exit_code,
                        a.signal, a.reason, a.retryable, a.duration_ms, tp.events, tp.node_dropped + tp.hub_dropped
                 FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
                 LEFT JOIN turn_progress tp ON tp.delivery_id = a.delivery_id AND tp.attempt = a.attempt
                 WHERE a.event_n > $1 AND a.event_n <= $2 AND {filter} ORDER BY a.event_n LIMIT $4"
            ),
            outcome_item,
        ),
    ];
    for (sql, item) in kinds {
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows: Vec<(i64, FeedEvent)> = match who {
            // The conversation's filter names the producer (`$5`); a message's does not.
            None => stmt.query_map(params![w.after, w.upto, key, w.limit], |r| Ok((r.get(0)?, item(r)?)))?,
            Some(who) => stmt.query_map(params![w.after, w.upto, key, w.limit, who], |r| Ok((r.get(0)?, item(r)?)))?,
        }
        .collect::<Result<_, _>>()?;
        if rows.len() as u64 >= u64::from(w.limit)
            && let Some((last, _)) = rows.last()
        {
            found.full_at = Some(found.full_at.map_or(*last, |f: i64| f.min(*last)));
        }
        found.items.extend(rows);
    }
    found.items.sort_by_key(|(n, _)| *n);
    Ok(found)
}

/// The page out of what a window found: the items up to where every kind is complete, at most
/// `limit` and within `bytes_max`; and the position the page is complete up to.
fn cut(found: Found, upto: i64, bounds: PageBounds) -> (Vec<FeedEvent>, i64) {
    let complete_to = found.full_at.unwrap_or(upto);
    let mut events = Vec::new();
    let mut bytes = 0u64;
    let mut last = None;
    for (n, event) in found.items {
        if n > complete_to {
            break;
        }
        let size = serde_json::to_vec(&event).map_or(u64::MAX, |b| b.len() as u64 + 1);
        let full = events.len() as u64 >= u64::from(bounds.limit);
        if full || (!events.is_empty() && bytes.saturating_add(size) > bounds.bytes_max) {
            // Cut short: the page is complete up to its last item only.
            return (events, last.unwrap_or(complete_to));
        }
        bytes = bytes.saturating_add(size);
        events.push(event);
        last = Some(n);
    }
    (events, complete_to)
}

/// Whether the feed has items above `top` (only the delivery events and outcomes of the jobs
/// that share the record's write lock can be there).
fn pending(conn: &dyn Db, scope: &FeedScope, top: i64) -> StoreResult<bool> {
    Ok(match scope {
        FeedScope::Message { message_id, .. } => conn
            .prepare_cached(
                "SELECT 1 WHERE
                   EXISTS (SELECT 1 FROM deliveries d JOIN delivery_events e ON e.delivery_id = d.id
                           WHERE d.message_id = $1 AND e.id > $2)
                   OR EXISTS (SELECT 1 FROM deliveries d JOIN attempts a ON a.delivery_id = d.id
                              WHERE d.message_id = $1 AND a.event_n > $2)",
            )?
            .exists(params![message_id, top])?,
        FeedScope::Conversation { conversation, producer } => conn
            .prepare_cached(
                "SELECT 1 WHERE
                   EXISTS (SELECT 1 FROM delivery_events e JOIN deliveries d ON d.id = e.delivery_id
                           WHERE e.id > $1 AND d.conversation = $2
                             AND EXISTS (SELECT 1 FROM messages m WHERE m.id = d.message_id AND m.producer = $3))
                   OR EXISTS (SELECT 1 FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
                              WHERE a.event_n > $1 AND d.conversation = $2
                                AND EXISTS (SELECT 1 FROM messages m WHERE m.id = d.message_id AND m.producer = $3))",
            )?
            .exists(params![top, conversation, producer])?,
    })
}

/// The item of a `delivery_events` row (columns as `read_window` selects them).
fn state_item(r: &Row<'_>) -> DbResult<FeedEvent> {
    let n: i64 = r.get(0)?;
    let row = n.to_string();
    let from = match r.get_ref(5)? {
        ValueRef::Null => None,
        _ => Some(state_column(r, 5, "delivery_events", &row)?),
    };
    let kind: String = r.get(7)?;
    let actor: String = r.get(8)?;
    let actor = match kind.as_str() {
        "hub" => "hub".to_string(),
        "node" | "operator" => format!("{kind}:{actor}"),
        _ => return Err(corrupt(r, 7, "delivery_events", &row, "actor kind", &kind)),
    };
    Ok(FeedEvent {
        reason: r.get(9)?,
        from,
        to: Some(state_column(r, 6, "delivery_events", &row)?),
        actor: Some(actor),
        ..header(r, FeedEventKind::State)?
    })
}

/// The item of a `progress_events` row.
fn progress_item(r: &Row<'_>) -> DbResult<FeedEvent> {
    let n: i64 = r.get(0)?;
    let seq: i64 = r.get(6)?;
    Ok(FeedEvent {
        attempt: Some(r.get(5)?),
        seq: Some(
            u64::try_from(seq)
                .map_err(|_| corrupt(r, 6, "progress_events", &n.to_string(), "seq", &seq.to_string()))?,
        ),
        progress: Some(json_column(r, 7, "progress_events", &n.to_string())?),
        ..header(r, FeedEventKind::Progress)?
    })
}

/// The item of an `attempts` row with its run's progress counts.
fn outcome_item(r: &Row<'_>) -> DbResult<FeedEvent> {
    let n: i64 = r.get(0)?;
    let row = n.to_string();
    let count = |idx: usize| -> DbResult<Option<u64>> {
        match r.get::<_, Option<i64>>(idx)? {
            None => Ok(None),
            Some(v) => {
                u64::try_from(v).map(Some).map_err(|_| corrupt(r, idx, "attempts", &row, "count", &v.to_string()))
            }
        }
    };
    Ok(FeedEvent {
        attempt: Some(r.get(5)?),
        outcome: Some(parse_column(r, 6, "attempts", &row, "outcome", Outcome::parse)?),
        exit_code: r.get(7)?,
        signal: r.get(8)?,
        reason: r.get(9)?,
        retryable: Some(r.get(10)?),
        duration_ms: count(11)?,
        progress_events: Some(count(12)?.unwrap_or(0)),
        progress_dropped: Some(count(13)?.unwrap_or(0)),
        ..header(r, FeedEventKind::Outcome)?
    })
}

/// What every item has: its position, time, message, delivery and host (columns 0-4).
fn header(r: &Row<'_>, kind: FeedEventKind) -> DbResult<FeedEvent> {
    let n: i64 = r.get(0)?;
    Ok(FeedEvent {
        cursor: n.to_string(),
        kind,
        at_ms: r.get(1)?,
        message_id: r.get(2)?,
        delivery_id: r.get(3)?,
        host: r.get(4)?,
        from: None,
        to: None,
        actor: None,
        reason: None,
        attempt: None,
        seq: None,
        progress: None,
        outcome: None,
        exit_code: None,
        signal: None,
        duration_ms: None,
        retryable: None,
        progress_events: None,
        progress_dropped: None,
    })
}

/// Parses a feed cursor as a request carries it (`after`): a decimal position.
pub fn parse_cursor(text: &str) -> Result<i64, String> {
    text.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
        format!(
            "after: {:?} is not a feed cursor (the `cursor` or `next_cursor` of an answer)",
            text.chars().take(40).collect::<String>()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::progress::{ProgressBounds, record};
    use crate::store::lifecycle::report::{NewReport, report};
    use crate::store::lifecycle::transition::Holder;
    use crate::store::{lifecycle::claim, lifecycle::handoff, testing, upkeep::purge};
    use baton_shared::wire::{ClaimedDelivery, ProgressItem, RunningTurnItem};

    const WIDE: PageBounds = PageBounds { limit: 1000, bytes_max: 1 << 20 };

    /// A page of `m`'s feed read after a barrier, as the hub reads it when items wait above
    /// the horizon (reports' outcomes on PostgreSQL): every item written so far is below it.
    fn of(conn: &dyn Db, m: &str, after: Option<i64>, bounds: PageBounds) -> FeedPage {
        let scope = FeedScope::Message { message_id: m.into(), producer: "prod".into() };
        page(conn, &scope, after, barrier(conn).unwrap(), bounds).unwrap()
    }

    fn kinds(events: &[FeedEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e.kind {
                FeedEventKind::State => format!("{}", e.to.unwrap()),
                FeedEventKind::Progress => format!("p{}", e.seq.unwrap()),
                FeedEventKind::Outcome => format!("{}", e.outcome.unwrap()),
            })
            .collect()
    }

    fn item(d: &ClaimedDelivery, seqs: std::ops::RangeInclusive<u64>) -> RunningTurnItem {
        RunningTurnItem {
            delivery_id: d.delivery_id.clone(),
            claim_token: d.claim_token.clone(),
            attempt: d.attempt,
            events: seqs.map(|seq| ProgressItem { seq, progress: serde_json::json!({"step": seq}).into() }).collect(),
            dropped: None,
        }
    }

    /// A delivered turn: claimed, mirrored and acked on host-a by instance `i`.
    fn delivered(conn: &dyn Db, key: &str) -> (String, ClaimedDelivery) {
        let m = accept_one(conn, "c", key, &["host-a"]);
        let d = claim::claim(conn, "host-a", "i", 1, 2).unwrap().remove(0);
        let h = Holder { instance_id: "i", claim_token: &d.claim_token };
        handoff::mirrored(conn, "host-a", &d.delivery_id, h, 3).unwrap();
        handoff::ack(conn, "host-a", &d.delivery_id, h, 4).unwrap();
        (m, d)
    }

    fn succeed(conn: &dyn Db, d: &ClaimedDelivery, at: i64) {
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder: Holder { instance_id: "i", claim_token: &d.claim_token },
            report_id: &format!("r-{}", d.delivery_id),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(5),
            result: None,
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        report(conn, "host-a", &r, at).unwrap();
    }

    /// A message's feed carries its state changes, its turn's progress and its outcome in the
    /// order they were recorded; pages of any size, each resumed from the last cursor, carry
    /// every item once; the outcome counts the run's progress; no progress is kept after it.
    #[test]
    fn a_message_feed_is_every_item_once_in_order_from_any_cursor() {
        let db = testing::db();
        let c = &*db.conn;
        let (m, d) = delivered(c, "k");
        let bounds = ProgressBounds::default();
        let r = record(c, "host-a", "i", &item(&d, 1..=3), bounds, 5).unwrap();
        assert_eq!((r.running, r.kept), (true, 3));
        let again = record(c, "host-a", "i", &item(&d, 2..=5), bounds, 6).unwrap();
        assert_eq!((again.kept, again.dropped), (2, 0), "a resent event is kept once");
        succeed(c, &d, 7);
        let late = record(c, "host-a", "i", &item(&d, 6..=6), bounds, 8).unwrap();
        assert_eq!((late.running, late.kept), (false, 0), "no progress after the outcome");

        let all = of(c, &m, None, WIDE);
        let want = ["queued", "claimed", "mirrored", "delivered", "p1", "p2", "p3", "p4", "p5", "succeeded"];
        assert_eq!(kinds(&all.events), want);
        assert_eq!(all.settled, Some(true));
        assert_eq!(all.events.last().unwrap().progress_events, Some(5));
        let positions: Vec<i64> = all.events.iter().map(|e| e.cursor.parse().unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
        assert_eq!(all.next, *positions.last().unwrap());

        for limit in [1, 2, 3, 7] {
            let (mut seen, mut after) = (Vec::new(), None);
            loop {
                let p = of(c, &m, after, PageBounds { limit, bytes_max: 1 << 20 });
                if p.events.is_empty() {
                    break;
                }
                assert!(p.events.len() <= limit as usize);
                seen.extend(p.events);
                after = Some(p.next);
            }
            assert_eq!(kinds(&seen), want, "limit {limit}");
        }
        // The byte bound: one item always goes, and the page resumes right after it.
        let small = of(c, &m, None, PageBounds { limit: 100, bytes_max: 1 });
        assert_eq!(small.events.len(), 1);
        assert_eq!(small.next, positions[0]);
    }

    /// A conversation's feed carries only the reading producer's own messages, only where its
    /// publish scope covers the conversation.
    #[test]
    fn a_conversation_feed_is_the_producers_own_messages_within_its_scope() {
        let db = testing::db();
        let c = &*db.conn;
        let mine = accept_one(c, "c", "k1", &["host-a"]);
        let msg = crate::store::lifecycle::accept::NewMessage {
            traceparent: None,
            producer: "other".into(),
            conversation: "c".into(),
            idempotency_key: "k2".into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        };
        crate::store::lifecycle::accept::accept_and_fan_out(
            c,
            &msg,
            crate::store::lifecycle::accept::RetryPolicy::default(),
            crate::store::lifecycle::accept::AcceptLimits { queued_per_host_max: 100, queued_per_pool_max: 100 },
            1,
        )
        .unwrap();
        let scope = |p: &str| FeedScope::Conversation { conversation: "c".into(), producer: p.into() };
        let page_of = |p: &str| page(c, &scope(p), None, 0, WIDE);
        let own = page_of("prod").unwrap();
        assert_eq!(own.events.len(), 1);
        assert!(own.events.iter().all(|e| e.message_id == mine));
        assert_eq!(page_of("other").unwrap().events.len(), 1);
        crate::store::registry::hosts::record_certificate(
            c,
            "aa",
            baton_shared::ids::Role::Producer,
            "prod",
            i64::MAX,
            1,
        )
        .unwrap();
        crate::store::registry::producers::set_scope(c, "prod", &["elsewhere".into()], "op", "why", 2).unwrap();
        assert!(matches!(page_of("prod"), Err(StoreError::Forbidden(_))));
    }

    /// A cursor past everything drawn is not this record's; one below items retention or a
    /// purge removed from its feed has expired, while the start and later cursors read on.
    #[test]
    fn a_foreign_cursor_is_bad_and_one_below_removed_items_has_expired() {
        let db = testing::db();
        let c = &*db.conn;
        let (old, d) = delivered(c, "k1");
        succeed(c, &d, 5);
        let first = of(c, &old, None, WIDE);
        let cursor = first.events[0].cursor.parse::<i64>().unwrap();
        let (newer, _) = delivered(c, "k2");
        let scope = FeedScope::Conversation { conversation: "c".into(), producer: "prod".into() };
        assert!(matches!(page(c, &scope, Some(i64::MAX / 2), 0, WIDE), Err(StoreError::BadCursor(_))));
        purge::purge(c, purge::Target::Message(&old), "op", "gone", 6).unwrap();
        assert!(matches!(page(c, &scope, Some(cursor), 0, WIDE), Err(StoreError::CursorExpired(_))));
        let fresh = page(c, &scope, None, 0, WIDE).unwrap();
        assert!(fresh.events.iter().all(|e| e.message_id == newer), "from the start: what is kept");
        assert!(page(c, &scope, Some(fresh.next), 0, WIDE).unwrap().events.is_empty());
        let gone = FeedScope::Message { message_id: old, producer: "prod".into() };
        assert!(matches!(page(c, &gone, None, 0, WIDE), Err(StoreError::NotFound(_))));
    }
}
