//! The claim's pool lanes (`scan.rs`, `pool_flight.rs`): members only, per-(pool, conversation)
//! order across hosts, affinity while a turn is in flight and for the affinity wait after, the
//! lanes' fairness, fences, and every way a pool turn returns to its pool.

use crate::store::StoreResult;
use crate::store::engine::{Db, params};
use crate::store::lifecycle::accept::{AcceptLimits, NewMessage, RetryPolicy, accept_and_fan_out};
use crate::store::lifecycle::claim::{Claimant, claim_as};
use crate::store::lifecycle::handoff::{ack, mirrored, reject};
use crate::store::lifecycle::operator::{requeue_host_instance, retire_everywhere};
use crate::store::lifecycle::report::{NewReport, RunReport, report_run};
use crate::store::lifecycle::scan::testing::{fence_set, turns};
use crate::store::lifecycle::transition::Holder;
use crate::store::registry::fences::{FenceKind, FenceScope};
use crate::store::registry::instances::RebindLimit;
use crate::store::registry::pools;
use crate::store::testing;
use baton_shared::states::Outcome;
use baton_shared::wire::ClaimedDelivery;
use std::time::Duration;

/// The affinity wait these tests claim with.
const WAIT_MS: i64 = 2_000;

const BIG: AcceptLimits = AcceptLimits { queued_per_host_max: 1_000_000, queued_per_pool_max: 1_000_000 };

/// `gpu` = host-a and host-b; host-c is in no pool.
fn gpu(c: &dyn Db) {
    pools::add(c, "gpu", &["host-a".into(), "host-b".into()], "op", "r", 1).unwrap();
}

/// A message of `conversation` to the pool `gpu`, with `max_attempts` runs.
fn post(c: &dyn Db, conversation: &str, key: &str, max_attempts: u32) -> String {
    let m = NewMessage {
        producer: "prod".into(),
        conversation: conversation.into(),
        idempotency_key: key.into(),
        payload: "{}".into(),
        to: Vec::new(),
        pools: vec!["gpu".into()],
        traceparent: None,
    };
    let policy =
        RetryPolicy { max_attempts: Some(max_attempts), retry_backoff_ms: Some(1_000), ..RetryPolicy::default() };
    let (accepted, ds) = accept_and_fan_out(c, &m, policy, BIG, 2).unwrap();
    assert_eq!(ds.len(), 1, "{accepted:?}");
    ds[0].delivery_id.clone()
}

fn claim(c: &dyn Db, host: &str, max: u32, now: i64) -> Vec<ClaimedDelivery> {
    let who = Claimant {
        host,
        serial: None,
        instance_id: &format!("i-{host}"),
        rebind: RebindLimit::default(),
        affinity_wait_ms: WAIT_MS,
    };
    claim_as(c, who, max, now).unwrap()
}

fn holder(d: &ClaimedDelivery, host: &str) -> (String, String) {
    (format!("i-{host}"), d.claim_token.clone())
}

/// Mirrors, acks and reports a claimed turn on `host` with `outcome` (exit 75 asks a retry).
fn run(c: &dyn Db, host: &str, d: &ClaimedDelivery, exit_code: i32, now: i64) -> StoreResult<()> {
    let (instance, token) = holder(d, host);
    let h = Holder { instance_id: &instance, claim_token: &token };
    mirrored(c, host, &d.delivery_id, h, now)?;
    ack(c, host, &d.delivery_id, h, now)?;
    let r = NewReport {
        delivery_id: &d.delivery_id,
        holder: h,
        report_id: &format!("r-{}-{}", d.delivery_id, d.attempt),
        outcome: if exit_code == 0 { Outcome::Succeeded } else { Outcome::Failed },
        exit_code: Some(exit_code),
        duration_ms: Some(1),
        result: None,
        reason: None,
        stderr_tail: None,
        stderr_dropped_bytes: None,
    };
    let run = RunReport {
        attempt: Some(d.attempt),
        retry_backoff: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(1),
        ..RunReport::default()
    };
    report_run(c, host, &r, &run, now)?;
    Ok(())
}

