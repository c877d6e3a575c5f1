//! The test fixture: a fresh hub in a temp directory, driven through its real binary.
//!
//! Everything about processes comes from the test kit (`baton_testkit`): finding and building
//! the binaries, the scrubbed environment, starting `serve` on port 0 and waiting until it is
//! ready, signals, waiting for exits, and printing a process's log when a test fails. What is
//! here is what this suite adds on top: assertions on exit statuses, JSON views of the CLI, and
//! HTTP clients shaped for the API's contract.
//!
//! - `Hub` owns one temp root: the hub's data directory and identities, its `serve` process
//!   (`kill9`, `terminate`, `restart`), the CLI run against it (`cli`, `cli_ok`, `cli_json`),
//!   and the execution log its nodes write (`node_harness`). A restart listens where the first
//!   run listened, so node configurations written earlier still find it.
//! - `Api` is a reqwest client holding one identity; `Node` is an `Api` bound to an instance id
//!   with the claim/mirror/ack/report calls a node makes.
//!
//! Binaries: see `baton_testkit::bins` (`BATON_HUB_BIN` / `BATON_NODE_BIN`, else built next to
//! the test executable once per test process; `BATON_TESTS_NO_BUILD=1` skips that build).

#![allow(dead_code)] // Not every fixture method is used by every module.

use crate::node_harness::ExecLog;
use baton_testkit::{Binaries, Identity, Role, Started};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use baton_testkit::EVENT_WAIT;

/// Request timeout of the test clients: above the longest long-poll a test asks for (20 s).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// A long-poll that should be woken must answer within this of the waking event, although it
/// asked to wait `LONG_WAIT_MS`: far above a wake-up, far below the wait.
pub const WAKE_MAX: Duration = Duration::from_secs(5);
/// The wait a test asks for when it expects to be woken long before it elapses.
pub const LONG_WAIT_MS: u64 = 20_000;
/// How long a test lets a long-poll settle into its wait before causing the wake-up.
pub const SETTLE: Duration = Duration::from_millis(400);
/// The operator name the CLI records (set through `BATON_OPERATOR`).
pub const OPERATOR: &str = "e2e";

// ---------------------------------------------------------------------------------------------
// Binaries and commands

/// The binaries under test, built once per test process.
pub fn bins() -> &'static Binaries {
    static BINS: OnceLock<Binaries> = OnceLock::new();
    BINS.get_or_init(|| Binaries::build().unwrap_or_else(|e| panic!("{e:#}")))
}

