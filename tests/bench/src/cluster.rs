//! The real processes, through the test kit (`baton_testkit`): the hub's data directory and
//! certificates (the real `baton-hub init` and `enroll`), `baton-hub serve` waited for until
//! `/readyz` answers, `baton-node run` with the benchmark's settings, and `baton_client`
//! clients presenting the enrolled certificates.
//!
//! Invariant: every child this benchmark starts is owned by a kit `Proc` set to stop gracefully
//! (SIGTERM, then SIGKILL after `STOP_GRACE`) when dropped, so an error or a panic anywhere
//! never leaves a process behind. Drop does not run when the benchmark itself is signalled, so
//! `main` spawns `baton_testkit::proc::stop_all_on_signal`, which stops every live child first.

use anyhow::{Context, bail};
use baton_client::{Client, RetryPolicy, TlsFiles};
use baton_testkit::{Binaries, Harness, Hub, Node, NodeConfig, Role, Started};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a stopped child may take to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(15);
/// How long the hub may take to open its store (a `quick_check` of a large backlog), bind and
/// answer `/readyz`.
pub const HUB_START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long every node may take to start and make its first claim.
pub const NODE_START_TIMEOUT: Duration = Duration::from_secs(60);

/// `baton-hub init` in `root` (the data directory is `root/hub`; the record in the PostgreSQL
/// database at `database_url` when given), then `enroll node` for each host and `enroll
/// producer` for each producer.
pub fn create_hub(
    bins: &Binaries,
    root: &Path,
    hosts: &[String],
    producers: &[&str],
    database_url: Option<&str>,
) -> anyhow::Result<Hub> {
    let mut hub = match database_url {
        None => Hub::init(bins, root, "bench")?,
        Some(url) => {
            let hub = Hub::new(bins, root, "bench")?;
            hub.cli(["init", "--database-url", url])?;
            hub
        }
    };
    for h in hosts {
        hub.enroll(Role::Node, h)?;
    }
    for p in producers {
        hub.enroll(Role::Producer, p)?;
    }
    hub.set_ready_within(HUB_START_TIMEOUT);
    hub.proc_mut().set_drop_grace(STOP_GRACE);
    Ok(hub)
}

/// Another hub on the PostgreSQL record at `database_url` that `first` keeps, rooted at
/// `root` (`Hub::join`: the same CA, and a probe identity of its own).
pub fn add_hub(bins: &Binaries, root: &Path, first: &Hub, database_url: &str) -> anyhow::Result<Hub> {
    let mut hub = Hub::join(bins, root, "bench", first, database_url)?;
    hub.set_ready_within(HUB_START_TIMEOUT);
    hub.proc_mut().set_drop_grace(STOP_GRACE);
    Ok(hub)
}

/// Starts `serve` on loopback (port 0) and waits until it is ready. Returns its base URL and
/// the seconds from spawn to ready (store open, repair, bind, first `/readyz`).
pub fn start_hub(hub: &mut Hub) -> anyhow::Result<(String, f64)> {
    let started = Instant::now();
    match hub.serve(None)? {
        Started::Ready(addr) => Ok((format!("https://{addr}"), started.elapsed().as_secs_f64())),
        Started::Exited(status) => {
            bail!("the hub exited ({status}) before it was ready; end of its log:\n{}", hub.proc().stderr())
        }
    }
}

/// How the benchmark configures each node.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// What runs a turn.
    pub harness: Harness,
    /// `parallel_conversations`.
    pub parallel_conversations: u32,
    /// `claim_batch_max`.
    pub claim_batch_max: u32,
    /// `handoff` (`combined` or `separate`).
    pub handoff: String,
    /// `handoffs_in_flight`, when not the node's default.
    pub handoffs_in_flight: Option<u32>,
    /// `otlp_endpoint`: where the node exports its spans; `None` (the default) for none.
    pub otlp_endpoint: Option<String>,
}

/// Writes a node config for `host` under `dir` (data directory `dir/HOST`) and starts
/// `baton-node run` with it. `hub_url` may list several hubs, comma-separated (the flag and
/// environment form of `hub_url`): the node prefers the first and moves on when one is
/// unreachable.
pub fn start_node(
    bins: &Binaries,
    hub: &Hub,
    hub_url: &str,
    host: &str,
    dir: &Path,
    settings: &NodeSettings,
) -> anyhow::Result<Node> {
    let first = hub_url.split(',').next().unwrap_or(hub_url);
    let mut config = NodeConfig::new(first, hub.identity(host)?, &dir.join(host), settings.harness.clone())
        .set("parallel_conversations", &settings.parallel_conversations.to_string())
        .set("claim_batch_max", &settings.claim_batch_max.to_string())
        .set("handoff", &format!("\"{}\"", settings.handoff))
        .set("claim_wait", "\"10s\"")
        .set("exec_timeout", "\"60s\"")
        .set("shutdown_grace", "\"5s\"")
        .set("backoff_max", "\"1s\"");
    if let Some(n) = settings.handoffs_in_flight {
        config = config.set("handoffs_in_flight", &n.to_string());
    }
    if let Some(endpoint) = &settings.otlp_endpoint {
        config = config.set("otlp_endpoint", &format!("{endpoint:?}"));
    }
    let mut node = Node::create(bins, dir, host, &config)?;
    node.proc_mut().set_drop_grace(STOP_GRACE);
    if hub_url.contains(',') {
        node.set_env("BATON_NODE_HUB_URL", hub_url);
    }
    node.start(None)?;
    Ok(node)
}

/// A client of the hub at `url` presenting the enrolled identity `name` and trusting only the
/// hub CA. It sends each request once: the benchmark counts every refusal and lost answer
/// rather than hiding it behind a retry (and a retry's pause would be timed as latency).
pub fn client(hub: &Hub, url: &str, name: &str) -> anyhow::Result<Client> {
    let id = hub.identity(name)?;
    let files = TlsFiles { ca_file: id.ca.clone(), cert_file: id.cert.clone(), key_file: id.key.clone() };
    let client = Client::new(url, &files).with_context(|| format!("building the client of {name}"))?;
    Ok(client.with_retry(RetryPolicy::once()))
}
