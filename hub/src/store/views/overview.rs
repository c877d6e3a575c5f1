//! What the operator listener shows that the other read modules do not: the backlog per host
//! and per conversation with the age of the oldest waiting delivery, current-run outcome
//! counts, and the recent deliveries that failed or ended `unknown`. Read-only: every function
//! here runs on a read connection. "Waiting" is queued or held, as in `host_backlog`.

use crate::store::Store;
use crate::store::StoreResult;
use crate::store::engine::Db;
use crate::store::engine::params;
use crate::store::registry::fences;
use crate::store::registry::fences::FenceRow;
use crate::store::views::fleet;
use crate::store::views::fleet::HostRow;
use crate::store::views::fleet::SilentHost;
use crate::store::views::read;
use crate::store::views::read::StatusView;
use crate::store::views::read::{DeliveryRow, delivery_row};
use baton_shared::states::Outcome;
use std::time::Duration;

/// Everything the status page's overview shows, read in one snapshot.
#[derive(Debug, Clone)]
pub struct Overview {
    /// Counts per state, fences, hosts.
    pub status: StatusView,
    /// Deliveries by their current run's outcome.
    pub outcomes: Vec<(Outcome, i64)>,
    /// Every host.
    pub hosts: Vec<HostRow>,
    /// Each host's backlog.
    pub backlogs: Vec<HostBacklog>,
    /// The deepest conversation backlogs.
    pub conversations: Vec<ConversationBacklog>,
    /// Active fences.
    pub fences: Vec<FenceRow>,
    /// Hosts silent longer than the warning.
    pub silent: Vec<SilentHost>,
    /// Recent failed or `unknown` deliveries.
    pub trouble: Vec<Trouble>,
    /// How many turns run now.
    pub running_total: i64,
    /// The turns that have run longest.
    pub running: Vec<RunningTurn>,
    /// Every pool with its members' standing and its counts (`pool_standing`).
    pub pools: Vec<crate::store::views::pool_standing::PoolStanding>,
}

/// Reads the overview at `now_ms` on `conn` (inside one read transaction: one snapshot).
pub(crate) fn gather(conn: &dyn Db, now_ms: i64, silence: Duration) -> StoreResult<Overview> {
    let silence_ms = i64::try_from(silence.as_millis()).unwrap_or(i64::MAX);
    let (running_total, running) = running_turns(conn, RUNNING_SHOWN_MAX)?;
    Ok(Overview {
        status: read::status(conn)?,
        outcomes: outcome_counts(conn)?,
        hosts: fleet::hosts(conn)?,
        backlogs: host_backlogs(conn)?,
        conversations: conversation_backlogs(conn, CONVERSATIONS_SHOWN_MAX)?,
        fences: fences::list(conn, false)?,
        silent: fleet::silent_hosts(conn, now_ms, silence_ms)?,
        trouble: recent_trouble(conn, TROUBLE_SHOWN_MAX)?,
        running_total,
        running,
        pools: {
            let active = fences::active(conn)?;
            crate::store::registry::pools::list(conn)?
                .into_iter()
                .map(|p| crate::store::views::pool_standing::standing(conn, p, &active, now_ms, silence_ms))
                .collect::<StoreResult<_>>()?
        },
    })
}

impl Store {
    /// The status page's overview at `now_ms`, flagging hosts silent longer than `silence`.
    pub async fn overview(&self, now_ms: i64, silence: Duration) -> StoreResult<Overview> {
        self.conns.read(move |c| gather(c, now_ms, silence)).await
    }

    /// Messages, deliveries and outcomes per minute over the last hour (`rates`).
    pub async fn rates(&self, now_ms: i64) -> StoreResult<Rates> {
        self.conns.read(move |c| rates(c, now_ms)).await
    }

    /// The deliveries an id prefix, a message id, a conversation or a host names, newest first
    /// (`search`).
    pub async fn search(&self, q: String) -> StoreResult<Vec<DeliveryRow>> {
        self.conns.read(move |c| search(c, &q, SEARCH_SHOWN_MAX)).await
    }

