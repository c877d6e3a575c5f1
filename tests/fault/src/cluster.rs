//! The processes of a fault run, on the test kit: a hub (`baton_testkit::Hub`), `baton-node`
//! agents that dial it through one fault `Proxy` each, and a producer client that writes the
//! client history. Every process is owned by a kit `Proc`, which kills and reaps it when dropped
//! (also during a panic's unwinding, printing its log), so no run leaves a process behind.
//!
//! On PostgreSQL (`Cluster::on_postgres`) a second hub may share the first's record: it is made
//! with `baton-hub init --database-url URL --ca-from FIRST_HUB_DATA_DIR`, so every certificate
//! works on both. Each node then has one proxy per hub and lists both hubs, in an order that
//! makes it prefer one of them (`BATON_NODE_HUB_URL`, comma-separated), and moves to the other
//! when the one it uses is unavailable; the producer may submit through either.
//!
//! A node's data directory may be copied while it runs (`Cluster::copy_node`): the copy is
//! started as another process of the same instance, as on another machine, on links of its own,
//! and takes the node's place; the original is kept aside (`Cluster::retired`) with its links, so
//! that a test can cut it off, heal it and watch it find out that it was taken over.

use crate::checker::{HubRecord, Inputs};
use crate::proxy::Proxy;
use crate::records::{HistoryLine, LineWriter, ledger_harness};
use baton_client::{Client, ClientError, RetryPolicy, TlsFiles};
use baton_shared::wire::{SubmitRequest, SubmitResponse};
use baton_testkit::{Binaries, Harness, Hub, Identity, Node, NodeConfig, Proc, Role, Signal, Started};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the producer waits for one accept answer; past it the outcome is `info`.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Hub addresses the producer keeps a client for; more hubs than a cluster runs, so only
/// the addresses of restarted hubs are dropped.
const PRODUCER_CLIENTS_MAX: usize = 8;

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

/// A producer identity that submits messages through `baton_client` and writes the client
/// history. Each call is one attempt (`RetryPolicy::once`): the suite retries with the same key
/// itself, so the history holds every attempt's own outcome.
#[derive(Debug)]
pub struct Producer {
    name: String,
    files: TlsFiles,
    /// A client per hub address (a restarted hub listens on a new port), at most
    /// `PRODUCER_CLIENTS_MAX`.
    clients: Mutex<HashMap<SocketAddr, Client>>,
    history: Mutex<LineWriter>,
}

impl Producer {
    /// A client presenting `identity` (trusting only the hub CA), writing history to `history`.
    pub fn new(identity: &Identity, history: &Path) -> anyhow::Result<Producer> {
        let files =
            TlsFiles { ca_file: identity.ca.clone(), cert_file: identity.cert.clone(), key_file: identity.key.clone() };
        Ok(Producer {
            name: identity.name.clone(),
            files,
            clients: Mutex::new(HashMap::new()),
            history: Mutex::new(LineWriter::append(history)?),
        })
    }

    /// The client of the hub at `hub`, built once per address.
    fn client(&self, hub: SocketAddr) -> Result<Client, String> {
        let mut clients = self.clients.lock().map_err(|_| "the producer's client lock is poisoned".to_string())?;
        if let Some(client) = clients.get(&hub) {
            return Ok(client.clone());
        }
        let client = Client::new(&format!("https://{hub}"), &self.files)
            .map_err(|e| format!("building the client: {e}"))?
            .with_retry(RetryPolicy::once());
        if clients.len() >= PRODUCER_CLIENTS_MAX {
            // The addresses of hubs that restarted since: only the current ones are used.
            clients.clear();
        }
        clients.insert(hub, client.clone());
        Ok(client)
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
        self.accept_with(hub, conversation, key, payload, to, &[], Retries::default()).await
    }

