//! Claims at once on one PostgreSQL record, as several hubs make them (against a real throwaway
//! cluster; skipped without PostgreSQL server binaries unless `BATON_REQUIRE_POSTGRES=1`). Each
//! connection stands for one hub's writer. A claim transaction takes the record's write lock in
//! shared mode (`Db::begin_shared`), so: claims of two hosts run at the same time; two claims of
//! one host take disjoint conversations (the queue one holds is skipped by the other, `FOR UPDATE
//! SKIP LOCKED`) and neither hands out a delivery twice or out of `seq` order; a claim that
//! would bind another instance waits for the bound instance's claim in flight and then sees what
//! it holds; and every other writer waits for the claims in flight, as they wait for it. Pool
//! work too: two members' claims on two connections skip the pool conversation the other
//! holds, and many members claiming and reporting at once hand out every pool delivery once,
//! each conversation's turns in order and on one host at a time. Holders' handoff steps share
//! the lock as claims do: a served store hands off while another hub's steps are open, and the
//! feeds' horizon stays below the open steps' events. Starts and reports share it as well: a
//! served store starts or reports a run while another hub's start or report is open, the same
//! run started or reported through both at once is started or recorded once and answered as a
//! repeat by the second, and an outcome committed above an open one waits above the feeds'
//! horizon until a barrier.

