//! The PostgreSQL connection and migrations against a real throwaway cluster (skipped without
//! PostgreSQL server binaries unless `BATON_REQUIRE_POSTGRES=1`): migrations apply once, re-run
//! does nothing (and says nothing: no notice for the hub's log), a newer schema is refused
//! untouched, a record numbered before the lockstep is renumbered once, hubs migrating at once
//! agree, and connection failures (address, login, TLS) are named without the password.

use baton_hub::store::engine::postgres::{self as pg, PgError, PgUrl};
use baton_testkit::pg::{PASSWORD, cluster_or_skip};

async fn client(url: &str) -> tokio_postgres::Client {
    pg::connect(&PgUrl::parse(url).unwrap()).await.unwrap()
}

async fn table_count(c: &tokio_postgres::Client) -> i64 {
    c.query_one("SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_a_rerun_changes_nothing() {
    let Some(cluster) = cluster_or_skip("migrations_apply", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let mut c = pg::connect(&url).await.unwrap();
    assert_eq!(pg::schema_version(&c, &url).await.unwrap(), None);

    let first = pg::migrate(&mut c, &url).await.unwrap();
    assert_eq!(first, pg::Migrated { from: 0, to: pg::known_version() });
    assert_eq!(pg::schema_version(&c, &url).await.unwrap(), Some(pg::known_version()));
    let tables = table_count(&c).await;
    assert!(tables > 10, "{tables} tables");
    c.execute("INSERT INTO conversations (name, last_seq) VALUES ('kept', 3)", &[]).await.unwrap();

    let again = pg::migrate(&mut c, &url).await.unwrap();
    assert!(again.was_current(), "{again:?}");
    assert_eq!(table_count(&c).await, tables);
    let kept: i64 = c.query_one("SELECT last_seq FROM conversations WHERE name = 'kept'", &[]).await.unwrap().get(0);
    assert_eq!(kept, 3);
}

#[tokio::test]
async fn a_newer_schema_is_refused_with_both_versions_and_left_untouched() {
    let Some(cluster) = cluster_or_skip("newer_schema", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let mut c = pg::connect(&url).await.unwrap();
    pg::migrate(&mut c, &url).await.unwrap();
    let newer = pg::known_version() + 1;
    c.execute("UPDATE baton_schema SET version = $1", &[&newer]).await.unwrap();

    let e = pg::migrate(&mut c, &url).await.unwrap_err();
    assert!(matches!(e, PgError::TooNew { found, known, .. } if found == newer && known == pg::known_version()));
    assert_eq!(e.exit_code(), baton_shared::exit::REFUSED);
    let text = e.to_string();
    assert!(
        text.contains(&format!("schema version {newer}, newer than this binary's {}", pg::known_version())),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "{text}");
    assert_eq!(pg::schema_version(&c, &url).await.unwrap(), Some(newer));
}

/// Several hubs starting at once: the advisory lock lets one migrate and the others find the
/// schema current. Without it they race on `CREATE TABLE` and fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hubs_migrating_at_once_all_succeed_with_one_schema() {
    let Some(cluster) = cluster_or_skip("concurrent_migrations", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let hubs: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut c = pg::connect(&url).await?;
                pg::migrate(&mut c, &url).await
            })
        })
        .collect();
    let mut applied = 0;
    for hub in hubs {
        let done = hub.await.unwrap().unwrap();
        assert_eq!(done.to, pg::known_version());
        if done.from == 0 {
            applied += 1;
        }
    }
    assert_eq!(applied, 1, "exactly one hub applies the migrations");
    let c = client(&cluster.url()).await;
    let rows: i64 = c.query_one("SELECT count(*) FROM baton_schema", &[]).await.unwrap().get(0);
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn connection_failures_name_the_cause_and_never_the_password() {
    let Some(cluster) = cluster_or_skip("connection_failures", false) else { return };

    // Nothing listens on this port: the address is named.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = PgUrl::parse(&format!("postgres://baton:{PASSWORD}@127.0.0.1:{closed}/baton?sslmode=disable")).unwrap();
    let e = pg::connect(&url).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgError::Unreachable { .. }), "{text}");
    assert!(
        text.contains(&format!("cannot reach the database at postgres://baton@127.0.0.1:{closed}/baton")),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "{text}");

    // A wrong password: the login is refused.
    let wrong = "not-the-password-42";
    let url =
        PgUrl::parse(&format!("postgres://baton:{wrong}@127.0.0.1:{}/baton?sslmode=disable", cluster.port())).unwrap();
    let e = pg::connect(&url).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PgError::Auth { .. }), "{text}");
    assert!(text.contains("refused the login") && text.contains("password authentication failed"), "{text}");
    assert!(!text.contains(wrong), "{text}");
    assert_eq!(e.exit_code(), baton_shared::exit::FAILURE);

    // TLS required from a server without it.
    let url = PgUrl::parse(&format!("postgres://baton:{PASSWORD}@127.0.0.1:{}/baton?sslmode=require", cluster.port()))
        .unwrap();
    let e = pg::connect(&url).await.unwrap_err();
    assert!(matches!(e, PgError::Tls { .. }), "{e}");
    assert!(e.to_string().contains("does not support TLS"), "{e}");
}