/// Runs `cmd` to completion with stdout and stderr captured, killing it (and failing the test)
/// if it outlives `limit`.
#[track_caller]
pub fn output_within(cmd: Command, limit: Duration) -> Output {
    match baton_testkit::bins::run(cmd, limit) {
        Ok(out) => out,
        Err(e) => panic!("{e:#}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The hub

/// How to set up a hub before it starts.
#[derive(Debug, Clone)]
pub struct HubBuilder {
    nodes: Vec<String>,
    producers: Vec<String>,
    config: Option<String>,
    crash_point: Option<String>,
    serve: bool,
    database_url: Option<String>,
    ca_from: Option<PathBuf>,
}

impl HubBuilder {
    /// Node hosts to enroll (replaces the defaults).
    pub fn nodes(mut self, names: &[&str]) -> Self {
        self.nodes = names.iter().map(|s| s.to_string()).collect();
        self
    }
    /// Producers to enroll (replaces the defaults).
    pub fn producers(mut self, names: &[&str]) -> Self {
        self.producers = names.iter().map(|s| s.to_string()).collect();
        self
    }
    /// The text of `DATA_DIR/hub.toml` (replacing the template `init` writes).
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_string());
        self
    }
    /// Arms `BATON_CRASH_POINT` for the first run of `serve`.
    pub fn crash_point(mut self, point: &str) -> Self {
        self.crash_point = Some(point.to_string());
        self
    }
    /// Keeps the record in the PostgreSQL database at `url` (`init --database-url`).
    pub fn postgres(mut self, url: &str) -> Self {
        self.database_url = Some(url.to_string());
        self
    }
    /// Takes the CA of the hub whose data directory is `dir` (`init --ca-from`): a second hub
    /// on the same record.
    pub fn ca_from(mut self, dir: &Path) -> Self {
        self.ca_from = Some(dir.to_path_buf());
        self
    }
    /// Sets everything up but does not start `serve`.
    pub fn stopped(mut self) -> Self {
        self.serve = false;
        self
    }
    /// Initialises the data directory, enrolls everyone, and (unless `stopped`) serves.
    pub fn start(self) -> Hub {
        let root = baton_testkit::fresh_dir("baton-it-").expect("tempdir");
        let database_url = self.database_url.clone().or_else(suite_database);
        let kit = match &database_url {
            // On SQLite the hub comes enrolled (a copy of the run's template, see
            // `Hub::init_enrolled`; enrolling reads nothing of the configuration written below
            // but where the record is).
            None => {
                let ids: Vec<(Role, &str)> = self
                    .nodes
                    .iter()
                    .map(|n| (Role::Node, n.as_str()))
                    .chain(self.producers.iter().map(|p| (Role::Producer, p.as_str())))
                    .collect();
                baton_testkit::Hub::init_enrolled(bins(), root.path(), OPERATOR, &ids)
                    .unwrap_or_else(|e| panic!("{e:#}"))
            }
            Some(url) => {
                let kit = baton_testkit::Hub::new(bins(), root.path(), OPERATOR).unwrap_or_else(|e| panic!("{e:#}"));
                let mut args = vec!["init".to_string(), "--database-url".into(), url.clone()];
                if let Some(dir) = &self.ca_from {
                    args.extend(["--ca-from".to_string(), dir.display().to_string()]);
                }
                kit.cli(&args).unwrap_or_else(|e| panic!("{e:#}"));
                kit
            }
        };
        let exec_log = ExecLog::create(&root.path().join("exec").join("exec.log"));
        let mut hub = Hub { kit, addr: None, exec_log, root };
        if let Some(text) = &self.config {
            hub.write_config(text);
        }
        if database_url.is_some() {
            for n in &self.nodes {
                hub.enroll_node(n);
            }
            for p in &self.producers {
                hub.enroll_producer(p);
            }
        }
        if self.serve {
            hub.serve(self.crash_point.as_deref());
        }
        hub
    }
}

/// Runs the whole suite's hubs on PostgreSQL when set to `postgres` (each hub a fresh database
/// of one throwaway cluster per test process); unset, they run on SQLite.
pub const BACKEND_ENV: &str = "BATON_IT_BACKEND";

/// Whether a test about the SQLite file itself (it reads, damages or replaces `hub.db`, or cuts
/// its writes) is skipped because the suite runs on PostgreSQL (`BACKEND_ENV`); says so.
pub fn skipped_on_postgres(test: &str) -> bool {
    let on = std::env::var(BACKEND_ENV).ok().as_deref() == Some("postgres");
    if on {
        eprintln!("{test}: about the SQLite file; skipped with {BACKEND_ENV}=postgres");
    }
    on
}

/// A fresh database for a hub, when the suite runs on PostgreSQL (`BACKEND_ENV`).
fn suite_database() -> Option<String> {
    static CLUSTER: OnceLock<std::sync::Arc<baton_testkit::pg::PgCluster>> = OnceLock::new();
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if std::env::var(BACKEND_ENV).ok().as_deref() != Some("postgres") {
        return None;
    }
    let cluster = CLUSTER.get_or_init(|| {
        // The server dies with the thread that started it (its parent-death signal is per
        // thread): a thread that lives as long as the test process starts it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let cluster = std::sync::Arc::new(
                baton_testkit::pg::PgCluster::start(false).unwrap_or_else(|e| panic!("{BACKEND_ENV}=postgres: {e:#}")),
            );
            tx.send(cluster.clone()).expect("the suite waits for its cluster");
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap_or_else(|_| panic!("{BACKEND_ENV}=postgres: the cluster did not start"))
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Some(cluster.create_database(&format!("it_{n}")).unwrap_or_else(|e| panic!("{e:#}")))
}

/// One hub data directory and, while it runs, its `serve` process.
pub struct Hub {
    kit: baton_testkit::Hub,
    /// Where the first run listened; every restart listens there again.
    addr: Option<SocketAddr>,
    exec_log: ExecLog,
    // Dropped last: the directory outlives the processes using it.
    root: tempfile::TempDir,
}

impl Drop for Hub {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.exec_log.print();
        }
    }
}

