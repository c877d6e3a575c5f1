//! Hubs waking each other through `LISTEN`/`NOTIFY`, against a real throwaway cluster (skipped
//! without PostgreSQL server binaries unless `BATON_REQUIRE_POSTGRES=1`). Two announcers and
//! listeners in one process stand for two hubs: a notice reaches the other hub and not its own
//! sender, notices piled up are coalesced without losing a host, connections killed on the
//! server or that stop answering are replaced and reported as "everything changed", an
//! oversized or unreadable notice becomes "all", and the CLI's one-shot notice works and names
//! a bad URL without the password.

use baton_hub::peers::{self as notify, Announcer, Notice, Origin};
use baton_hub::store::engine::postgres::{self as pg, PgUrl};
use baton_testkit::pg::{PASSWORD, cluster_or_skip};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The longest wait for a notice (generous: the machine may be loaded).
const WAIT: Duration = Duration::from_secs(30);

/// One hub's listener, its notices in a channel.
struct Hears {
    rx: mpsc::UnboundedReceiver<Notice>,
    task: tokio::task::JoinHandle<()>,
}

impl Hears {
    /// Starts listening at `url` as `me` and waits until it listens (its first notice).
    async fn start(url: &str, me: Origin, shutdown: &CancellationToken) -> Hears {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = notify::listen(
            PgUrl::parse(url).unwrap(),
            me,
            move |n| {
                let _ = tx.send(n);
            },
            shutdown.clone(),
        );
        let mut hears = Hears { rx, task };
        assert_eq!(hears.next().await, Notice::everything(), "a listener starts by saying everything changed");
        hears
    }

    async fn next(&mut self) -> Notice {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a notice within the deadline")
            .expect("the listener is running")
    }
}

/// `url` with an application name, by which the test finds its server connection.
fn named(url: &str, name: &str) -> String {
    format!("{url}&application_name={name}")
}

/// Ends the server connections of `name` from `admin`; returns how many there were.
async fn kill_connections(admin: &tokio_postgres::Client, name: &str) -> usize {
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&name],
        )
        .await
        .unwrap();
    assert!(rows.iter().all(|r| r.get::<_, bool>(0)));
    rows.len()
}