    /// How many deliveries ended `unknown` at or after `since_ms` (`unknown_since`).
    pub async fn unknown_since(&self, since_ms: i64) -> StoreResult<i64> {
        self.conns.read(move |c| unknown_since(c, since_ms)).await
    }

    /// The turns running now (`running_turns_of`: at most `max`, longest running
    /// first, with the count of all of them), and the hosts silent longer than
    /// `silence_warn_ms` at `now_ms` (`fleet::silent_hosts`), in one snapshot.
    pub async fn running_turns(
        &self,
        filter: RunningFilter,
        max: u32,
        now_ms: i64,
        silence_warn_ms: i64,
    ) -> StoreResult<(i64, Vec<RunningTurn>, Vec<String>)> {
        self.conns
            .read(move |c| {
                let (total, rows) = running_turns_of(c, &filter, max)?;
                let silent = fleet::silent_hosts(c, now_ms, silence_warn_ms)?.into_iter().map(|h| h.host).collect();
                Ok((total, rows, silent))
            })
            .await
    }
}

/// Most conversations the status page lists in its backlog (deepest first).
pub const CONVERSATIONS_SHOWN_MAX: u32 = 50;
/// Most recent failed or `unknown` deliveries the status page lists.
pub const TROUBLE_SHOWN_MAX: u32 = 30;

/// One host's backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBacklog {
    /// The host.
    pub host: String,
    /// Deliveries waiting for it (queued or held), as `host_backlog` counts them.
    pub waiting: i64,
    /// When its oldest waiting delivery was created (unix ms); `None` when none waits.
    pub oldest_created_at_ms: Option<i64>,
}

/// The backlog of every host that is enrolled or has ever had a delivery waiting, by name. A
/// host with nothing waiting is listed with zero, so a gauge built from it drops to zero
/// rather than keeping its last value. Costs one indexed look-up per host, however deep the
/// backlog.
pub fn host_backlogs(conn: &dyn Db) -> StoreResult<Vec<HostBacklog>> {
    let mut rows: Vec<HostBacklog> = conn
        .prepare_cached(
            "SELECT n.host, coalesce((SELECT waiting FROM host_backlog b WHERE b.host = n.host), 0)
             FROM (SELECT name AS host FROM hosts UNION SELECT host FROM host_backlog) n ORDER BY n.host",
        )?
        .query_map([], |r| Ok(HostBacklog { host: r.get(0)?, waiting: r.get(1)?, oldest_created_at_ms: None }))?
        .collect::<Result<_, _>>()?;
    // Queue order (`n`) is creation order, so the first waiting row of each state is the oldest.
    let mut oldest = conn.prepare_cached(
        "SELECT min(created_at) FROM (
             SELECT created_at FROM (SELECT created_at FROM deliveries WHERE host = $1 AND state = 'queued' ORDER BY n LIMIT 1) q
             UNION ALL
             SELECT created_at FROM (SELECT created_at FROM deliveries WHERE host = $1 AND state = 'held' ORDER BY n LIMIT 1) h
         ) f",
    )?;
    for row in &mut rows {
        if row.waiting > 0 {
            row.oldest_created_at_ms = oldest.query_row(params![row.host], |r| r.get(0))?;
        }
    }
    Ok(rows)
}

/// One conversation's backlog, over every host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationBacklog {
    /// The conversation.
    pub conversation: String,
    /// Deliveries waiting (queued or held).
    pub waiting: i64,
    /// Of them, held.
    pub held: i64,
    /// How many hosts they wait for.
    pub hosts: i64,
    /// When the oldest of them was created (unix ms).
    pub oldest_created_at_ms: i64,
}