impl Hub {
    /// A running hub with nodes `host-a`, `host-b` and producers `prod`, `prod-two`.
    pub fn start() -> Hub {
        Hub::builder().start()
    }

    /// A running hub with node hosts `hosts` and the producer `prod`.
    pub fn with_nodes(hosts: &[&str]) -> Hub {
        Hub::builder().nodes(hosts).producers(&["prod"]).start()
    }

    /// A builder with the default identities (see `start`).
    pub fn builder() -> HubBuilder {
        HubBuilder {
            nodes: vec!["host-a".into(), "host-b".into()],
            producers: vec!["prod".into(), "prod-two".into()],
            config: None,
            crash_point: None,
            serve: true,
            database_url: None,
            ca_from: None,
        }
    }

    /// The kit's hub, for what this fixture does not wrap (extra `serve` environment).
    pub fn kit_mut(&mut self) -> &mut baton_testkit::Hub {
        &mut self.kit
    }

    /// The data directory (`--data-dir`).
    pub fn data_dir(&self) -> &Path {
        self.kit.data_dir()
    }

    /// Where enrolled certificates are written.
    pub fn certs_dir(&self) -> &Path {
        self.kit.certs_dir()
    }

    /// A scratch directory for the test, inside the hub's temp root.
    pub fn scratch(&self, name: &str) -> PathBuf {
        let p = self.root.path().join(name);
        fs::create_dir_all(&p).expect("scratch dir");
        p
    }

