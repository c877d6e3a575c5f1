//! The hub with its record in PostgreSQL (`database_url`), through the real binary: the key's
//! three layers, a malformed URL refused without its password, `init` migrating the database
//! (no SQLite file, `hub.toml` 0600), a second hub joining with the first one's CA, the
//! commands that only make sense for an SQLite file refused, and `serve` answering `/readyz`
//! with a round trip through the CLI of two hubs on one record. It also reruns the rest of this
//! suite with every hub on PostgreSQL, so that every run of the test command proves the
//! contract, the node and the operator's commands on both backends.
//!
//! The cases with a database start a throwaway cluster (`baton_testkit::pg`), skipped when no
//! PostgreSQL server is installed unless `BATON_REQUIRE_POSTGRES=1`.

use crate::harness::{EVENT_WAIT, OPERATOR, bins};
use baton_testkit::Hub;
use baton_testkit::identity::Role;
use baton_testkit::pg::{PASSWORD, PgCluster, cluster_or_skip};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

/// The exit status of bad usage or input, a malformed URL included (`baton_shared::exit`).
const EXIT_USAGE: i32 = 2;
/// The environment variable of the `database_url` key.
const URL_ENV: &str = "BATON_HUB_DATABASE_URL";

/// `baton-hub --data-dir DIR ARGS…` of `hub`, with `env` added to its scrubbed environment.
fn run(hub: &Hub, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = hub.command(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    baton_testkit::bins::run(cmd, EVENT_WAIT).unwrap_or_else(|e| panic!("{e:#}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails unless `out` exited 0; returns its stdout.
fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what} exited {}: {}{}", out.status, stdout(&out), stderr(&out));
    stdout(&out)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o7777
}

/// One answer of `psql` against the cluster's `baton` database (unaligned, tuples only).
fn psql(cluster: &PgCluster, sql: &str) -> String {
    let bin = baton_testkit::pg::server_bin_dir().expect("the cluster started, so its binaries are there");
    let mut cmd = baton_testkit::bins::command(&bin.join("psql"));
    cmd.args(["-h", "127.0.0.1", "-p", &cluster.port().to_string(), "-U", baton_testkit::pg::USER, "-tA", "-c", sql])
        .arg(baton_testkit::pg::DATABASE)
        .env("PGPASSWORD", PASSWORD)
        .env("PGSSLMODE", "disable");
    ok(baton_testkit::bins::run(cmd, EVENT_WAIT).unwrap(), "psql").trim().to_string()
}

/// A hub data directory under `root/name`, not initialised.
fn hub_at(root: &Path, name: &str) -> Hub {
    Hub::new(bins(), &root.join(name), OPERATOR).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `database_url` is layered like every key (flag over environment over file), and `config
/// check` says where the record is without the password. No database is needed: nothing
/// connects.
#[test]
fn database_url_layers_and_is_shown_without_its_password() {
    let root = baton_testkit::fresh_dir("baton-it-").unwrap();
    let hub = hub_at(root.path(), "hub");
    let sqlite = ok(run(&hub, &["config", "check"], &[]), "config check");
    assert!(sqlite.contains("record: ") && sqlite.contains("hub.db"), "SQLite is the default: {sqlite}");
    std::fs::create_dir_all(hub.data_dir()).unwrap();
    std::fs::write(hub.data_dir().join("hub.toml"), "database_url = \"postgres://f:s3cret@file.example/rec\"\n")
        .unwrap();
    let env = [(URL_ENV, "postgres://e:s3cret@env.example/rec")];
    for (args, env, host) in [
        (vec!["config", "check"], &[][..], "f@file.example"),
        (vec!["config", "check"], &env[..], "e@env.example"),
        (vec!["--database-url", "postgres://g:s3cret@flag.example/rec", "config", "check"], &env[..], "g@flag.example"),
        (vec!["config", "check", "--database-url", "postgres://g:s3cret@flag.example/rec"], &env[..], "g@flag.example"),
    ] {
        let shown = ok(run(&hub, &args, env), "config check");
        assert!(shown.contains(&format!("record: PostgreSQL at postgres://{host}:5432/rec")), "{args:?}: {shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}

/// A malformed URL, from any layer and for any command, is exit 2 naming the key and what is
/// wrong, never the password; `init` creates nothing.
#[test]
fn a_malformed_database_url_is_a_usage_error_without_the_password() {
    let root = baton_testkit::fresh_dir("baton-it-").unwrap();
    let hub = hub_at(root.path(), "hub");
    let bad = "postgres://baton:s3cret@db.example:notaport/rec";
    for (args, env) in [
        (vec!["init", "--database-url", bad], vec![]),
        (vec!["init"], vec![(URL_ENV, bad)]),
        (vec!["serve", "--listen", "127.0.0.1:0"], vec![(URL_ENV, bad)]),
        (vec!["deliveries", "list"], vec![(URL_ENV, "postgres://baton:s3cret@db.example/rec?sslmode=sometimes")]),
    ] {
        let out = run(&hub, &args, &env);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(EXIT_USAGE), "{args:?}: {err}");
        assert!(err.contains("database_url is not a usable PostgreSQL URL"), "{args:?}: {err}");
        assert!(!err.contains("s3cret") && !stdout(&out).contains("s3cret"), "{args:?}: {err}");
        assert!(!hub.data_dir().join("ca.crt").exists(), "{args:?} created the CA");
    }
}

/// `init --database-url` migrates the database and makes no SQLite file, writing the URL into
/// `hub.toml` (0600); a second hub joins with `--ca-from` (the same CA, its own server
/// certificate), one without it is refused once certificates were issued; `backup` and
/// `restore` refuse, naming PostgreSQL's tools.
#[test]
fn init_on_postgres_and_a_second_hub_joining_with_the_same_ca() {
    let Some(cluster) = cluster_or_skip("init_on_postgres", false) else { return };
    let url = cluster.url();
    let root = baton_testkit::fresh_dir("baton-it-").unwrap();
    let mut first = hub_at(root.path(), "first");
    let said = ok(run(&first, &["init", "--database-url", &url], &[]), "init");
    assert!(said.contains("PostgreSQL at postgres://baton@127.0.0.1:"), "{said}");
    assert!(!said.contains(PASSWORD), "{said}");
    let dir = first.data_dir().to_path_buf();
    assert!(!dir.join("hub.db").exists(), "no SQLite file on PostgreSQL");
    assert_eq!(mode(&dir.join("hub.toml")), 0o600, "hub.toml holds the password");
    let toml = std::fs::read_to_string(dir.join("hub.toml")).unwrap();
    assert!(toml.lines().any(|l| l == format!("database_url = \"{url}\"")), "{toml}");
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/postgres"))
        .unwrap()
        .filter(|f| f.as_ref().unwrap().path().extension().is_some_and(|e| e == "sql"))
        .count();
    assert_eq!(psql(&cluster, "SELECT version FROM baton_schema"), migrations.to_string(), "every migration applied");
    // A producer's certificate alone (no host, no message) is already the record in use.
    first.enroll(Role::Producer, "prod").unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(psql(&cluster, "SELECT count(*) FROM certificates"), "1", "enroll reached the record");

    // A hub joining without the CA would not verify what was issued: refused, nothing made.
    let stranger = hub_at(root.path(), "stranger");
    let out = run(&stranger, &["init"], &[(URL_ENV, &url)]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("--ca-from"), "{}", stderr(&out));
    assert!(!stderr(&out).contains(PASSWORD), "{}", stderr(&out));
    assert!(!stranger.data_dir().join("ca.crt").exists(), "a refused init creates nothing");
    assert!(stderr(&out).contains("1 certificate(s) issued"), "{}", stderr(&out));
    first.enroll(Role::Node, "host-a").unwrap_or_else(|e| panic!("{e:#}"));

    // The second hub takes the URL from the environment and the CA from the first hub.
    let second = hub_at(root.path(), "second");
    ok(run(&second, &["init", "--ca-from", dir.to_str().unwrap()], &[(URL_ENV, &url)]), "init --ca-from");
    let other = second.data_dir();
    for file in ["ca.crt", "ca.key"] {
        assert_eq!(std::fs::read(dir.join(file)).unwrap(), std::fs::read(other.join(file)).unwrap(), "{file}");
    }
    assert_eq!(mode(&other.join("ca.key")), 0o600);
    assert_ne!(std::fs::read(dir.join("hub.crt")).unwrap(), std::fs::read(other.join("hub.crt")).unwrap());
    assert!(!other.join("hub.db").exists());
    assert_eq!(mode(&other.join("hub.toml")), 0o600);

    // Commands on the SQLite file say what to use instead, exit 2.
    let out = run(&first, &["backup", "--out", root.path().join("b.db").to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("pg_dump") && !stderr(&out).contains(PASSWORD), "{}", stderr(&out));
    assert!(!root.path().join("b.db").exists());
    let some_file = dir.join("hub.toml");
    let out = run(&first, &["restore", "--from", some_file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("pg_restore"), "{}", stderr(&out));
}

/// Two hubs serve one record: each answers `/readyz` (store open, startup repair done), each
/// holding its own data directory's lock, and an enrollment through one hub's CLI is seen
/// through the other's. A hub whose `hub.toml` other users may read warns.
#[test]
fn two_hubs_serve_one_postgres_record() {
    let Some(cluster) = cluster_or_skip("serve_on_postgres", false) else { return };
    let url = cluster.url();
    let root = baton_testkit::fresh_dir("baton-it-").unwrap();
    let mut first = hub_at(root.path(), "first");
    ok(run(&first, &["init", "--database-url", &url], &[]), "init");
    let mut second = hub_at(root.path(), "second");
    let ca_from = first.data_dir().to_str().unwrap().to_string();
    ok(run(&second, &["init", "--database-url", &url, "--ca-from", &ca_from], &[]), "init --ca-from");
    first.enroll(Role::Node, "host-a").unwrap_or_else(|e| panic!("{e:#}"));
    second.enroll(Role::Producer, "prod").unwrap_or_else(|e| panic!("{e:#}"));
    // A configuration open to other users may show them the password: the hub says so.
    let loose = second.data_dir().join("hub.toml");
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    for hub in [&mut first, &mut second] {
        match hub.serve(None).unwrap_or_else(|e| panic!("{e:#}")) {
            baton_testkit::Started::Ready(_) => {}
            other => panic!("serve on PostgreSQL did not become ready: {other:?}\n{}", hub.proc().stderr()),
        }
    }
    // A second `serve` on a data directory already served is refused by its lock, as on SQLite.
    let out = run(&first, &["serve", "--listen", "127.0.0.1:0"], &[]);
    assert!(!out.status.success() && stderr(&out).contains("another hub already serves"), "{}", stderr(&out));
    assert!(second.proc().stderr().contains("other users may read it: chmod 600"), "{}", second.proc().stderr());
    assert!(!first.proc().stderr().contains("other users may read it"), "{}", first.proc().stderr());
    assert!(!first.proc().stderr().contains(PASSWORD), "{}", first.proc().stderr());
    let hosts = ok(run(&second, &["hosts", "list", "--json"], &[]), "hosts list");
    assert!(hosts.contains("host-a"), "enrolled through the first hub, listed through the second: {hosts}");
    first.kill().unwrap();
    second.kill().unwrap();
}

/// `migrate --to`: a stopped SQLite hub's record moves to an empty PostgreSQL database and back
/// to a new SQLite file, each copy compared with its source and verified by the command, and
/// the record read through the CLI is the same on all three. It refuses while a hub serves the
/// data directory, and into a database that already holds a record.
#[test]
fn a_record_migrates_to_postgres_and_back() {
    let Some(cluster) = cluster_or_skip("migrate_to_postgres", false) else { return };
    let root = baton_testkit::fresh_dir("baton-it-").unwrap();
    let mut hub = hub_at(root.path(), "hub");
    ok(run(&hub, &["init"], &[]), "init");
    hub.enroll(Role::Node, "host-a").unwrap_or_else(|e| panic!("{e:#}"));
    hub.enroll(Role::Node, "host-b").unwrap_or_else(|e| panic!("{e:#}"));
    ok(run(&hub, &["members", "add", "--conversation", "team", "host-a"], &[]), "members add");
    for i in 0..5 {
        let key = format!("k{i}");
        ok(run(&hub, &["send", "--conversation", "team", "--key", &key, "--payload", "{\"i\":1}"], &[]), "send");
        let side = format!("s{i}");
        ok(
            run(&hub, &["send", "--conversation", "side", "--to", "host-b", "--key", &side, "--payload", "{}"], &[]),
            "send",
        );
    }
    ok(run(&hub, &["fence", "pause", "--conversation", "side", "--reason", "r"], &[]), "fence");
    let listed = |hub: &Hub, env: &[(&str, &str)]| {
        let d = ok(run(hub, &["deliveries", "list", "--json"], env), "deliveries list");
        let f = ok(run(hub, &["fence", "list", "--json"], env), "fence list");
        let m = ok(run(hub, &["members", "list", "--json"], env), "members list");
        (d, f, m)
    };
    let before = listed(&hub, &[]);
    assert!(before.0.matches("delivery_id").count() == 10, "{}", before.0);

    // Not while a hub serves the directory.
    match hub.serve(None).unwrap_or_else(|e| panic!("{e:#}")) {
        baton_testkit::Started::Ready(_) => {}
        other => panic!("serve: {other:?}"),
    }
    let url = cluster.create_database("moved").unwrap();
    let out = run(&hub, &["migrate", "--to", &url], &[]);
    assert!(!out.status.success() && stderr(&out).contains("stop it first"), "{}", stderr(&out));
    hub.kill().unwrap();

    let said = ok(run(&hub, &["migrate", "--to", &url], &[]), "migrate --to postgres");
    assert!(said.contains("both verify and hold the same record"), "{said}");
    assert!(!said.contains(PASSWORD), "{said}");
    let on_pg = [("BATON_HUB_DATABASE_URL", url.as_str())];
    assert_eq!(listed(&hub, &on_pg), before, "the record read from PostgreSQL is the one moved");
    ok(run(&hub, &["verify"], &on_pg), "verify on PostgreSQL");

    // A second move into the same database is refused: it holds a record now.
    let again = run(&hub, &["migrate", "--to", &url], &[]);
    assert!(!again.status.success() && stderr(&again).contains("already holds a record"), "{}", stderr(&again));
    assert!(!stderr(&again).contains(PASSWORD), "{}", stderr(&again));

    // And back, from PostgreSQL to a new SQLite file.
    let back = root.path().join("back.db");
    let said = ok(run(&hub, &["migrate", "--to", back.to_str().unwrap()], &on_pg), "migrate --to a file");
    assert!(said.contains("both verify"), "{said}");
    std::fs::rename(hub.db(), root.path().join("original.db")).unwrap();
    for side in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{side}", hub.db().display()));
    }
    std::fs::rename(&back, hub.db()).unwrap();
    assert_eq!(listed(&hub, &[]), before, "the record moved back is the same");
}

/// The modules rerun with every hub on PostgreSQL. What differs by backend lives below
/// `Store`, in the record's engine: the two connection types (transactions, savepoints, the
/// record's write lock, conflicts run again, a lost connection), how a server's refusal becomes
/// an error, and the statements whose text differs. Every statement runs on both backends in
/// the store's own tests (`store_unit_tests_pass_on_postgres`), and the engine's behaviour under
/// several hubs, a restarting server and crashes in `multi_hub`, `pg_*` and the fault suite's
/// PostgreSQL tests. The modules rerun here are those in which a running hub meets the engine
/// where the store's tests cannot reach it: requests at once on several connections (order
/// under concurrent producers, pool claims), batches whose failed items roll back alone, a hub
/// killed with transactions open, waiting reads woken by commits, refusals made from the
/// server's errors, and values PostgreSQL's text types treat otherwise (NUL, the largest sizes).
pub const RERUN_ON_POSTGRES: [&str; 9] = [
    "conversation_order::",
    "harness_stderr::",
    "hub_batch::",
    "hub_contract::",
    "hub_crash::",
    "hub_longpoll::",
    "node_outage::",
    "pools::",
    "values::",
];

/// The modules not rerun on PostgreSQL, each for one reason. A module of the suite must be in
/// one list or the other (`the_whole_suite_passes_on_postgres` checks), so a new one is placed
/// by a decision, not by default.
pub const NOT_RERUN_ON_POSTGRES: [(&str, &str); 55] = [
    // They put their hubs on PostgreSQL themselves (this one would also rerun itself).
    ("hub_postgres::", "on PostgreSQL already"),
    ("multi_hub::", "on PostgreSQL already"),
    // One request at a time through the hub's operations, each one statement sequence the
    // store's tests run on both backends (named after each), above code that is the same on
    // both: what a backend could change, they would not see that the store's tests do not.
    ("approval::", "approvals, store::lifecycle::approval's tests"),
    ("conversation_fairness::", "the claim's scan, store::lifecycle::scan's and claim's tests"),
    ("conversations_cli::", "membership, store::registry::members' tests"),
    ("deadlines::", "deadlines and stalls, store::tests::turns"),
    ("hub_fences::", "fences at the claim, store::registry::fences' and claim's tests"),
    ("hub_turns::", "sessions, starts and reruns, store::tests::turns and registry::sessions' tests"),
    ("node_flow::", "the node's flow over the contract's operations, which hub_contract reruns"),
    ("ops_explain::", "the explanation, store::views::read's tests"),
    ("ops_lists::", "the listings, store::views::listing's tests"),
    ("ops_truth::", "operator commands and their audit, store::lifecycle::operator's and registry::audit's tests"),
    ("progress::", "the events feed, store::views::feed's tests"),
    ("running_turns::", "turns in flight and retire, store::tests::turns"),
    ("replay::", "reads by key and cursor, store::views::replay's tests"),
    ("status_view::", "the overview, store::views::overview's tests"),
    (
        "turn_control::",
        "cancel and the start lease, store::tests::turns; a copy's takeover on PostgreSQL is the fault suite's proxy test",
    ),
    // The transport, the request and answer shapes, the CLI's parsing and printing: code above
    // `Store`, the same on both backends, whose reads and writes the rerun modules make too.
    ("cert_rotation::", "TLS"),
    ("hub_auth::", "TLS and roles"),
    ("hub_edges::", "connections and HTTP"),
    ("hub_errors::", "HTTP answers"),
    ("openapi_exact::", "HTTP validation"),
    ("exact_payloads::", "payload bytes"),
    ("file_bounds::", "files a user names"),
    ("hub_cli::", "configuration and CLI output"),
    ("ops_output::", "CLI output"),
    ("ops_certs::", "certificates"),
    ("ops_identity::", "identities and certificates"),
    ("ops_fleet::", "views of the fleet"),
    ("ops_silence::", "a node-side timer over operations the rerun covers"),
    ("ops_retention::", "a sweep the store's tests run on both backends"),
    ("hub_lean::", "the hub's in-process caches and wake-ups"),
    ("instance_scope::", "instance binding, covered by the contract's"),
    ("producer_cli::", "the producer command line"),
    ("producer_spool::", "the producer's own store"),
    ("status_page::", "the operator listener and a browser"),
    ("metrics::", "the exporters and the alert files; the gauges' reads are store unit tests, run on both"),
    ("examples::", "the Python examples"),
    ("python_client::", "the Python client package, over the HTTP calls the rerun modules make"),
    // The record keeps a message's traceparent as one more text column of the row the
    // contract's rerun modules write and read; the rest is the exporters and the node.
    ("traces::", "a text column; the spans and their exporters"),
    // The node's own side: its local SQLite store, its processes and its recovery.
    ("node_batch::", "the node's batching"),
    ("node_clone::", "the node's data directory"),
    ("node_config_check::", "the node's configuration"),
    ("node_crash::", "the node's store"),
    ("node_exec::", "the node's processes"),
    ("node_failover::", "the node's hub list"),
    ("node_harness::", "the node's harness"),
    ("node_regain::", "the node's reconnects"),
    ("node_turns::", "the node's processes"),
    // The SQLite file itself.
    ("corruption::", "a damaged SQLite file"),
    ("power_loss::", "the SQLite file's durability"),
    ("ops_restore::", "restoring an SQLite file"),
    // Packages install the packaged hub on its own SQLite file whatever the backend.
    ("packaging::", "installs its own hub"),
    // The demo starts its own hub on SQLite, as a newcomer runs it.
    ("demo::", "runs its own hub"),
    // The suite's fixtures, no tests.
    ("harness::", "fixtures"),
];

/// The tests of this binary that `args` selects, as `--list` names them.
fn listed_tests(exe: &Path, args: &[&str]) -> Vec<String> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--list").args(args);
    let out = baton_testkit::bins::run(cmd, EVENT_WAIT).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(out.status.success(), "--list failed: {}", stderr(&out));
    stdout(&out).lines().filter_map(|l| l.strip_suffix(": test")).map(str::to_string).collect()
}

/// Reruns the modules of `RERUN_ON_POSTGRES` in a child of this test binary with every hub on
/// PostgreSQL (`BATON_IT_BACKEND=postgres`, one fresh database per hub), and fails with the
/// child's output unless every one of their tests passed there. Every module of the suite is
/// in that list or in `NOT_RERUN_ON_POSTGRES`, with its reason. The tests about the SQLite file
/// itself pass there by saying they are skipped (`harness::skipped_on_postgres`). The whole
/// suite on PostgreSQL is `BATON_IT_BACKEND=postgres cargo test -p baton-tests --test it`. Not
/// run when the suite already runs on PostgreSQL; skipped without PostgreSQL unless
/// `BATON_REQUIRE_POSTGRES=1`.
#[test]
fn the_whole_suite_passes_on_postgres() {
    const TEST: &str = "the_whole_suite_passes_on_postgres";
    let exe = std::env::current_exe().expect("this test binary");
    // Every module is placed, once: a new module is rerun or left out by a decision.
    let modules = |tests: &[String]| -> std::collections::BTreeSet<String> {
        tests.iter().filter_map(|t| t.split_once("::").map(|(m, _)| format!("{m}::"))).collect()
    };
    let all = modules(&listed_tests(&exe, &[]));
    let mut placed: Vec<&str> = RERUN_ON_POSTGRES.to_vec();
    placed.extend(NOT_RERUN_ON_POSTGRES.iter().map(|(m, _)| *m));
    let unique: std::collections::BTreeSet<String> = placed.iter().map(|m| m.to_string()).collect();
    assert_eq!(unique.len(), placed.len(), "a module is listed twice: {placed:?}");
    let with_tests: std::collections::BTreeSet<String> = unique.iter().filter(|m| all.contains(*m)).cloned().collect();
    let unplaced: Vec<&String> = all.difference(&unique).collect();
    assert!(unplaced.is_empty(), "modules neither rerun on PostgreSQL nor left out with a reason: {unplaced:?}");
    for m in RERUN_ON_POSTGRES {
        assert!(with_tests.contains(m), "{m} is to be rerun on PostgreSQL but has no tests");
    }
    if std::env::var(crate::harness::BACKEND_ENV).ok().as_deref() == Some("postgres")
        || !baton_testkit::pg::available_or_skip(TEST)
    {
        return;
    }
    let expected: Vec<String> = listed_tests(&exe, &RERUN_ON_POSTGRES)
        .into_iter()
        .filter(|t| RERUN_ON_POSTGRES.iter().any(|m| t.starts_with(m)))
        .collect();
    let mut cmd = std::process::Command::new(&exe);
    // The child inherits this run's test threads (`RUST_TEST_THREADS`, which the workspace's
    // `.cargo/config.toml` sets), so the rerun loads the machine as the suite does.
    cmd.args(RERUN_ON_POSTGRES);
    cmd.env(crate::harness::BACKEND_ENV, "postgres");
    let out = baton_testkit::bins::run(cmd, RERUN_LIMIT).unwrap_or_else(|e| panic!("{e:#}"));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "the suite failed on PostgreSQL:\n{text}");
    let passed: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("test ")?.strip_suffix(" ... ok")).collect();
    let missing: Vec<&String> = expected.iter().filter(|t| !passed.contains(&t.as_str())).collect();
    assert!(missing.is_empty(), "these tests did not pass on PostgreSQL: {missing:?}\n{text}");
}

/// How long the rerun on PostgreSQL may take before it fails.
const RERUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(900);