/// (host, state) of a delivery.
fn where_is(c: &dyn Db, id: &str) -> (Option<String>, String) {
    c.query_row("SELECT host, state FROM deliveries WHERE id = $1", [id], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
}

/// (in_flight, bound_host, last_host) of a pool conversation.
fn flight(c: &dyn Db, conversation: &str) -> (i64, Option<String>, Option<String>) {
    c.query_row(
        "SELECT in_flight, bound_host, last_host FROM pool_queues WHERE pool = 'gpu' AND conversation = $1",
        [conversation],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .unwrap()
}

fn verify_clean(c: &dyn Db) {
    let problems = crate::store::upkeep::verify::check(c).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// Only members claim a pool's work; the claim binds it to the claiming host, and while it is
/// in flight the conversation's later turns go to that host only, in seq order (prefetch).
#[test]
fn members_claim_pool_work_and_the_conversation_stays_with_its_host() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    let ids: Vec<String> = (1..=3).map(|i| post(c, "c", &format!("k{i}"), 1)).collect();
    assert!(claim(c, "host-c", 10, 3).is_empty(), "host-c is no member");
    let got = claim(c, "host-a", 1, 3);
    assert_eq!(turns(&got), [("c", 1)]);
    assert_eq!(where_is(c, &ids[0]), (Some("host-a".into()), "claimed".into()));
    assert_eq!(flight(c, "c"), (1, Some("host-a".into()), None));
    assert!(claim(c, "host-b", 10, 4).is_empty(), "bound to host-a while its turn is in flight");
    assert_eq!(turns(&claim(c, "host-a", 10, 4)), [("c", 2), ("c", 3)], "host-a prefetches in order");
    assert_eq!(flight(c, "c").0, 3);
    verify_clean(c);
}

/// Once nothing is in flight, the last host is preferred for the affinity wait; after it any
/// member takes the next turn.
#[test]
fn the_last_host_is_preferred_for_the_affinity_wait() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    post(c, "c", "k1", 1);
    let d = claim(c, "host-a", 10, 3).remove(0);
    run(c, "host-a", &d, 0, 10).unwrap();
    assert_eq!(flight(c, "c"), (0, None, Some("host-a".into())));
    let second = post(c, "c", "k2", 1);
    assert!(claim(c, "host-b", 10, 11).is_empty(), "within host-a's affinity wait");
    assert_eq!(
        crate::store::lifecycle::claim::next_due_at(c, "host-b", 11, WAIT_MS).unwrap(),
        Some(10 + WAIT_MS),
        "host-b's waiting claim wakes when the wait is over"
    );
    assert_eq!(turns(&claim(c, "host-b", 10, 10 + WAIT_MS)), [("c", 2)], "after it, any member");
    assert_eq!(where_is(c, &second).0.as_deref(), Some("host-b"));
    // The last host takes it at once.
    let d = claim(c, "host-a", 10, 20 + WAIT_MS);
    assert!(d.is_empty(), "bound to host-b now");
    verify_clean(c);
}

/// Two members claiming one at a time across many conversations: every delivery is handed out
/// once, each conversation's turns in seq order, and both hosts get work.
#[test]
fn two_members_share_many_conversations_in_order() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    for i in 0..40 {
        post(c, &format!("c{}", i % 8), &format!("k{i}"), 1);
    }
    let mut seen: Vec<(String, String, i64)> = Vec::new();
    let mut now = 10;
    while seen.len() < 40 {
        now += 1;
        for host in ["host-a", "host-b"] {
            for d in claim(c, host, 2, now) {
                seen.push((host.to_string(), d.conversation.clone(), d.seq));
                run(c, host, &d, 0, now).unwrap();
            }
        }
        now += WAIT_MS;
        assert!(now < 1_000_000, "stalled after {} turns", seen.len());
    }
    for conv in (0..8).map(|i| format!("c{i}")) {
        let seqs: Vec<i64> = seen.iter().filter(|(_, c, _)| *c == conv).map(|(_, _, s)| *s).collect();
        assert_eq!(seqs, (1..=5).collect::<Vec<i64>>(), "{conv}");
    }
    for host in ["host-a", "host-b"] {
        assert!(seen.iter().any(|(h, _, _)| h == host), "{host} did work: {seen:?}");
    }
    verify_clean(c);
}

/// A deep pool cannot starve the host's own deliveries, nor the reverse: the lanes take turns.
#[test]
fn the_host_s_own_work_and_a_pool_s_take_turns() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    for i in 0..20 {
        post(c, &format!("p{i}"), &format!("p{i}"), 1);
        crate::store::lifecycle::accept::testing::accept_one(c, &format!("h{i}"), &format!("h{i}"), &["host-a"]);
    }
    let got = claim(c, "host-a", 8, 3);
    let pool = got.iter().filter(|d| d.conversation.starts_with('p')).count();
    assert_eq!((pool, got.len() - pool), (4, 4), "{:?}", turns(&got));
}