    /// The address the hub listens on (the same across restarts).
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("the hub never listened")
    }

    /// `https://ADDR`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// The shared execution log of this hub's nodes.
    pub fn exec_log(&self) -> &ExecLog {
        &self.exec_log
    }

    /// Replaces `DATA_DIR/hub.toml`.
    pub fn write_config(&self, text: &str) {
        // A record in PostgreSQL stays where `init` put it: its `database_url` line is kept.
        let file = self.data_dir().join("hub.toml");
        let kept = fs::read_to_string(&file).unwrap_or_default();
        let url = kept.lines().find(|l| l.starts_with("database_url =")).map(|l| format!("{l}\n"));
        fs::write(&file, format!("{}{text}", url.unwrap_or_default())).expect("write hub.toml");
    }

    /// Starts `serve` (which must not be running) and waits until it is ready.
    #[track_caller]
    pub fn serve(&mut self, crash_point: Option<&str>) {
        match self.kit.serve(crash_point) {
            Ok(Started::Ready(addr)) => {
                if let Some(first) = self.addr {
                    assert_eq!(addr, first, "the restarted hub must listen where the nodes look for it");
                }
                self.addr = Some(addr);
                self.kit.listen_on(addr);
            }
            Ok(Started::Exited(status)) => {
                panic!("baton-hub serve exited ({status}) before it was ready:\n{}", self.serve_stderr())
            }
            Err(e) => panic!("{e:#}"),
        }
    }

    /// Whether `serve` is running (and has not exited on its own).
    pub fn is_running(&mut self) -> bool {
        self.kit.proc_mut().running()
    }

    /// Kills `serve` with SIGKILL and reaps it; returns how it ended.
    pub fn kill9(&mut self) -> ExitStatus {
        self.kit.kill().expect("kill baton-hub serve").expect("the hub was never started")
    }

    /// Sends SIGTERM and waits (up to `EVENT_WAIT`) for the exit.
    #[track_caller]
    pub fn terminate(&mut self) -> ExitStatus {
        self.kit.proc().signal(baton_testkit::Signal::SIGTERM).expect("SIGTERM to baton-hub serve");
        self.wait_exit(EVENT_WAIT).expect("baton-hub did not exit after SIGTERM")
    }

    /// Waits up to `limit` for `serve` to exit on its own (a crash point, a signal); reaps it.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.kit.proc_mut().wait_exit(limit).expect("wait for baton-hub serve")
    }

    /// Stops `serve` if it runs (SIGKILL) and starts it again, on the same address, without a
    /// crash point.
    pub fn restart(&mut self) {
        self.kit.kill().expect("kill baton-hub serve");
        self.serve(None);
    }

    /// The stderr of the latest `serve` run.
    pub fn serve_stderr(&self) -> String {
        self.kit.proc().stderr()
    }

    /// The stdout of the latest `serve` run.
    pub fn serve_stdout(&self) -> String {
        self.kit.proc().stdout()
    }

    /// The stderr of every `serve` run so far.
    pub fn serve_logs(&self) -> String {
        self.kit.proc().stderr_all()
    }

    // --- CLI -----------------------------------------------------------------------------

    /// The CLI command for `args`, with `--data-dir` and a scrubbed environment.
    pub fn cli_command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.kit.command(args)
    }

    /// Runs `baton-hub --data-dir D ARGS…` and returns what it did.
    pub fn cli<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_within(self.cli_command(args), EVENT_WAIT)
    }

    /// Runs the CLI, asserts exit status 0, and returns stdout.
    #[track_caller]
    pub fn cli_ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        match self.kit.cli(args) {
            Ok(out) => out,
            Err(e) => panic!("{e:#}"),
        }
    }

    /// Runs the CLI (the caller passes `--json`), asserts exit 0, and parses stdout.
    #[track_caller]
    pub fn cli_json<I, S>(&self, args: I) -> Value
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let text = self.cli_ok(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("CLI output is not JSON ({e}): {text}"))
    }
    /// `status --json`, whatever it says needs attention: the counts and the attention items.
    /// Exit 0 (nothing needs attention) and 1 (something does, or the hub is down) both answer
    /// in full; anything else fails the test.
    #[track_caller]
    pub fn status_json(&self) -> Value {
        let out = self.cli(["status", "--json"]);
        assert!(matches!(out.status.code(), Some(0 | 1)), "status --json: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("status is not JSON ({e}): {out:?}"))
    }

    /// `deliveries list --json`: every delivery, oldest first.
    pub fn deliveries(&self) -> Vec<Value> {
        let v = self.cli_json(["deliveries", "list", "--json"]);
        v.as_array().expect("deliveries list is an array").clone()
    }

    /// `deliveries show ID --json`: the delivery with its events and attempts.
    pub fn show(&self, delivery_id: &str) -> Value {
        self.cli_json(["deliveries", "show", delivery_id, "--json"])
    }

    /// The delivery's current state, from `deliveries show`.
    pub fn state(&self, delivery_id: &str) -> String {
        self.show(delivery_id)["delivery"]["state"].as_str().expect("state").to_string()
    }

    /// The delivery's (state, reason), from `deliveries show`.
    pub fn state_reason(&self, delivery_id: &str) -> (String, Option<String>) {
        let d = self.show(delivery_id);
        (
            d["delivery"]["state"].as_str().expect("state").to_string(),
            d["delivery"]["reason"].as_str().map(str::to_string),
        )
    }

    /// The delivery's events as (from, to, actor_kind, actor) tuples, in commit order.
    pub fn events(&self, delivery_id: &str) -> Vec<(Option<String>, String, String, String)> {
        let d = self.show(delivery_id);
        d["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| {
                (
                    e["from_state"].as_str().map(str::to_string),
                    e["to_state"].as_str().expect("to_state").to_string(),
                    e["actor_kind"].as_str().expect("actor_kind").to_string(),
                    e["actor"].as_str().expect("actor").to_string(),
                )
            })
            .collect()
    }

    /// Sets a fence through the CLI and returns its id. `scope` is e.g. `["--conversation", "c"]`.
    /// `--force`: tests fence conversations before their first message.
    pub fn fence(&self, kind: &str, scope: &[&str], reason: &str) -> i64 {
        let mut args = vec!["fence", kind];
        args.extend_from_slice(scope);
        args.extend_from_slice(&["--reason", reason, "--json", "--force"]);
        if kind == "block" {
            // A block on everything or on a host is destructive: it needs --yes.
            args.push("--yes");
        }
        let v = self.cli_json(args);
        v["id"].as_i64().unwrap_or_else(|| panic!("fence id in {v}"))
    }

    /// Lifts a fence through the CLI.
    pub fn lift(&self, id: i64) {
        self.cli_ok(["fence", "lift", &id.to_string(), "--reason", "test lifts it"]);
    }

    /// `baton-hub verify` must exit 0.
    pub fn verify_ok(&self) {
        let out = self.cli(["verify"]);
        assert!(
            out.status.success(),
            "verify exited {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // --- identities ----------------------------------------------------------------------

    /// Enrolls a node host; returns its certificate, key and CA paths (for `baton-node`).
    pub fn enroll_node(&mut self, host: &str) -> Identity {
        self.kit.enroll(Role::Node, host).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Enrolls a producer.
    pub fn enroll_producer(&mut self, name: &str) -> Identity {
        self.kit.enroll(Role::Producer, name).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// An identity enrolled earlier.
    pub fn identity(&self, name: &str) -> &Identity {
        self.kit.identity(name).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The hub CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        fs::read_to_string(self.data_dir().join("ca.crt")).expect("ca.crt")
    }

    /// The hub CA private key (PEM).
    pub fn ca_key_pem(&self) -> String {
        fs::read_to_string(self.data_dir().join("ca.key")).expect("ca.key")
    }

    // --- clients -------------------------------------------------------------------------

    /// A client holding the enrolled identity `name`.
    pub fn client(&self, name: &str) -> Api {
        let id = self.identity(name);
        Api::new(&self.url(), &id.ca_pem().expect("ca"), Some(&id.pem().expect("identity")))
    }

    /// A client holding an arbitrary certificate+key PEM (trusting the hub CA).
    pub fn client_with_pem(&self, pem: &[u8]) -> Api {
        Api::new(&self.url(), self.ca_pem().as_bytes(), Some(pem))
    }

    /// A client trusting the hub CA but presenting no certificate.
    pub fn anonymous_client(&self) -> Api {
        Api::new(&self.url(), self.ca_pem().as_bytes(), None)
    }

    /// A node client for `host` acting as `instance`.
    pub fn node(&self, host: &str, instance: &str) -> Node {
        Node { api: self.client(host), instance: instance.to_string() }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// An answer: status and JSON body (`Value::Null` when the body is not JSON).
#[derive(Debug, Clone)]
pub struct Resp {
    /// HTTP status.
    pub status: u16,
    /// The body as JSON.
    pub body: Value,
    /// The body as text.
    pub text: String,
}

impl Resp {
    /// Asserts the status and returns the body.
    #[track_caller]
    pub fn ok(&self, status: u16) -> &Value {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.text);
        &self.body
    }

    /// Asserts an error answer: the status, the stable code, and the `{code, message}` shape.
    /// Returns the message.
    #[track_caller]
    pub fn err(&self, status: u16, code: &str) -> String {
        assert_eq!((self.status, self.body["code"].as_str()), (status, Some(code)), "body: {}", self.text);
        let obj = self.body.as_object().unwrap_or_else(|| panic!("error body is not an object: {}", self.text));
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["code", "message"], "error body is exactly {{code, message}}: {}", self.text);
        let message = self.body["message"].as_str().expect("message").to_string();
        assert!(!message.is_empty(), "the error message is empty");
        message
    }
}

/// A TLS client with (usually) a client certificate.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    /// A client for `base`, trusting only `ca` (PEM) and presenting `identity` (cert+key PEM).
    pub fn new(base: &str, ca: &[u8], identity: Option<&[u8]>) -> Api {
        let b = baton_testkit::identity::client_builder(ca, identity).unwrap_or_else(|e| panic!("{e:#}"));
        Api { http: b.timeout(CLIENT_TIMEOUT).build().expect("reqwest client"), base: base.to_string() }
    }

    /// The hub's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn read(r: reqwest::Response) -> reqwest::Result<Resp> {
        let status = r.status().as_u16();
        let text = r.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Resp { status, body, text })
    }

    /// GET; transport errors are returned.
    pub async fn try_get(&self, path: &str) -> reqwest::Result<Resp> {
        Self::read(self.http.get(format!("{}{path}", self.base)).send().await?).await
    }

    /// POST JSON; transport errors are returned.
    pub async fn try_post(&self, path: &str, body: &Value) -> reqwest::Result<Resp> {
        Self::read(self.http.post(format!("{}{path}", self.base)).json(body).send().await?).await
    }

    /// POST JSON with extra request headers (`traceparent`); a transport error fails the test.
    pub async fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Resp {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap_or_else(|e| panic!("POST {path}: {e:?}"));
        Self::read(r).await.expect("read body")
    }

    /// GET; a transport error fails the test.
    pub async fn get(&self, path: &str) -> Resp {
        self.try_get(path).await.unwrap_or_else(|e| panic!("GET {path}: {e:?}"))
    }

    /// POST JSON; a transport error fails the test.
    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.try_post(path, body).await.unwrap_or_else(|e| panic!("POST {path}: {e:?}"))
    }

    /// POST raw bytes with a content type.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>, content_type: &str) -> Resp {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e:?}"));
        Self::read(r).await.expect("read body")
    }

    /// `POST /v1/messages` with `to`.
    pub async fn submit(&self, conversation: &str, key: &str, payload: Value, to: &[&str]) -> Resp {
        self.post("/v1/messages", &submit_body(conversation, key, payload, to)).await
    }

    /// `POST /v1/messages`, asserting 201, returning (message_id, {host: delivery_id}).
    pub async fn submit_new(&self, conversation: &str, key: &str, to: &[&str]) -> Submitted {
        let r = self.submit(conversation, key, json!({"key": key}), to).await;
        Submitted::from_body(r.ok(201))
    }

    /// `GET /v1/messages/{id}`.
    pub async fn message(&self, message_id: &str) -> Resp {
        self.get(&format!("/v1/messages/{message_id}")).await
    }
}

