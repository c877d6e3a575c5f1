//! Approval before a turn runs, and the breaker for a conversation whose turns keep failing
//! (SPEC §8).
//!
//! Approval: a message submitted with `"approval": "required"` has its deliveries parked held
//! (`APPROVAL_REQUIRED`) by the hub at fan-out, in the accept's transaction. It is the held
//! state and the held queue of a hold fence: an earlier held turn keeps the later turns of its
//! conversation on that host back (`claim`), so order holds. The decision is the message's,
//! made once (`messages.approval_decision`): `decide` approves (its held deliveries go back to
//! queued, where a fence may still catch them at the claim like any other) or rejects them
//! (failed, with the reason), by an operator or by a producer whose approval right
//! (`producer_approvals`, the publish scopes' patterns) covers the conversation; `expire` fails
//! them, by the hub, once `approval_timeout_ms` has passed undecided. `held release` leaves a
//! delivery awaiting approval alone (`operator::release`). Every decision is one audit row and
//! one event per delivery, with who, when and why.
//!
//! Breaker: `count_outcome` keeps, per conversation, its failed outcomes in a row (a succeeded
//! one resets the count; `unknown` and `cancelled` change nothing). When the count reaches
//! `limits.breaker_failures` (0: off) the hub sets a hold fence on the conversation with the
//! count in its reason (`BREAKER_ACTOR`) and the count starts again, so lifting the fence is an
//! ordinary `fence lift`.

use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::lifecycle::transition::{self, Change};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::fences::{self, FenceKind, FenceScope, NewFence};
use crate::store::{Actor, StoreError, StoreResult, lifecycle::accept, registry::producers};
use baton_shared::states::DeliveryState::{self, Failed, Held, Queued};
use baton_shared::wire::DeliverySummary;

use crate::store::Store;
/// The reason a delivery awaiting approval is held with (fan-out parks it: `accept`).
pub use crate::store::lifecycle::accept::APPROVAL_REQUIRED;

/// Who approves or rejects, as `Store::decide_approval` takes it.
#[derive(Debug, Clone)]
pub enum ApprovalBy {
    /// An operator, by name.
    Operator(String),
    /// A producer (its approval right is checked), by name.
    Producer(String),
}

impl Store {
    /// Approves or rejects a message awaiting approval (`decide`), in one
    /// transaction.
    pub async fn decide_approval(
        &self,
        message_id: String,
        by: ApprovalBy,
        decision: Decision,
        reason: String,
    ) -> StoreResult<Decided> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let decider = match &by {
                    ApprovalBy::Operator(n) => Decider::Operator(n),
                    ApprovalBy::Producer(n) => Decider::Producer(n),
                };
                decide(c, &message_id, decider, decision, &reason, clock.now_ms())
            })
            .await
    }

    /// The message `id` names, as a message id or a whole delivery id (`message_of`).
    pub async fn approval_message(&self, id: String) -> StoreResult<Option<String>> {
        self.conns.read(move |c| message_of(c, &id)).await
    }

    /// Fails what every approval that timed out by `now_ms` holds (`expire`), reading
    /// first and writing only when one is due. Returns the messages.
    pub async fn expire_approvals(&self, now_ms: i64) -> StoreResult<Vec<String>> {
        match self.conns.read(next_expiry).await? {
            Some(at) if at <= now_ms => self.conns.write(move |c| expire(c, now_ms)).await,
            _ => Ok(Vec::new()),
        }
    }
}

/// The name the breaker's fences are set under (the hub, on its own account).
pub const BREAKER_ACTOR: &str = "hub";

/// The longest `approval_timeout_ms` the hub's `limits.approval_timeout_max` may allow (30
/// days): an approval is a person's decision, which may take days, but not forever.
pub const APPROVAL_TIMEOUT_MAX_MS: u64 = 30 * 24 * 3600 * 1000;

/// Most approvals one `expire` call times out (one bounded transaction; the next call takes
/// the rest).
pub const EXPIRE_BATCH_MAX: i64 = 500;

/// Approve or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Its held deliveries go back to queued.
    Approve,
    /// Its held deliveries fail with the reason.
    Reject,
}

impl Decision {
    /// The stored word (`messages.approval_decision`) and the answer's `decision`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approved",
            Decision::Reject => "rejected",
        }
    }
}

