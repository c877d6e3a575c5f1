//! Offline invariant check of a hub database (`baton-hub verify`): the same rules the fault
//! checker applies to the hub's side. Returns every problem found, each typed by its kind with
//! its subject and detail, so callers (the CLI's JSON, the fault checker) read a type, not prose.

use crate::store::Store;
use crate::store::engine::{Db, dialect};
use crate::store::lifecycle::transition::allowed;
use crate::store::{ActorKind, StoreResult};
use baton_shared::states::DeliveryState;
use std::fmt;

impl Store {
    /// Every invariant, including a full integrity check; the problems found.
    pub async fn verify(&self) -> StoreResult<Vec<Problem>> {
        self.conns.read(check).await
    }
}

/// What kind of rule a problem breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    /// SQLite's own integrity check failed. Subject: `database`.
    Integrity,
    /// A foreign key points nowhere. Subject: the table and row.
    ForeignKey,
    /// An accept left half written: a message with neither a delivery nor a fan-out obligation,
    /// an obligation without routing, or routing without an obligation (a message fanned out in
    /// its accept's transaction keeps neither; one fanned out later keeps both). Subject: the
    /// message.
    AtomicAccept,
    /// Fan-out is incomplete or went astray: an obligation marked done while a recipient has no
    /// delivery (subject: the message), or, for a message that kept its routing, a delivery for
    /// a host or pool it was not routed to (subject: the delivery).
    FanOut,
    /// An attempt of a run that was never delivered: the delivery's current run while it is not
    /// delivered, or a run after it. (Earlier runs of a retried or redriven delivery keep their
    /// attempts.) Subject: the delivery.
    AttemptWithoutDelivery,
    /// A conversation's sequence counter is behind its messages. Subject: the conversation.
    SequenceBehind,
    /// A host's waiting count disagrees with its queued and held deliveries. Subject: the host.
    BacklogCount,
    /// A delivery's event log does not lead from its creation to its current state. Subject:
    /// the delivery.
    EventLog,
    /// An event records a transition the SPEC §2 table forbids. Subject: the delivery.
    IllegalTransition,
    /// A stored value does not parse into its type. Subject: the row.
    CorruptValue,
    /// A message's `settled_at` disagrees with its deliveries: set while its fan-out is pending
    /// or a delivery is unfinished (retention could remove a message still at work), or unset
    /// though every delivery is final and its fan-out done (retention would keep it for ever).
    /// Subject: the message.
    Settlement,
    /// A pool conversation's flight disagrees with its deliveries: the count of its pool
    /// deliveries in flight, or the one host they must all be on (`lifecycle::pool_flight`).
    /// Subject: the pool and conversation.
    PoolFlight,
}

impl ProblemKind {
    /// Every kind.
    pub const ALL: [ProblemKind; 12] = [
        ProblemKind::Integrity,
        ProblemKind::ForeignKey,
        ProblemKind::AtomicAccept,
        ProblemKind::FanOut,
        ProblemKind::AttemptWithoutDelivery,
        ProblemKind::SequenceBehind,
        ProblemKind::BacklogCount,
        ProblemKind::EventLog,
        ProblemKind::IllegalTransition,
        ProblemKind::CorruptValue,
        ProblemKind::Settlement,
        ProblemKind::PoolFlight,
    ];

    /// The stable name (`verify --json` prints it).
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Integrity => "integrity",
            ProblemKind::ForeignKey => "foreign_key",
            ProblemKind::AtomicAccept => "atomic_accept",
            ProblemKind::FanOut => "fan_out",
            ProblemKind::AttemptWithoutDelivery => "attempt_without_delivery",
            ProblemKind::SequenceBehind => "sequence_behind",
            ProblemKind::BacklogCount => "backlog_count",
            ProblemKind::EventLog => "event_log",
            ProblemKind::IllegalTransition => "illegal_transition",
            ProblemKind::CorruptValue => "corrupt_value",
            ProblemKind::Settlement => "settlement",
            ProblemKind::PoolFlight => "pool_flight",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<ProblemKind> {
        ProblemKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The rule it breaks.
    pub kind: ProblemKind,
    /// What it is about: a delivery, message, conversation or host name, a table row, or
    /// `database` (see each kind).
    pub subject: String,
    /// What exactly is wrong, for people.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.kind, self.subject, self.detail)
    }
}

