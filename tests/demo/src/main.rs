//! `baton-demo`: builds Baton, then runs a hub and two nodes on loopback with a throwaway CA
//! and a sample harness, sends messages into two conversations, pauses one while the other
//! flows, lifts the pause, prints every delivery's state and every attempt's outcome, and shuts
//! everything down with SIGTERM.
//!
//! Run it with `cargo run --release -p baton-demo`. Everything lives in a temporary directory
//! that is removed at the end (`--keep` keeps it).

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the demo waits for the deliveries it expects before giving up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages sent into each conversation.
const MESSAGES_PER_CONVERSATION: usize = 3;
/// The sample harness: reads the payload and answers with one line naming the turn.
const HARNESS: &str = r#"read -r payload; echo "turn $BATON_CONVERSATION#$BATON_SEQ handled: $payload"; sleep 0.2"#;

/// A child process that is stopped (SIGTERM, then SIGKILL) when dropped.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn terminate(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status()?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                say(&format!("{} stopped ({status})", self.name));
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill()?;
        bail!("{} did not stop within 15 s of SIGTERM; killed", self.name)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn section(title: &str) {
    say("");
    say(&format!("== {title}"));
}

/// Builds the two binaries with the same profile as this one and returns their directory.
fn build_binaries() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("no directory for the demo binary")?.to_path_buf();
    if let Ok(cargo) = std::env::var("CARGO") {
        let release = dir.file_name().is_some_and(|n| n == "release");
        say("building baton-hub and baton-node …");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "baton-hub", "-p", "baton-node"]);
        if release {
            cmd.arg("--release");
        }
        if !cmd.status()?.success() {
            bail!("cargo build failed");
        }
    }
    for bin in ["baton-hub", "baton-node"] {
        if !dir.join(bin).exists() {
            bail!("{} is missing; run `cargo build -p baton-hub -p baton-node` first", dir.join(bin).display());
        }
    }
    Ok(dir)
}

struct Demo {
    bin: PathBuf,
    dir: PathBuf,
}

impl Demo {
    fn hub(&self) -> Command {
        let mut c = Command::new(self.bin.join("baton-hub"));
        c.arg("--data-dir").arg(self.dir.join("hub")).env("BATON_OPERATOR", "demo");
        c
    }

    /// Runs a hub CLI command and returns its stdout, failing on a non-zero exit.
    fn cli(&self, args: &[&str]) -> Result<String> {
        let out = self.hub().args(args).output()?;
        if !out.status.success() {
            bail!("baton-hub {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            if done(&self.deliveries()?) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_node(&self, host: &str, addr: &str) -> Result<Proc> {
        let certs = self.dir.join("certs");
        let config = self.dir.join(format!("{host}.toml"));
        let command = serde_json::to_string(&["sh", "-c", HARNESS])?;
        std::fs::write(
            &config,
            format!(
                "hub_url = \"https://{addr}\"\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\ndata_dir = {:?}\n\
                 command = {command}\nparallel_conversations = 2\nexec_timeout = \"30s\"\nclaim_wait = \"5s\"\n",
                certs.join("ca.crt"),
                certs.join(format!("{host}.crt")),
                certs.join(format!("{host}.key")),
                self.dir.join(format!("{host}-data")),
            ),
        )?;
        let log = std::fs::File::create(self.dir.join(format!("{host}.log")))?;
        let child = Command::new(self.bin.join("baton-node"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        say(&format!("started baton-node for {host} (log: {host}.log)"));
        Ok(Proc { name: if host == "host-a" { "node host-a" } else { "node host-b" }, child })
    }
}

fn wait_for_file(path: &Path, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return Ok(s.trim().to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} did not appear", path.display())
}

fn main() -> Result<()> {
    let keep = std::env::args().any(|a| a == "--keep");
    let bin = build_binaries()?;
    let tmp = tempfile::Builder::new().prefix("baton-demo-").tempdir()?;
    let demo = Demo { bin, dir: tmp.path().to_path_buf() };

    section("a hub with its own CA");
    demo.show(&["init"])?;
    let certs = demo.dir.join("certs");
    let certs = certs.to_str().context("temp path is not UTF-8")?;
    demo.show(&["enroll", "node", "host-a", "--out", certs])?;
    demo.show(&["enroll", "node", "host-b", "--out", certs])?;
    let log = std::fs::File::create(demo.dir.join("hub.log"))?;
    let hub_child = demo.hub().args(["serve", "--listen", "127.0.0.1:0"]).stdout(Stdio::null()).stderr(log).spawn()?;
    let mut hub = Proc { name: "hub", child: hub_child };
    let addr = wait_for_file(&demo.dir.join("hub").join("hub.addr"), Duration::from_secs(20))?;
    say(&format!("hub listening on {addr} (mTLS only)"));

    section("two nodes");
    let mut node_a = demo.start_node("host-a", &addr)?;
    let mut node_b = demo.start_node("host-b", &addr)?;

    section("pause conversation \"beta\", then send into \"alpha\" and \"beta\"");
    demo.show(&["fence", "pause", "--conversation", "beta", "--reason", "demo: hold beta back"])?;
    for i in 1..=MESSAGES_PER_CONVERSATION {
        for conv in ["alpha", "beta"] {
            let payload = format!("{{\"task\": \"{conv} step {i}\"}}");
            demo.cli(&[
                "send",
                "--conversation",
                conv,
                "--to",
                "host-a,host-b",
                "--key",
                &format!("{conv}-{i}"),
                "--payload",
                &payload,
            ])?;
        }
    }
    say(&format!("sent {} messages to host-a and host-b", 2 * MESSAGES_PER_CONVERSATION));
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

    section("shut down (SIGTERM)");
    node_a.terminate()?;
    node_b.terminate()?;
    hub.terminate()?;
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
