//! The processes of a fault run, on the test kit: a hub (`baton_testkit::Hub`), `baton-node`
//! agents that dial it through one fault `Proxy` each, and a producer client that writes the
//! client history. Every process is owned by a kit `Proc`, which kills and reaps it when dropped
//! (also during a panic's unwinding, printing its log), so no run leaves a process behind.

use crate::checker::Inputs;
use crate::proxy::Proxy;
use crate::records::{HistoryLine, LineWriter, ledger_harness};
use baton_testkit::{Binaries, Harness, Hub, Identity, Node, NodeConfig, Proc, Role, Started};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the producer waits for one accept answer; past it the outcome is `info`.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// A client presenting `identity` (trusting only the hub CA), writing history to `history`.
    pub fn new(identity: &Identity, history: &Path) -> anyhow::Result<Producer> {
        let client = identity
            .client_builder()?
            .timeout(ACCEPT_TIMEOUT)
            .connect_timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Producer { name: identity.name.clone(), client, history: Mutex::new(LineWriter::append(history)?) })
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
        self.accept_with(hub, conversation, key, payload, to, Retries::default()).await
    }

    /// One accept attempt of a message that may be run again when its harness asks (`retries`).
    pub async fn accept_with(
        &self,
        hub: Option<SocketAddr>,
        conversation: &str,
        key: &str,
        payload: &serde_json::Value,
        to: &[String],
        retries: Retries,
    ) -> AcceptOutcome {
        let mut content = format!("{conversation}|{payload}|{}", to.join(","));
        if retries != Retries::default() {
            content.push_str(&format!("|{:?}|{:?}", retries.max_attempts, retries.retry_backoff_ms));
        }
        let hash = format!("{:x}", fxhash(&content));
        self.record("invoke", key, &hash, None, None, None);
        let Some(hub) = hub else {
            self.record("info", key, &hash, None, None, Some("hub down".into()));
            return AcceptOutcome::Info;
        };
        let mut body =
            serde_json::json!({"conversation": conversation, "idempotency_key": key, "payload": payload, "to": to});
        if let Some(n) = retries.max_attempts {
            body["max_attempts"] = n.into();
        }
        if let Some(ms) = retries.retry_backoff_ms {
            body["retry_backoff_ms"] = ms.into();
        }
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

/// A message's retry fields (`SubmitRequest::max_attempts`, `retry_backoff_ms`); the default
/// sends neither, so the hub's defaults apply (one run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retries {
    /// Runs the harness may ask for with exit 75, the first included.
    pub max_attempts: Option<u32>,
    /// The base of the backoff before a retry, in milliseconds.
    pub retry_backoff_ms: Option<u64>,
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

/// Most pending rows of one store a drain failure lists.
const PENDING_SHOWN_MAX: i64 = 50;

impl Cluster {
    /// Sets up (without starting anything) a hub with `hosts` enrolled and producer `prod`, and
    /// one node per host, each dialing the hub through its own proxy. The proxies point nowhere
    /// until `start_hub`.
    pub async fn new(bins: &Binaries, hosts: &[&str]) -> anyhow::Result<Cluster> {
        let root = baton_testkit::fresh_dir("baton-fault-")?;
        let mut hub = Hub::init(bins, root.path(), "fault")?;
        let mut identities = Vec::new();
        for h in hosts {
            identities.push(hub.enroll(Role::Node, h)?);
        }
        let prod = hub.enroll(Role::Producer, "prod")?;
        let history = root.path().join("history.jsonl");
        let ledger = root.path().join("ledger.jsonl");
        let producer = std::sync::Arc::new(Producer::new(&prod, &history)?);
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        let placeholder: SocketAddr = ([127, 0, 0, 1], 9).into();
        for (h, identity) in hosts.iter().zip(&identities) {
            let proxy = Proxy::start(([127, 0, 0, 1], 0).into(), placeholder).await?;
            let url = format!("https://{}", proxy.addr());
            let harness = Harness::Command(ledger_harness(&ledger, h));
            let config = NodeConfig::new(&url, identity, &root.path().join(format!("node-{h}")), harness)
                .set("parallel_conversations", "4")
                .set("exec_timeout", "\"20s\"")
                .set("claim_wait", "\"1s\"")
                .set("claim_batch_max", "8")
                .set("shutdown_grace", "\"1s\"")
                .set("backoff_max", "\"500ms\"");
            nodes.push(Node::create(bins, &root.path().join("nodes"), h, &config)?);
            proxies.push(proxy);
        }
        Ok(Cluster { hub, nodes, proxies, producer, history, ledger, root })
    }

    /// The run's temp directory.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Starts (or restarts) the hub on a free port and points every proxy at it.
    pub fn start_hub(&mut self, crash_point: Option<&str>) -> anyhow::Result<Started> {
        let started = self.hub.serve(crash_point)?;
        if let Started::Ready(addr) = started {
            for p in &self.proxies {
                p.set_upstream(addr);
            }
        }
        Ok(started)
    }

    /// The process of node `i`, or of the hub for `i == nodes.len()`.
    pub fn proc(&self, i: usize) -> &Proc {
        self.nodes.get(i).map_or_else(|| self.hub.proc(), Node::proc)
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

    /// Lifts every fence, then releases every held delivery (heal before drain). The held
    /// deliveries are read after the lifts: until a fence's lift commits, claims may still
    /// park deliveries under it. A command that fails (other than exit 1, nothing to do) is
    /// returned as an error after the others ran.
    pub fn lift_all_fences(&self) -> anyhow::Result<()> {
        let read = |sql: &str| -> anyhow::Result<Vec<String>> {
            let conn = crate::checker::open_read_only(&self.hub.db())?;
            let rows = conn.prepare(sql)?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
            Ok(rows)
        };
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
        let mut items = Vec::new();
        let conn = crate::checker::open_read_only(&self.hub.db())?;
        let mut st = conn.prepare(
            "SELECT d.id, d.host, d.conversation, d.seq, d.state, d.attempt, coalesce(d.reason, ''),
                    coalesce(d.started_session, -1), coalesce(d.cancel_requested_at, -1)
             FROM deliveries d
             WHERE d.state IN ('queued', 'claimed', 'mirrored', 'held')
                OR (d.state = 'delivered'
                    AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))
             LIMIT ?1",
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
        for n in &self.nodes {
            s.push_str(&format!("=== node {}\n{}\n", n.proc().stem(), n.proc().stderr_all()));
        }
        s
    }
}