/// A host removed from the pool claims none of its work; a retired host's pool turns go back.
#[test]
fn a_removed_host_takes_nothing_more() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    post(c, "c", "k1", 1);
    pools::remove(c, "gpu", &["host-b".into()], "op", "r", 2).unwrap();
    assert!(claim(c, "host-b", 10, 3).is_empty());
    assert_eq!(claim(c, "host-a", 10, 3).len(), 1);
}

/// A requeue of a silent holder returns its pool turns to the pool, not to the host; a
/// retryable failure returns the run to the pool with its not-before; a rejected claim frees
/// the conversation.
#[test]
fn requeue_retry_and_reject_return_turns_to_the_pool() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    let id = post(c, "c", "k1", 2);
    claim(c, "host-a", 10, 3);
    requeue_host_instance(c, "host-a", "i-host-a", "op", "gone", 4).unwrap();
    assert_eq!(where_is(c, &id), (None, "queued".into()), "back in the pool, no host");
    assert_eq!(flight(c, "c"), (0, None, Some("host-a".into())));
    let d = claim(c, "host-b", 10, 4 + WAIT_MS).remove(0);
    // A retryable failure (exit 75): the run goes back to the pool after its backoff.
    run(c, "host-b", &d, 75, 5 + WAIT_MS).unwrap();
    let (host, state) = where_is(c, &id);
    assert_eq!((host, state.as_str()), (None, "queued"));
    let due: i64 = c.query_row("SELECT not_before FROM deliveries WHERE id = $1", [&id], |r| r.get(0)).unwrap();
    assert!(claim(c, "host-a", 10, due - 1).is_empty(), "not before its time");
    let d = claim(c, "host-a", 10, due + WAIT_MS);
    assert_eq!((d.len(), d[0].attempt), (1, 2), "run 2, by any member");
    let (instance, token) = holder(&d[0], "host-a");
    reject(c, "host-a", &id, Holder { instance_id: &instance, claim_token: &token }, "no room", due + WAIT_MS).unwrap();
    assert_eq!(flight(c, "c"), (0, None, Some("host-a".into())));
    verify_clean(c);
}

/// Retiring a host ends its pool turns (delivered without an outcome: unknown), returns those
/// it claimed but never ran to the pool, and frees their conversations for the other members at
/// once (a host that left the pool is not waited for).
#[test]
fn retiring_a_member_frees_its_conversations() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    post(c, "c", "k1", 1);
    let second = post(c, "c", "k2", 1);
    let got = claim(c, "host-a", 2, 3);
    assert_eq!(turns(&got), [("c", 1), ("c", 2)]);
    let (instance, token) = holder(&got[0], "host-a");
    let h = Holder { instance_id: &instance, claim_token: &token };
    mirrored(c, "host-a", &got[0].delivery_id, h, 3).unwrap();
    ack(c, "host-a", &got[0].delivery_id, h, 3).unwrap();
    let plan = crate::store::lifecycle::operator::retire_plan(c, "host-a").unwrap();
    assert_eq!((plan.claimed, plan.to_pools, plan.failing()), (0, 1, 0), "{plan:?}");
    retire_everywhere(c, "host-a", "op", "gone", 4).unwrap();
    assert_eq!(where_is(c, &got[0].delivery_id).0.as_deref(), Some("host-a"), "its run stays named on host-a");
    assert_eq!(where_is(c, &second), (None, "queued".into()), "the claimed turn never ran: back in the pool");
    assert_eq!(flight(c, "c").0, 0);
    assert_eq!(turns(&claim(c, "host-b", 10, 5)), [("c", 2)], "at once: host-a is no member any more");
    verify_clean(c);
}

/// A fence on a host keeps it from pool work without touching the work; the pool's own fences
/// park or fail its deliveries whoever would claim them.
#[test]
fn fences_on_hosts_and_on_pools() {
    for kind in [FenceKind::Pause, FenceKind::Hold, FenceKind::Block] {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        let id = post(c, "c", "k1", 1);
        let f = fence_set(c, kind, FenceScope::Host, Some("host-a"), "drain", 2).unwrap();
        assert!(claim(c, "host-a", 10, 3).is_empty(), "{kind:?} on host-a");
        assert_eq!(where_is(c, &id), (None, "queued".into()), "{kind:?} on host-a leaves pool work alone");
        assert_eq!(claim(c, "host-b", 10, 3).len(), 1, "the other member takes it");
        crate::store::registry::fences::lift(c, f, "op", "r", 4).unwrap();
        let id = post(c, "d", "k2", 1);
        fence_set(c, kind, FenceScope::Pool, Some("gpu"), "stop", 5).unwrap();
        claim(c, "host-a", 10, 6);
        let expected = match kind {
            FenceKind::Pause => "queued",
            FenceKind::Hold => "held",
            FenceKind::Block => "failed",
        };
        assert_eq!(where_is(c, &id), (None, expected.into()), "{kind:?} on the pool");
        verify_clean(c);
    }
}