    /// One accept attempt of a message to the hosts `to` and the pools `pools` (either may be
    /// empty, not both) that may be run again when its harness asks (`retries`).
    #[allow(clippy::too_many_arguments)]
    pub async fn accept_with(
        &self,
        hub: Option<SocketAddr>,
        conversation: &str,
        key: &str,
        payload: &serde_json::Value,
        to: &[String],
        pools: &[String],
        retries: Retries,
    ) -> AcceptOutcome {
        let mut content = format!("{conversation}|{payload}|{}", to.join(","));
        if !pools.is_empty() {
            content.push_str(&format!("|pools={}", pools.join(",")));
        }
        if retries.max_attempts.is_some() || retries.retry_backoff_ms.is_some() {
            content.push_str(&format!("|{:?}|{:?}", retries.max_attempts, retries.retry_backoff_ms));
        }
        if let Some(ms) = retries.deadline_ms {
            content.push_str(&format!("|deadline={ms}"));
        }
        let hash = format!("{:x}", fxhash(&content));
        self.record("invoke", key, &hash, None, None, None);
        let Some(hub) = hub else {
            self.record("info", key, &hash, None, None, Some("hub down".into()));
            return AcceptOutcome::Info;
        };
        let client = match self.client(hub) {
            Ok(c) => c,
            Err(e) => {
                self.record("info", key, &hash, None, None, Some(e));
                return AcceptOutcome::Info;
            }
        };
        let req = SubmitRequest {
            conversation: conversation.into(),
            idempotency_key: key.into(),
            payload: payload.clone().into(),
            // Only the recipients named: a message to pools alone has no `to`.
            to: (!to.is_empty() || pools.is_empty()).then(|| to.to_vec()),
            pools: (!pools.is_empty()).then(|| pools.to_vec()),
            max_attempts: retries.max_attempts,
            retry_backoff_ms: retries.retry_backoff_ms,
            approval: None,
            approval_timeout_ms: None,
            deadline_ms: retries.deadline_ms,
            stall_ms: None,
        };
        // Past the deadline the request is dropped: its answer is lost, like any other.
        let answer = tokio::time::timeout(ACCEPT_TIMEOUT, client.submit(&req)).await;
        let (phase, outcome, id, http, err) = judge(answer);
        self.record(phase, key, &hash, id, http, err);
        outcome
    }
}

/// What one submit attempt's answer (or its `ACCEPT_TIMEOUT` elapsing) means for the history:
/// the phase, the outcome, and the message id, HTTP status and error text recorded with it.
/// A refusal (a 4xx other than 429) is `fail`; no answer, an unreadable one, a 5xx or a 429
/// is `info`: the message may or may not exist.
fn judge(
    answer: Result<Result<SubmitResponse, ClientError>, tokio::time::error::Elapsed>,
) -> (&'static str, AcceptOutcome, Option<String>, Option<u16>, Option<String>) {
    let answer = match answer {
        Ok(a) => a,
        Err(_) => {
            return ("info", AcceptOutcome::Info, None, None, Some(format!("no answer within {ACCEPT_TIMEOUT:?}")));
        }
    };
    match answer {
        Ok(r) => {
            let status = if r.duplicate { 200 } else { 201 };
            ("ok", AcceptOutcome::Ok(r.message_id.clone()), Some(r.message_id), Some(status), None)
        }
        Err(ClientError::Api(e)) if e.status == 429 || e.status >= 500 => {
            ("info", AcceptOutcome::Info, None, Some(e.status), Some(e.to_string()))
        }
        Err(ClientError::Api(e)) => ("fail", AcceptOutcome::Fail(e.status), None, Some(e.status), Some(e.to_string())),
        Err(ClientError::BadAnswer { status, detail }) => {
            ("info", AcceptOutcome::Info, None, Some(status), Some(format!("unreadable body: {detail}")))
        }
        Err(e) => ("info", AcceptOutcome::Info, None, None, Some(e.to_string())),
    }
}

/// A message's retry fields (`SubmitRequest::max_attempts`, `retry_backoff_ms`); the default
/// sends neither, so the hub's defaults apply (one run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retries {
    /// Runs the harness may ask for with exit 75, the first included.
    pub max_attempts: Option<u32>,
    /// The base of the backoff before a retry, in milliseconds.
    pub retry_backoff_ms: Option<u64>,
    /// The longest each turn may run (`deadline_ms`).
    pub deadline_ms: Option<u64>,
}

/// A small stable hash (FNV-1a, 64 bits) for the history's payload hash.
pub fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

// ---------------------------------------------------------------------------------------------
// The cluster

/// A node whose data directory a copy took over (`Cluster::copy_node`): the original process,
/// still running until it finds out, and its links, which follow the hubs as the nodes' do.
#[derive(Debug)]
pub struct Retired {
    /// The original node: its data directory, its process.
    pub node: Node,
    /// Its links, one per hub, in hub order.
    pub links: Vec<Proxy>,
}