use baton_hub::store::engine::postgres::{self as pg, PgUrl};
use baton_hub::store::engine::{Db, PgConn};
use baton_hub::store::lifecycle::accept::{self, AcceptLimits, NewMessage, RetryPolicy};
use baton_hub::store::lifecycle::claim;
use baton_hub::store::lifecycle::handoff::{self, Step};
use baton_hub::store::lifecycle::report::{self, NewReport, RunReport};
use baton_hub::store::lifecycle::transition::Holder;
use baton_hub::store::lifecycle::turns;
use baton_hub::store::registry::pools;
use baton_hub::store::registry::sessions::NodeAt;
use baton_hub::store::upkeep::verify;
use baton_hub::store::views::feed::{self, FeedScope, PageBounds};
use baton_hub::store::{Store, StoreError, registry::hosts};
use baton_shared::states::Outcome;
use baton_shared::wire::{ClaimedDelivery, FeedEventKind, HolderItem, ReportRequest, StartItem};
use baton_testkit::pg::{PgCluster, cluster_or_skip};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest wait for another connection to be seen waiting, or to finish (generous: the
/// machine may be loaded).
const WAIT: Duration = Duration::from_secs(30);

#[test]
fn claims_on_several_connections_run_at_once_and_stay_exclusive() {
    let Some(cluster) = cluster_or_skip("claims_at_once", false) else { return };
    one_host_two_claims_take_disjoint_conversations(&cluster);
    two_hosts_claim_at_once(&cluster);
    another_instance_waits_for_the_bound_one(&cluster);
    other_writers_and_claims_wait_for_each_other(&cluster);
    two_members_skip_the_pool_conversation_the_other_holds(&cluster);
    members_racing_on_several_connections_hand_out_each_pool_turn_once(&cluster);
    holder_steps_run_beside_another_hubs_and_the_horizon_stays_below_theirs(&cluster);
    starts_run_beside_another_hubs_and_one_run_is_started_once(&cluster);
    reports_run_beside_another_hubs_and_their_outcomes_wait_above_the_horizon(&cluster);
}

/// Another hub's report of d1 is open (its outcome's position drawn, not committed). A served
/// store records d2's report meanwhile and answers (its job shares the record's lock); d2's
/// feed then holds its outcome above the horizon and says so, until the open report committed
/// and a barrier moved the horizon. The same report of d1 sent through the served store waits
/// for the open one's row and is answered as its repeat: one attempt.
fn reports_run_beside_another_hubs_and_their_outcomes_wait_above_the_horizon(cluster: &PgCluster) {
    let url = record(cluster, "reports");
    let Delivered { rt, store, session, setup, runs } = two_delivered_runs(&url);
    let [d1, d2] = &runs;
    let request = |d: &ClaimedDelivery, report_id: &str| ReportRequest {
        delivery_id: d.delivery_id.clone(),
        instance_id: "i".into(),
        claim_token: d.claim_token.clone(),
        report_id: report_id.into(),
        attempt: Some(d.attempt),
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        duration_ms: Some(1),
        signal: None,
        result: Some("ok".into()),
        reason: None,
        stderr_tail: None,
        stderr_dropped_bytes: None,
        stopped_by: None,
    };
    let report = |req: ReportRequest| {
        let store = store.clone();
        let node = NodeAt { host: "host-a".into(), session: Some(session) };
        let bounds = report::Backoff { base: report::RETRY_BACKOFF_DEFAULT, max: report::RETRY_BACKOFF_MAX_DEFAULT };
        rt.spawn(async move { store.report(node, req, bounds).await })
    };
    let outcome_at = |c: &PgConn, d: &ClaimedDelivery| -> i64 {
        c.prepare_cached("SELECT event_n FROM attempts WHERE delivery_id = $1")
            .unwrap()
            .query_row([&d.delivery_id], |r| r.get(0))
            .unwrap()
    };

    let sep = if url.contains('?') { '&' } else { '?' };
    let other = connect(&format!("{url}{sep}write_idle_timeout=300"));
    other.begin_shared().unwrap();
    let first = request(d1, "r1");
    let recorded = NewReport {
        delivery_id: &first.delivery_id,
        holder: Holder { instance_id: "i", claim_token: &first.claim_token },
        report_id: &first.report_id,
        outcome: first.outcome,
        exit_code: first.exit_code,
        duration_ms: first.duration_ms,
        result: first.result.as_deref(),
        reason: None,
        stderr_tail: None,
        stderr_dropped_bytes: None,
    };
    let run = RunReport { attempt: first.attempt, session: Some(session), ..RunReport::default() };
    report::report_run(&other, "host-a", &recorded, &run, 12).unwrap();
    other.flush().unwrap();
    let d1_outcome = outcome_at(&other, d1);

    let (answer, freed) = rt
        .block_on(async { tokio::time::timeout(WAIT, report(request(d2, "r2"))).await })
        .expect("the report is answered while another hub's report is open")
        .unwrap()
        .unwrap();
    assert!(!answer.1, "a first report: {answer:?} {freed:?}");
    let reader = connect(&url);
    assert!(outcome_at(&reader, d2) > d1_outcome, "d2's outcome is numbered above d1's, still open");
    let horizon = |c: &PgConn| {
        c.begin_read().unwrap();
        let h = feed::horizon(c).unwrap();
        c.control("COMMIT").unwrap();
        h
    };
    assert!(horizon(&reader) < d1_outcome, "the horizon stays below the open report's outcome");
    let scope = FeedScope::Message { message_id: d2.message_id.clone(), producer: "prod".into() };
    let bounds = PageBounds { limit: 100, bytes_max: 1 << 20 };
    let page =
        |after: Option<i64>, known: i64| rt.block_on(store.feed_page(scope.clone(), after, known, bounds)).unwrap();
    let below = page(None, 0);
    assert!(below.events.iter().all(|e| e.kind != FeedEventKind::Outcome), "{below:?}");
    let above = page(Some(below.next), 0);
    assert!(above.events.is_empty() && above.pending_above, "d2's outcome waits above the horizon: {above:?}");

    // d1's report again, through the served store: it waits for the open report's row.
    let again = report(first);
    let admin = connect(&url);
    let (done, waited) = mpsc::channel::<()>();
    wait_until_waiting(&admin, &waited);
    drop(done);
    other.control("COMMIT").unwrap();
    let (repeated, _) = rt
        .block_on(async { tokio::time::timeout(WAIT, again).await })
        .expect("the repeated report ends once the open one committed")
        .unwrap()
        .unwrap();
    assert!(repeated.1, "the repeat is answered as a duplicate: {repeated:?}");
    let attempts: i64 =
        reader.prepare_cached("SELECT count(*) FROM attempts").unwrap().query_row([], |r| r.get(0)).unwrap();
    assert_eq!(attempts, 2, "one attempt per run");

    let passed = rt.block_on(store.feed_barrier()).unwrap();
    assert!(passed >= outcome_at(&reader, d2), "a barrier moves the horizon past both outcomes");
    let after_barrier = page(Some(below.next), passed);
    assert!(
        after_barrier.events.iter().any(|e| e.kind == FeedEventKind::Outcome),
        "d2's outcome is answered once the horizon passed it: {after_barrier:?}"
    );
    assert!(write(&setup, verify::check).is_empty());
}

/// A served store on the record at `url` and what it serves: a session of host-a's instance
/// `i`, and two runs handed off to it (conversations c1 and c2), not started.
struct Delivered {
    rt: tokio::runtime::Runtime,
    store: Store,
    session: u64,
    /// A connection for setting up and checking the record.
    setup: PgConn,
    runs: [ClaimedDelivery; 2],
}

fn two_delivered_runs(url: &str) -> Delivered {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = rt.block_on(Store::open_postgres(&PgUrl::parse(url).unwrap(), baton_shared::clock::system())).unwrap();
    let rebind = baton_hub::store::registry::instances::RebindLimit::default();
    let opened =
        rt.block_on(store.open_session("host-a".into(), "i".into(), None, rebind, Duration::from_secs(60))).unwrap();
    let setup = connect(url);
    write(&setup, |c| {
        send(c, "c1", "k1", "host-a");
        send(c, "c2", "k2", "host-a");
        Ok(())
    });
    let got = write(&setup, |c| claim::claim(c, "host-a", "i", 10, 2));
    let runs: [ClaimedDelivery; 2] = got.try_into().unwrap_or_else(|got| panic!("two deliveries claimed: {got:?}"));
    for d in &runs {
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        write(&setup, |c| handoff::handoff(c, "host-a", &d.delivery_id, holder, 11));
    }
    Delivered { rt, store, session: opened.session, setup, runs }
}

/// Another hub's start of d1 is open (not committed). A served store starts d2 meanwhile and
/// answers (its job shares the record's lock); its start of d1 itself waits for the open one's
/// row, and once that committed answers `start` as the repeat it is: d1 is started once, for
/// the session.
fn starts_run_beside_another_hubs_and_one_run_is_started_once(cluster: &PgCluster) {
    let url = record(cluster, "starts");
    let Delivered { rt, store, session, setup, runs } = two_delivered_runs(&url);
    let [d1, d2] = &runs;
    let item = |d: &ClaimedDelivery| StartItem {
        delivery_id: d.delivery_id.clone(),
        claim_token: d.claim_token.clone(),
        attempt: d.attempt,
    };
    let start = |items: Vec<StartItem>| {
        let (store, session) = (store.clone(), session);
        rt.spawn(async move { store.start_turns("host-a".into(), "i".into(), session, items).await })
    };

    let sep = if url.contains('?') { '&' } else { '?' };
    let other = connect(&format!("{url}{sep}write_idle_timeout=300"));
    other.begin_shared().unwrap();
    let begun = turns::start(&other, "host-a", "i", session, &[item(d1)], 12).unwrap();
    assert!(begun[0].start, "{begun:?}");
    // Its start written (sent now, not with a next statement): d1's row is locked.
    other.flush().unwrap();

    let answered = rt
        .block_on(async { tokio::time::timeout(WAIT, start(vec![item(d2)])).await })
        .expect("the start is answered while another hub's start is open")
        .unwrap()
        .unwrap();
    assert!(answered[0].start, "{answered:?}");

    // The same run through the served store: it waits for the open start's row, then repeats it.
    let again = start(vec![item(d1)]);
    let admin = connect(&url);
    let (done, waited) = mpsc::channel::<()>();
    wait_until_waiting(&admin, &waited);
    drop(done);
    other.control("COMMIT").unwrap();
    let repeated = rt
        .block_on(async { tokio::time::timeout(WAIT, again).await })
        .expect("the repeated start ends once the open one committed")
        .unwrap()
        .unwrap();
    assert!(repeated[0].start && repeated[0].code.is_none(), "the repeat is answered start: {repeated:?}");
    let started: Vec<Option<i64>> = setup
        .prepare_cached("SELECT started_session FROM deliveries ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(started, [Some(session as i64); 2], "each run started once, for the session");
    assert!(write(&setup, verify::check).is_empty());
}

/// Another hub's transaction of holders' steps is open: it handed off d1 (its events drawn,
/// not committed). A served store's batch of handoffs hands off d2 meanwhile and answers (its
/// job shares the record's lock); d2's events, committed, are numbered above d1's, and the
/// horizon a reader sees stays below d1's until they commit; a barrier then moves past both.
fn holder_steps_run_beside_another_hubs_and_the_horizon_stays_below_theirs(cluster: &PgCluster) {
    let url = record(cluster, "holder_steps");
    let setup = connect(&url);
    write(&setup, |c| {
        send(c, "c1", "k1", "host-a");
        send(c, "c2", "k2", "host-a");
        Ok(())
    });
    let got = write(&setup, |c| claim::claim(c, "host-a", "i", 10, 2));
    let [d1, d2] = got.as_slice() else { panic!("two deliveries claimed: {got:?}") };
    let handed_off = |c: &PgConn, d: &ClaimedDelivery| -> i64 {
        c.prepare_cached("SELECT min(id) FROM delivery_events WHERE delivery_id = $1 AND to_state = 'mirrored'")
            .unwrap()
            .query_row([&d.delivery_id], |r| r.get(0))
            .unwrap()
    };
    // Opened first: opening may write, which waits for any transaction sharing the lock.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = rt.block_on(Store::open_postgres(&PgUrl::parse(&url).unwrap(), baton_shared::clock::system())).unwrap();
    // Idle in its transaction for as long as the test may take on a loaded machine.
    let sep = if url.contains('?') { '&' } else { '?' };
    let other = connect(&format!("{url}{sep}write_idle_timeout=300"));
    other.begin_shared().unwrap();
    let holder = Holder { instance_id: "i", claim_token: &d1.claim_token };
    assert!(handoff::handoff(&other, "host-a", &d1.delivery_id, holder, 11).unwrap().changed);
    let d1_first = handed_off(&other, d1);

    let node = NodeAt { host: "host-a".into(), session: None };
    let items = vec![HolderItem { delivery_id: d2.delivery_id.clone(), claim_token: d2.claim_token.clone() }];
    let answered = rt
        .block_on(async {
            tokio::time::timeout(WAIT, store.holder_steps(Step::Handoff, node, "i".into(), items)).await
        })
        .expect("the handoff is answered while another hub's steps are open");
    assert!(answered.unwrap()[0].as_ref().unwrap().changed);
    let reader = connect(&url);
    assert!(handed_off(&reader, d2) > d1_first, "d2's events are numbered above d1's, still open");
    let horizon = |c: &PgConn| {
        c.begin_read().unwrap();
        let h = feed::horizon(c).unwrap();
        c.control("COMMIT").unwrap();
        h
    };
    assert!(horizon(&reader) < d1_first, "the horizon stays below the open steps' events");

    other.control("COMMIT").unwrap();
    let passed = rt.block_on(store.feed_barrier()).unwrap();
    assert!(passed > handed_off(&reader, d2), "a barrier moves the horizon past both");
    assert!(write(&setup, verify::check).is_empty());
    the_same_step_on_two_hubs_at_once_is_answered_as_a_repeat(&url);
}

/// One holder's `mirrored` of one delivery through two hubs at once (a node that asked again
/// through another hub): the second reads the delivery claimed, then waits for the first's row
/// lock, and is answered as the repeat it is, not as a stale claim.
fn the_same_step_on_two_hubs_at_once_is_answered_as_a_repeat(url: &str) {
    let setup = connect(url);
    write(&setup, |c| {
        send(c, "c3", "k3", "host-b");
        Ok(())
    });
    let got = write(&setup, |c| claim::claim(c, "host-b", "j", 20, 1));
    let [d] = got.as_slice() else { panic!("one delivery claimed: {got:?}") };
    let (first, second, admin) = (connect(url), connect(url), connect(url));
    first.begin_shared().unwrap();
    let holder = Holder { instance_id: "j", claim_token: &d.claim_token };
    assert!(handoff::mirrored(&first, "host-b", &d.delivery_id, holder, 21).unwrap().changed);
    let (done, answered) = mpsc::channel();
    let (id, token) = (d.delivery_id.clone(), d.claim_token.clone());
    let again = std::thread::spawn(move || {
        second.begin_shared().unwrap();
        let holder = Holder { instance_id: "j", claim_token: &token };
        let got = handoff::mirrored(&second, "host-b", &id, holder, 22).map(|r| r.changed).map_err(|e| e.to_string());
        second.control("COMMIT").unwrap();
        done.send(got).unwrap();
    });
    wait_until_waiting(&admin, &answered);
    first.control("COMMIT").unwrap();
    let changed = answered.recv_timeout(WAIT).expect("the second step ends once the first committed");
    again.join().unwrap();
    assert_eq!(changed, Ok(false), "the second step is a repeat");
    assert!(write(&setup, verify::check).is_empty());
}

/// host-a's claim holds pool conversation c1 (its queue row locked); host-b's claim on another
/// connection skips it and takes c2, both its turns; after host-a committed, c1 is bound to
/// host-a and host-b takes nothing of it.
fn two_members_skip_the_pool_conversation_the_other_holds(cluster: &PgCluster) {
    let url = record(cluster, "pool_members");
    let (first, second) = (connect(&url), connect(&url));
    write(&first, |c| {
        pools::add(c, "gpu", &["host-a".into(), "host-b".into()], "op", "r", 1)?;
        for (key, conversation) in [("a1", "c1"), ("b1", "c2"), ("a2", "c1"), ("b2", "c2")] {
            send_to_pool(c, conversation, key, "gpu");
        }
        Ok(())
    });
    first.begin_shared().unwrap();
    let held = claim::claim(&first, "host-a", "i", 1, 2).unwrap();
    assert_eq!(turns(&held), [("c1".to_string(), 1)]);
    let (done, result) = mpsc::channel();
    let other = std::thread::spawn(move || {
        second.begin_shared().unwrap();
        let got = claim::claim(&second, "host-b", "j", 10, 2).map_err(|e| e.to_string());
        second.control("COMMIT").unwrap();
        done.send(got).unwrap();
        second
    });
    let got = result.recv_timeout(WAIT).expect("host-b's claim ends while host-a's is open").unwrap();
    assert_eq!(turns(&got), [("c2".to_string(), 1), ("c2".to_string(), 2)], "c1 was skipped, not waited for");
    first.control("COMMIT").unwrap();
    let second = other.join().unwrap();
    assert!(write(&second, |c| claim::claim(c, "host-b", "j", 10, 3)).is_empty(), "c1 is bound to host-a");
    assert_eq!(turns(&write(&first, |c| claim::claim(c, "host-a", "i", 10, 3))), [("c1".to_string(), 2)]);
    assert!(write(&first, verify::check).is_empty());
}

/// Three members, two connections each (six hubs' writers), claim and run pool turns of eight
/// conversations at once: every delivery is handed out once, each conversation's turns are
/// handed out in increasing seq and never while another host's turn of it is in flight (the
/// turns of a claim are run before the next claim, so a host's claims are its runs), and the
/// record verifies.
fn members_racing_on_several_connections_hand_out_each_pool_turn_once(cluster: &PgCluster) {
    const MESSAGES: usize = 96;
    let url = record(cluster, "pool_race");
    let setup = connect(&url);
    write(&setup, |c| {
        hosts::add_host(c, "host-c", 0)?;
        pools::add(c, "gpu", &["host-a".into(), "host-b".into(), "host-c".into()], "op", "r", 1)?;
        for i in 0..MESSAGES {
            send_to_pool(c, &format!("c{}", i % 8), &format!("k{i}"), "gpu");
        }
        Ok(())
    });
    // Each handed-out turn: (conversation, seq, host), in the order claims handed them out.
    let log: HandedOut = Default::default();
    let threads: Vec<_> = ["host-a", "host-b", "host-c", "host-a", "host-b", "host-c"]
        .into_iter()
        .map(|host| {
            let (conn, log) = (connect(&url), log.clone());
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(120);
                let instance = format!("i-{host}");
                let mut now = 10;
                while log.lock().unwrap().len() < MESSAGES && Instant::now() < deadline {
                    now += 1;
                    let got = match claim_once(&conn, host, &instance, now, &log) {
                        Ok(got) => got,
                        // Two hubs' claims of one host may meet on its row: the server's
                        // deadlock error, which a node retries like any storage failure.
                        Err(_) => continue,
                    };
                    for d in got {
                        run_to_outcome(&conn, host, &instance, &d, now);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), MESSAGES, "every pool delivery was handed out");
    let mut seen = std::collections::HashSet::new();
    assert!(log.iter().all(|(c, s, _)| seen.insert((c.clone(), *s))), "none twice: {log:?}");
    for conversation in (0..8).map(|i| format!("c{i}")) {
        let seqs: Vec<i64> = log.iter().filter(|(c, _, _)| *c == conversation).map(|(_, s, _)| *s).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{conversation} handed out in order: {seqs:?}");
    }
    let problems = write(&setup, verify::check);
    assert!(problems.is_empty(), "{problems:?}");
}

/// What each claim handed out, logged before its commit: a pool conversation's queue row stays
/// locked by the claim until then, so the log is in the order claims handed turns out.
type HandedOut = std::sync::Arc<std::sync::Mutex<Vec<(String, i64, String)>>>;

/// One claim transaction of `host` (at most 3 turns), logged and committed.
fn claim_once(
    conn: &PgConn,
    host: &str,
    instance: &str,
    now: i64,
    log: &HandedOut,
) -> Result<Vec<ClaimedDelivery>, String> {
    conn.begin_shared().map_err(|e| e.to_string())?;
    match claim::claim(conn, host, instance, 3, now) {
        Ok(got) => {
            let mut log = log.lock().unwrap();
            log.extend(got.iter().map(|d| (d.conversation.clone(), d.seq, host.to_string())));
            conn.control("COMMIT").expect("a claim that handed turns out commits");
            Ok(got)
        }
        Err(e) => {
            let _ = conn.control("ROLLBACK");
            Err(e.to_string())
        }
    }
}

/// Mirrors, acks and reports a claimed turn (succeeded) in one write transaction.
fn run_to_outcome(conn: &PgConn, host: &str, instance: &str, d: &ClaimedDelivery, now: i64) {
    let h = Holder { instance_id: instance, claim_token: &d.claim_token };
    write(conn, |c| {
        handoff::mirrored(c, host, &d.delivery_id, h, now)?;
        handoff::ack(c, host, &d.delivery_id, h, now)?;
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder: h,
            report_id: &format!("r-{}", d.delivery_id),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(1),
            result: None,
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        report::report_run(c, host, &r, &RunReport { attempt: Some(d.attempt), ..RunReport::default() }, now)
    });
}

/// Accepts one message of `conversation` to the pool `pool` and fans it out.
fn send_to_pool(conn: &dyn Db, conversation: &str, key: &str, pool: &str) {
    let msg = NewMessage {
        traceparent: None,
        producer: "prod".into(),
        conversation: conversation.into(),
        idempotency_key: key.into(),
        payload: "{}".into(),
        to: Vec::new(),
        pools: vec![pool.to_string()],
    };
    let limits = AcceptLimits { queued_per_host_max: 1 << 20, queued_per_pool_max: 1 << 20 };
    accept::accept_and_fan_out(conn, &msg, RetryPolicy::default(), limits, 1).unwrap();
}

/// Two claims of one instance, the first still open: the second skips the conversation the
/// first holds and takes the other one's turns in order, then waits for the first to commit
/// before its own end lands (they share the host's waiting count, which a claim moves once, at
/// its end). The conversation the first held is left for the next claim, in order. Nothing is
/// handed out twice.
fn one_host_two_claims_take_disjoint_conversations(cluster: &PgCluster) {
    let url = record(cluster, "one_host");
    let (first, second, admin) = (connect(&url), connect(&url), connect(&url));
    write(&first, |c| {
        for (key, conversation) in [("a1", "c1"), ("b1", "c2"), ("a2", "c1"), ("b2", "c2")] {
            send(c, conversation, key, "host-a");
        }
        // Binds instance `i`: the claims below are the bound instance's.
        claim::claim(c, "host-a", "i", 0, 1).map(drop)
    });

    first.begin_shared().unwrap();
    let held = claim::claim(&first, "host-a", "i", 1, 2).unwrap();
    assert_eq!(turns(&held), [("c1".to_string(), 1)], "the least recently served conversation goes first");

    let (done, result) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        second.begin_shared().unwrap();
        let got = claim::claim(&second, "host-a", "i", 10, 2);
        second.control("COMMIT").unwrap();
        done.send(got.map_err(|e| e.to_string())).unwrap();
        second
    });
    wait_until_waiting(&admin, &result);
    first.control("COMMIT").unwrap();
    let got = result.recv_timeout(WAIT).expect("the second claim ends once the first committed").unwrap();
    waiter.join().unwrap();
    // c1 was held by the first claim throughout the second's walk: c2's turns, in order.
    assert_eq!(
        turns(&got),
        [("c2".to_string(), 1), ("c2".to_string(), 2)],
        "the second claim skipped the conversation the first held, and kept its order"
    );
    let rest = write(&first, |c| claim::claim(c, "host-a", "i", 10, 3));
    assert_eq!(turns(&rest), [("c1".to_string(), 2)], "the held conversation's next turn is next");
    let mut ids: Vec<&str> = held.iter().chain(&got).chain(&rest).map(|d| d.delivery_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "every delivery handed out exactly once");
    assert!(write(&first, |c| claim::claim(c, "host-a", "i", 10, 4)).is_empty(), "nothing is left to hand out");
}

/// A claim of host-a is open; a claim of host-b on another connection does not wait for it.
fn two_hosts_claim_at_once(cluster: &PgCluster) {
    let url = record(cluster, "two_hosts");
    let (first, second) = (connect(&url), connect(&url));
    write(&first, |c| {
        send(c, "c1", "a", "host-a");
        send(c, "c1", "b", "host-b");
        Ok(())
    });
    first.begin_shared().unwrap();
    let a = claim::claim(&first, "host-a", "i", 10, 2).unwrap();
    assert_eq!(a.len(), 1);
    let (done, result) = mpsc::channel();
    let other = std::thread::spawn(move || {
        second.begin_shared().unwrap();
        let got = claim::claim(&second, "host-b", "j", 10, 2).map_err(|e| e.to_string());
        second.control("COMMIT").unwrap();
        done.send(got).unwrap();
    });
    let b = result.recv_timeout(WAIT).expect("host-b's claim ends while host-a's is still open").unwrap();
    assert_eq!(b.len(), 1, "host-b's own delivery");
    assert_ne!(a[0].delivery_id, b[0].delivery_id);
    first.control("COMMIT").unwrap();
    other.join().unwrap();
}

/// Instance `i` of host-a has a claim open; instance `j` claims on another connection. It must
/// not bind itself on what it read before `i`'s claim committed: it waits for the host's row,
/// then finds `i` holding work and is refused.
fn another_instance_waits_for_the_bound_one(cluster: &PgCluster) {
    let url = record(cluster, "rebind");
    let (first, second, admin) = (connect(&url), connect(&url), connect(&url));
    write(&first, |c| {
        send(c, "c1", "a1", "host-a");
        send(c, "c2", "b1", "host-a");
        claim::claim(c, "host-a", "i", 0, 1).map(drop)
    });
    first.begin_shared().unwrap();
    assert_eq!(claim::claim(&first, "host-a", "i", 1, 2).unwrap().len(), 1);
    let (done, result) = mpsc::channel();
    let other = std::thread::spawn(move || {
        second.begin_shared().unwrap();
        let got = claim::claim(&second, "host-a", "j", 10, 2);
        let _ = second.control(if got.is_ok() { "COMMIT" } else { "ROLLBACK" });
        done.send(got).unwrap();
    });
    wait_until_waiting(&admin, &result);
    first.control("COMMIT").unwrap();
    match result.recv_timeout(WAIT).expect("the other instance's claim ends") {
        Err(StoreError::InstanceConflict(m)) => assert!(m.contains("instance i of host host-a still holds 1"), "{m}"),
        other => panic!("expected an instance conflict, got {other:?}"),
    }
    other.join().unwrap();
}

/// A claim transaction is open: an ordinary write transaction on another connection waits for
/// it; and while an ordinary one is open, a claim transaction waits for that.
fn other_writers_and_claims_wait_for_each_other(cluster: &PgCluster) {
    let url = record(cluster, "exclusive");
    let (first, admin) = (connect(&url), connect(&url));
    let mut second = connect(&url);
    write(&first, |c| {
        send(c, "c1", "a1", "host-a");
        Ok(())
    });
    for (claims_first, claims_then) in [(true, false), (false, true)] {
        begin(&first, claims_first).unwrap();
        let (done, result) = mpsc::channel();
        let other = std::thread::spawn(move || {
            let begun = begin(&second, claims_then);
            let _ = second.control("ROLLBACK");
            done.send(begun.map_err(|e| e.to_string())).unwrap();
            second
        });
        wait_until_waiting(&admin, &result);
        first.control("COMMIT").unwrap();
        result.recv_timeout(WAIT).expect("the waiting transaction begins once the first ended").unwrap();
        second = other.join().unwrap();
    }
}

/// Begins a claim transaction (`claims`) or an ordinary write transaction.
fn begin(conn: &PgConn, claims: bool) -> baton_hub::store::engine::DbResult<()> {
    if claims { conn.begin_shared() } else { conn.begin_write() }
}

/// A new database `name` in the cluster, migrated, with hosts host-a and host-b enrolled.
fn record(cluster: &PgCluster, name: &str) -> String {
    let url = cluster.create_database(name).unwrap();
    pg::connect_and_migrate_blocking(&PgUrl::parse(&url).unwrap()).unwrap();
    let conn = connect(&url);
    write(&conn, |c| {
        hosts::add_host(c, "host-a", 0)?;
        hosts::add_host(c, "host-b", 0)
    });
    url
}

fn connect(url: &str) -> PgConn {
    PgConn::connect(&PgUrl::parse(url).unwrap()).unwrap()
}

/// Runs `f` in one ordinary write transaction and commits it.
fn write<R>(conn: &PgConn, f: impl FnOnce(&dyn Db) -> Result<R, StoreError>) -> R {
    baton_hub::store::in_write_txn(conn, f).unwrap()
}

/// Accepts one message of `conversation` to `host` and fans it out.
fn send(conn: &dyn Db, conversation: &str, key: &str, host: &str) {
    let msg = NewMessage {
        traceparent: None,
        producer: "prod".into(),
        conversation: conversation.into(),
        idempotency_key: key.into(),
        payload: "{}".into(),
        to: vec![host.to_string()],
        pools: Vec::new(),
    };
    let limits = AcceptLimits { queued_per_host_max: 1 << 20, queued_per_pool_max: 1 << 20 };
    accept::accept_and_fan_out(conn, &msg, RetryPolicy::default(), limits, 1).unwrap();
}

/// Each delivery's (conversation, seq), in the order handed out.
fn turns(got: &[ClaimedDelivery]) -> Vec<(String, i64)> {
    got.iter().map(|d| (d.conversation.clone(), d.seq)).collect()
}

/// Waits until some connection of the record waits for a lock (seen by `admin` in `pg_locks`),
/// failing if the waiting side answered first.
fn wait_until_waiting<T: std::fmt::Debug>(admin: &PgConn, answered: &mpsc::Receiver<T>) {
    let deadline = Instant::now() + WAIT;
    loop {
        if waiting_locks(admin) > 0 {
            return;
        }
        if let Ok(got) = answered.try_recv() {
            panic!("expected the other connection to wait for a lock; it answered {got:?}");
        }
        assert!(Instant::now() < deadline, "no connection was seen waiting for a lock");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many locks connections of the cluster wait for (seen by `admin` in `pg_locks`).
fn waiting_locks(admin: &PgConn) -> i64 {
    admin
        .prepare_cached("SELECT count(*) FROM pg_locks WHERE NOT granted")
        .unwrap()
        .query_row([], |r| r.get(0))
        .unwrap()
}