/// Adds one problem of `kind` per row of `sql`, whose columns are (subject, detail).
fn collect(conn: &dyn Db, kind: ProblemKind, sql: &str, out: &mut Vec<Problem>) -> StoreResult<()> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |r| Ok(Problem { kind, subject: r.get(0)?, detail: r.get(1)? }))?;
    for r in rows {
        out.push(r?);
    }
    Ok(())
}

/// Checks every hub-side invariant, including a full integrity check of the file; an empty list
/// means none is violated.
pub fn check(conn: &dyn Db) -> StoreResult<Vec<Problem>> {
    use ProblemKind::*;
    let mut out = Vec::new();
    // The file's own check is SQLite's; a PostgreSQL server checks its pages itself.
    if let Some(file) = conn.sqlite_file() {
        for line in file.integrity()? {
            out.push(Problem { kind: Integrity, subject: "database".into(), detail: line });
        }
    }
    // SQLite's foreign keys are checked here; PostgreSQL enforces them at every write.
    if let Some(sql) = dialect::FOREIGN_KEY_CHECK.of(conn) {
        collect(conn, ForeignKey, sql, &mut out)?;
    }
    for (kind, sql) in RULES {
        collect(conn, *kind, sql, &mut out)?;
    }
    check_event_chains(conn, &mut out)?;
    Ok(out)
}