/// What a copy's start-up reads, in the copied node database, as the machine its running turns
/// were started on (the attempts' `boot_id`): not this machine's, since the copy stands for
/// one started elsewhere.
pub const ELSEWHERE_BOOT: &str = "another-machine";

/// A hub (or two sharing one PostgreSQL record), its nodes (each behind its own proxy per hub)
/// and a producer, in one temp directory.
#[derive(Debug)]
pub struct Cluster {
    /// The hub (the first, with two).
    pub hub: Hub,
    /// The second hub on the same PostgreSQL record, when the cluster has two.
    pub second: Option<Hub>,
    /// The nodes, in host order.
    pub nodes: Vec<Node>,
    /// One proxy per node, same order: the node's only way to the (first) hub.
    pub proxies: Vec<Proxy>,
    /// With a second hub, one more proxy per node, same order: the node's way to it.
    pub second_proxies: Vec<Proxy>,
    /// The nodes a copy of their data directory took over, in the order they were copied.
    pub retired: Vec<Retired>,
    /// The producer.
    pub producer: std::sync::Arc<Producer>,
    /// The client history file.
    pub history: PathBuf,
    /// The effects ledger file.
    pub ledger: PathBuf,
    /// Where the hubs keep their record.
    record: HubRecord,
    /// The binaries, for the nodes a copy adds.
    bins: Binaries,
    /// The host of each node, in node order.
    hosts: Vec<String>,
    /// Data directories copied so far (names each copy).
    copies: usize,
    // Dropped last, after every process: the directory outlives what uses it.
    root: tempfile::TempDir,
}

/// Most pending rows of one store a drain failure lists.
const PENDING_SHOWN_MAX: i64 = 50;
/// Most hubs a cluster runs on one record.
pub const HUBS_MAX: usize = 2;
/// The operator name every hub's CLI records.
const OPERATOR: &str = "fault";

impl Cluster {
    /// Sets up (without starting anything) a hub on an SQLite file with `hosts` enrolled and
    /// producer `prod`, and one node per host, each dialing the hub through its own proxy. The
    /// proxies point nowhere until `start_hub`.
    pub async fn new(bins: &Binaries, hosts: &[&str]) -> anyhow::Result<Cluster> {
        Cluster::build(bins, hosts, None, 1).await
    }

    /// As `new`, but the record is the (empty) PostgreSQL database at `url`, shared by `hubs`
    /// hubs (1 or `HUBS_MAX`). The second is made with `init --ca-from` the first, so every
    /// identity works on both; each node gets a proxy per hub and lists both, node `i`
    /// preferring hub `i % hubs` (so both hubs serve nodes), and moves to the other when its
    /// hub is unavailable. Nothing runs until `start_hub_at`.
    pub async fn on_postgres(bins: &Binaries, hosts: &[&str], url: &str, hubs: usize) -> anyhow::Result<Cluster> {
        anyhow::ensure!((1..=HUBS_MAX).contains(&hubs), "a cluster runs 1 to {HUBS_MAX} hubs, not {hubs}");
        Cluster::build(bins, hosts, Some(url), hubs).await
    }