async fn uses_tls(c: &tokio_postgres::Client) -> bool {
    c.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn verify_full_trusts_the_clusters_ca_and_refuses_another() {
    let Some(cluster) = cluster_or_skip("tls_verify_full", true) else { return };
    let ca = cluster.ca_file().unwrap().to_owned();

    for host in ["127.0.0.1", "localhost"] {
        let c = client(&cluster.tls_url(host, &ca)).await;
        assert!(uses_tls(&c).await, "verify-full to {host} runs over TLS");
    }
    // `require` without a CA file encrypts without checking; `disable` does not encrypt.
    let plain = cluster.url();
    let required = plain.replace("sslmode=disable", "sslmode=require");
    assert!(uses_tls(&client(&required).await).await);
    assert!(!uses_tls(&client(&plain).await).await);
    // verify-ca checks the chain only.
    let verify_ca = cluster.tls_url("127.0.0.1", &ca).replace("verify-full", "verify-ca");
    assert!(uses_tls(&client(&verify_ca).await).await);

    // A CA that did not sign the server's certificate is refused, naming TLS and why.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    std::fs::write(&other, baton_shared::pki::create_ca("another ca").unwrap().cert_pem).unwrap();
    for mode in ["verify-full", "verify-ca"] {
        let url = PgUrl::parse(&cluster.tls_url("127.0.0.1", &other).replace("verify-full", mode)).unwrap();
        let e = pg::connect(&url).await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, PgError::Tls { .. }), "{mode}: {text}");
        assert!(text.starts_with("TLS to the database failed") && text.contains("UnknownIssuer"), "{mode}: {text}");
        assert!(!text.contains(PASSWORD), "{text}");
    }
}