/// The rules that are one query each, on either backend: (kind, SQL selecting subject and
/// detail). Foreign keys are `dialect::FOREIGN_KEY_CHECK`.
const RULES: &[(ProblemKind, &str)] = &[
    (
        ProblemKind::PoolFlight,
        "SELECT q.pool || ' ' || q.conversation,
                'in flight recorded ' || q.in_flight || ' on ' || coalesce(q.bound_host, 'no host') || ', actual ' ||
                count(d.id) || ' on ' || coalesce(min(d.host), 'no host') ||
                CASE WHEN count(DISTINCT d.host) > 1 THEN ' and others' ELSE '' END
         FROM pool_queues q LEFT JOIN deliveries d
           ON d.pool = q.pool AND d.conversation = q.conversation
          AND (d.state IN ('claimed', 'mirrored')
               OR (d.state = 'delivered'
                   AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))
         GROUP BY q.pool, q.conversation, q.in_flight, q.bound_host
         HAVING q.in_flight <> count(d.id) OR count(DISTINCT d.host) > 1
             OR (count(d.id) > 0 AND q.bound_host IS DISTINCT FROM min(d.host))",
    ),
    (
        ProblemKind::AtomicAccept,
        "SELECT id, 'message with neither a delivery nor a fan-out obligation' FROM messages m
         WHERE NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id)
           AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id)",
    ),
    (
        ProblemKind::AtomicAccept,
        "SELECT m.id, 'fan-out obligation without routing' FROM messages m
         JOIN fanout_obligations o ON o.message_id = m.id
         WHERE NOT EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = m.id)
           AND NOT EXISTS (SELECT 1 FROM message_pool_recipients r WHERE r.message_id = m.id)",
    ),
    (
        ProblemKind::AtomicAccept,
        "SELECT r.message_id, 'routing to host ' || r.host || ' without a fan-out obligation'
         FROM message_recipients r
         WHERE NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = r.message_id)",
    ),
    (
        ProblemKind::AtomicAccept,
        "SELECT r.message_id, 'routing to pool ' || r.pool || ' without a fan-out obligation'
         FROM message_pool_recipients r
         WHERE NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = r.message_id)",
    ),
    (
        ProblemKind::FanOut,
        "SELECT r.message_id, 'obligation done but recipient ' || r.host || ' has no delivery'
         FROM message_recipients r JOIN fanout_obligations o ON o.message_id = r.message_id
         WHERE o.done_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM deliveries d
                           WHERE d.message_id = r.message_id AND d.host = r.host AND d.pool IS NULL)",
    ),
    (
        ProblemKind::FanOut,
        "SELECT r.message_id, 'obligation done but recipient pool ' || r.pool || ' has no delivery'
         FROM message_pool_recipients r JOIN fanout_obligations o ON o.message_id = r.message_id
         WHERE o.done_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = r.message_id AND d.pool = r.pool)",
    ),
    (
        ProblemKind::FanOut,
        "SELECT d.id, 'delivery for pool ' || d.pool || ', to which message ' || d.message_id || ' was not routed'
         FROM deliveries d
         WHERE d.pool IS NOT NULL
           AND EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = d.message_id)
           AND NOT EXISTS (SELECT 1 FROM message_pool_recipients r WHERE r.message_id = d.message_id AND r.pool = d.pool)",
    ),
    (
        ProblemKind::FanOut,
        "SELECT d.id, 'delivery for host ' || d.host || ', to which message ' || d.message_id || ' was not routed'
         FROM deliveries d
         WHERE d.pool IS NULL
           AND EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = d.message_id)
           AND NOT EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = d.message_id AND r.host = d.host)",
    ),
    (
        ProblemKind::AttemptWithoutDelivery,
        "SELECT d.id, 'attempt ' || a.id || ' of run ' || a.attempt || ' on a delivery that is ' || d.state ||
                ' on run ' || d.attempt || ', that run never delivered'
         FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
         WHERE a.attempt > d.attempt OR (a.attempt = d.attempt AND d.state <> 'delivered')",
    ),
    (
        ProblemKind::SequenceBehind,
        "SELECT c.name, 'last_seq ' || c.last_seq || ' is behind its messages'
         FROM conversations c WHERE c.last_seq < (SELECT max(seq) FROM messages m WHERE m.conversation = c.name)",
    ),
    (
        ProblemKind::BacklogCount,
        "SELECT h.name, 'waiting count recorded ' || coalesce(b.waiting, 0) || ', actual ' ||
                (SELECT count(*) FROM deliveries d WHERE d.host = h.name AND d.state IN ('queued', 'held'))
         FROM hosts h LEFT JOIN host_backlog b ON b.host = h.name
         WHERE coalesce(b.waiting, 0) <> (SELECT count(*) FROM deliveries d WHERE d.host = h.name AND d.state IN ('queued', 'held'))",
    ),
    (
        ProblemKind::CorruptValue,
        "SELECT id, 'payload is not JSON' FROM messages WHERE NOT json_valid(payload)",
    ),
    (
        ProblemKind::Settlement,
        "SELECT m.id, 'settled at ' || m.settled_at || ' while ' ||
                CASE WHEN EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id AND o.done_at IS NULL)
                     THEN 'its fan-out is pending' ELSE 'a delivery of it is unfinished' END
         FROM messages m
         WHERE m.settled_at IS NOT NULL
           AND (EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id AND o.done_at IS NULL)
                OR EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                             OR (d.state = 'delivered'
                                 AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))))",
    ),
    (
        ProblemKind::Settlement,
        "SELECT m.id, 'not settled, though every delivery of it is final and its fan-out done'
         FROM messages m
         WHERE m.settled_at IS NULL
           AND EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id)
           AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id AND o.done_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                             OR (d.state = 'delivered'
                                 AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))))",
    ),
];

/// The event log's last word on one delivery while its chain is walked.
struct Chain {
    id: String,
    state: String,
    last_to: Option<String>,
}