/// Who decides.
#[derive(Debug, Clone, Copy)]
pub enum Decider<'a> {
    /// An operator, through the CLI.
    Operator(&'a str),
    /// A producer with the right to approve in the conversation, through the API.
    Producer(&'a str),
}

impl Decider<'_> {
    /// How it is recorded (`approval_decided_by`, the audit row): `operator:NAME`, `producer:NAME`.
    pub fn recorded(&self) -> String {
        match self {
            Decider::Operator(n) => format!("operator:{n}"),
            Decider::Producer(n) => format!("producer:{n}"),
        }
    }

    /// The actor of the delivery events: a producer's decision is recorded as the operator kind
    /// under `producer:NAME`, as a producer's cancel is.
    fn actor(&self) -> Actor {
        match self {
            Decider::Operator(n) => Actor::operator(n),
            Decider::Producer(_) => Actor::operator(&self.recorded()),
        }
    }
}

/// What a decision did.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The message.
    pub message_id: String,
    /// `approved` or `rejected`.
    pub decision: &'static str,
    /// The deliveries it moved (back to queued, or to failed).
    pub moved: Vec<String>,
    /// The message's deliveries after it, by host.
    pub deliveries: Vec<DeliverySummary>,
}

/// Whether `delivery_id` is held awaiting its message's approval (what `held release` leaves
/// alone).
pub fn awaits_approval(conn: &dyn Db, delivery_id: &str) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.id = $1 AND d.state = 'held' AND m.approval = 'required' AND m.approval_decision IS NULL)",
        )?
        .query_row([delivery_id], |r| r.get(0))?)
}

/// The message `id` names: itself when it is a message's id, else the message of the
/// delivery with that id; `None` when it is neither.
pub fn message_of(conn: &dyn Db, id: &str) -> StoreResult<Option<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT id FROM messages WHERE id = $1
             UNION ALL SELECT message_id FROM deliveries WHERE id = $1 LIMIT 1",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?)
}

/// Refuses (`ApprovalForbidden`, naming the conversation and the right) a decision by
/// `producer` in a conversation its approval right does not cover.
pub fn check_may_approve(conn: &dyn Db, producer: &str, conversation: &str) -> StoreResult<()> {
    let right = producers::approvals_of(conn, producer)?;
    if right.iter().any(|p| producers::covers(p, conversation)) {
        return Ok(());
    }
    let has = if right.is_empty() { "none".to_string() } else { right.join(" ") };
    Err(StoreError::ApprovalForbidden(format!(
        "producer {producer} may not approve or reject messages in conversation {conversation:?} (its approval \
         right is {has}; an operator grants it with `baton-hub producers approve`)"
    )))
}

