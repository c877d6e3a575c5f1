//! `baton-demo`: runs a hub and two nodes on loopback with a throwaway CA and a sample harness,
//! sends messages into two conversations as a producer over mTLS (with `baton_client`, as any
//! producer would), pauses one conversation while the other flows, lifts the pause, shows a turn
//! that fails, a turn the harness asks to retry (exit 75) sent with the `baton` command line,
//! the status page's address, every delivery's state and every attempt's outcome as the
//! operator and as the producer see them, what `baton-hub status` flags, and shuts everything
//! down with SIGTERM.
//!
//! Run it with `cargo run --release -p baton-demo`. That one build compiles the hub's, the
//! node's and the client's code as well (this package depends on their libraries for that), so
//! the demo's own `cargo build` of the three programs finds every library fresh and only links
//! them. Run directly, it takes the programs beside its own binary. Everything lives in a
//! temporary directory that is removed at the end (`--keep` keeps it); `--hold` waits for Enter
//! before shutting down, to look at the status page at leisure.

use anyhow::{Context, Result, bail};
use baton_client::{Client, TlsFiles};
use baton_shared::wire::{Payload, SubmitRequest};
use baton_testkit::{Binaries, Harness, Hub, Node, NodeConfig, Proc, Role, Signal, Started, bins};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long the demo waits for the deliveries it expects before giving up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// How long one `baton` command may take (`wait` included).
const CLI_WAIT: Duration = Duration::from_secs(90);
/// Messages sent into each conversation.
const MESSAGES_PER_CONVERSATION: usize = 3;
/// The producer that sends them.
const PRODUCER: &str = "shop";
/// The packages whose programs the demo runs, built (linked) when it runs through cargo; the
/// demo's own package is among them so that features resolve as in its `cargo run`.
const PROGRAMS: [&str; 4] = ["baton-demo", "baton-hub", "baton-node", "baton-client"];
/// The sample harness: reads the payload and answers with one line naming the turn. A payload
/// asking it to fail exits 3 (`failed`); one that is "flaky" exits 75 on its first run, which
/// asks the hub for a retry, and succeeds on the next.
const HARNESS: &str = r#"read -r payload
case "$payload" in
  *"fail on purpose"*) echo "the harness refuses: $payload" >&2; exit 3 ;;
  *flaky*) if [ "$BATON_ATTEMPT" = 1 ]; then echo "busy, try again later" >&2; exit 75; fi ;;
esac
echo "turn $BATON_CONVERSATION#$BATON_SEQ (run $BATON_ATTEMPT) handled: $payload"
sleep 0.2"#;
/// The message whose turn fails on purpose, and the one retried once.
const FAILING_KEY: &str = "gamma-1";
const RETRIED_KEY: &str = "delta-1";