/// Every hub migrates at start; on a current database that must not put the server's notices
/// ("relation already exists, skipping") into every hub's log. Warnings would still come.
#[tokio::test]
async fn migrating_a_current_database_sends_no_notice() {
    let Some(cluster) = cluster_or_skip("migrate_quietly", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let (mut c, mut connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await.unwrap();
    let (tx, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let io = tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notice(n) = message {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    pg::migrate(&mut c, &url).await.unwrap();
    let again = pg::migrate(&mut c, &url).await.unwrap();
    assert!(again.was_current());
    // A round trip after the migrations: every notice they caused has arrived by now.
    c.batch_execute("SELECT 1").await.unwrap();
    let mut heard = Vec::new();
    while let Ok(n) = notices.try_recv() {
        heard.push(n);
    }
    assert!(heard.is_empty(), "notices: {heard:?}");
    drop(c);
    io.await.unwrap();
}

/// The statements a hub applied while the PostgreSQL history was numbered apart, in its order:
/// its 0001, 0002 and 0003 (now 0001 with `FIRST_ALSO`), then its 0004 to 0009 (now 0007 to
/// 0012). Its version `v` meant the first `v` of these.
fn numbered_apart() -> Vec<&'static str> {
    let mut steps = vec![pg::MIGRATIONS[0]];
    steps.extend(pg::FIRST_ALSO);
    steps.extend(&pg::MIGRATIONS[6..12]);
    steps
}

/// Everything the schema is made of, as text to compare: columns with their types, nullability
/// and defaults; constraints; indexes; triggers; functions' bodies.
async fn catalog(c: &tokio_postgres::Client) -> Vec<String> {
    let queries = [
        "SELECT format('column %s.%s %s %s %s', table_name, column_name, data_type, is_nullable, column_default)
         FROM information_schema.columns WHERE table_schema = current_schema() AND table_name <> 'baton_schema'",
        "SELECT format('constraint %s %s', conrelid::regclass, pg_get_constraintdef(oid)) FROM pg_constraint
         WHERE connamespace = current_schema()::regnamespace AND conrelid <> 'baton_schema'::regclass",
        "SELECT format('index %s', indexdef) FROM pg_indexes WHERE schemaname = current_schema()
         AND tablename <> 'baton_schema'",
        "SELECT format('trigger %s', pg_get_triggerdef(t.oid)) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace",
        "SELECT format('function %s %s', proname, md5(prosrc)) FROM pg_proc
         WHERE pronamespace = current_schema()::regnamespace",
    ];
    let mut all = Vec::new();
    for q in queries {
        for row in c.query(q, &[]).await.unwrap() {
            all.push(row.get::<_, String>(0));
        }
    }
    all.sort();
    all
}

/// A record a hub migrated while the PostgreSQL history was numbered apart, at every version it
/// could be at, is renumbered once into lockstep and brought to this binary's schema: the same
/// catalog as a record migrated from nothing, its rows kept, and a second start changing
/// nothing.
#[tokio::test]
async fn a_record_numbered_apart_is_renumbered_into_lockstep_at_every_version() {
    let Some(cluster) = cluster_or_skip("numbered_apart", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let mut c = pg::connect(&url).await.unwrap();
    pg::migrate(&mut c, &url).await.unwrap();
    let want = catalog(&c).await;
    assert!(want.len() > 50, "{want:?}");

    let steps = numbered_apart();
    for version in 0..=steps.len() {
        let db = format!("apart_{version}");
        let url = PgUrl::parse(&cluster.create_database(&db).unwrap()).unwrap();
        let mut c = pg::connect(&url).await.unwrap();
        // As the runner before the lockstep left it: its version table, then its migrations.
        c.batch_execute(
            "CREATE TABLE baton_schema (one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
                 version BIGINT NOT NULL CHECK (version >= 0));
             INSERT INTO baton_schema (one, version) VALUES (true, 0);",
        )
        .await
        .unwrap();
        for step in &steps[..version] {
            c.batch_execute(step).await.unwrap();
        }
        let v = i64::try_from(version).unwrap();
        c.execute("UPDATE baton_schema SET version = $1", &[&v]).await.unwrap();
        if version >= 1 {
            c.execute("INSERT INTO conversations (name, last_seq) VALUES ('kept', 7)", &[]).await.unwrap();
        }
        let told = pg::schema_version(&c, &url).await.unwrap().unwrap();
        assert!(told <= pg::known_version(), "version {version} is told as {told}");

        let done = pg::migrate(&mut c, &url).await.unwrap();
        assert_eq!(done.to, pg::known_version(), "from version {version} numbered apart");
        let renumbered = match v {
            0 => 0,
            1 | 2 => 6,
            v => v + 3,
        };
        assert_eq!(done.from, renumbered, "version {version} numbered apart is {renumbered} in lockstep");
        assert_eq!(catalog(&c).await, want, "the schema from version {version} numbered apart");
        if version >= 1 {
            let kept: i64 =
                c.query_one("SELECT last_seq FROM conversations WHERE name = 'kept'", &[]).await.unwrap().get(0);
            assert_eq!(kept, 7, "rows are kept from version {version}");
        }
        let again = pg::migrate(&mut c, &url).await.unwrap();
        assert!(again.was_current(), "version {version}: {again:?}");
    }
}