/// The held deliveries of a message awaiting its approval, in queue order.
fn held_awaiting(conn: &dyn Db, message_id: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached("SELECT id FROM deliveries WHERE message_id = $1 AND state = 'held' ORDER BY n")?
        .query_map([message_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Records the decision on the message, guarded on it being undecided.
fn record_decision(
    conn: &dyn Db,
    message_id: &str,
    decision: &str,
    by: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<()> {
    let n = conn
        .prepare_cached(
            "UPDATE messages SET approval_decision = $1, approval_decided_at = $2, approval_decided_by = $3,
                    approval_reason = $4
             WHERE id = $5 AND approval = 'required' AND approval_decision IS NULL",
        )?
        .execute(params![decision, now_ms, by, reason, message_id])?;
    if n != 1 {
        return Err(StoreError::InvalidTransition(format!("message {message_id} is not awaiting approval")));
    }
    Ok(())
}

/// Moves every held delivery of the message: back to queued (approved) or to failed.
fn move_held(
    conn: &dyn Db,
    message_id: &str,
    to: DeliveryState,
    why: &str,
    actor: &Actor,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    let ids = held_awaiting(conn, message_id)?;
    for id in &ids {
        let change =
            Change { delivery_id: id, from: Held, to, expect_holder: None, new_holder: None, reason: Some(why) };
        transition::apply(conn, change, actor, now_ms)?;
    }
    Ok(ids)
}

/// Approves or rejects a message awaiting approval: the decision is recorded on the message
/// and in the audit log, and each of its held deliveries moves (approved: held → queued;
/// rejected: held → failed with the reason), each with its event. A producer needs the
/// approval right in the message's conversation (`ApprovalForbidden`); a message that needs
/// no approval or was already decided is `InvalidTransition`. Call inside a write transaction.
pub fn decide(
    conn: &dyn Db,
    message_id: &str,
    by: Decider<'_>,
    decision: Decision,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Decided> {
    let row: Option<(String, String, Option<String>, Option<String>)> = conn
        .prepare_cached(
            "SELECT conversation, approval, approval_decision, approval_decided_by FROM messages WHERE id = $1",
        )?
        .query_row([message_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((conversation, approval, decided, decided_by)) = row else {
        return Err(StoreError::NotFound(format!("no message {message_id}")));
    };
    if let Decider::Producer(p) = by {
        check_may_approve(conn, p, &conversation)?;
    }
    if approval != "required" {
        return Err(StoreError::InvalidTransition(format!("message {message_id} does not require approval")));
    }
    if let Some(d) = decided {
        return Err(StoreError::InvalidTransition(format!(
            "message {message_id} was already {} by {}",
            d.replace('_', " "),
            decided_by.unwrap_or_default()
        )));
    }
    let recorded = by.recorded();
    record_decision(conn, message_id, decision.as_str(), &recorded, reason, now_ms)?;
    let (to, why) = match decision {
        Decision::Approve => (Queued, format!("approved by {recorded}: {reason}")),
        Decision::Reject => (Failed, format!("rejected by {recorded}: {reason}")),
    };
    let moved = move_held(conn, message_id, to, &why, &by.actor(), now_ms)?;
    let action = match decision {
        Decision::Approve => "message_approve",
        Decision::Reject => "message_reject",
    };
    record_operator_event(conn, action, &format!("message {message_id}"), &recorded, Some(reason), now_ms)?;
    Ok(Decided {
        message_id: message_id.to_string(),
        decision: decision.as_str(),
        moved,
        deliveries: accept::deliveries_of(conn, message_id)?,
    })
}

/// The earliest time an undecided approval times out, if any: the hub's housekeeping reads
/// this before it writes anything.
pub fn next_expiry(conn: &dyn Db) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT min(approval_expires_at) FROM messages
             WHERE approval = 'required' AND approval_decision IS NULL AND approval_expires_at IS NOT NULL",
        )?
        .query_row([], |r| r.get(0))?)
}

/// Fails, by the hub, the held deliveries of every message whose approval timed out at or
/// before `now_ms` undecided (at most `EXPIRE_BATCH_MAX`), the reason naming the timeout, with
/// one audit row each. Returns the messages. Call inside a write transaction.
pub fn expire(conn: &dyn Db, now_ms: i64) -> StoreResult<Vec<String>> {
    let due: Vec<(String, i64)> = conn
        .prepare_cached(
            "SELECT id, approval_timeout_ms FROM messages
             WHERE approval = 'required' AND approval_decision IS NULL AND approval_expires_at <= $1
             ORDER BY approval_expires_at, id LIMIT $2",
        )?
        .query_map(params![now_ms, EXPIRE_BATCH_MAX], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let hub = Actor::hub();
    for (id, timeout_ms) in &due {
        let why = format!("approval timed out: not approved within approval_timeout_ms = {timeout_ms}");
        record_decision(conn, id, "timed_out", "hub", &why, now_ms)?;
        move_held(conn, id, Failed, &why, &hub, now_ms)?;
        record_operator_event(conn, "message_approval_timeout", &format!("message {id}"), "hub", Some(&why), now_ms)?;
    }
    Ok(due.into_iter().map(|(id, _)| id).collect())
}

/// What the breaker did with one outcome: the hold fence it set, if it tripped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tripped {
    /// The fence's id.
    pub fence_id: i64,
    /// The conversation it holds.
    pub conversation: String,
    /// The failures in a row that tripped it.
    pub failures: u32,
}

/// Whether a fence is one the breaker set: a hold on a conversation set by the hub, its reason
/// `breaker_reason`'s.
pub fn is_breaker(f: &fences::FenceRow) -> bool {
    f.kind == FenceKind::Hold && f.set_by == BREAKER_ACTOR && f.reason.starts_with(BREAKER_REASON_START)
}

/// How a breaker's reason starts (both triggers: `breaker_reason`, `breaker_period::reason`).
pub(crate) const BREAKER_REASON_START: &str = "breaker: ";

/// The reason a breaker's fence carries: the count and the limit.
pub fn breaker_reason(failures: u32, limit: u32) -> String {
    format!("{BREAKER_REASON_START}{failures} turns failed in a row (limits.breaker_failures = {limit})")
}

/// Counts one outcome of a turn of `conversation` for the breaker: `failed` adds one to its
/// failures in a row, `succeeded` resets them, anything else changes nothing. At `limit`
/// failures (`0`: the breaker is off and nothing is counted) the hub sets a hold fence on the
/// conversation (unless one is active already) and the count starts again. Call inside the
/// report's write transaction.
pub fn count_outcome(
    conn: &dyn Db,
    conversation: &str,
    failed: bool,
    succeeded: bool,
    limit: u32,
    now_ms: i64,
) -> StoreResult<Option<Tripped>> {
    if limit == 0 || !(failed || succeeded) {
        return Ok(None);
    }
    if succeeded {
        conn.prepare_cached("DELETE FROM breaker_counts WHERE conversation = $1")?.execute([conversation])?;
        return Ok(None);
    }
    let failures: i64 = conn
        .prepare_cached(
            "INSERT INTO breaker_counts AS t (conversation, failures, updated_at) VALUES ($1, 1, $2)
             ON CONFLICT (conversation) DO UPDATE SET failures = t.failures + 1, updated_at = $2 RETURNING failures",
        )?
        .query_row(params![conversation, now_ms], |r| r.get(0))?;
    let failures = u32::try_from(failures).unwrap_or(u32::MAX);
    if failures < limit {
        return Ok(None);
    }
    conn.prepare_cached("DELETE FROM breaker_counts WHERE conversation = $1")?.execute([conversation])?;
    if fences::active_same(conn, FenceKind::Hold, FenceScope::Conversation, Some(conversation))?.is_some() {
        return Ok(None);
    }
    let reason = breaker_reason(failures, limit);
    let fence = NewFence {
        kind: FenceKind::Hold,
        scope: FenceScope::Conversation,
        target: Some(conversation),
        operator: BREAKER_ACTOR,
        reason: &reason,
    };
    let fence_id = fences::set(conn, fence, now_ms)?;
    Ok(Some(Tripped { fence_id, conversation: conversation.to_string(), failures }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::{AcceptLimits, Accepted, NewMessage, RetryPolicy, accept_and_fan_out};
    use crate::store::lifecycle::claim;
    use crate::store::lifecycle::handoff::{ack, mirrored};
    use crate::store::lifecycle::operator::{Selector, release};
    use crate::store::lifecycle::report::{NewReport, RunReport, report_run};
    use crate::store::lifecycle::transition::Holder;
    use crate::store::registry::hosts::record_certificate;
    use crate::store::testing;
    use baton_shared::states::Outcome;

    const LIMITS: AcceptLimits = AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 };

    fn msg(conv: &str, key: &str) -> NewMessage {
        NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: conv.into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        }
    }

    fn post(conn: &dyn Db, conv: &str, key: &str, policy: RetryPolicy, now: i64) -> StoreResult<Accepted> {
        accept_and_fan_out(conn, &msg(conv, key), policy, LIMITS, now).map(|(a, _)| a)
    }

    fn required(timeout_ms: Option<u64>) -> RetryPolicy {
        RetryPolicy { approval_required: true, approval_timeout_ms: timeout_ms, ..RetryPolicy::default() }
    }

    fn id(a: Accepted) -> String {
        match a {
            Accepted::New { message_id, .. } | Accepted::Duplicate { message_id, .. } => message_id,
        }
    }

    fn delivery(conn: &dyn Db, message_id: &str) -> (String, String, Option<String>) {
        conn.query_row("SELECT id, state, reason FROM deliveries WHERE message_id = $1", [message_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap()
    }

    fn seqs(got: &[baton_shared::wire::ClaimedDelivery]) -> Vec<i64> {
        got.iter().map(|d| d.seq).collect()
    }

    /// A message needing approval is parked held at fan-out; a later turn of its conversation
    /// waits behind it; an operator's approval queues it, and the two run in order.
    #[test]
    fn an_approval_holds_the_turn_and_its_successors_until_approved() {
        let db = testing::db();
        let c = &db.conn;
        let first = id(post(c, "c", "k1", required(None), 1).unwrap());
        let second = id(post(c, "c", "k2", RetryPolicy::default(), 2).unwrap());
        let (d1, state, reason) = delivery(c, &first);
        assert_eq!((state.as_str(), reason.as_deref()), ("held", Some(APPROVAL_REQUIRED)));
        assert_eq!(delivery(c, &second).1, "queued");
        assert!(claim::claim(c, "host-a", "i", 10, 3).unwrap().is_empty(), "#2 waits behind the held #1");
        let done = decide(c, &d1_message(c, &d1), Decider::Operator("op"), Decision::Approve, "looks fine", 4).unwrap();
        assert_eq!((done.decision, done.moved.len()), ("approved", 1));
        assert_eq!(seqs(&claim::claim(c, "host-a", "i", 10, 5).unwrap()), [1, 2], "in order, after the approval");
        let events: i64 = c
            .query_row(
                "SELECT count(*) FROM delivery_events WHERE delivery_id = $1 AND actor = 'op'
                   AND reason = 'approved by operator:op: looks fine'",
                [&d1],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(events, 1, "the approval is in the delivery's history");
        let audit: i64 = c
            .query_row(
                "SELECT count(*) FROM operator_events WHERE action = 'message_approve' AND operator = 'operator:op'
                   AND reason = 'looks fine' AND subject = $1",
                [format!("message {first}")],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(audit, 1, "and in the audit log");
        let again = decide(c, &first, Decider::Operator("op"), Decision::Reject, "late", 6).unwrap_err();
        assert!(matches!(again, StoreError::InvalidTransition(_)), "decided once: {again}");
    }

    fn d1_message(conn: &dyn Db, delivery_id: &str) -> String {
        message_of(conn, delivery_id).unwrap().unwrap()
    }

    /// A producer decides only where an operator granted it the right; a rejection fails the
    /// held delivery with the reason and who gave it.
    #[test]
    fn a_producer_needs_the_right_and_a_rejection_fails_the_turn() {
        let db = testing::db();
        let c = &db.conn;
        record_certificate(c, "aa", baton_shared::ids::Role::Producer, "prod", i64::MAX, 1).unwrap();
        let m = id(post(c, "support-1", "k", required(None), 1).unwrap());
        let e = decide(c, &m, Decider::Producer("prod"), Decision::Approve, "me", 2).unwrap_err();
        assert!(matches!(e, StoreError::ApprovalForbidden(_)) && e.to_string().contains("support-1"), "{e}");
        producers::set_approvals(c, "prod", &["other".into()], "op", "grant", 3).unwrap();
        assert!(matches!(
            decide(c, &m, Decider::Producer("prod"), Decision::Approve, "me", 4),
            Err(StoreError::ApprovalForbidden(_))
        ));
        producers::set_approvals(c, "prod", &["support-*".into()], "op", "grant", 5).unwrap();
        let done = decide(c, &m, Decider::Producer("prod"), Decision::Reject, "not today", 6).unwrap();
        assert_eq!(done.decision, "rejected");
        let (_, state, reason) = delivery(c, &m);
        assert_eq!((state.as_str(), reason.as_deref()), ("failed", Some("rejected by producer:prod: not today")));
        assert_eq!(producers::set_approvals(c, "prod", &[], "op", "revoke", 7).unwrap(), Vec::<String>::new());
    }

    /// `held release` does not bypass an approval: refused by id, left held by conversation.
    #[test]
    fn a_release_leaves_a_turn_awaiting_approval_held() {
        let db = testing::db();
        let c = &db.conn;
        let m = id(post(c, "c", "k", required(None), 1).unwrap());
        let (d, _, _) = delivery(c, &m);
        let e = release(c, Selector::Delivery(&d), "op", "r", 2).unwrap_err();
        assert!(e.to_string().contains("held approve"), "{e}");
        assert!(release(c, Selector::Conversation("c"), "op", "r", 3).unwrap().is_empty());
        assert_eq!(delivery(c, &m).1, "held");
    }

    /// Past its `approval_timeout_ms` an undecided approval fails its turn, by the hub, the
    /// reason naming the timeout; nothing is due before.
    #[test]
    fn an_approval_times_out_into_a_failure_naming_the_timeout() {
        let db = testing::db();
        let c = &db.conn;
        let m = id(post(c, "c", "k", required(Some(500)), 1_000).unwrap());
        assert_eq!(next_expiry(c).unwrap(), Some(1_500));
        assert!(expire(c, 1_499).unwrap().is_empty());
        assert_eq!(expire(c, 1_500).unwrap(), vec![m.clone()]);
        let (_, state, reason) = delivery(c, &m);
        assert_eq!(state, "failed");
        assert!(reason.unwrap().contains("approval_timeout_ms = 500"));
        assert_eq!(next_expiry(c).unwrap(), None);
        let by: String =
            c.query_row("SELECT approval_decided_by FROM messages WHERE id = $1", [&m], |r| r.get(0)).unwrap();
        assert_eq!(by, "hub");
    }

    /// The approval is part of the content: the same key and approval replays, another
    /// approval is a conflict; an absent one and `none` hash alike.
    #[test]
    fn the_approval_is_part_of_the_content() {
        let db = testing::db();
        let c = &db.conn;
        assert!(matches!(post(c, "c", "k", required(None), 1).unwrap(), Accepted::New { .. }));
        assert!(matches!(post(c, "c", "k", required(None), 2).unwrap(), Accepted::Duplicate { .. }));
        assert!(matches!(post(c, "c", "k", RetryPolicy::default(), 3), Err(StoreError::IdempotencyConflict(_))));
        assert!(matches!(post(c, "c", "k", required(Some(9)), 4), Err(StoreError::IdempotencyConflict(_))));
    }

    /// Runs the conversation's next turn on host-a and reports `outcome` with the breaker at `limit`.
    fn turn(conn: &dyn Db, key: &str, outcome: Outcome, limit: u32, now: i64) {
        post(conn, "c", key, RetryPolicy::default(), now).unwrap();
        let got = claim::claim(conn, "host-a", "i", 1, now).unwrap();
        let d = &got[0];
        let h = Holder { instance_id: "i", claim_token: &d.claim_token };
        mirrored(conn, "host-a", &d.delivery_id, h, now).unwrap();
        ack(conn, "host-a", &d.delivery_id, h, now).unwrap();
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder: h,
            report_id: key,
            outcome,
            exit_code: Some(if outcome == Outcome::Failed { 1 } else { 0 }),
            duration_ms: Some(1),
            result: None,
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        report_run(conn, "host-a", &r, &RunReport { breaker_failures: limit, ..RunReport::default() }, now).unwrap();
    }

    fn breakers(conn: &dyn Db) -> Vec<fences::FenceRow> {
        fences::list(conn, false).unwrap().into_iter().filter(is_breaker).collect()
    }

    /// N failures in a row trip the breaker: a hold on the conversation set by the hub, its
    /// reason naming the count; a success between starts the count again; off at 0.
    #[test]
    fn the_breaker_trips_after_failures_in_a_row_only() {
        let db = testing::db();
        let c = &db.conn;
        for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
            turn(c, k, Outcome::Failed, 0, 10 + i as i64);
        }
        assert!(breakers(c).is_empty(), "off by default");
        turn(c, "e", Outcome::Failed, 3, 20);
        turn(c, "f", Outcome::Failed, 3, 21);
        turn(c, "g", Outcome::Succeeded, 3, 22);
        turn(c, "h", Outcome::Failed, 3, 23);
        turn(c, "i", Outcome::Failed, 3, 24);
        assert!(breakers(c).is_empty(), "a success started the count again");
        turn(c, "j", Outcome::Failed, 3, 25);
        let tripped = breakers(c);
        assert_eq!(tripped.len(), 1);
        let f = &tripped[0];
        assert_eq!((f.scope, f.target.as_deref(), f.set_by.as_str()), (FenceScope::Conversation, Some("c"), "hub"));
        assert_eq!(f.reason, breaker_reason(3, 3));
        post(c, "c", "k", RetryPolicy::default(), 26).unwrap();
        assert!(claim::claim(c, "host-a", "i", 1, 27).unwrap().is_empty(), "the next turn is parked held");
    }
}