/// The body of a submit.
pub fn submit_body(conversation: &str, key: &str, payload: Value, to: &[&str]) -> Value {
    json!({"conversation": conversation, "idempotency_key": key, "payload": payload, "to": to})
}

/// An accepted message: its id and its delivery per host.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The message id.
    pub message_id: String,
    /// Its sequence number.
    pub seq: i64,
    /// host → delivery id.
    pub deliveries: HashMap<String, String>,
}

impl Submitted {
    /// Reads a 200/201 submit answer.
    pub fn from_body(v: &Value) -> Submitted {
        let deliveries = v["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .map(|d| {
                (d["host"].as_str().expect("host").to_string(), d["delivery_id"].as_str().expect("id").to_string())
            })
            .collect();
        Submitted {
            message_id: v["message_id"].as_str().expect("message_id").to_string(),
            seq: v["seq"].as_i64().expect("seq"),
            deliveries,
        }
    }

    /// The delivery for `host`.
    pub fn to(&self, host: &str) -> &str {
        self.deliveries.get(host).unwrap_or_else(|| panic!("no delivery for {host}"))
    }
}

/// A delivery as a claim (or holdings) handed it out.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Delivery id.
    pub delivery_id: String,
    /// Message id.
    pub message_id: String,
    /// Conversation.
    pub conversation: String,
    /// Sequence number.
    pub seq: i64,
    /// Payload.
    pub payload: Value,
    /// The claim token.
    pub claim_token: String,
    /// The state reported with it.
    pub state: String,
}

