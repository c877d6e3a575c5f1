//! `baton-demo`: builds Baton, then runs a hub and two nodes on loopback with a throwaway CA
//! and a sample harness, sends messages into two conversations as a producer over mTLS (with
//! `baton_client`, as any producer would), pauses one conversation while the other flows, lifts
//! the pause, prints every delivery's state and every attempt's outcome as the operator and as
//! the producer see them, and shuts everything down with SIGTERM.
//!
//! Run it with `cargo run --release -p baton-demo`. Everything lives in a temporary directory
//! that is removed at the end (`--keep` keeps it).

use anyhow::{Context, Result, bail};
use baton_client::{Client, TlsFiles};
use baton_shared::wire::{Payload, SubmitRequest};
use baton_testkit::{Binaries, Harness, Hub, Node, NodeConfig, Proc, Role, Signal, Started};
use std::io::Write;
use std::time::Duration;

/// How long the demo waits for the deliveries it expects before giving up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// Messages sent into each conversation.
const MESSAGES_PER_CONVERSATION: usize = 3;
/// The producer that sends them.
const PRODUCER: &str = "shop";
/// The sample harness: reads the payload and answers with one line naming the turn.
const HARNESS: &str = r#"read -r payload; echo "turn $BATON_CONVERSATION#$BATON_SEQ handled: $payload"; sleep 0.2"#;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn section(title: &str) {
    say("");
    say(&format!("== {title}"));
}

/// The two binaries: built first with the same profile as this one when the demo runs through
/// cargo, else taken from next to this binary.
fn binaries() -> Result<Binaries> {
    if std::env::var_os("CARGO").is_some() {
        say("building baton-hub and baton-node …");
        Binaries::build()
    } else {
        Binaries::locate()
    }
}

/// Stops a process with SIGTERM, saying so; kills it (and fails) after `STOP_GRACE`.
fn stop(proc: &mut Proc, name: &str) -> Result<()> {
    if !proc.running() {
        return Ok(());
    }
    proc.signal(Signal::SIGTERM)?;
    match proc.wait_exit(STOP_GRACE)? {
        Some(status) => {
            say(&format!("{name} stopped ({status})"));
            Ok(())
        }
        None => {
            proc.kill()?;
            bail!("{name} did not stop within {} s of SIGTERM; killed", STOP_GRACE.as_secs())
        }
    }
}

struct Demo {
    bins: Binaries,
    hub: Hub,
}

impl Demo {
    /// Runs a hub CLI command and returns its stdout, failing on a non-zero exit.
    fn cli(&self, args: &[&str]) -> Result<String> {
        self.hub.cli(args)
    }

    fn show(&self, args: &[&str]) -> Result<()> {
        say(&format!("$ baton-hub {}", args.join(" ")));
        for line in self.cli(args)?.lines() {
            say(&format!("  {line}"));
        }
        Ok(())
    }