/// The pool queue's flight count always equals the pool deliveries in flight.
#[test]
fn the_flight_count_follows_every_transition() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    for i in 0..6 {
        post(c, &format!("c{}", i % 2), &format!("k{i}"), 2);
    }
    let got = claim(c, "host-a", 10, 3);
    run(c, "host-a", &got[0], 0, 4).unwrap();
    run(c, "host-a", &got[1], 75, 4).unwrap();
    let counted: i64 = c
        .query_row(
            "SELECT count(*) FROM deliveries d WHERE d.pool IS NOT NULL
               AND (d.state IN ('claimed', 'mirrored') OR (d.state = 'delivered' AND NOT EXISTS (
                    SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))",
            params![],
            |r| r.get(0),
        )
        .unwrap();
    let kept: i64 =
        c.query_row("SELECT coalesce(sum(in_flight), 0) FROM pool_queues", params![], |r| r.get(0)).unwrap();
    assert_eq!(counted, kept);
    verify_clean(c);
}

/// `verify` finds a flight count or a bound host that disagrees with the deliveries.
#[test]
fn verify_finds_a_wrong_flight() {
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    post(c, "c", "k1", 1);
    claim(c, "host-a", 10, 3);
    verify_clean(c);
    for broken in [
        "UPDATE pool_queues SET in_flight = 2",
        "UPDATE pool_queues SET bound_host = 'host-b'",
        "UPDATE pool_queues SET in_flight = 0, bound_host = NULL",
    ] {
        c.execute_batch(broken).unwrap();
        let problems = crate::store::upkeep::verify::check(c).unwrap();
        let kinds: Vec<_> = problems.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, [crate::store::upkeep::verify::ProblemKind::PoolFlight], "{broken}: {problems:?}");
        assert_eq!(problems[0].subject, "gpu c");
        c.execute_batch("UPDATE pool_queues SET in_flight = 1, bound_host = 'host-a'").unwrap();
        verify_clean(c);
    }
}

/// A pool delivery held by its pool's hold fence is released like a host's: what a release
/// would put back names the pool (it has no host), the pool's hold still active would catch it
/// again, and once the hold is lifted the release returns it to the pool for any member.
#[test]
fn a_held_pool_delivery_is_released_to_its_pool() {
    use crate::store::lifecycle::operator::{HeldFor, Selector, held_targets, release};
    let db = testing::db();
    let c = &*db.conn;
    gpu(c);
    let id = post(c, "c", "k1", 1);
    let hold = fence_set(c, FenceKind::Hold, FenceScope::Pool, Some("gpu"), "look", 2).unwrap();
    claim(c, "host-a", 10, 3);
    assert_eq!(where_is(c, &id), (None, "held".into()));
    let targets = held_targets(c, Selector::Conversation("c")).unwrap();
    assert_eq!(targets, [("c".to_string(), HeldFor::Pool("gpu".into()))]);
    let active = crate::store::registry::fences::active(c).unwrap();
    assert!(matches!(
        crate::store::registry::fences::pool_turn(&active, "c", "gpu", ""),
        crate::store::registry::fences::PoolTurn::Fenced(f) if f.id == hold
    ));
    crate::store::registry::fences::lift(c, hold, "op", "done", 4).unwrap();
    release(c, Selector::Conversation("c"), "op", "go", 5).unwrap();
    assert_eq!(where_is(c, &id), (None, "queued".into()));
    assert_eq!(turns(&claim(c, "host-b", 10, 6)), [("c", 1)]);
    verify_clean(c);
}

/// A message's deliveries are found through an index, whatever their kind: the pools migration
/// replaced the (message, host) uniqueness with two partial indexes that a lookup by message
/// alone cannot use, and every fan-out and settlement then scanned the whole table.
#[test]
fn a_message_s_deliveries_are_looked_up_by_index() {
    let db = testing::db();
    let c = &*db.conn;
    if c.sqlite_file().is_none() {
        return; // PostgreSQL plans from its statistics; the index exists on both (same migration).
    }
    let plan: Vec<String> = c
        .prepare_cached("EXPLAIN QUERY PLAN SELECT id, state FROM deliveries WHERE message_id = $1")
        .unwrap()
        .query_map(["m"], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(plan.iter().any(|l| l.contains("deliveries_by_message")), "{plan:?}");
}