impl Claimed {
    fn from_value(v: &Value) -> Claimed {
        let s = |k: &str| v[k].as_str().unwrap_or_else(|| panic!("{k} missing in {v}")).to_string();
        Claimed {
            delivery_id: s("delivery_id"),
            message_id: s("message_id"),
            conversation: s("conversation"),
            seq: v["seq"].as_i64().expect("seq"),
            payload: v["payload"].clone(),
            claim_token: s("claim_token"),
            state: s("state"),
        }
    }

    /// Parses the `deliveries` array of a claim or holdings answer.
    pub fn list(body: &Value) -> Vec<Claimed> {
        body["deliveries"]
            .as_array()
            .unwrap_or_else(|| panic!("no deliveries in {body}"))
            .iter()
            .map(Self::from_value)
            .collect()
    }
}

/// A node: a node-certificate client acting as one instance.
#[derive(Clone)]
pub struct Node {
    /// The client.
    pub api: Api,
    /// The instance id it sends.
    pub instance: String,
}

impl Node {
    /// The same certificate as another instance.
    pub fn as_instance(&self, instance: &str) -> Node {
        Node { api: self.api.clone(), instance: instance.to_string() }
    }

    /// `POST /v1/claims`, raw.
    pub async fn claim_raw(&self, max: u32, wait_ms: u64) -> Resp {
        self.api.post("/v1/claims", &json!({"instance_id": self.instance, "max": max, "wait_ms": wait_ms})).await
    }

