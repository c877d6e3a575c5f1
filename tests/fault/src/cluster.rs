//! Real processes for fault runs: a `baton-hub` data directory and its `serve` process, `baton-node`
//! agents that dial the hub through one fault `Proxy` each, and a producer client that writes the
//! client history. Every child is owned by a `Proc`, which kills and reaps it when dropped (also
//! during a panic's unwinding), so no run leaves a process behind.

use crate::checker::Inputs;
use crate::proxy::Proxy;
use crate::records::{HistoryLine, LineWriter, ledger_harness};
use anyhow::{Context, anyhow, bail};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a process may take to start listening (or to exit) before the run fails.
pub const START_WAIT: Duration = Duration::from_secs(20);
/// How long the producer waits for one accept answer; past it the outcome is `info`.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The binaries under test.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `baton-hub`.
    pub hub: PathBuf,
    /// `baton-node`.
    pub node: PathBuf,
}

impl Bins {
    /// `BATON_HUB_BIN` / `BATON_NODE_BIN`, else the binaries next to the running executable's
    /// target directory (`target/debug/deps/x` or `target/debug/x` → `target/debug/baton-hub`).
    /// With `build`, first runs `cargo build -p baton-hub -p baton-node --all-features` there
    /// (crash points compiled in) unless `BATON_TESTS_NO_BUILD=1`.
    pub fn locate(build: bool) -> anyhow::Result<Bins> {
        let exe = std::env::current_exe()?;
        let mut dir = exe.parent().ok_or_else(|| anyhow!("no parent of {}", exe.display()))?.to_path_buf();
        if dir.file_name().is_some_and(|n| n == "deps") {
            dir.pop();
        }
        let env_hub = std::env::var_os("BATON_HUB_BIN").map(PathBuf::from);
        let env_node = std::env::var_os("BATON_NODE_BIN").map(PathBuf::from);
        let no_build = std::env::var_os("BATON_TESTS_NO_BUILD").is_some_and(|v| v == "1");
        if build && !no_build && (env_hub.is_none() || env_node.is_none()) {
            build_bins(&dir)?;
        }
        let bins = Bins {
            hub: env_hub.unwrap_or_else(|| dir.join("baton-hub")),
            node: env_node.unwrap_or_else(|| dir.join("baton-node")),
        };
        for b in [&bins.hub, &bins.node] {
            if !b.exists() {
                bail!(
                    "{} not found; build it with `cargo build -p baton-hub -p baton-node --all-features`",
                    b.display()
                );
            }
        }
        Ok(bins)
    }
}

