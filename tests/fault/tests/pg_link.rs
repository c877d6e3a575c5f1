//! The link between a hub's store and PostgreSQL going silent (the fault proxy's blackhole: the
//! connection stays open and swallows everything, as a partition does): the operation in
//! flight fails as storage unavailable within the URL's `call_timeout` instead of waiting
//! forever, the server ends the stranded transaction (so the record's write lock is not held
//! for other hubs), and once the link heals the store reconnects and nothing committed is
//! lost. Skipped without PostgreSQL unless `BATON_REQUIRE_POSTGRES=1`.

use baton_fault::proxy::{Fault, Proxy};
use baton_hub::pg::PgUrl;
use baton_hub::store::api::Enrollment;
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