    fn deliveries(&self) -> Result<Vec<serde_json::Value>> {
        let text = self.cli(&["deliveries", "list", "--json"])?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Waits until `done` holds for the deliveries list.
    fn wait_for(&self, what: &str, done: impl Fn(&[serde_json::Value]) -> bool) -> Result<()> {
        baton_testkit::wait::until(what, SETTLE_TIMEOUT, || Ok(done(&self.deliveries()?).then_some(())))
    }

    /// Enrolls a node host, showing the command.
    fn enroll(&mut self, host: &str) -> Result<()> {
        let certs = self.hub.certs_dir().to_str().context("temp path is not UTF-8")?.to_string();
        self.show(&["enroll", "node", host, "--out", &certs])?;
        self.hub.enrolled(Role::Node, host)?;
        Ok(())
    }

    /// Enrolls the producer, showing the command, and returns its client of the hub at `url`.
    fn producer(&mut self, url: &str) -> Result<Client> {
        let certs = self.hub.certs_dir().to_str().context("temp path is not UTF-8")?.to_string();
        self.show(&["enroll", "producer", PRODUCER, "--out", &certs])?;
        let id = self.hub.enrolled(Role::Producer, PRODUCER)?;
        let files = TlsFiles { ca_file: id.ca, cert_file: id.cert, key_file: id.key };
        Ok(Client::new(url, &files)?)
    }

    fn start_node(&self, dir: &std::path::Path, host: &str, url: &str) -> Result<Node> {
        let harness = Harness::Command(vec!["sh".into(), "-c".into(), HARNESS.into()]);
        let config = NodeConfig::new(url, self.hub.identity(host)?, &dir.join(format!("{host}-data")), harness)
            .set("parallel_conversations", "2")
            .set("exec_timeout", "\"30s\"")
            .set("claim_wait", "\"5s\"");
        let mut node = Node::create(&self.bins, dir, host, &config)?;
        node.start(None)?;
        say(&format!("started baton-node for {host} (log: {host}.log)"));
        Ok(node)
    }
}

fn main() -> Result<()> {
    // Exactly one rustls provider is compiled in; installing it first makes that explicit.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let keep = std::env::args().any(|a| a == "--keep");
    let bins = binaries()?;
    let tmp = baton_testkit::fresh_dir("baton-demo-")?;
    let dir = tmp.path().to_path_buf();
    let hub = Hub::new(&bins, &dir, "demo")?;
    let mut demo = Demo { bins, hub };

    section("a hub with its own CA");
    demo.show(&["init"])?;
    demo.enroll("host-a")?;
    demo.enroll("host-b")?;
    let addr = match demo.hub.serve(None)? {
        Started::Ready(addr) => addr,
        Started::Exited(status) => bail!("the hub exited ({status}):\n{}", demo.hub.proc().stderr()),
    };
    say(&format!("hub listening on {addr} (mTLS only)"));
    let url = format!("https://{addr}");

    section("a producer");
    let producer = demo.producer(&url)?;

    section("two nodes");
    let mut node_a = demo.start_node(&dir, "host-a", &url)?;
    let mut node_b = demo.start_node(&dir, "host-b", &url)?;

    section("pause conversation \"beta\", then send into \"alpha\" and \"beta\"");
    // `--force`: "beta" has no messages yet, which the CLI would otherwise take for a typo.
    demo.show(&["fence", "pause", "--conversation", "beta", "--force", "--reason", "demo: hold beta back"])?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut sent = Vec::new();
    for i in 1..=MESSAGES_PER_CONVERSATION {
        for conv in ["alpha", "beta"] {
            let payload = Payload::from_text(format!("{{\"task\": \"{conv} step {i}\"}}"))?;
            let req = SubmitRequest {
                conversation: conv.to_string(),
                idempotency_key: format!("{conv}-{i}"),
                payload,
                to: Some(vec!["host-a".into(), "host-b".into()]),
                max_attempts: None,
                retry_backoff_ms: None,
            };
            let accepted = rt.block_on(producer.submit(&req))?;
            sent.push((format!("{conv} step {i}"), accepted.message_id));
        }
    }
    say(&format!("{PRODUCER} sent {} messages to host-a and host-b over mTLS", 2 * MESSAGES_PER_CONVERSATION));
    let settled = |d: &serde_json::Value| d["outcome"].is_string() || d["state"] == "failed" || d["state"] == "unknown";
    demo.wait_for("alpha to finish", |ds| ds.iter().filter(|d| d["conversation"] == "alpha").all(settled))?;
    say("alpha has run on both hosts; beta is still queued behind the pause:");
    demo.show(&["deliveries", "list"])?;

    section("lift the pause");
    let fences: Vec<serde_json::Value> = serde_json::from_str(&demo.cli(&["fence", "list", "--json"])?)?;
    let id = fences.first().and_then(|f| f["id"].as_i64()).context("the pause fence is missing")?;
    demo.show(&["fence", "lift", &id.to_string(), "--reason", "demo: let beta go"])?;
    demo.wait_for("every delivery to settle", |ds| ds.iter().all(settled))?;

    section("every delivery and its outcome");
    demo.show(&["deliveries", "list"])?;
    let first = demo.deliveries()?.into_iter().next().context("no deliveries")?;
    let first_id = first["delivery_id"].as_str().context("no id")?.to_string();
    demo.show(&["deliveries", "show", &first_id])?;
    demo.show(&["status"])?;

    section("what the producer sees");
    for (what, id) in &sent {
        let view = rt.block_on(producer.message(id, None))?;
        let ends: Vec<String> = view
            .deliveries
            .iter()
            .map(|d| {
                let outcome = d.attempts.last().map_or(d.state.as_str(), |a| a.outcome.as_str());
                format!("{} {outcome}", d.host)
            })
            .collect();
        say(&format!("  {what}: {}", ends.join(", ")));
    }

    section("shut down (SIGTERM)");
    stop(node_a.proc_mut(), "node host-a")?;
    stop(node_b.proc_mut(), "node host-b")?;
    stop(demo.hub.proc_mut(), "hub")?;
    let all = demo.deliveries()?;
    let ok = all.iter().filter(|d| d["outcome"] == "succeeded").count();
    say(&format!("{ok} of {} deliveries succeeded", all.len()));
    if keep {
        let kept = tmp.keep();
        say(&format!("kept {}", kept.display()));
    }
    if ok != all.len() {
        bail!("not every delivery succeeded");
    }
    Ok(())
}
