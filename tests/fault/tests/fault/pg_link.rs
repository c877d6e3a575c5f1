//! The link between a hub's store and PostgreSQL going silent (the fault proxy's blackhole: the
//! connection stays open and swallows everything, as a partition does): the operation in
//! flight fails as storage unavailable within the URL's `call_timeout` instead of waiting
//! forever, the server ends the stranded transaction (so the record's write lock is not held
//! for other hubs), and once the link heals the store reconnects and nothing committed is
//! lost. A hub that freezes while it holds the record's write lock holds the other hubs' writes
//! only for the URL's `write_idle_timeout`. Skipped without PostgreSQL unless
//! `BATON_REQUIRE_POSTGRES=1`.

use baton_fault::proxy::{Fault, Proxy};
use baton_hub::store::engine::postgres::PgUrl;
use baton_hub::store::engine::{Db, PgConn};
use baton_hub::store::registry::hosts::Enrollment;
use baton_hub::store::{Store, StoreError};
use baton_shared::ids::Role;
use baton_testkit::pg::{DATABASE, PASSWORD, USER, cluster_or_skip};
use std::time::{Duration, Instant};

/// The `call_timeout` of the store's URL, seconds.
const CALL_TIMEOUT_S: u64 = 2;
/// Long enough for anything that should happen, however loaded the machine.
const EVENT_WAIT: Duration = Duration::from_secs(60);

fn node(name: &str, serial: &str) -> Enrollment {
    Enrollment {
        role: Role::Node,
        name: name.into(),
        serial: serial.into(),
        not_after_unix: i64::from(i32::MAX),
        scope: None,
        revoke_old: false,
        reason: "link test".into(),
        quota: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_link_fails_fast_and_heals_without_loss() {
    let Some(cluster) = cluster_or_skip("a_silent_database_link", false) else { return };
    let proxy = Proxy::start(([127, 0, 0, 1], 0).into(), ([127, 0, 0, 1], cluster.port()).into()).await.unwrap();
    let url = format!(
        "postgres://{USER}:{PASSWORD}@{}/{DATABASE}?sslmode=disable&call_timeout={CALL_TIMEOUT_S}",
        proxy.addr()
    );
    let store = Store::open_postgres(&PgUrl::parse(&url).unwrap(), baton_shared::clock::system()).await.unwrap();
    store.enroll(node("host-a", "0a"), "op".into()).await.unwrap();

    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let silent = tokio::time::timeout(EVENT_WAIT, store.enroll(node("host-b", "0b"), "op".into()))
        .await
        .expect("a write on a silent link must fail, not wait for ever");
    assert!(matches!(silent, Err(StoreError::Storage(_))), "{silent:?}");
    assert!(
        started.elapsed() < EVENT_WAIT,
        "answered after {:?}, bounded by call_timeout, not by the link",
        started.elapsed()
    );

    // The writer tries to reconnect at once, through the same silent link: that attempt must
    // give up too (a connection is bounded like a round trip), or the writer would hang in it.
    tokio::time::sleep(Duration::from_secs(CALL_TIMEOUT_S + 1)).await;
    proxy.heal();
    // The writer reconnects on its next transaction; the stranded one was ended by the server,
    // so its write lock does not stop the new connection's writes.
    let start = Instant::now();
    loop {
        let attempt = tokio::time::timeout(EVENT_WAIT, store.enroll(node("host-b", "0b"), "op".into()));
        match attempt.await.expect("the store hangs after the link healed") {
            Ok(_) => break,
            Err(e) => {
                assert!(start.elapsed() < EVENT_WAIT, "the store never came back: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let hosts: Vec<String> = store.hosts().await.unwrap().into_iter().map(|h| h.name).collect();
    assert_eq!(hosts, ["host-a", "host-b"], "what was committed before the cut is kept, the retry landed once");
    assert_eq!(store.verify().await.unwrap(), vec![]);
}

/// A writer that took the record's write lock and then went quiet (a hub stopped or swapped
/// out mid-transaction; here a transaction that sends nothing more) keeps another hub's writer
/// waiting only until the server ends the idle transaction, after `write_idle_timeout`, not for
/// `call_timeout`; and the quiet writer's transaction is gone, its next statement refused,
/// never committed late.
#[test]
fn a_frozen_writer_holds_the_write_lock_only_for_write_idle_timeout() {
    let Some(cluster) = cluster_or_skip("a_frozen_writer", false) else { return };
    // `call_timeout` far beyond the test's wait: without the idle bound the other writer would
    // wait that long for the lock, and the test would fail at `EVENT_WAIT`.
    let url = PgUrl::parse(&format!("{}&call_timeout=3600&write_idle_timeout=1", cluster.url())).unwrap();
    let frozen = PgConn::connect(&url).unwrap();
    frozen.begin_write().expect("the first writer takes the write lock");
    let other = PgConn::connect(&url).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let took =
            other.begin_write().and_then(|()| other.execute_batch("SELECT 1")).and_then(|()| other.control("COMMIT"));
        let _ = tx.send(took);
    });
    let took = rx.recv_timeout(EVENT_WAIT).expect("the other writer is still waiting for the frozen one's lock");
    assert!(took.is_ok(), "the other writer took the lock and committed: {took:?}");
    let late = frozen.execute_batch("SELECT 1").and_then(|()| frozen.control("COMMIT"));
    let refused = late.expect_err("the frozen writer's transaction was ended by the server, not committed late");
    assert!(refused.to_string().contains("idle"), "ended for being idle in its transaction: {refused}");
}