    async fn build(bins: &Binaries, hosts: &[&str], url: Option<&str>, hubs: usize) -> anyhow::Result<Cluster> {
        let root = baton_testkit::fresh_dir("baton-fault-")?;
        let (hub, record) = match url {
            None => {
                // Enrolled as it is made (a copy of the run's template: `Hub::init_enrolled`).
                let ids: Vec<(Role, &str)> =
                    hosts.iter().map(|h| (Role::Node, *h)).chain([(Role::Producer, "prod")]).collect();
                let hub = Hub::init_enrolled(bins, root.path(), OPERATOR, &ids)?;
                let record = HubRecord::Sqlite(hub.db());
                (hub, record)
            }
            Some(url) => {
                let mut hub = Hub::new(bins, root.path(), OPERATOR)?;
                hub.cli(["init", "--database-url", url])?;
                for h in hosts {
                    hub.enroll(Role::Node, h)?;
                }
                hub.enroll(Role::Producer, "prod")?;
                (hub, HubRecord::Postgres(url.to_string()))
            }
        };
        let identities: Vec<_> = hosts.iter().map(|h| hub.identity(h).cloned()).collect::<Result<_, _>>()?;
        let prod = hub.identity("prod")?.clone();
        let second = match url {
            Some(url) if hubs > 1 => Some(Hub::join(bins, &root.path().join("second"), OPERATOR, &hub, url)?),
            _ => None,
        };
        let history = root.path().join("history.jsonl");
        let ledger = root.path().join("ledger.jsonl");
        let producer = std::sync::Arc::new(Producer::new(&prod, &history)?);
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        let mut second_proxies = Vec::new();
        let placeholder: SocketAddr = ([127, 0, 0, 1], 9).into();
        for (i, (h, identity)) in hosts.iter().zip(&identities).enumerate() {
            let proxy = Proxy::start(([127, 0, 0, 1], 0).into(), placeholder).await?;
            let mut urls = vec![format!("https://{}", proxy.addr())];
            proxies.push(proxy);
            if second.is_some() {
                let proxy = Proxy::start(([127, 0, 0, 1], 0).into(), placeholder).await?;
                urls.push(format!("https://{}", proxy.addr()));
                second_proxies.push(proxy);
                let n = urls.len();
                urls.rotate_left(i % n);
            }
            let node =
                node_at(bins, root.path(), h, h, identity, &root.path().join(format!("node-{h}")), &urls, &ledger)?;
            nodes.push(node);
        }
        Ok(Cluster {
            hub,
            second,
            nodes,
            proxies,
            second_proxies,
            retired: Vec::new(),
            producer,
            history,
            ledger,
            record,
            bins: bins.clone(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            copies: 0,
            root,
        })
    }

    /// The run's temp directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Where the hubs keep their record.
    pub fn record(&self) -> &HubRecord {
        &self.record
    }

    /// How many hubs the cluster runs.
    pub fn hub_count(&self) -> usize {
        1 + usize::from(self.second.is_some())
    }

    /// Hub `h` (0 is the first).
    pub fn hub_at(&self, h: usize) -> Option<&Hub> {
        match h {
            0 => Some(&self.hub),
            1 => self.second.as_ref(),
            _ => None,
        }
    }

    /// Hub `h`, to start, signal or kill it.
    pub fn hub_at_mut(&mut self, h: usize) -> Option<&mut Hub> {
        match h {
            0 => Some(&mut self.hub),
            1 => self.second.as_mut(),
            _ => None,
        }
    }

    /// Every node's proxy to hub `h`, in node order.
    fn proxies_of(&self, h: usize) -> &[Proxy] {
        if h == 0 { &self.proxies } else { &self.second_proxies }
    }

    /// Every proxy: those to the first hub, then those to the second.
    pub fn links(&self) -> Vec<&Proxy> {
        self.proxies.iter().chain(&self.second_proxies).collect()
    }

    /// Starts (or restarts) the hub on a free port and points every proxy at it.
    pub fn start_hub(&mut self, crash_point: Option<&str>) -> anyhow::Result<Started> {
        self.start_hub_at(0, crash_point)
    }

    /// Starts (or restarts) hub `h` on a free port and points every node's proxy to it there.
    pub fn start_hub_at(&mut self, h: usize, crash_point: Option<&str>) -> anyhow::Result<Started> {
        let hub = self.hub_at_mut(h).ok_or_else(|| anyhow::anyhow!("the cluster has no hub {h}"))?;
        let started = hub.serve(crash_point)?;
        if let Started::Ready(addr) = started {
            for p in self.proxies_of(h) {
                p.set_upstream(addr);
            }
            for r in &self.retired {
                if let Some(p) = r.links.get(h) {
                    p.set_upstream(addr);
                }
            }
        }
        Ok(started)
    }

    /// Adds `key = toml_value` (a top-level key) to every hub's configuration file
    /// (`HUB_DATA_DIR/hub.toml`), for the hubs' later starts.
    pub fn set_hub_key(&self, key: &str, toml_value: &str) -> anyhow::Result<()> {
        for h in 0..self.hub_count() {
            let Some(hub) = self.hub_at(h) else { continue };
            let path = hub.data_dir().join("hub.toml");
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(anyhow::anyhow!("reading {}: {e}", path.display())),
            };
            // First in the file: after a `[table]` header it would belong to that table.
            std::fs::write(&path, format!("{key} = {toml_value}\n{text}"))
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Copies node `i`'s data directory while it runs and starts the copy, which takes the
    /// node's place: the original is stopped (SIGSTOP) for the copy (`cp -a`, as a VM snapshot
    /// is taken) and let go on (SIGCONT), then moved with its links to `retired`. The copy is the
    /// same instance (its database is the original's) started as on another machine: its record
    /// of the turns the original was running names another boot (`ELSEWHERE_BOOT`), so its
    /// start-up finds nothing of them left to stop, as it would elsewhere. It dials every hub on
    /// fresh links of its own, which no fault has touched (its direct link) and which become
    /// node `i`'s links. The original's links are left as they are: cut them first to copy a
    /// partitioned node. Returns the copy's name.
    pub async fn copy_node(&mut self, i: usize) -> anyhow::Result<String> {
        anyhow::ensure!(i < self.nodes.len(), "the cluster has no node {i}");
        let host = self.hosts[i].clone();
        self.copies += 1;
        let name = format!("{host}-copy{}", self.copies);
        let data = self.root.path().join(format!("node-{name}"));
        let original = self.nodes[i].proc();
        let stopped = original.pid().is_some() && original.signal(Signal::SIGSTOP).is_ok();
        let copied = std::process::Command::new("cp").arg("-a").arg(self.nodes[i].data_dir()).arg(&data).output();
        if stopped {
            original.signal(Signal::SIGCONT)?;
        }
        let copied = copied.map_err(|e| anyhow::anyhow!("cp -a: {e}"))?;
        anyhow::ensure!(
            copied.status.success(),
            "copying {}: {}",
            self.nodes[i].data_dir().display(),
            String::from_utf8_lossy(&copied.stderr)
        );
        as_if_elsewhere(&data.join("node.db"))?;
        let placeholder: SocketAddr = ([127, 0, 0, 1], 9).into();
        let mut links = Vec::new();
        for h in 0..self.hub_count() {
            let link = Proxy::start(([127, 0, 0, 1], 0).into(), placeholder).await?;
            if let Some(addr) = self.hub_at(h).and_then(Hub::addr) {
                link.set_upstream(addr);
            }
            links.push(link);
        }
        let mut urls: Vec<String> = links.iter().map(|l| format!("https://{}", l.addr())).collect();
        let n = urls.len();
        urls.rotate_left(i % n);
        let identity = self.hub.identity(&host)?.clone();
        let mut copy = node_at(&self.bins, self.root.path(), &name, &host, &identity, &data, &urls, &self.ledger)?;
        copy.start(None)?;
        let original = std::mem::replace(&mut self.nodes[i], copy);
        let mut links = links.into_iter();
        let mut old_links = Vec::new();
        if let Some(l) = links.next() {
            old_links.push(std::mem::replace(&mut self.proxies[i], l));
        }
        if let Some(l) = links.next() {
            old_links.push(std::mem::replace(&mut self.second_proxies[i], l));
        }
        self.retired.push(Retired { node: original, links: old_links });
        Ok(name)
    }

    /// The process of node `i`, or of hub `i - nodes.len()` past the nodes (the first hub when
    /// there is no such hub).
    pub fn proc(&self, i: usize) -> &Proc {
        match self.nodes.get(i) {
            Some(n) => n.proc(),
            None => self.hub_at(i - self.nodes.len()).unwrap_or(&self.hub).proc(),
        }
    }

    /// Checker inputs for this cluster.
    pub fn inputs(&self, liveness: bool) -> Inputs {
        Inputs {
            hub: self.record.clone(),
            node_dbs: self
                .nodes
                .iter()
                .chain(self.retired.iter().map(|r| &r.node))
                .map(Node::db)
                .filter(|p| p.exists())
                .collect(),
            retired_node_dbs: self.retired.iter().map(|r| r.node.db()).collect(),
            history: Some(self.history.clone()),
            ledger: Some(self.ledger.clone()),
            liveness,
            deadline_allowance: crate::checker::KILL_GRACE_ASSUMED + crate::checker::DEADLINE_SLACK,
        }
    }

    /// Lifts every fence, then releases every held delivery (heal before drain). The held
    /// deliveries are read after the lifts: until a fence's lift commits, claims may still
    /// park deliveries under it. A command that fails (other than exit 1, nothing to do) is
    /// returned as an error after the others ran.
    pub fn lift_all_fences(&self) -> anyhow::Result<()> {
        let read = |sql: &str| self.record.read(|db| crate::checker::rows(db, sql, |r| r.get::<_, String>(0)));
        let mut failed = Vec::new();
        let mut run = |args: &[&str]| -> anyhow::Result<()> {
            let out = self.hub.cli_output(args)?;
            if !matches!(out.status.code(), Some(0 | 1)) {
                failed.push(format!("{}: {}: {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr)));
            }
            Ok(())
        };
        for id in read("SELECT CAST(id AS TEXT) FROM fences WHERE lifted_at IS NULL")? {
            run(&["fence", "lift", &id, "--reason", "heal"])?;
        }
        // Every fence was lifted just above: the release's check (would an active fence catch
        // them again?) finds nothing, for host and pool deliveries alike.
        for c in read("SELECT DISTINCT conversation FROM deliveries WHERE state = 'held'")? {
            run(&["held", "release", "--conversation", &c, "--reason", "heal"])?;
        }
        anyhow::ensure!(failed.is_empty(), "heal commands failed: {}", failed.join("; "));
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
        Ok(self.pending_items()?.is_empty())
    }

    /// What keeps the record from being quiescent, for a failure message (empty when nothing).
    pub fn pending(&self) -> String {
        match self.pending_items() {
            Ok(items) => items.iter().map(|i| format!("{i}\n")).collect(),
            Err(e) => format!("cannot read the stores: {e:#}\n"),
        }
    }

    /// Everything still pending, one line each (at most `PENDING_SHOWN_MAX` rows per store):
    /// the hub's deliveries that are not final (or delivered without an outcome of their
    /// current run) and its unfinished fan-outs, and each node's local copies not settled and
    /// reports not confirmed. Quiescent means none.
    fn pending_items(&self) -> anyhow::Result<Vec<String>> {
        let mut items = self.record.read(|conn| {
            let mut items = Vec::new();
            let mut st = conn.prepare(
                "SELECT d.id, coalesce(d.host, 'pool ' || d.pool), d.conversation, d.seq, d.state, d.attempt, coalesce(d.reason, ''),
                    coalesce(d.started_session, -1), coalesce(d.cancel_requested_at, -1)
             FROM deliveries d
             WHERE d.state IN ('queued', 'claimed', 'mirrored', 'held')
                OR (d.state = 'delivered'
                    AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))
             LIMIT $1",
            )?;
            let rows = st.query_map([PENDING_SHOWN_MAX], |r| {
                Ok(format!(
                    "hub: {} {} {}#{} {} run {} reason {:?} started_session {} cancel_at {}",
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, i64>(7)?,
                    r.get::<_, i64>(8)?
                ))
            })?;
            for r in rows {
                items.push(r?);
            }
            let obligations: i64 =
                conn.query_row("SELECT count(*) FROM fanout_obligations WHERE done_at IS NULL", [], |r| r.get(0))?;
            if obligations > 0 {
                items.push(format!("hub: {obligations} fan-out obligation(s) pending"));
            }
            Ok(items)
        })?;
        for n in &self.nodes {
            if !n.db().exists() {
                continue;
            }
            let stem = n.proc().stem();
            let c = crate::checker::open_read_only(&n.db())?;
            let mut st = c.prepare(
                "SELECT delivery_id, state, coalesce(reason, '') FROM deliveries WHERE state IN ('mirrored', 'acked')
                 LIMIT ?1",
            )?;
            let rows = st.query_map([PENDING_SHOWN_MAX], |r| {
                Ok(format!(
                    "{stem}: {} {} {:?}",
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?
                ))
            })?;
            for r in rows {
                items.push(r?);
            }
            let outbox: i64 = c.query_row(
                "SELECT count(*) FROM outbox WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL",
                [],
                |r| r.get(0),
            )?;
            if outbox > 0 {
                items.push(format!("{stem}: {outbox} report(s) waiting in the outbox"));
            }
        }
        Ok(items)
    }

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut s = format!("=== hub\n{}\n", self.hub.proc().stderr_all());
        if let Some(second) = &self.second {
            s.push_str(&format!("=== second hub\n{}\n", second.proc().stderr_all()));
        }
        for n in self.nodes.iter().chain(self.retired.iter().map(|r| &r.node)) {
            s.push_str(&format!("=== node {}\n{}\n", n.proc().stem(), n.proc().stderr_all()));
        }
        s
    }
}

/// A node named `name` (its config file and log stem) of `host`, presenting `identity`, keeping
/// its store in `data`, dialing `urls` (the first, or all in order through `BATON_NODE_HUB_URL`)
/// and recording each turn in `ledger`: the settings every fault-suite node runs with.
#[allow(clippy::too_many_arguments)]
fn node_at(
    bins: &Binaries,
    root: &Path,
    name: &str,
    host: &str,
    identity: &Identity,
    data: &Path,
    urls: &[String],
    ledger: &Path,
) -> anyhow::Result<Node> {
    let harness = Harness::Command(ledger_harness(ledger, host));
    let config = NodeConfig::new(&urls[0], identity, data, harness)
        .set("parallel_conversations", "4")
        .set("exec_timeout", "\"20s\"")
        .set("claim_wait", "\"1s\"")
        .set("claim_batch_max", "8")
        .set("shutdown_grace", "\"1s\"")
        .set("backoff_max", "\"500ms\"");
    let mut node = Node::create(bins, &root.join("nodes"), name, &config)?;
    if urls.len() > 1 {
        // Every hub, in the node's order (the variable overrides the file's one URL).
        node.set_env("BATON_NODE_HUB_URL", &urls.join(","));
    }
    Ok(node)
}

/// Makes the copied node database at `db` read as copied to another machine: the process
/// groups of the turns it records as running name another boot (`ELSEWHERE_BOOT`), so a node
/// started on it judges them gone (as after a reboot) instead of stopping the original's
/// harnesses, which on another machine it could not reach.
fn as_if_elsewhere(db: &Path) -> anyhow::Result<()> {
    let conn = rusqlite::Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.execute(
        "UPDATE attempts SET boot_id = ?1 WHERE ended_at_ms IS NULL AND boot_id IS NOT NULL",
        [ELSEWHERE_BOOT],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_client::ApiError;
    use baton_shared::error::ErrorCode;

    /// Judges `answer` and returns its phase, outcome and recorded HTTP status.
    fn check(answer: Result<SubmitResponse, ClientError>, expected: (&str, AcceptOutcome, Option<u16>)) {
        let (phase, outcome, _, http, _) = judge(Ok(answer));
        assert_eq!((phase, outcome, http), expected);
    }

    fn refused(status: u16, code: &str) -> Result<SubmitResponse, ClientError> {
        let message = "m".to_string();
        Err(ClientError::Api(ApiError { status, code: ErrorCode::parse(code), code_text: code.into(), message }))
    }

    #[test]
    fn only_a_refusal_is_a_failed_accept_and_every_lost_answer_is_info() {
        let accepted =
            |duplicate| Ok(SubmitResponse { message_id: "m1".into(), seq: 1, duplicate, deliveries: Vec::new() });
        check(accepted(false), ("ok", AcceptOutcome::Ok("m1".into()), Some(201)));
        check(accepted(true), ("ok", AcceptOutcome::Ok("m1".into()), Some(200)));
        check(refused(409, "idempotency_conflict"), ("fail", AcceptOutcome::Fail(409), Some(409)));
        check(refused(400, "invalid_field"), ("fail", AcceptOutcome::Fail(400), Some(400)));
        check(refused(429, "over_capacity"), ("info", AcceptOutcome::Info, Some(429)));
        check(refused(503, "storage_unavailable"), ("info", AcceptOutcome::Info, Some(503)));
        let lost = ClientError::Transport { detail: "reset".into(), maybe_sent: true };
        check(Err(lost), ("info", AcceptOutcome::Info, None));
        let unsent = ClientError::Transport { detail: "refused".into(), maybe_sent: false };
        check(Err(unsent), ("info", AcceptOutcome::Info, None));
        check(
            Err(ClientError::BadAnswer { status: 201, detail: "eof".into() }),
            ("info", AcceptOutcome::Info, Some(201)),
        );
    }

    #[tokio::test]
    async fn no_answer_within_the_deadline_is_info() {
        let never = std::future::pending::<Result<SubmitResponse, ClientError>>();
        let answer = tokio::time::timeout(Duration::from_millis(1), never).await;
        let (phase, outcome, _, http, err) = judge(answer);
        assert_eq!((phase, outcome, http), ("info", AcceptOutcome::Info, None));
        assert!(err.is_some_and(|e| e.starts_with("no answer within")));
    }
}