#[tokio::test]
async fn a_host_notice_reaches_the_other_hub_and_not_its_sender() {
    let Some(cluster) = cluster_or_skip("notice_reaches_other_hub", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    let (a, b) = (Origin::fresh(), Origin::fresh());
    let mut hears_a = Hears::start(&url, a, &shutdown).await;
    let mut hears_b = Hears::start(&url, b, &shutdown).await;
    let announcer_a = Announcer::start(PgUrl::parse(&url).unwrap(), a, &shutdown);
    let announcer_b = Announcer::start(PgUrl::parse(&url).unwrap(), b, &shutdown);

    announcer_a.announce(Notice::host("alpha"));
    assert_eq!(hears_b.next().await, Notice::host("alpha"));

    // B's own notice reaches A; B skips it, so the next thing B hears is A's next notice.
    announcer_b.announce(Notice::host("beta"));
    assert_eq!(hears_a.next().await, Notice::host("beta"));
    announcer_a.clone().announce(Notice::outcomes());
    assert_eq!(hears_b.next().await, Notice::outcomes());

    shutdown.cancel();
    tokio::time::timeout(WAIT, hears_a.task).await.unwrap().unwrap();
    tokio::time::timeout(WAIT, hears_b.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn notices_that_pile_up_are_coalesced_without_losing_a_host() {
    let Some(cluster) = cluster_or_skip("coalescing", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    let mut hears = Hears::start(&url, Origin::fresh(), &shutdown).await;
    let announcer = Announcer::start(PgUrl::parse(&url).unwrap(), Origin::fresh(), &shutdown);

    let hosts: Vec<String> = (0..300).map(|i| format!("host-{i}")).collect();
    for host in &hosts {
        announcer.announce(Notice::host(host));
    }
    announcer.announce(Notice::record());
    let (mut heard, mut payloads) = (Notice::default(), 0);
    while hosts.iter().any(|h| !heard.covers_host(h)) || !heard.has_record() {
        heard.merge(hears.next().await);
        payloads += 1;
    }
    assert!(!heard.is_all_hosts(), "the hosts fit one payload, so each was named");
    assert_eq!(heard.hosts().count(), hosts.len());
    assert!(payloads < hosts.len(), "{payloads} payloads for {} notices", hosts.len());

    // Hosts beyond one payload become work for all hosts.
    let long: Vec<String> = (0..200).map(|i| format!("h{i:063}")).collect();
    for host in &long {
        announcer.announce(Notice::host(host));
    }
    let mut heard = Notice::default();
    while long.iter().any(|h| !heard.covers_host(h)) {
        heard.merge(hears.next().await);
    }
    assert!(heard.is_all_hosts(), "{} hosts named", heard.hosts().count());
    shutdown.cancel();
}

#[tokio::test]
async fn a_listener_whose_connection_is_killed_reconnects_and_says_everything_changed() {
    let Some(cluster) = cluster_or_skip("listener_reconnects", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    let mut hears = Hears::start(&named(&url, "listener_b"), Origin::fresh(), &shutdown).await;
    let announcer = Announcer::start(PgUrl::parse(&url).unwrap(), Origin::fresh(), &shutdown);

    let admin = pg::connect(&PgUrl::parse(&url).unwrap()).await.unwrap();
    assert_eq!(kill_connections(&admin, "listener_b").await, 1);
    assert_eq!(hears.next().await, Notice::everything(), "listening again after the kill");
    announcer.announce(Notice::host("after"));
    assert_eq!(hears.next().await, Notice::host("after"));
    shutdown.cancel();
    tokio::time::timeout(WAIT, hears.task).await.unwrap().unwrap();
}

/// A connection that stops answering without being closed (a cut link; here its server process
/// is stopped) is found by the listener's ping and replaced.
#[tokio::test]
async fn a_listener_whose_connection_stops_answering_reconnects() {
    let Some(cluster) = cluster_or_skip("listener_ping", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    let admin = pg::connect(&PgUrl::parse(&url).unwrap()).await.unwrap();
    let mut hears = Hears::start(&named(&url, "listener_c"), Origin::fresh(), &shutdown).await;
    let pid: i32 = admin
        .query_one("SELECT pid FROM pg_stat_activity WHERE application_name = 'listener_c'", &[])
        .await
        .unwrap()
        .get(0);
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let noticed = tokio::time::timeout(notify::LISTEN_PING_INTERVAL + notify::SEND_WAIT + WAIT, hears.rx.recv()).await;
    signal("-CONT");
    assert_eq!(noticed.unwrap().unwrap(), Notice::everything(), "listening again on a new connection");
    notify::announce_once(&PgUrl::parse(&url).unwrap(), &Notice::host("after")).await.unwrap();
    assert_eq!(hears.next().await, Notice::host("after"));
    shutdown.cancel();
}

/// The announcer's connection is killed and, for a while, the database refuses new ones: the
/// notice it could not send arrives once it is back, as "everything changed".
#[tokio::test]
async fn an_announcer_that_could_not_send_says_everything_changed_once_reconnected() {
    let Some(cluster) = cluster_or_skip("announcer_reconnects", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    // On another database: a database cannot refuse connections while one is connected to it.
    let admin = pg::connect(&PgUrl::parse(&cluster.url_for("postgres")).unwrap()).await.unwrap();
    let mut hears = Hears::start(&url, Origin::fresh(), &shutdown).await;
    let announcer = Announcer::start(PgUrl::parse(&named(&url, "announcer_a")).unwrap(), Origin::fresh(), &shutdown);
    announcer.announce(Notice::host("before"));
    assert_eq!(hears.next().await, Notice::host("before"));

    admin.batch_execute("ALTER DATABASE baton ALLOW_CONNECTIONS false").await.unwrap();
    assert_eq!(kill_connections(&admin, "announcer_a").await, 1);
    announcer.announce(Notice::host("after"));
    // The send fails on the dead connection or on the refused new one; wait for a refusal.
    let refused = "is not currently accepting connections";
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cluster.log_tail().contains(refused) {
        assert!(tokio::time::Instant::now() < deadline, "no refused connection: {}", cluster.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin.batch_execute("ALTER DATABASE baton ALLOW_CONNECTIONS true").await.unwrap();
    assert_eq!(hears.next().await, Notice::everything());
    announcer.announce(Notice::host("later"));
    assert_eq!(hears.next().await, Notice::host("later"));
    shutdown.cancel();
}

#[tokio::test]
async fn an_unreadable_payload_is_taken_as_everything_changed() {
    let Some(cluster) = cluster_or_skip("unreadable_payload", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    let mut hears = Hears::start(&url, Origin::fresh(), &shutdown).await;
    let c = pg::connect(&PgUrl::parse(&url).unwrap()).await.unwrap();
    for payload in ["baton2 0123456789abcdef w:alpha", "", "baton1 0123456789abcdef w:Alpha"] {
        c.execute("SELECT pg_notify($1, $2)", &[&notify::CHANNEL, &payload]).await.unwrap();
        assert_eq!(hears.next().await, Notice::everything(), "{payload:?}");
    }
    shutdown.cancel();
}

#[tokio::test]
async fn announce_once_reaches_the_hubs_and_a_bad_url_is_named_without_the_password() {
    let Some(cluster) = cluster_or_skip("announce_once", false) else { return };
    let url = cluster.url();
    let shutdown = CancellationToken::new();
    let mut hears = Hears::start(&url, Origin::fresh(), &shutdown).await;

    notify::announce_once(&PgUrl::parse(&url).unwrap(), &Notice::record()).await.unwrap();
    assert_eq!(hears.next().await, Notice::record());

    let wrong_password = url.replace(PASSWORD, "not-the-password");
    let e = notify::announce_once(&PgUrl::parse(&wrong_password).unwrap(), &Notice::record()).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("refused the login"), "{text}");
    assert!(!text.contains("not-the-password") && !text.contains(PASSWORD), "{text}");

    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let nowhere = format!("postgres://baton:{PASSWORD}@127.0.0.1:{free}/baton?sslmode=disable");
    let e = notify::announce_once(&PgUrl::parse(&nowhere).unwrap(), &Notice::record()).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&format!("cannot reach the database at postgres://baton@127.0.0.1:{free}/baton")), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
    shutdown.cancel();
}