impl Chain {
    /// The chain must end in the delivery's current state.
    fn finish(self, out: &mut Vec<Problem>) {
        if self.last_to.as_deref() != Some(self.state.as_str()) {
            out.push(Problem {
                kind: ProblemKind::EventLog,
                subject: self.id,
                detail: format!("the delivery is {} but its last event says {:?}", self.state, self.last_to),
            });
        }
    }
}

/// Every delivery's events form a path in the SPEC §2 table from creation to its current state.
fn check_event_chains(conn: &dyn Db, out: &mut Vec<Problem>) -> StoreResult<()> {
    let mut stmt = conn.prepare(
        "SELECT d.id, d.state, e.from_state, e.to_state, e.actor_kind FROM deliveries d
         LEFT JOIN delivery_events e ON e.delivery_id = d.id ORDER BY d.id, e.id",
    )?;
    type Link = (String, String, Option<String>, Option<String>, Option<String>);
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?;
    let mut current: Option<Chain> = None;
    let problem = |kind, subject: &str, detail: String| Problem { kind, subject: subject.to_string(), detail };
    for row in rows {
        let (id, state, from, to, kind): Link = row?;
        if current.as_ref().map(|c| &c.id) != Some(&id) {
            if let Some(done) = current.take() {
                done.finish(out);
            }
            current = Some(Chain { id: id.clone(), state, last_to: None });
            if to.is_none() {
                out.push(problem(ProblemKind::EventLog, &id, "the delivery has no events".into()));
                continue;
            }
            if from.is_some() || to.as_deref() != Some("queued") || kind.as_deref() != Some("hub") {
                out.push(problem(
                    ProblemKind::EventLog,
                    &id,
                    "the log does not start with its creation by the hub".into(),
                ));
            }
        } else {
            let prev = current.as_ref().and_then(|c| c.last_to.clone());
            if from != prev {
                out.push(problem(
                    ProblemKind::EventLog,
                    &id,
                    format!("the log jumps from {prev:?} to an event from {from:?}"),
                ));
            }
            let parsed = (
                from.as_deref().and_then(DeliveryState::parse),
                to.as_deref().and_then(DeliveryState::parse),
                kind.as_deref().and_then(ActorKind::parse),
            );
            match parsed {
                (Some(f), Some(t), Some(k)) if allowed(f, t, k) => {}
                _ => out.push(problem(ProblemKind::IllegalTransition, &id, format!("{from:?} -> {to:?} by {kind:?}"))),
            }
        }
        if let Some(c) = current.as_mut() {
            c.last_to = to;
        }
    }
    if let Some(done) = current {
        done.finish(out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::operator::{self, Selector};
    use crate::store::lifecycle::transition::Holder;
    use crate::store::registry::fences::{self, FenceKind, FenceScope, NewFence};
    use crate::store::{lifecycle::claim, testing};

    fn kinds(problems: &[Problem]) -> Vec<ProblemKind> {
        problems.iter().map(|p| p.kind).collect()
    }

    fn found_in(problems: &[Problem], subject: &str, detail: &str) -> bool {
        problems.iter().any(|p| p.subject == subject && p.detail == detail)
    }

    #[test]
    fn a_legal_history_verifies_and_each_breakage_is_typed() {
        let db = testing::db();
        let c = &db.conn;
        let fanned = accept_one(c, "a", "k1", &["host-a", "host-b"]);
        let held = accept_one(c, "b", "k2", &["host-a"]);
        let hold = NewFence {
            kind: FenceKind::Hold,
            scope: FenceScope::Conversation,
            target: Some("b"),
            operator: "op",
            reason: "r",
        };
        fences::set(c, hold, 1).unwrap();
        let got = claim::claim(c, "host-a", "i", 10, 2).unwrap();
        let h = Holder { instance_id: "i", claim_token: &got[0].claim_token };
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &got[0].delivery_id, h, 3).unwrap();
        crate::store::lifecycle::handoff::ack(c, "host-a", &got[0].delivery_id, h, 4).unwrap();
        operator::release(c, Selector::Conversation("b"), "op", "r", 5).unwrap();
        operator::retire(c, "host-b", "op", "r", 6).unwrap();
        assert_eq!(check(c).unwrap(), Vec::<Problem>::new());

        // A state changed behind the event log's back is found, and so is a broken backlog count.
        c.execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = $1", [&held]).unwrap();
        let held_delivery: String =
            c.query_row("SELECT id FROM deliveries WHERE message_id = $1", [&held], |r| r.get(0)).unwrap();
        let problems = check(c).unwrap();
        assert!(problems.iter().any(|p| p.kind == ProblemKind::EventLog && p.subject == held_delivery), "{problems:?}");
        assert!(problems.iter().any(|p| p.kind == ProblemKind::BacklogCount && p.subject == "host-a"), "{problems:?}");
        // A delivery missing from a completed fan-out is found, naming the message.
        c.execute("DELETE FROM deliveries WHERE host = 'host-b'", []).unwrap();
        let problems = check(c).unwrap();
        assert!(problems.iter().any(|p| p.kind == ProblemKind::FanOut && p.subject == fanned), "{problems:?}");
        // A payload that is not JSON is found, naming the message.
        c.execute("UPDATE messages SET payload = 'nope' WHERE id = $1", [&fanned]).unwrap();
        let problems = check(c).unwrap();
        assert!(problems.iter().any(|p| p.kind == ProblemKind::CorruptValue && p.subject == fanned), "{problems:?}");
    }

    /// A message fanned out in its accept's transaction keeps no routing rows and no
    /// obligation: it verifies, and each way its accept could be left half written is found.
    #[test]
    fn an_accept_fanned_out_at_once_verifies_and_a_half_written_one_is_found() {
        use crate::store::lifecycle::accept::{AcceptLimits, RetryPolicy, accept_and_fan_out};
        let db = testing::db();
        let c = &db.conn;
        let limits = AcceptLimits { queued_per_host_max: 10, queued_per_pool_max: 10 };
        let mut ids = Vec::new();
        for key in ["k1", "k2", "k3"] {
            let msg = crate::store::lifecycle::accept::NewMessage {
                traceparent: None,
                producer: "prod".into(),
                conversation: key.into(),
                idempotency_key: key.into(),
                payload: "{}".into(),
                to: vec!["host-a".into()],
                pools: Vec::new(),
            };
            let (accepted, _) = accept_and_fan_out(c, &msg, RetryPolicy::default(), limits, 1).unwrap();
            let (crate::store::lifecycle::accept::Accepted::New { message_id, .. }
            | crate::store::lifecycle::accept::Accepted::Duplicate { message_id, .. }) = accepted;
            ids.push(message_id);
        }
        assert_eq!(check(c).unwrap(), Vec::<Problem>::new());
        let atomic = |problems: &[Problem], subject: &str, detail: &str| {
            problems.iter().any(|p| p.kind == ProblemKind::AtomicAccept && p.subject == subject && p.detail == detail)
        };
        // Routing beside deliveries without the obligation it belongs to.
        c.execute("INSERT INTO message_recipients (message_id, host) VALUES ($1, 'host-b')", [&ids[0]]).unwrap();
        // An obligation with no routing.
        c.execute("INSERT INTO fanout_obligations (message_id, created_at, done_at) VALUES ($1, 1, 1)", [&ids[1]])
            .unwrap();
        // A message that lost its deliveries and has no obligation to repair them from.
        c.execute_batch(&format!(
            "DELETE FROM delivery_events WHERE delivery_id IN (SELECT id FROM deliveries WHERE message_id = '{0}');
             DELETE FROM deliveries WHERE message_id = '{0}';
             UPDATE host_backlog SET waiting = waiting - 1 WHERE host = 'host-a'",
            ids[2]
        ))
        .unwrap();
        let problems = check(c).unwrap();
        assert!(atomic(&problems, &ids[0], "routing to host host-b without a fan-out obligation"), "{problems:?}");
        assert!(atomic(&problems, &ids[1], "fan-out obligation without routing"), "{problems:?}");
        assert!(atomic(&problems, &ids[2], "message with neither a delivery nor a fan-out obligation"), "{problems:?}");
        // The obligation makes the routing rows the reference: its delivery was routed nowhere.
        let mut found = kinds(&problems);
        found.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(found, [[ProblemKind::AtomicAccept; 3].as_slice(), &[ProblemKind::FanOut]].concat(), "{problems:?}");
    }

    #[test]
    fn an_attempt_without_delivery_and_an_illegal_step_are_typed() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "a", "k1", &["host-a"]);
        let d: String = c.query_row("SELECT id FROM deliveries", [], |r| r.get(0)).unwrap();
        c.execute(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
             VALUES ('a1', $1, 'host-a', 'i', 'r1', 'h', 'succeeded', 1)",
            [&d],
        )
        .unwrap();
        c.execute(
            "INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, at)
             VALUES ($1, 'queued', 'delivered', 'operator', 'op', 2)",
            [&d],
        )
        .unwrap();
        c.execute(
            "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't' WHERE id = $1",
            [&d],
        )
        .unwrap();
        let problems = check(c).unwrap();
        assert!(kinds(&problems).contains(&ProblemKind::IllegalTransition), "{problems:?}");
        c.execute("UPDATE deliveries SET state = 'failed', instance_id = NULL, claim_token = NULL, reason = 'x'", [])
            .unwrap();
        let problems = check(c).unwrap();
        assert!(
            problems.iter().any(|p| p.kind == ProblemKind::AttemptWithoutDelivery && p.subject == d),
            "{problems:?}"
        );
    }

    /// `settled_at` out of step with the deliveries is found both ways: set on a message still
    /// at work (retention could remove it), and unset on one whose every delivery is final.
    #[test]
    fn a_settlement_out_of_step_with_the_deliveries_is_found_both_ways() {
        let db = testing::db();
        let c = &db.conn;
        let open = accept_one(c, "a", "k1", &["host-a"]);
        let done = accept_one(c, "b", "k2", &["host-b"]);
        let unrouted = crate::store::lifecycle::accept::testing::accept_only(c, "c", "k3", &["host-a"]);
        // Retiring host-b fails its queued delivery, which settles that message.
        operator::retire(c, "host-b", "op", "r", 6).unwrap();
        let settled = |id: &str| -> bool {
            c.query_row("SELECT settled_at IS NOT NULL FROM messages WHERE id = $1", [id], |r| r.get(0)).unwrap()
        };
        assert!(settled(&done) && !settled(&open));
        assert_eq!(check(c).unwrap(), Vec::<Problem>::new());

        c.execute("UPDATE messages SET settled_at = 7 WHERE id = $1", [&open]).unwrap();
        c.execute("UPDATE messages SET settled_at = NULL WHERE id = $1", [&done]).unwrap();
        c.execute("UPDATE messages SET settled_at = 8 WHERE id = $1", [&unrouted]).unwrap();
        let problems = check(c).unwrap();
        assert_eq!(kinds(&problems), [ProblemKind::Settlement; 3], "{problems:?}");
        assert!(found_in(&problems, &unrouted, "settled at 8 while its fan-out is pending"), "{problems:?}");
        let found = |subject: &str, detail: &str| found_in(&problems, subject, detail);
        assert!(found(&open, "settled at 7 while a delivery of it is unfinished"), "{problems:?}");
        assert!(found(&done, "not settled, though every delivery of it is final and its fan-out done"), "{problems:?}");
    }

    #[test]
    fn kinds_have_stable_names() {
        for k in ProblemKind::ALL {
            assert_eq!(ProblemKind::parse(k.as_str()), Some(k));
        }
    }
}