/// `args` as a shell command line: an argument with anything but letters, digits and `-_./:=,@%+`
/// in it is single-quoted, so a command the demo shows can be pasted as it reads.
fn shell_words(args: &[&str]) -> String {
    let plain = |a: &str| !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
    let word = |a: &&str| if plain(a) { a.to_string() } else { format!("'{}'", a.replace('\'', r"'\''")) };
    args.iter().map(word).collect::<Vec<_>>().join(" ")
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The demo's steps, each headed with the time since it started.
struct Progress(Instant);

impl Progress {
    fn section(&self, title: &str) {
        say("");
        say(&format!("== [{:5.1} s] {title}", self.0.elapsed().as_secs_f64()));
    }
}

/// The two programs, and `baton`: linked first with the same profile as this binary when the
/// demo runs through cargo, else taken from next to this binary.
fn programs() -> Result<(Binaries, PathBuf)> {
    if std::env::var_os("CARGO").is_some() {
        say("linking baton-hub, baton-node and baton: `cargo run` compiled their code with the demo, so this");
        say("step only links the three programs (cargo's own progress follows) …");
        bins::build_bins_shown(&PROGRAMS)?;
    }
    Ok((Binaries::locate()?, bins::locate_producer_cli()?))
}

/// Stops a process with SIGTERM, saying so; kills it (and fails) after `STOP_GRACE`.
fn stop(proc: &mut Proc, name: &str) -> Result<()> {
    if !proc.running() {
        return Ok(());
    }
    let asked = Instant::now();
    proc.signal(Signal::SIGTERM)?;
    match proc.wait_exit(STOP_GRACE)? {
        Some(status) => {
            say(&format!("{name} stopped ({status}) after {:.1} s", asked.elapsed().as_secs_f64()));
            Ok(())
        }
        None => {
            proc.kill()?;
            bail!("{name} did not stop within {} s of SIGTERM; killed", STOP_GRACE.as_secs())
        }
    }
}

/// A delivery that reached its end: failed or unknown, or delivered with its run's outcome. A
/// delivery waiting for a retry is queued again, so it is not settled.
fn settled(d: &serde_json::Value) -> bool {
    d["state"] == "failed" || d["state"] == "unknown" || (d["state"] == "delivered" && d["outcome"].is_string())
}

/// Prints a command's output indented under it.
fn indented(text: &str) {
    for line in text.lines() {
        say(&format!("  {line}"));
    }
}

struct Demo {
    bins: Binaries,
    hub: Hub,
    dir: PathBuf,
    /// `baton`, the producer command line.
    cli: PathBuf,
}

impl Demo {
    /// Runs a hub CLI command and returns its stdout, failing on a non-zero exit.
    fn cli(&self, args: &[&str]) -> Result<String> {
        self.hub.cli(args)
    }

    fn show(&self, args: &[&str]) -> Result<()> {
        say(&format!("$ baton-hub {}", shell_words(args)));
        indented(&self.cli(args)?);
        Ok(())
    }

    /// Runs `baton ARGS` (the producer command line) in the demo's directory, showing the
    /// command, its output and its exit status; returns the status.
    fn baton(&self, args: &[&str]) -> Result<i32> {
        say(&format!("$ baton {}", shell_words(args)));
        let mut cmd = bins::command(&self.cli);
        cmd.args(args).current_dir(&self.dir);
        let out = bins::run(cmd, CLI_WAIT)?;
        indented(&String::from_utf8_lossy(&out.stdout));
        indented(&String::from_utf8_lossy(&out.stderr));
        let code = out.status.code().context("baton was killed by a signal")?;
        say(&format!("  (exit {code})"));
        Ok(code)
    }

    fn deliveries(&self) -> Result<Vec<serde_json::Value>> {
        let text = self.cli(&["deliveries", "list", "--json"])?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Waits until `done` holds for the deliveries list, saying what it waits for.
    fn wait_for(&self, what: &str, done: impl Fn(&[serde_json::Value]) -> bool) -> Result<()> {
        say(&format!("waiting for {what} …"));
        baton_testkit::wait::until(what, SETTLE_TIMEOUT, || Ok(done(&self.deliveries()?).then_some(())))
    }

    /// The one delivery of conversation `conv`.
    fn delivery_of(&self, conv: &str) -> Result<String> {
        let ds = self.deliveries()?;
        let d = ds.iter().find(|d| d["conversation"] == conv).with_context(|| format!("no delivery in {conv}"))?;
        Ok(d["delivery_id"].as_str().context("a delivery without an id")?.to_string())
    }

    /// Enrolls a node host, showing the command.
    fn enroll(&mut self, host: &str) -> Result<()> {
        let certs = self.hub.certs_dir().to_str().context("temp path is not UTF-8")?.to_string();
        self.show(&["enroll", "node", host, "--out", &certs])?;
        self.hub.enrolled(Role::Node, host)?;
        Ok(())
    }

    /// Enrolls the producer, showing the command; returns its client of the hub at `url` and
    /// writes `baton.toml`, the same identity for the `baton` command line.
    fn producer(&mut self, url: &str) -> Result<Client> {
        let certs = self.hub.certs_dir().to_str().context("temp path is not UTF-8")?.to_string();
        self.show(&["enroll", "producer", PRODUCER, "--out", &certs])?;
        let id = self.hub.enrolled(Role::Producer, PRODUCER)?;
        let config = format!(
            "hub_url = \"{url}\"\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            id.ca.display(),
            id.cert.display(),
            id.key.display()
        );
        std::fs::write(self.dir.join("baton.toml"), &config)?;
        say("baton.toml, the `baton` command line's configuration (the same producer certificate):");
        indented(&config);
        let files = TlsFiles { ca_file: id.ca, cert_file: id.cert, key_file: id.key };
        Ok(Client::new(url, &files)?)
    }

    fn start_node(&self, host: &str, url: &str) -> Result<Node> {
        let harness = Harness::Command(vec!["sh".into(), "-c".into(), HARNESS.into()]);
        let config = NodeConfig::new(url, self.hub.identity(host)?, &self.dir.join(format!("{host}-data")), harness)
            .set("parallel_conversations", "2")
            .set("exec_timeout", "\"30s\"")
            .set("claim_wait", "\"5s\"");
        let mut node = Node::create(&self.bins, &self.dir, host, &config)?;
        node.start(None)?;
        say(&format!("started baton-node for {host} (log: {host}.log)"));
        Ok(node)
    }

    /// Shows the operator listener's address and that its status page answers.
    fn status_page(&self, rt: &tokio::runtime::Runtime) -> Result<()> {
        let file = self.hub.data_dir().join("operator.addr");
        let addr = baton_testkit::wait::until("the operator listener's address", SETTLE_TIMEOUT, || {
            Ok(std::fs::read_to_string(&file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
        })?;
        let url = format!("http://{addr}/");
        let page = rt.block_on(async { reqwest::get(&url).await?.error_for_status()?.text().await })?;
        say(&format!("status page: {url} (plain HTTP on loopback, no certificate; address in hub/operator.addr)"));
        say(&format!(
            "  it answers ({} bytes of HTML, reloading every 10 s); /healthz, /readyz and /metrics are there too",
            page.len()
        ));
        Ok(())
    }

    /// `baton-hub status`, which exits 1 when something needs attention: shows it and says
    /// honestly what it flagged and whether the demo caused it. `failed` names the turn failed
    /// on purpose (its delivery and message ids, its conversation): a flag that names it is the
    /// demo's doing and the demo goes on; any other flag, or another exit status, fails the demo.
    fn status(&self, failed: &[&str]) -> Result<()> {
        say("$ baton-hub status");
        let out = self.hub.cli_output(["status"])?;
        indented(&String::from_utf8_lossy(&out.stdout));
        indented(&String::from_utf8_lossy(&out.stderr));
        match out.status.code() {
            Some(0) => {
                say("  (exit 0: nothing needs attention. The failed turn is not flagged: a failed outcome is");
                say("  final and reported to its producer, as `baton wait` exit 7 showed; status flags what an");
                say("  operator must act on: host-wide fences, held deliveries, `unknown` outcomes, silent hosts,");
                say("  hosts whose waiting work no node serves, a full record, expiring certificates.)");
                Ok(())
            }
            Some(1) => {
                let json = self.hub.cli_output(["status", "--json"])?;
                let report: serde_json::Value = serde_json::from_slice(&json.stdout).context("status --json")?;
                let items = report["attention"].as_array().cloned().unwrap_or_default();
                say(&format!("  (exit 1: {} item(s) need attention:", items.len()));
                let mut foreign = Vec::new();
                for item in &items {
                    let text = format!("{} {}", item["subject"], item["detail"]);
                    let ours = failed.iter().any(|f| text.contains(f));
                    let kind = item["kind"].as_str().unwrap_or("?");
                    say(&format!(
                        "  - {kind}: {}",
                        if ours { "the turn this demo failed on purpose" } else { "NOT caused by this demo" }
                    ));
                    if !ours {
                        foreign.push(kind.to_string());
                    }
                }
                if !foreign.is_empty() {
                    say("  )");
                    bail!("baton-hub status flags what the demo did not cause: {foreign:?}");
                }
                say("  so status exits 1 because of the demo's deliberate failure, and the demo goes on. In");
                say("  production, exit 1 from `baton-hub status` is the signal to look.)");
                Ok(())
            }
            other => bail!("baton-hub status exited {other:?}: {}", String::from_utf8_lossy(&out.stderr)),
        }
    }
}

/// Submits one message to `host` as the producer's client; returns its message id.
fn submit(
    rt: &tokio::runtime::Runtime,
    producer: &Client,
    conv: &str,
    key: &str,
    task: &str,
    host: &str,
) -> Result<String> {
    let req = SubmitRequest {
        conversation: conv.to_string(),
        idempotency_key: key.to_string(),
        payload: Payload::from_text(format!("{{\"task\": \"{task}\"}}"))?,
        to: Some(vec![host.to_string()]),
        pools: None,
        max_attempts: None,
        retry_backoff_ms: None,
        approval: None,
        approval_timeout_ms: None,
        deadline_ms: None,
        stall_ms: None,
    };
    Ok(rt.block_on(producer.submit(&req))?.message_id)
}

fn main() -> Result<()> {
    // Exactly one rustls provider is compiled in; installing it first makes that explicit.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(unknown) = args.iter().find(|a| !matches!(a.as_str(), "--keep" | "--hold")) {
        bail!(
            "unknown argument {unknown:?}; baton-demo takes --keep (keep the directory) and --hold (wait for Enter before shutting down)"
        );
    }
    let keep = args.iter().any(|a| a == "--keep");
    let hold = args.iter().any(|a| a == "--hold");
    let progress = Progress(Instant::now());
    progress.section("the programs");
    let (bins, cli) = programs()?;
    say(&format!("using {}, {} and {}", bins.hub.display(), bins.node.display(), cli.display()));
    let tmp = baton_testkit::fresh_dir("baton-demo-")?;
    let dir = tmp.path().to_path_buf();
    say(&format!("working in {}", dir.display()));
    let hub = Hub::new(&bins, &dir, "demo")?;
    let mut demo = Demo { bins, hub, dir: dir.clone(), cli };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;

    progress.section("a hub with its own CA");
    demo.show(&["init"])?;
    demo.enroll("host-a")?;
    demo.enroll("host-b")?;
    let addr = match demo.hub.serve(None)? {
        Started::Ready(addr) => addr,
        Started::Exited(status) => bail!("the hub exited ({status}):\n{}", demo.hub.proc().stderr()),
    };
    say(&format!("hub listening on {addr} (mTLS only)"));
    demo.status_page(&rt)?;
    let url = format!("https://{addr}");

    progress.section("a producer");
    let producer = demo.producer(&url)?;

    progress.section("two nodes");
    let mut node_a = demo.start_node("host-a", &url)?;
    let mut node_b = demo.start_node("host-b", &url)?;

    progress.section("pause conversation \"beta\", then send into \"alpha\" and \"beta\"");
    // `--force`: "beta" has no messages yet, which the CLI would otherwise take for a typo.
    demo.show(&["fence", "pause", "--conversation", "beta", "--force", "--reason", "demo: hold beta back"])?;
    let mut sent = Vec::new();
    for i in 1..=MESSAGES_PER_CONVERSATION {
        for conv in ["alpha", "beta"] {
            let payload = Payload::from_text(format!("{{\"task\": \"{conv} step {i}\"}}"))?;
            let req = SubmitRequest {
                conversation: conv.to_string(),
                idempotency_key: format!("{conv}-{i}"),
                payload,
                to: Some(vec!["host-a".into(), "host-b".into()]),
                pools: None,
                max_attempts: None,
                retry_backoff_ms: None,
                approval: None,
                approval_timeout_ms: None,
                deadline_ms: None,
                stall_ms: None,
            };
            let accepted = rt.block_on(producer.submit(&req))?;
            sent.push((format!("{conv} step {i}"), accepted.message_id));
        }
    }
    say(&format!("{PRODUCER} sent {} messages to host-a and host-b over mTLS", 2 * MESSAGES_PER_CONVERSATION));
    demo.wait_for("alpha to finish", |ds| ds.iter().filter(|d| d["conversation"] == "alpha").all(settled))?;
    say("alpha has run on both hosts; beta is still queued behind the pause:");
    demo.show(&["deliveries", "list"])?;

    progress.section("lift the pause");
    let fences: Vec<serde_json::Value> = serde_json::from_str(&demo.cli(&["fence", "list", "--json"])?)?;
    let id = fences.first().and_then(|f| f["id"].as_i64()).context("the pause fence is missing")?;
    demo.show(&["fence", "lift", &id.to_string(), "--reason", "demo: let beta go"])?;
    demo.wait_for("every delivery to settle", |ds| ds.iter().all(settled))?;

    progress.section("a turn that fails (the harness exits 3)");
    let failing = submit(&rt, &producer, "gamma", FAILING_KEY, "gamma: fail on purpose", "host-a")?;
    sent.push(("gamma: fail on purpose".into(), failing.clone()));
    say(&format!("{PRODUCER} sent {FAILING_KEY} to host-a; the harness refuses it"));
    demo.wait_for("gamma to end", |ds| ds.iter().filter(|d| d["conversation"] == "gamma").all(settled))?;
    let failed_delivery = demo.delivery_of("gamma")?;
    demo.show(&["deliveries", "show", &failed_delivery])?;
    say("the producer's view: `baton wait` exits 7 when a delivery did not succeed");
    let code = demo.baton(&["--config", "baton.toml", "wait", "--idempotency-key", FAILING_KEY, "--timeout", "30s"])?;
    if code != 7 {
        bail!("baton wait on the failed turn exited {code}, not 7");
    }

    progress.section("a turn retried: exit 75 asks for another run (sent with the `baton` CLI)");
    let code = demo.baton(&[
        "--config",
        "baton.toml",
        "send",
        "--conversation",
        "delta",
        "--to",
        "host-b",
        "--idempotency-key",
        RETRIED_KEY,
        "--max-attempts",
        "3",
        "--retry-backoff",
        "1s",
        "--payload",
        r#"{"task": "delta: flaky tool"}"#,
    ])?;
    if code != 0 {
        bail!("baton send exited {code}");
    }
    say("its first run exits 75; the hub runs it again after the backoff, while max_attempts leaves room");
    let code = demo.baton(&["--config", "baton.toml", "wait", "--idempotency-key", RETRIED_KEY, "--timeout", "60s"])?;
    if code != 0 {
        bail!("baton wait on the retried turn exited {code}, not 0");
    }
    demo.baton(&["--config", "baton.toml", "get", "--idempotency-key", RETRIED_KEY])?;
    let retried = demo.delivery_of("delta")?;
    demo.show(&["deliveries", "show", &retried])?;
    let delta = demo.deliveries()?.into_iter().find(|d| d["conversation"] == "delta").context("no delta")?;
    sent.push(("delta: flaky tool".into(), delta["message_id"].as_str().context("no message id")?.to_string()));

    progress.section("every delivery and its outcome");
    demo.show(&["deliveries", "list"])?;
    let first = demo.deliveries()?.into_iter().find(|d| d["conversation"] == "alpha").context("no deliveries")?;
    let first_id = first["delivery_id"].as_str().context("no id")?.to_string();
    demo.show(&["deliveries", "show", &first_id])?;

    progress.section("what needs attention");
    demo.status(&[&failed_delivery, &failing, "gamma"])?;

    progress.section("what the producer sees");
    for (what, id) in &sent {
        let view = rt.block_on(producer.message(id, None))?;
        let ends: Vec<String> = view
            .deliveries
            .iter()
            .map(|d| {
                let outcome = d.attempts.last().map_or(d.state.as_str(), |a| a.outcome.as_str());
                format!("{} {outcome}", d.host.as_deref().unwrap_or("-"))
            })
            .collect();
        say(&format!("  {what}: {}", ends.join(", ")));
    }

    if hold {
        say("");
        say("--hold: the hub and both nodes keep running; open the status page above. Press Enter to shut down.");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }

    progress.section("shut down (SIGTERM)");
    // The producer's open connections would keep the hub draining them for its shutdown_grace.
    drop(producer);
    drop(rt);
    stop(node_a.proc_mut(), "node host-a")?;
    stop(node_b.proc_mut(), "node host-b")?;
    stop(demo.hub.proc_mut(), "hub")?;
    let verdict = verdict(&demo, &retried);
    if keep {
        let kept = tmp.keep();
        say(&format!("kept {}", kept.display()));
    }
    let summary = verdict?;
    progress.section("done");
    say(&summary);
    Ok(())
}

/// Checks every delivery ended as the demo meant it to: all succeeded but the failing turn,
/// which failed, and the retried one succeeded on its second run. Returns the summary line.
fn verdict(demo: &Demo, retried: &str) -> Result<String> {
    let all = demo.deliveries()?;
    let ok = all.iter().filter(|d| d["outcome"] == "succeeded").count();
    let failed: Vec<&serde_json::Value> = all.iter().filter(|d| d["outcome"] != "succeeded").collect();
    if failed.len() != 1 || failed[0]["conversation"] != "gamma" {
        let shown: Vec<String> =
            failed.iter().map(|d| format!("{} {} {}", d["conversation"], d["state"], d["outcome"])).collect();
        bail!("not every delivery ended as meant: only gamma's should fail; these did not succeed: {shown:?}");
    }
    let shown: serde_json::Value = serde_json::from_str(&demo.cli(&["deliveries", "show", retried, "--json"])?)?;
    let runs = shown["attempts"].as_array().map_or(0, Vec::len);
    if runs != 2 {
        bail!("the retried turn ran {runs} time(s), not twice: {shown}");
    }
    Ok(format!(
        "{ok} of {} deliveries succeeded; the other one is gamma's, failed on purpose; delta's succeeded on its second \
         run after asking for a retry",
        all.len()
    ))
}
