//! A claim PostgreSQL ends in a deadlock is run again inside the hub, and counted, instead of
//! reaching the node as 503 (against a real throwaway cluster; skipped without PostgreSQL server
//! binaries unless `BATON_REQUIRE_POSTGRES=1`). The deadlock is made on purpose: another
//! connection holds the host's backlog row, which the claim updates once it holds the host's
//! row, and then asks for the host's row itself. The server ends the claim's transaction (it
//! waited first, so its deadlock check runs first); the claim runs again once the other one
//! committed, hands out the delivery, and `baton_hub_conflict_retries_total` moves.

use baton_hub::store::engine::postgres::{self as pg, PgUrl};
use baton_hub::store::engine::{Db, PgConn};
use baton_hub::store::lifecycle::accept::{self, AcceptLimits, NewMessage, RetryPolicy};
use baton_hub::store::lifecycle::claim::Claimer;
use baton_hub::store::{Store, registry::hosts};
use baton_shared::ids::Role;
use baton_testkit::pg::cluster_or_skip;
use std::time::{Duration, Instant};

/// The longest wait for the claim to be seen waiting (generous: the machine may be loaded).
const WAIT: Duration = Duration::from_secs(30);

const SERIAL: &str = "0a01";

#[test]
fn a_claim_ended_in_a_deadlock_runs_again_and_is_counted() {
    let Some(cluster) = cluster_or_skip("a_claim_ended_in_a_deadlock", false) else { return };
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().unwrap();
    let url = cluster.create_database("deadlock").unwrap();
    pg::connect_and_migrate_blocking(&PgUrl::parse(&url).unwrap()).unwrap();
    let setup = PgConn::connect(&PgUrl::parse(&url).unwrap()).unwrap();
    baton_hub::store::in_write_txn(&setup, |c| {
        let issued =
            hosts::Issued { role: Role::Node, name: "host-a", serial: SERIAL, not_after_unix: i64::from(i32::MAX) };
        hosts::enroll(c, issued, "op", "enrolled", 0)?;
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "c1".into(),
            idempotency_key: "k1".into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        };
        accept::accept_and_fan_out(
            c,
            &msg,
            RetryPolicy::default(),
            AcceptLimits { queued_per_host_max: 1 << 20, queued_per_pool_max: 1 << 20 },
            1,
        )?;
        Ok(())
    })
    .unwrap();
    drop(setup);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = rt.block_on(Store::open_postgres(&PgUrl::parse(&url).unwrap(), baton_shared::clock::system())).unwrap();

    // The other side: it holds host-a's backlog row, and only ever notices the deadlock late, so
    // the claim is the transaction the server ends.
    let other = PgConn::connect(&PgUrl::parse(&url).unwrap()).unwrap();
    other.execute_batch("SET deadlock_timeout = '60s'").unwrap();
    other.execute_batch("BEGIN").unwrap();
    other.execute_batch("UPDATE host_backlog SET waiting = waiting WHERE host = 'host-a'").unwrap();

    let claimer = Claimer {
        host: "host-a".into(),
        serial: SERIAL.into(),
        instance_id: "i".into(),
        session: None,
        rebind: Default::default(),
        pool_affinity_wait: baton_shared::limits::POOL_AFFINITY_WAIT,
    };
    let claim = rt.spawn({
        let store = store.clone();
        async move { store.claim(claimer, 8).await }
    });

    // Once the claim waits for the backlog row (holding host-a's), ask for host-a's row.
    let watcher = PgConn::connect(&PgUrl::parse(&url).unwrap()).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let waiting: i64 = watcher
            .prepare_cached("SELECT count(*) FROM pg_locks WHERE NOT granted")
            .unwrap()
            .query_row([], |r| r.get(0))
            .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(!claim.is_finished(), "the claim ended without waiting for the backlog row");
        assert!(Instant::now() < deadline, "the claim was never seen waiting for the backlog row");
        std::thread::sleep(Duration::from_millis(10));
    }
    other
        .execute_batch("SELECT 1 FROM hosts WHERE name = 'host-a' FOR UPDATE")
        .expect("the claim's transaction was ended, not this one");
    other.execute_batch("COMMIT").unwrap();

    let claimed = rt.block_on(claim).unwrap().expect("the claim succeeds after it ran again");
    assert_eq!(claimed.deliveries.len(), 1, "the delivery was handed out: {claimed:?}");
    let text = recorder.render();
    let retries: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("baton_hub_conflict_retries_total "))
        .unwrap_or_else(|| panic!("no conflict retries counted:\n{text}"))
        .trim()
        .parse()
        .unwrap();
    assert!(retries >= 1.0, "{text}");
}