    /// `POST /v1/claims`, asserting 200.
    pub async fn claim(&self, max: u32, wait_ms: u64) -> Vec<Claimed> {
        Claimed::list(self.claim_raw(max, wait_ms).await.ok(200))
    }

    /// `GET /v1/holdings?instance_id=`, asserting 200.
    pub async fn holdings(&self) -> Vec<Claimed> {
        Claimed::list(self.api.get(&format!("/v1/holdings?instance_id={}", self.instance)).await.ok(200))
    }

    fn holder(&self, c: &Claimed) -> Value {
        json!({"instance_id": self.instance, "claim_token": c.claim_token})
    }

    /// `POST /v1/deliveries/{id}/mirrored`.
    pub async fn mirrored(&self, c: &Claimed) -> Resp {
        self.api.post(&format!("/v1/deliveries/{}/mirrored", c.delivery_id), &self.holder(c)).await
    }

    /// `POST /v1/deliveries/{id}/ack`.
    pub async fn ack(&self, c: &Claimed) -> Resp {
        self.api.post(&format!("/v1/deliveries/{}/ack", c.delivery_id), &self.holder(c)).await
    }

    /// `POST /v1/deliveries/{id}/reject`.
    pub async fn reject(&self, c: &Claimed, reason: &str) -> Resp {
        let mut body = self.holder(c);
        body["reason"] = json!(reason);
        self.api.post(&format!("/v1/deliveries/{}/reject", c.delivery_id), &body).await
    }

    /// The body of a report.
    pub fn report_body(&self, c: &Claimed, report_id: &str, outcome: &str, exit_code: i32) -> Value {
        json!({
            "delivery_id": c.delivery_id,
            "instance_id": self.instance,
            "claim_token": c.claim_token,
            "report_id": report_id,
            "outcome": outcome,
            "exit_code": exit_code,
            "duration_ms": 12,
            "result": "done",
        })
    }

    /// `POST /delivery-report`.
    pub async fn report(&self, c: &Claimed, report_id: &str, outcome: &str, exit_code: i32) -> Resp {
        self.api.post("/delivery-report", &self.report_body(c, report_id, outcome, exit_code)).await
    }

    /// Mirrors and acks, asserting both change the state.
    pub async fn mirror_and_ack(&self, c: &Claimed) {
        let m = self.mirrored(c).await;
        assert_eq!(m.ok(200)["state"], "mirrored");
        let a = self.ack(c).await;
        assert_eq!(a.ok(200)["state"], "delivered");
    }
}

/// Runs `f` and returns its result with how long it took.
pub async fn timed<F: std::future::Future>(f: F) -> (F::Output, Duration) {
    let start = Instant::now();
    let r = f.await;
    (r, start.elapsed())
}

/// A random UUID string (for ids that do not exist).
pub fn random_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A raw TLS connector for tests that speak to the hub below HTTP: it presents `name`'s
/// certificate, trusts the CAs in `ca_file` and offers only the ALPN protocol `alpn`.
pub fn raw_connector(hub: &Hub, name: &str, ca_file: &Path, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let id = hub.identity(name);
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_file).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(&id.cert).unwrap().collect::<Result<_, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(&id.key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// Dials the hub over TCP and completes the TLS handshake with `tls`.
pub async fn raw_dial(
    hub: &Hub,
    tls: &tokio_rustls::TlsConnector,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(hub.addr()).await?;
    tls.connect(rustls_pki_types::ServerName::IpAddress(hub.addr().ip().into()), tcp).await
}