/// The conversations with deliveries waiting, deepest first (then by name), at most `max`.
pub fn conversation_backlogs(conn: &dyn Db, max: u32) -> StoreResult<Vec<ConversationBacklog>> {
    Ok(conn
        .prepare_cached(
            "SELECT conversation, count(*), sum(CASE WHEN state = 'held' THEN 1 ELSE 0 END), count(DISTINCT host), min(created_at)
             FROM deliveries WHERE state IN ('queued', 'held')
             GROUP BY conversation ORDER BY count(*) DESC, conversation LIMIT $1",
        )?
        .query_map(params![max], |r| {
            Ok(ConversationBacklog {
                conversation: r.get(0)?,
                waiting: r.get(1)?,
                held: r.get(2)?,
                hosts: r.get(3)?,
                oldest_created_at_ms: r.get(4)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// Every outcome, in the order the counts are given.
pub const OUTCOMES: [Outcome; 4] = [Outcome::Succeeded, Outcome::Failed, Outcome::Unknown, Outcome::Cancelled];

/// How many deliveries' current run ended with each outcome (outcomes with none included, as
/// zero), in `OUTCOMES` order.
pub fn outcome_counts(conn: &dyn Db) -> StoreResult<Vec<(Outcome, i64)>> {
    // One pass over the current runs' attempts (the gauges read this every `gauge_interval`,
    // and it reads every finished delivery the record keeps).
    let counted: Vec<(String, i64)> = conn
        .prepare_cached(
            "SELECT a.outcome, count(*) FROM deliveries d JOIN attempts a ON a.delivery_id = d.id AND a.attempt = d.attempt
             GROUP BY a.outcome",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let of = |o: Outcome| counted.iter().find(|(name, _)| name == o.as_str()).map_or(0, |(_, n)| *n);
    Ok(OUTCOMES.into_iter().map(|o| (o, of(o))).collect())
}

/// A delivery that failed or ended `unknown`, with what its run said about it.
#[derive(Debug, Clone)]
pub struct Trouble {
    /// The delivery (its `reason`: why the hub failed it, or why it ended `unknown`).
    pub row: DeliveryRow,
    /// The reason its current run's report gave (a harness failure's, a node's), if any.
    pub run_reason: Option<String>,
    /// The end of its current run's harness stderr, as the node reported it, if any.
    pub run_stderr: Option<String>,
}

/// The most recently changed deliveries that failed or ended `unknown` (the delivery's state,
/// or its current run's outcome), newest first, at most `max`.
pub fn recent_trouble(conn: &dyn Db, max: u32) -> StoreResult<Vec<Trouble>> {
    Ok(conn
        .prepare_cached(concat!(
            "SELECT ",
            crate::store::views::read::delivery_columns!(),
            ",
                 (SELECT a.reason FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt),
                 (SELECT a.stderr_tail FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
             FROM deliveries d
             WHERE d.n IN (
                 SELECT n FROM deliveries WHERE state IN ('failed', 'unknown')
                 UNION
                 SELECT t.n FROM attempts a JOIN deliveries t ON t.id = a.delivery_id AND t.attempt = a.attempt
                 WHERE a.outcome IN ('failed', 'unknown'))
             ORDER BY d.updated_at DESC, d.n DESC LIMIT $1"
        ))?
        .query_map(params![max], |r| {
            Ok(Trouble { row: delivery_row(r)?, run_reason: r.get(11)?, run_stderr: r.get(12)? })
        })?
        .collect::<Result<_, _>>()?)
}

/// Most running turns the status page lists (the longest running first).
pub const RUNNING_SHOWN_MAX: u32 = 30;

/// A turn running now: delivered, started on its node, its report outstanding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningTurn {
    /// The delivery.
    pub delivery_id: String,
    /// Where it runs.
    pub host: String,
    /// Its conversation.
    pub conversation: String,
    /// Its sequence in the conversation.
    pub seq: i64,
    /// Which run of the delivery (1 for the first).
    pub attempt: i64,
    /// When the node said it started (unix ms).
    pub started_at_ms: i64,
    /// When the node session that started it was last heard from (unix ms), if known: its
    /// renewals (`POST /v1/running`) and every other request it makes.
    pub node_last_contact_ms: Option<i64>,
    /// Its run's progress, when the harness sent any (`progress::last_progress`).
    pub progress: Option<crate::store::lifecycle::progress::LastProgress>,
}

/// The running turns `running_turns_of` lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunningFilter {
    /// Only this host's.
    pub host: Option<String>,
    /// Only this conversation's.
    pub conversation: Option<String>,
}

/// How many turns run now, and the `max` that have run longest. A delivered delivery whose
/// current run started and has no report yet (what `deliveries explain` calls `running`).
pub fn running_turns(conn: &dyn Db, max: u32) -> StoreResult<(i64, Vec<RunningTurn>)> {
    running_turns_of(conn, &RunningFilter::default(), max)
}

/// `running_turns` of one host or conversation (`deliveries list --running`).
pub fn running_turns_of(conn: &dyn Db, f: &RunningFilter, max: u32) -> StoreResult<(i64, Vec<RunningTurn>)> {
    const RUNNING: &str = "d.state = 'delivered' AND d.started_at IS NOT NULL
         AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
         AND (CAST($1 AS TEXT) IS NULL OR d.host = $1) AND (CAST($2 AS TEXT) IS NULL OR d.conversation = $2)";
    // The running set is found by reading every delivered row the record keeps, so the count
    // rides on the listing's one pass (a window over the rows before the limit); a listing of
    // none counts alone.
    if max == 0 {
        let total: i64 = conn
            .prepare_cached(&format!("SELECT count(*) FROM deliveries d WHERE {RUNNING}"))?
            .query_row(params![f.host, f.conversation], |r| r.get(0))?;
        return Ok((total, Vec::new()));
    }
    let mut total = 0;
    let rows: Vec<RunningTurn> = conn
        .prepare_cached(&format!(
            "SELECT d.id, d.host, d.conversation, d.seq, d.attempt, d.started_at,
                    (SELECT s.last_contact_at FROM node_sessions s WHERE s.host = d.host AND s.session = d.started_session),
                    count(*) OVER ()
             FROM deliveries d WHERE {RUNNING} ORDER BY d.started_at, d.n LIMIT $3"
        ))?
        .query_map(params![f.host, f.conversation, max], |r| {
            total = r.get(7)?;
            Ok(RunningTurn {
                delivery_id: r.get(0)?,
                host: r.get(1)?,
                conversation: r.get(2)?,
                seq: r.get(3)?,
                attempt: r.get(4)?,
                started_at_ms: r.get(5)?,
                node_last_contact_ms: r.get(6)?,
                progress: None,
            })
        })?
        .collect::<Result<_, _>>()?;
    let rows = rows
        .into_iter()
        .map(|mut t| {
            t.progress = crate::store::lifecycle::progress::last_progress(conn, &t.delivery_id, t.attempt)?;
            Ok(t)
        })
        .collect::<StoreResult<_>>()?;
    Ok((total, rows))
}

/// How many turns run now on each host that has any, with the earliest start among them
/// (unix ms), by host: what `running_turns` counts, in one pass over the delivered rows.
pub fn running_by_host(conn: &dyn Db) -> StoreResult<Vec<(String, i64, i64)>> {
    Ok(conn
        .prepare_cached(
            "SELECT d.host, count(*), min(d.started_at) FROM deliveries d
             WHERE d.state = 'delivered' AND d.started_at IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
             GROUP BY d.host ORDER BY d.host",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?)
}

/// How far back the rates look, in minutes.
pub const RATE_MINUTES: usize = 60;

/// The last `RATE_MINUTES` minutes of work, one slot per minute, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rates {
    /// The end of the last slot (unix ms, exclusive); slot `i` starts at
    /// `until_ms - (RATE_MINUTES - i) * 60 000`.
    pub until_ms: i64,
    /// Messages accepted.
    pub messages: Vec<i64>,
    /// Deliveries made (a message's fan-out), counted at their message's acceptance.
    pub deliveries: Vec<i64>,
    /// Runs reported, by outcome, in `OUTCOMES` order.
    pub outcomes: Vec<(Outcome, Vec<i64>)>,
}

/// Per-minute counts over the last hour before `now_ms`, from the record (so every hub on a
/// shared record shows the same, and a restart loses none). Acceptances and fan-out come by
/// the `accepted_at` index; outcomes by a scan of the attempts, so callers cache the answer
/// (the status page reads it at most once a minute).
pub fn rates(conn: &dyn Db, now_ms: i64) -> StoreResult<Rates> {
    let minutes = i64::try_from(RATE_MINUTES).unwrap_or(60);
    let from = now_ms - minutes * 60_000;
    let slot = |at_slot: i64| usize::try_from(at_slot).ok().filter(|i| *i < RATE_MINUTES);
    let mut messages = vec![0; RATE_MINUTES];
    let mut deliveries = vec![0; RATE_MINUTES];
    for (sql, slots) in [
        (
            "SELECT (m.accepted_at - $1) / 60000, count(*) FROM messages m
             WHERE m.accepted_at >= $1 AND m.accepted_at < $2 GROUP BY 1",
            &mut messages,
        ),
        (
            "SELECT (m.accepted_at - $1) / 60000, count(*) FROM messages m JOIN deliveries d ON d.message_id = m.id
             WHERE m.accepted_at >= $1 AND m.accepted_at < $2 GROUP BY 1",
            &mut deliveries,
        ),
    ] {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map(params![from, now_ms], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (at, n) = row?;
            if let Some(i) = slot(at) {
                slots[i] = n;
            }
        }
    }
    let mut outcomes: Vec<(Outcome, Vec<i64>)> = OUTCOMES.iter().map(|o| (*o, vec![0; RATE_MINUTES])).collect();
    let mut stmt = conn.prepare_cached(
        "SELECT (reported_at - $1) / 60000, outcome, count(*) FROM attempts
         WHERE reported_at >= $1 AND reported_at < $2 GROUP BY 1, 2",
    )?;
    let rows = stmt
        .query_map(params![from, now_ms], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)))?;
    for row in rows {
        let (at, outcome, n) = row?;
        if let (Some(i), Some(slots)) = (slot(at), outcomes.iter_mut().find(|(o, _)| o.as_str() == outcome)) {
            slots.1[i] = n;
        }
    }
    Ok(Rates { until_ms: now_ms, messages, deliveries, outcomes })
}

/// Most deliveries a status page search lists.
pub const SEARCH_SHOWN_MAX: u32 = 50;

/// The deliveries a status page search names, newest first, at most `max`: those whose id
/// starts with `q`, of the message `q`, in the conversation `q`, or for the host `q`. A search
/// for text no id, conversation or host holds finds nothing (never an error).
pub fn search(conn: &dyn Db, q: &str, max: u32) -> StoreResult<Vec<DeliveryRow>> {
    let q = q.trim();
    if q.is_empty() {
        return Ok(Vec::new());
    }
    let cols = concat!("SELECT ", crate::store::views::read::delivery_columns!(), " FROM deliveries d");
    let mut found: Vec<DeliveryRow> = Vec::new();
    let mut add = |rows: Vec<DeliveryRow>| {
        for r in rows {
            if !found.iter().any(|f| f.delivery_id == r.delivery_id) {
                found.push(r);
            }
        }
    };
    let id_ok = q.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if id_ok {
        let ids = match crate::store::views::listing::resolve_delivery(conn, q)? {
            crate::store::views::listing::Resolved::One(id) => vec![id],
            crate::store::views::listing::Resolved::Many(ids) => ids,
            crate::store::views::listing::Resolved::Nothing => Vec::new(),
        };
        let mut one = conn.prepare_cached(&format!("{cols} WHERE d.id = $1"))?;
        let mut rows = Vec::new();
        for id in ids {
            rows.extend(one.query_map(params![id], delivery_row)?.collect::<Result<Vec<_>, _>>()?);
        }
        add(rows);
    }
    for filter in ["d.message_id = $1", "d.conversation = $1", "d.host = $1"] {
        let rows = conn
            .prepare_cached(&format!("{cols} WHERE {filter} ORDER BY d.n DESC LIMIT $2"))?
            .query_map(params![q, max], delivery_row)?
            .collect::<Result<Vec<_>, _>>()?;
        add(rows);
    }
    found.sort_by(|a, b| b.updated_at_ms.cmp(&a.updated_at_ms).then_with(|| b.delivery_id.cmp(&a.delivery_id)));
    found.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    Ok(found)
}

/// How many deliveries ended `unknown` at or after `since_ms`: the delivery's state (retired
/// while mirrored), or its current run's outcome (started, end not known). What `status` flags:
/// a turn that may or may not have run wants an operator's look. An operator's read: it scans
/// the attempts (no index serves the hot path for this).
pub fn unknown_since(conn: &dyn Db, since_ms: i64) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM (
                 SELECT d.id FROM deliveries d WHERE d.state = 'unknown' AND d.updated_at >= $1
                 UNION
                 SELECT a.delivery_id FROM attempts a JOIN deliveries d ON d.id = a.delivery_id AND d.attempt = a.attempt
                 WHERE a.outcome = 'unknown' AND a.reported_at >= $1
             ) u",
        )?
        .query_row(params![since_ms], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::registry::hosts::{Issued, enroll};
    use crate::store::testing;
    use baton_shared::ids::Role;

    /// Records outcome `outcome` of run `attempt` of `delivery_id` on host-a at `at`, as attempt
    /// `id` (its report id too).
    fn record_attempt(c: &dyn Db, id: &str, delivery_id: &str, outcome: &str, at: i64, attempt: i64) {
        c.execute(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at, attempt)
             VALUES ($1, $2, 'host-a', 'i', $1, 'h', $3, $4, $5)",
            params![id, delivery_id, outcome, at, attempt],
        )
        .unwrap();
    }

    #[test]
    fn backlogs_count_waiting_deliveries_per_host_and_conversation_with_their_oldest() {
        let db = testing::db();
        let c = &db.conn;
        enroll(
            c,
            Issued { role: Role::Node, name: "host-idle", serial: "s1", not_after_unix: 10_000 },
            "op",
            "enrolled",
            1,
        )
        .unwrap();
        accept_one(c, "c1", "k1", &["host-a", "host-b"]);
        accept_one(c, "c1", "k2", &["host-a"]);
        accept_one(c, "c2", "k3", &["host-a"]);
        c.execute("UPDATE deliveries SET created_at = 1000 + n", []).unwrap();
        let first_b: String = c.query_row("SELECT id FROM deliveries WHERE host = 'host-b'", [], |r| r.get(0)).unwrap();
        c.execute("UPDATE deliveries SET state = 'held' WHERE id = $1; ", [&first_b]).unwrap();

        let hosts = host_backlogs(c).unwrap();
        let seen: Vec<(&str, i64, bool)> =
            hosts.iter().map(|h| (h.host.as_str(), h.waiting, h.oldest_created_at_ms.is_some())).collect();
        assert_eq!(seen, [("host-a", 3, true), ("host-b", 1, true), ("host-c", 0, false), ("host-idle", 0, false)]);
        let a_oldest: i64 =
            c.query_row("SELECT min(created_at) FROM deliveries WHERE host = 'host-a'", [], |r| r.get(0)).unwrap();
        assert_eq!(hosts[0].oldest_created_at_ms, Some(a_oldest));

        let convs = conversation_backlogs(c, 10).unwrap();
        let seen: Vec<(&str, i64, i64, i64)> =
            convs.iter().map(|b| (b.conversation.as_str(), b.waiting, b.held, b.hosts)).collect();
        assert_eq!(seen, [("c1", 3, 1, 2), ("c2", 1, 0, 1)]);
        assert_eq!(conversation_backlogs(c, 1).unwrap().len(), 1, "the bound holds");
        assert!(recent_trouble(c, 10).unwrap().is_empty());
        assert!(outcome_counts(c).unwrap().iter().all(|(_, n)| *n == 0));
    }

    #[test]
    fn trouble_is_a_failed_or_unknown_state_or_current_outcome_newest_first() {
        let db = testing::db();
        let c = &db.conn;
        for k in ["k1", "k2", "k3"] {
            accept_one(c, "c", k, &["host-a"]);
        }
        let ids: Vec<String> = c
            .prepare("SELECT id FROM deliveries ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        c.execute(
            "UPDATE deliveries SET state = 'failed', reason = 'blocked', updated_at = 5 WHERE id = $1",
            [&ids[0]],
        )
        .unwrap();
        c.execute(
            "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't', updated_at = 7
             WHERE id = $1",
            [&ids[1]],
        )
        .unwrap();
        let attempt: i64 =
            c.query_row("SELECT attempt FROM deliveries WHERE id = $1", [&ids[1]], |r| r.get(0)).unwrap();
        record_attempt(c, "att-1", &ids[1], "unknown", 7, attempt);
        // k3 runs again (its second run): its first run's failure is no trouble now.
        c.execute(
            "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't', updated_at = 8, attempt = 2
             WHERE id = $1",
            [&ids[2]],
        )
        .unwrap();
        record_attempt(c, "att-3", &ids[2], "failed", 6, 1);
        let trouble: Vec<String> = recent_trouble(c, 10).unwrap().into_iter().map(|t| t.row.delivery_id).collect();
        assert_eq!(trouble, [ids[1].clone(), ids[0].clone()]);
        let newest: Vec<String> = recent_trouble(c, 1).unwrap().into_iter().map(|t| t.row.delivery_id).collect();
        assert_eq!(newest, [ids[1].clone()], "newest first, at most max");
        let unknown = outcome_counts(c).unwrap().into_iter().find(|(o, _)| *o == Outcome::Unknown).unwrap();
        assert_eq!(unknown.1, 1);
        // `status` counts the current run's `unknown` from its report's time on, and a delivery
        // whose state is `unknown` from its change.
        assert_eq!((unknown_since(c, 7).unwrap(), unknown_since(c, 8).unwrap()), (1, 0));
        c.execute(
            "UPDATE deliveries SET state = 'unknown', reason = 'host retired', updated_at = 9 WHERE id = $1",
            [&ids[0]],
        )
        .unwrap();
        assert_eq!(
            (unknown_since(c, 7).unwrap(), unknown_since(c, 9).unwrap(), unknown_since(c, 10).unwrap()),
            (2, 1, 0)
        );
    }

    /// A running turn is delivered, started and unreported; one reported or not yet started
    /// is not. The longest running comes first, with its node session's last contact.
    #[test]
    fn running_turns_are_started_and_unreported_longest_first() {
        let db = testing::db();
        let c = &db.conn;
        for k in ["k1", "k2", "k3", "k4"] {
            accept_one(c, "c", k, &["host-a"]);
        }
        let ids: Vec<String> = c
            .prepare("SELECT id FROM deliveries ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        c.execute(
            "INSERT INTO node_sessions (host, session, instance_id, node_version, started_at, last_contact_at)
             VALUES ('host-a', 1, 'i', '1.0', 1, 900)",
            [],
        )
        .unwrap();
        // ids[0] started at 500, ids[1] at 300, ids[2] started and reported, ids[3] not started.
        for (id, started) in [(&ids[0], Some(500)), (&ids[1], Some(300)), (&ids[2], Some(100)), (&ids[3], None)] {
            c.execute(
                "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't', started_at = $2,
                        started_session = $3 WHERE id = $1",
                params![id, started, started.map(|_| 1i64)],
            )
            .unwrap();
        }
        record_attempt(c, "att-1", &ids[2], "succeeded", 700, 1);
        let (total, rows) = running_turns(c, 10).unwrap();
        assert_eq!(total, 2);
        let seen: Vec<(&str, i64, Option<i64>)> =
            rows.iter().map(|t| (t.delivery_id.as_str(), t.started_at_ms, t.node_last_contact_ms)).collect();
        assert_eq!(seen, [(ids[1].as_str(), 300, Some(900)), (ids[0].as_str(), 500, Some(900))]);
        let (total, rows) = running_turns(c, 1).unwrap();
        assert_eq!((total, rows.len()), (2, 1), "the bound holds, the count does not");
    }

    /// Each minute of the last hour counts the messages accepted in it, their deliveries and
    /// the runs reported by outcome; older ones and the current moment's are out.
    #[test]
    fn rates_count_each_minute_of_the_last_hour() {
        let db = testing::db();
        let c = &db.conn;
        let now = 10_000_000;
        accept_one(c, "c", "k1", &["host-a", "host-b"]);
        accept_one(c, "c", "k2", &["host-a"]);
        accept_one(c, "c", "k3", &["host-a"]);
        // k1 (two deliveries) in the last minute, k2 in the first minute of the hour, k3 before it.
        for (k, at) in [("k1", now - 1), ("k2", now - 3_600_000), ("k3", now - 3_600_001)] {
            c.execute("UPDATE messages SET accepted_at = $2 WHERE idempotency_key = $1", params![k, at]).unwrap();
        }
        let first: String = c.query_row("SELECT id FROM deliveries ORDER BY n LIMIT 1", [], |r| r.get(0)).unwrap();
        for (id, outcome, at, attempt) in
            [("a1", "failed", now - 61_000, 1), ("a2", "succeeded", now - 60_000, 2), ("a3", "failed", now, 3)]
        {
            record_attempt(c, id, &first, outcome, at, attempt);
        }
        let r = rates(c, now).unwrap();
        assert_eq!(r.messages.len(), RATE_MINUTES);
        assert_eq!((r.messages[0], r.messages[RATE_MINUTES - 1], r.messages.iter().sum::<i64>()), (1, 1, 2));
        assert_eq!((r.deliveries[0], r.deliveries[RATE_MINUTES - 1]), (1, 2));
        let slots = |o: Outcome| r.outcomes.iter().find(|(x, _)| *x == o).unwrap().1.clone();
        let failed = slots(Outcome::Failed);
        assert_eq!((failed[RATE_MINUTES - 2], failed.iter().sum::<i64>()), (1, 1), "the current moment is out");
        assert_eq!(slots(Outcome::Succeeded)[RATE_MINUTES - 1], 1);
    }

    /// A search finds deliveries by id prefix, message id, conversation or host, newest first;
    /// text none of them holds finds nothing, without an error.
    #[test]
    fn search_finds_by_id_prefix_message_conversation_or_host() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "conv-1", "k1", &["host-a", "host-b"]);
        accept_one(c, "conv-2", "k2", &["host-b"]);
        c.execute("UPDATE deliveries SET updated_at = n", []).unwrap();
        let (id, message): (String, String) = c
            .query_row("SELECT id, message_id FROM deliveries ORDER BY n LIMIT 1", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        let found = |q: &str| -> Vec<(String, String)> {
            search(c, q, 10).unwrap().into_iter().map(|d| (d.host.unwrap_or_default(), d.conversation)).collect()
        };
        assert_eq!(found(&id), [("host-a".to_string(), "conv-1".to_string())]);
        // Ids made in one millisecond share their time-ordered head (and a counter after it), so
        // "long enough" reaches into the random tail: all but the last four characters.
        assert_eq!(found(&id[..id.len() - 4]).len(), 1, "a long enough prefix names it alone");
        assert_eq!(found(&message).len(), 2, "both deliveries of the message");
        assert_eq!(found("conv-2"), [("host-b".to_string(), "conv-2".to_string())]);
        assert_eq!(
            found("host-b"),
            [("host-b".to_string(), "conv-2".to_string()), ("host-b".to_string(), "conv-1".to_string())],
            "newest first"
        );
        assert!(found("no such thing <b>").is_empty());
        assert!(found("  ").is_empty());
        assert_eq!(search(c, "host-b", 1).unwrap().len(), 1, "the bound holds");
    }
}