fn build_bins(profile_dir: &Path) -> anyhow::Result<()> {
    let target = profile_dir.parent().ok_or_else(|| anyhow!("no target dir above {}", profile_dir.display()))?;
    let profile = profile_dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "baton-hub", "-p", "baton-node", "--all-features", "--target-dir"])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let out = cmd.output().context("running cargo build")?;
    if !out.status.success() {
        bail!("cargo build failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process that is killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
        let child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
        Ok(Proc { child })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (and so been reaped).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`) through `kill(1)` (this crate forbids
    /// unsafe code, so no direct `kill(2)`).
    pub fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let st = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status()?;
        if !st.success() {
            bail!("kill -{sig} {} failed", self.pid());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The hub

/// One hub data directory and, while it runs, its `serve` process.
#[derive(Debug)]
pub struct Hub {
    bin: PathBuf,
    data: PathBuf,
    logs: PathBuf,
    proc: Option<Proc>,
    addr: Option<SocketAddr>,
    runs: u32,
}

/// How a `serve` start ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// Listening on this address.
    Listening(SocketAddr),
    /// It exited before listening (an armed crash point in startup repair, say).
    Exited,
}

impl Hub {
    /// `baton-hub init` in `root/hub`.
    pub fn init(bin: &Path, root: &Path) -> anyhow::Result<Hub> {
        let logs = root.join("logs");
        std::fs::create_dir_all(&logs)?;
        let hub = Hub { bin: bin.into(), data: root.join("hub"), logs, proc: None, addr: None, runs: 0 };
        hub.cli(&["init"])?;
        Ok(hub)
    }

    /// The hub database.
    pub fn db(&self) -> PathBuf {
        self.data.join("hub.db")
    }

    /// Runs an operator command; fails unless it exits 0. Returns stdout.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.cli_raw(args)?;
        if !out.status.success() {
            bail!("baton-hub {args:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs an operator command and returns whatever it did.
    pub fn cli_raw(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("BATON_OPERATOR", "fault");
        cmd.arg("--data-dir").arg(&self.data).args(args).stdin(Stdio::null());
        Ok(cmd.output()?)
    }

    /// Enrolls a node host or producer; returns the directory holding `NAME.crt`, `NAME.key`, `ca.crt`.
    pub fn enroll(&self, role: &str, name: &str) -> anyhow::Result<PathBuf> {
        let out = self.data.join("certs");
        let shown = out.display().to_string();
        self.cli(&["enroll", role, name, "--out", &shown])?;
        Ok(out)
    }

    /// Starts `serve` on a free port, with an optional armed crash point, and waits until it
    /// listens or exits.
    pub fn serve(&mut self, crash_point: Option<&str>) -> anyhow::Result<Started> {
        self.proc = None;
        let addr_file = self.data.join("hub.addr");
        let _ = std::fs::remove_file(&addr_file);
        self.runs += 1;
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        cmd.arg("--data-dir").arg(&self.data).args(["serve", "--listen", "127.0.0.1:0"]);
        if let Some(p) = crash_point {
            cmd.env("BATON_CRASH_POINT", p);
        }
        let mut proc = Proc::spawn(cmd, &self.logs.join(format!("hub-{}.log", self.runs)))?;
        let start = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&addr_file)
                && let Ok(addr) = text.trim().parse::<SocketAddr>()
            {
                self.addr = Some(addr);
                self.proc = Some(proc);
                return Ok(Started::Listening(addr));
            }
            if proc.exited() {
                self.addr = None;
                return Ok(Started::Exited);
            }
            if start.elapsed() > START_WAIT {
                bail!("baton-hub serve did not listen within {START_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The address `serve` listens on, while it runs.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Whether `serve` is running.
    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|p| !p.exited())
    }

    /// SIGKILLs `serve` (if it runs) and reaps it.
    pub fn kill9(&mut self) {
        self.proc = None;
        self.addr = None;
    }

    /// The running `serve` process.
    pub fn proc(&self) -> Option<&Proc> {
        self.proc.as_ref()
    }

    /// Every log line of every `serve` run (for failure messages).
    pub fn logs(&self) -> String {
        (1..=self.runs)
            .map(|r| std::fs::read_to_string(self.logs.join(format!("hub-{r}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }
}

// ---------------------------------------------------------------------------------------------
// Nodes

/// One `baton-node` host: its data directory, config, and, while it runs, its process.
#[derive(Debug)]
pub struct Node {
    bin: PathBuf,
    /// The host name.
    pub host: String,
    data: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    proc: Option<Proc>,
    runs: u32,
}

impl Node {
    /// Writes the config of `host` (certs from `certs`, hub via `hub_url`, the ledger harness).
    pub fn new(
        bin: &Path,
        root: &Path,
        host: &str,
        certs: &Path,
        hub_url: &str,
        ledger: &Path,
    ) -> anyhow::Result<Node> {
        let data = root.join(format!("node-{host}"));
        std::fs::create_dir_all(&data)?;
        let logs = root.join("logs");
        std::fs::create_dir_all(&logs)?;
        let command = serde_json::to_string(&ledger_harness(ledger, host))?;
        let q = |p: &Path| serde_json::to_string(&p.display().to_string()).unwrap_or_default();
        let config = format!(
            "hub_url = \"{hub_url}\"\nca_file = {}\ncert_file = {}\nkey_file = {}\ndata_dir = {}\ncommand = {command}\n\
             parallel_conversations = 4\nexec_timeout = \"20s\"\nclaim_wait = \"1s\"\nclaim_batch_max = 8\n\
             shutdown_grace = \"1s\"\nbackoff_max = \"500ms\"\n",
            q(&certs.join("ca.crt")),
            q(&certs.join(format!("{host}.crt"))),
            q(&certs.join(format!("{host}.key"))),
            q(&data),
        );
        let path = root.join(format!("node-{host}.toml"));
        std::fs::write(&path, config)?;
        Ok(Node { bin: bin.into(), host: host.into(), data, config: path, logs, proc: None, runs: 0 })
    }

    /// The node database.
    pub fn db(&self) -> PathBuf {
        self.data.join("node.db")
    }

    /// Starts the node with an optional armed crash point.
    pub fn start(&mut self, crash_point: Option<&str>) -> anyhow::Result<()> {
        self.proc = None;
        self.runs += 1;
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        cmd.arg("run").arg("--config").arg(&self.config);
        if let Some(p) = crash_point {
            cmd.env("BATON_CRASH_POINT", p);
        }
        self.proc = Some(Proc::spawn(cmd, &self.logs.join(format!("node-{}-{}.log", self.host, self.runs)))?);
        Ok(())
    }

    /// Whether the process runs.
    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|p| !p.exited())
    }

    /// SIGKILLs the node (if it runs) and reaps it.
    pub fn kill9(&mut self) {
        self.proc = None;
    }

    /// The running process.
    pub fn proc(&self) -> Option<&Proc> {
        self.proc.as_ref()
    }

    /// Every log line of every run (for failure messages).
    pub fn logs(&self) -> String {
        (1..=self.runs)
            .map(|r| std::fs::read_to_string(self.logs.join(format!("node-{}-{r}.log", self.host))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }
}

// ---------------------------------------------------------------------------------------------
// The producer

/// What one accept attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcceptOutcome {
    /// Accepted (201) or replayed (200): the message id.
    Ok(String),
    /// Refused for good (4xx other than 429).
    Fail(u16),
    /// Indeterminate: no answer, a 5xx or a 429; retry with the same key.
    Info,
}

/// A producer identity that submits messages and writes the client history.
#[derive(Debug)]
pub struct Producer {
    name: String,
    client: reqwest::Client,
    history: Mutex<LineWriter>,
}

impl Producer {
    /// A client with `certs/NAME.{crt,key}` trusting `certs/ca.crt`, writing history to `history`.
    pub fn new(name: &str, certs: &Path, history: &Path) -> anyhow::Result<Producer> {
        let mut pem = std::fs::read(certs.join(format!("{name}.crt")))?;
        pem.push(b'\n');
        pem.extend(std::fs::read(certs.join(format!("{name}.key")))?);
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(certs.join("ca.crt"))?)?)
            .identity(reqwest::Identity::from_pem(&pem)?)
            .timeout(ACCEPT_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Producer { name: name.into(), client, history: Mutex::new(LineWriter::append(history)?) })
    }

    fn record(&self, phase: &str, key: &str, hash: &str, id: Option<String>, http: Option<u16>, err: Option<String>) {
        let line = HistoryLine {
            op: "accept".into(),
            phase: phase.into(),
            key: key.into(),
            payload_hash: hash.into(),
            message_id: id,
            http,
            producer: Some(self.name.clone()),
            err,
        };
        if let Ok(mut w) = self.history.lock() {
            // The history is the test's own file; a failed write would be a broken disk.
            let _ = w.write(&line);
        }
    }

    /// One accept attempt against `hub` (None: the hub is down, recorded as `info`).
    pub async fn accept(
        &self,
        hub: Option<SocketAddr>,
        conversation: &str,
        key: &str,
        payload: &serde_json::Value,
        to: &[String],
    ) -> AcceptOutcome {
        let hash = format!("{:x}", fxhash(&format!("{conversation}|{payload}|{}", to.join(","))));
        self.record("invoke", key, &hash, None, None, None);
        let Some(hub) = hub else {
            self.record("info", key, &hash, None, None, Some("hub down".into()));
            return AcceptOutcome::Info;
        };
        let body =
            serde_json::json!({"conversation": conversation, "idempotency_key": key, "payload": payload, "to": to});
        let sent = self.client.post(format!("https://{hub}/v1/messages")).json(&body).send().await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                self.record("info", key, &hash, None, None, Some(e.to_string()));
                return AcceptOutcome::Info;
            }
        };
        let status = resp.status().as_u16();
        let json: Option<serde_json::Value> = resp.json().await.ok();
        match status {
            200 | 201 => match json.as_ref().and_then(|j| j["message_id"].as_str()) {
                Some(id) => {
                    self.record("ok", key, &hash, Some(id.into()), Some(status), None);
                    AcceptOutcome::Ok(id.into())
                }
                None => {
                    self.record("info", key, &hash, None, Some(status), Some("unreadable body".into()));
                    AcceptOutcome::Info
                }
            },
            429 | 500..=599 => {
                self.record("info", key, &hash, None, Some(status), None);
                AcceptOutcome::Info
            }
            _ => {
                self.record("fail", key, &hash, None, Some(status), json.map(|j| j.to_string()));
                AcceptOutcome::Fail(status)
            }
        }
    }
}

/// A small stable hash (FNV-1a, 64 bits) for the history's payload hash.
pub fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

// ---------------------------------------------------------------------------------------------
// The cluster

/// A hub, its nodes (each behind its own proxy) and a producer, in one temp directory.
#[derive(Debug)]
pub struct Cluster {
    /// The hub.
    pub hub: Hub,
    /// The nodes, in host order.
    pub nodes: Vec<Node>,
    /// One proxy per node, same order: the node's only way to the hub.
    pub proxies: Vec<Proxy>,
    /// The producer.
    pub producer: std::sync::Arc<Producer>,
    /// The client history file.
    pub history: PathBuf,
    /// The effects ledger file.
    pub ledger: PathBuf,
    // Dropped last, after every process: the directory outlives what uses it.
    root: tempfile::TempDir,
}

impl Cluster {
    /// Sets up (without starting) a hub with `hosts` enrolled and producer `prod`; the hub is
    /// started once so the proxies know where to point, then stopped again.
    pub async fn new(bins: &Bins, hosts: &[&str]) -> anyhow::Result<Cluster> {
        let root = tempfile::Builder::new().prefix("baton-fault-").tempdir()?;
        let hub = Hub::init(&bins.hub, root.path())?;
        let mut certs = PathBuf::new();
        for h in hosts {
            certs = hub.enroll("node", h)?;
        }
        let certs = if hosts.is_empty() { hub.enroll("producer", "prod")? } else { certs };
        if !hosts.is_empty() {
            hub.enroll("producer", "prod")?;
        }
        let history = root.path().join("history.jsonl");
        let ledger = root.path().join("ledger.jsonl");
        let producer = std::sync::Arc::new(Producer::new("prod", &certs, &history)?);
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        let placeholder: SocketAddr = ([127, 0, 0, 1], 9).into();
        for h in hosts {
            let proxy = Proxy::start(([127, 0, 0, 1], 0).into(), placeholder).await?;
            let url = format!("https://{}", proxy.addr());
            nodes.push(Node::new(&bins.node, root.path(), h, &certs, &url, &ledger)?);
            proxies.push(proxy);
        }
        Ok(Cluster { hub, nodes, proxies, producer, history, ledger, root })
    }

    /// The run's temp directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Starts (or restarts) the hub and points every proxy at it.
    pub fn start_hub(&mut self, crash_point: Option<&str>) -> anyhow::Result<Started> {
        let started = self.hub.serve(crash_point)?;
        if let Started::Listening(addr) = started {
            for p in &self.proxies {
                p.set_upstream(addr);
            }
        }
        Ok(started)
    }

    /// Checker inputs for this cluster.
    pub fn inputs(&self, liveness: bool) -> Inputs {
        Inputs {
            hub_db: self.hub.db(),
            node_dbs: self.nodes.iter().map(Node::db).filter(|p| p.exists()).collect(),
            history: Some(self.history.clone()),
            ledger: Some(self.ledger.clone()),
            liveness,
        }
    }

    /// Lifts every fence and releases every held delivery (heal before drain).
    pub fn lift_all_fences(&self) -> anyhow::Result<()> {
        let conn = crate::checker::open_read_only(&self.hub.db())?;
        let active: Vec<i64> = conn
            .prepare("SELECT id FROM fences WHERE lifted_at IS NULL")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let held: Vec<String> = conn
            .prepare("SELECT DISTINCT conversation FROM deliveries WHERE state = 'held'")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        drop(conn);
        for id in active {
            self.hub.cli(&["fence", "lift", &id.to_string(), "--reason", "heal"])?;
        }
        for c in held {
            // Exit 1 (nothing held any more) is fine.
            let _ = self.hub.cli_raw(&["held", "release", "--conversation", &c, "--reason", "heal"])?;
        }
        Ok(())
    }

    /// Waits until the record is quiescent (nothing pending anywhere) or `limit` passes.
    /// Returns whether it became quiescent; a timeout shows up as I10 violations in the checker.
    pub async fn quiesce(&self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.quiescent().unwrap_or(false) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    fn quiescent(&self) -> anyhow::Result<bool> {
        let conn = crate::checker::open_read_only(&self.hub.db())?;
        let busy: i64 = conn.query_row(
            "SELECT (SELECT count(*) FROM fanout_obligations WHERE done_at IS NULL)
                  + (SELECT count(*) FROM deliveries WHERE state IN ('queued', 'claimed', 'mirrored', 'held'))
                  + (SELECT count(*) FROM deliveries d WHERE state = 'delivered'
                       AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id))",
            [],
            |r| r.get(0),
        )?;
        if busy > 0 {
            return Ok(false);
        }
        for n in &self.nodes {
            if !n.db().exists() {
                continue;
            }
            let c = crate::checker::open_read_only(&n.db())?;
            let open: i64 = c.query_row(
                "SELECT (SELECT count(*) FROM deliveries WHERE state IN ('mirrored', 'acked'))
                      + (SELECT count(*) FROM outbox WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL)",
                [],
                |r| r.get(0),
            )?;
            if open > 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut s = format!("=== hub\n{}\n", self.hub.logs());
        for n in &self.nodes {
            s.push_str(&format!("=== node {}\n{}\n", n.host, n.logs()));
        }
        s
    }
}
