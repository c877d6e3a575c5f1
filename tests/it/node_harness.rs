//! Node-side fixtures for the end-to-end tests: a hub that can be SIGKILLed and restarted on
//! the same address, real `baton-node run` processes, and the execution log their harness
//! command appends to.
//!
//! - `TestHub` wraps the hub harness's `Hub` (data directory, enrolled identities, CLI) but
//!   runs `serve` itself, so that `restart` listens on the address the nodes were given.
//! - `NodeProc` is one `baton-node run --config F` process for one data directory (= one
//!   instance). `kill9`, `term` and `restart` keep the data directory; every run's stderr goes
//!   to its own file, printed when a test fails.
//! - `ExecLog` is the file the test harness command appends `DELIVERY CONVERSATION SEQ HOST`
//!   to, one `echo >>` per turn (atomic for a short line), before anything else it does.
//!
//! Processes are reaped in `Drop`, and so are harness process groups a node left behind.

use crate::harness::{Api, EVENT_WAIT, Hub, Identity, hub_bin, node_bin, output_within, scrubbed};
use serde_json::Value;
use std::collections::HashMap;
use std::fs;
use std::net::SocketAddr;
use std::ops::Deref;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// How long a test waits for a node-side event (a turn, a report, an exit).
pub const NODE_WAIT: Duration = Duration::from_secs(30);

/// Polls `f` every 50 ms until it returns `Some`, failing the test after `limit`.
#[track_caller]
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether `status` is a death by SIGABRT (what a crash point's `abort()` leaves).
pub fn aborted(status: ExitStatus) -> bool {
    status.signal() == Some(libc::SIGABRT)
}

// ---------------------------------------------------------------------------------------------
// The hub, restartable on the same address

/// A hub whose `serve` the node tests start themselves, so a restart keeps the address.
/// Dereferences to the hub harness's `Hub` for the CLI (`show`, `deliveries`, `verify_ok`, …).
pub struct TestHub {
    child: Option<Child>,
    /// The address of the first run; every restart listens on it again.
    addr: Option<SocketAddr>,
    runs: u32,
    logs: PathBuf,
    exec_log: ExecLog,
    // Dropped last: its temp directory outlives the processes using it.
    hub: Hub,
}

impl Deref for TestHub {
    type Target = Hub;
    fn deref(&self) -> &Hub {
        &self.hub
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for run in 1..=self.runs {
                let text = fs::read_to_string(self.log_path(run)).unwrap_or_default();
                eprintln!("----- baton-hub serve run {run} stderr (tail) -----\n{}", tail(&text, 60));
            }
            eprintln!("----- exec log -----\n{}", fs::read_to_string(&self.exec_log.path).unwrap_or_default());
        }
    }
}

impl TestHub {
    /// A hub with node hosts `hosts` and the producer `prod`, serving on a fresh port.
    pub fn start(hosts: &[&str]) -> TestHub {
        TestHub::start_with(hosts, None)
    }

    /// As `start`, with `BATON_CRASH_POINT` armed for the first run of `serve`.
    pub fn start_with(hosts: &[&str], crash_point: Option<&str>) -> TestHub {
        let hub = Hub::builder().nodes(hosts).producers(&["prod"]).stopped().start();
        let logs = hub.scratch("node-it-logs");
        let exec_log = ExecLog { path: hub.scratch("exec").join("exec.log") };
        fs::write(&exec_log.path, "").expect("create exec log");
        let mut t = TestHub { child: None, addr: None, runs: 0, logs, exec_log, hub };
        t.serve(crash_point);
        t
    }

    fn log_path(&self, run: u32) -> PathBuf {
        self.logs.join(format!("serve-{run}.stderr"))
    }

    /// Starts `serve` on the remembered address (port 0 the first time); waits for `hub.addr`.
    fn serve(&mut self, crash_point: Option<&str>) {
        assert!(self.child.is_none(), "the hub is already running");
        let addr_file = self.hub.data_dir().join("hub.addr");
        let _ = fs::remove_file(&addr_file);
        self.runs += 1;
        let listen = self.addr.map_or_else(|| "127.0.0.1:0".to_string(), |a| a.to_string());
        let mut cmd = scrubbed(&hub_bin());
        cmd.arg("--data-dir").arg(self.hub.data_dir()).args(["serve", "--listen", &listen]);
        if let Some(p) = crash_point {
            cmd.env("BATON_CRASH_POINT", p);
        }
        cmd.stdout(fs::File::create(self.logs.join(format!("serve-{}.stdout", self.runs))).expect("stdout log"));
        cmd.stderr(fs::File::create(self.log_path(self.runs)).expect("stderr log"));
        let mut child = cmd.spawn().expect("spawn baton-hub serve");
        let start = Instant::now();
        let addr = loop {
            if let Ok(text) = fs::read_to_string(&addr_file)
                && let Ok(addr) = text.trim().parse::<SocketAddr>()
            {
                break addr;
            }
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!(
                    "baton-hub serve --listen {listen} exited ({status}) before listening:\n{}",
                    fs::read_to_string(self.log_path(self.runs)).unwrap_or_default()
                );
            }
            assert!(start.elapsed() < EVENT_WAIT, "baton-hub serve did not write hub.addr within {EVENT_WAIT:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(old) = self.addr {
            assert_eq!(addr, old, "the restarted hub must listen where the nodes look for it");
        }
        self.addr = Some(addr);
        self.child = Some(child);
    }

    /// `https://ADDR` (the same across restarts).
    pub fn url(&self) -> String {
        format!("https://{}", self.addr.expect("the hub never listened"))
    }

    /// The shared execution log of this test's nodes.
    pub fn exec_log(&self) -> &ExecLog {
        &self.exec_log
    }

    /// Kills `serve` with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("the hub is not running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Waits up to `limit` for `serve` to exit on its own (a crash point); reaps it.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("the hub is not running");
        let status = wait_child(child, limit).unwrap_or_else(|| panic!("baton-hub serve still runs after {limit:?}"));
        self.child = None;
        status
    }

    /// Starts `serve` again on the same address, without a crash point (SIGKILLs it first if
    /// it still runs).
    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.kill9();
        }
        self.serve(None);
    }

    /// The stderr of every `serve` run so far.
    pub fn serve_logs(&self) -> String {
        (1..=self.runs).map(|r| fs::read_to_string(self.log_path(r)).unwrap_or_default()).collect()
    }

    /// A producer client (`prod`).
    pub fn producer(&self) -> Api {
        let id = self.hub.identity("prod");
        Api::new(&self.url(), Some(&fs::read(&id.ca).expect("ca")), Some(&id.pem()))
    }

    /// `baton-hub send` one message; returns host → delivery id.
    pub fn send(&self, conversation: &str, key: &str, to: &[&str]) -> Vec<(String, String)> {
        let to = to.join(",");
        let payload = format!("{{\"key\":\"{key}\"}}");
        let v = self.hub.cli_json([
            "send",
            "--conversation",
            conversation,
            "--to",
            &to,
            "--key",
            key,
            "--payload",
            &payload,
            "--producer",
            "prod",
            "--json",
        ]);
        v["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .map(|d| (d["host"].as_str().expect("host").into(), d["delivery_id"].as_str().expect("id").into()))
            .collect()
    }

    /// Sends one message to one host; returns its delivery id.
    pub fn send_one(&self, conversation: &str, key: &str, host: &str) -> String {
        let mut d = self.send(conversation, key, &[host]);
        assert_eq!(d.len(), 1, "one recipient, one delivery: {d:?}");
        d.remove(0).1
    }

    /// `deliveries show ID --json`, the delivery part.
    pub fn delivery(&self, id: &str) -> Value {
        self.hub.show(id)["delivery"].clone()
    }

    /// The delivery's attempts.
    pub fn attempts(&self, id: &str) -> Vec<Value> {
        self.hub.show(id)["attempts"].as_array().expect("attempts").clone()
    }

    /// Waits until the delivery has an outcome; returns the whole `deliveries show` value.
    #[track_caller]
    pub fn wait_outcome(&self, id: &str) -> Value {
        wait_for(&format!("an outcome for delivery {id}"), NODE_WAIT, || {
            let v = self.hub.show(id);
            (!v["delivery"]["outcome"].is_null()).then_some(v)
        })
    }

    /// Asserts the delivery ended with exactly one attempt of `outcome`; returns the attempt.
    #[track_caller]
    pub fn assert_one_attempt(&self, id: &str, outcome: &str) -> Value {
        let v = self.hub.show(id);
        let attempts = v["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "exactly one attempt for {id}: {v:#}");
        assert_eq!(attempts[0]["outcome"], outcome, "attempt outcome of {id}: {v:#}");
        assert_eq!(v["delivery"]["outcome"], outcome, "delivery outcome of {id}: {v:#}");
        attempts[0].clone()
    }

    /// How many times the delivery's events enter `to_state`.
    pub fn entered(&self, id: &str, to_state: &str) -> usize {
        self.hub.show(id)["events"].as_array().expect("events").iter().filter(|e| e["to_state"] == to_state).count()
    }

    /// A node for `host` (its data directory is `SCRATCH/host`).
    pub fn node(&self, host: &str) -> NodeBuilder<'_> {
        NodeBuilder {
            hub: self,
            identity: self.hub.identity(host).clone(),
            name: host.to_string(),
            label: host.to_string(),
            then: "true".into(),
            settings: vec![
                ("claim_wait".into(), "\"5s\"".into()),
                ("backoff_max".into(), "\"500ms\"".into()),
                ("parallel_conversations".into(), "4".into()),
            ],
            crash_point: None,
            trace_ends: false,
            env: Vec::new(),
        }
    }
}

fn wait_child(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// The execution log

/// One turn the harness command ran: `DELIVERY CONVERSATION SEQ HOST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// `BATON_DELIVERY_ID`.
    pub delivery_id: String,
    /// `BATON_CONVERSATION`.
    pub conversation: String,
    /// `BATON_SEQ`.
    pub seq: i64,
    /// The node's label (its host, or e.g. `host-a-clone`).
    pub host: String,
}

/// The file every test node's harness appends to.
pub struct ExecLog {
    path: PathBuf,
}

impl ExecLog {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every turn start so far, in append order.
    pub fn lines(&self) -> Vec<Ran> {
        self.events().into_iter().filter(|(_, end)| !end).map(|(r, _)| r).collect()
    }

    /// Every start and (with `trace_ends`) end so far, in append order; `true` for an end.
    pub fn events(&self) -> Vec<(Ran, bool)> {
        let text = fs::read_to_string(&self.path).expect("read exec log");
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let end = match f.get(4) {
                    None => false,
                    Some(&"end") if f.len() == 5 => true,
                    _ => panic!("malformed exec log line {l:?}"),
                };
                assert!(f.len() >= 4, "malformed exec log line {l:?}");
                let ran = Ran {
                    delivery_id: f[0].into(),
                    conversation: f[1].into(),
                    seq: f[2].parse().unwrap_or_else(|_| panic!("seq in {l:?}")),
                    host: f[3].into(),
                };
                (ran, end)
            })
            .collect()
    }

    /// Asserts that each (host, conversation) ran its turns one at a time (each start is
    /// followed by its own end before the next start) in increasing `seq`.
    #[track_caller]
    pub fn assert_one_at_a_time_in_order(&self) {
        let mut last: HashMap<(String, String), (i64, bool)> = HashMap::new();
        for (r, end) in self.events() {
            let key = (r.host.clone(), r.conversation.clone());
            let prev = last.insert(key, (r.seq, end));
            match (prev, end) {
                (None, false) => {}
                (Some((p, true)), false) => {
                    assert!(p < r.seq, "{} started {} #{} after #{p}", r.host, r.conversation, r.seq)
                }
                (Some((p, false)), true) => {
                    assert_eq!(p, r.seq, "{} ended {} #{} while #{p} ran", r.host, r.conversation, r.seq)
                }
                (prev, _) => panic!("{} {} #{} (end: {end}) after {prev:?}: overlap", r.host, r.conversation, r.seq),
            }
        }
    }

    /// How many times the delivery ran.
    pub fn runs_of(&self, delivery_id: &str) -> usize {
        self.lines().iter().filter(|r| r.delivery_id == delivery_id).count()
    }

    /// Waits until the delivery ran at least once.
    #[track_caller]
    pub fn wait_ran(&self, delivery_id: &str) {
        wait_for(&format!("delivery {delivery_id} to run"), NODE_WAIT, || (self.runs_of(delivery_id) > 0).then_some(()))
    }
}

// ---------------------------------------------------------------------------------------------
// Nodes

/// How to start one node.
pub struct NodeBuilder<'a> {
    hub: &'a TestHub,
    identity: Identity,
    name: String,
    label: String,
    then: String,
    settings: Vec<(String, String)>,
    crash_point: Option<String>,
    trace_ends: bool,
    env: Vec<(String, String)>,
}

impl NodeBuilder<'_> {
    /// An extra environment variable for every run (`LD_PRELOAD` for the power-loss tests).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// The harness also logs `DELIVERY CONVERSATION SEQ HOST end` when its work is done.
    pub fn trace_ends(mut self) -> Self {
        self.trace_ends = true;
        self
    }

    /// Another data directory (`SCRATCH/name`) and exec-log label for the same certificate.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self.label = name.to_string();
        self
    }

    /// Shell run by the harness after it logged the turn and before it echoes its result.
    pub fn then(mut self, script: &str) -> Self {
        self.then = script.to_string();
        self
    }

    /// Sets a config key; `toml_value` is TOML (`"\"1s\""`, `4`).
    pub fn set(mut self, key: &str, toml_value: &str) -> Self {
        self.settings.retain(|(k, _)| k != key);
        self.settings.push((key.to_string(), toml_value.to_string()));
        self
    }

    /// Arms `BATON_CRASH_POINT` for the first run.
    pub fn crash_point(mut self, point: &str) -> Self {
        self.crash_point = Some(point.to_string());
        self
    }

    /// Writes the config and starts `baton-node run`.
    pub fn start(self) -> NodeProc {
        let dir = self.hub.scratch(&format!("node-{}", self.name));
        let data_dir = dir.join("data");
        let pids = dir.join("harness.pids");
        let log = self.hub.exec_log.path();
        // The harness: logs the turn first (one short `echo >>`, atomic), records its process
        // group so the test can reap what a killed node left behind, then does `then`.
        let line = format!("$BATON_DELIVERY_ID $BATON_CONVERSATION $BATON_SEQ {}", self.label);
        let end = if self.trace_ends { format!("echo \"{line} end\" >> '{}'", log.display()) } else { String::new() };
        let script = format!(
            "echo \"{line}\" >> '{log}'\n\
             echo $$ >> '{pids}'\n\
             {then}\n\
             {end}\n\
             echo \"ran $BATON_DELIVERY_ID\"\n",
            log = log.display(),
            pids = pids.display(),
            then = self.then,
        );
        let command = vec!["sh".to_string(), "-c".to_string(), script];
        let s = |v: &str| serde_json::to_string(v).expect("json string");
        let p = |p: &Path| s(&p.display().to_string());
        let mut toml = format!(
            "hub_url = {}\nca_file = {}\ncert_file = {}\nkey_file = {}\ndata_dir = {}\ncommand = {}\n",
            s(&self.hub.url()),
            p(&self.identity.ca),
            p(&self.identity.cert),
            p(&self.identity.key),
            p(&data_dir),
            serde_json::to_string(&command).expect("json array"),
        );
        for (k, v) in &self.settings {
            toml.push_str(&format!("{k} = {v}\n"));
        }
        let config = dir.join("node.toml");
        fs::write(&config, toml).expect("write node.toml");
        let mut node =
            NodeProc { config, data_dir, dir, pids, runs: 0, child: None, exec_log: log.to_path_buf(), env: self.env };
        node.spawn(self.crash_point.as_deref());
        node
    }
}

/// One node instance: a data directory and, while it runs, its `baton-node run` process.
pub struct NodeProc {
    config: PathBuf,
    data_dir: PathBuf,
    dir: PathBuf,
    pids: PathBuf,
    exec_log: PathBuf,
    runs: u32,
    child: Option<Child>,
    env: Vec<(String, String)>,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.reap_harness_groups();
        if std::thread::panicking() {
            for run in 1..=self.runs {
                eprintln!(
                    "----- baton-node {} run {run} stderr (tail) -----\n{}",
                    self.data_dir.display(),
                    tail(&self.run_log(run), 80)
                );
            }
        }
    }
}

impl NodeProc {
    fn log_path(&self, run: u32) -> PathBuf {
        self.dir.join(format!("node-{run}.stderr"))
    }

    fn run_log(&self, run: u32) -> String {
        fs::read_to_string(self.log_path(run)).unwrap_or_default()
    }

    fn spawn(&mut self, crash_point: Option<&str>) {
        assert!(self.child.is_none(), "the node is already running");
        self.runs += 1;
        let mut cmd = scrubbed(&node_bin());
        cmd.arg("run").arg("--config").arg(&self.config);
        if let Some(p) = crash_point {
            cmd.env("BATON_CRASH_POINT", p);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdout(fs::File::create(self.dir.join(format!("node-{}.stdout", self.runs))).expect("stdout log"));
        cmd.stderr(fs::File::create(self.log_path(self.runs)).expect("stderr log"));
        self.child = Some(cmd.spawn().expect("spawn baton-node run"));
    }

    /// The stderr of every run so far, concatenated.
    pub fn logs(&self) -> String {
        (1..=self.runs).map(|r| self.run_log(r)).collect()
    }

    /// The stderr of the current (latest) run.
    pub fn log(&self) -> String {
        self.run_log(self.runs)
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().expect("try_wait").is_none())
    }

    /// Waits up to `limit` for the node to exit on its own; reaps it.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let status = wait_child(self.child.as_mut().expect("the node is not running"), limit)?;
        self.child = None;
        Some(status)
    }

    /// Waits for an exit by a crash point: not a success, and the crash point named in stderr.
    #[track_caller]
    pub fn wait_crash(&mut self, point: &str) {
        let status = self
            .wait_exit(NODE_WAIT)
            .unwrap_or_else(|| panic!("baton-node did not reach crash point {point} within {NODE_WAIT:?}"));
        assert!(aborted(status), "baton-node exited {status}, not by abort, at {point}");
        let log = self.log();
        assert!(log.contains(&format!("crash point {point} reached")), "stderr does not name {point}:\n{log}");
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the node is not running");
        let _ = child.kill();
        child.wait().expect("wait")
    }

    /// `kill -TERM PID`, then waits (up to `NODE_WAIT`) for the exit and returns its status.
    #[track_caller]
    pub fn term(&mut self) -> ExitStatus {
        self.signal("TERM")
    }

    /// `kill -SIG PID` (`"TERM"`, `"INT"`), then waits (up to `NODE_WAIT`) for the exit.
    #[track_caller]
    pub fn signal(&mut self, sig: &str) -> ExitStatus {
        let pid = self.child.as_ref().expect("the node is not running").id();
        let st = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().expect("run kill");
        assert!(st.success(), "kill -{sig} {pid} failed");
        self.wait_exit(NODE_WAIT).unwrap_or_else(|| panic!("baton-node did not exit within {NODE_WAIT:?} of SIG{sig}"))
    }

    /// The node's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Drops the extra environment for later runs.
    pub fn clear_env(&mut self) {
        self.env.clear();
    }

    /// Starts the same instance again (same data directory), without a crash point.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.kill9();
        }
        self.spawn(None);
    }

    /// A `baton-node run` command for this node's config, to start a second process by hand.
    pub fn second_run_command(&self) -> Command {
        let mut cmd = scrubbed(&node_bin());
        cmd.arg("run").arg("--config").arg(&self.config);
        cmd
    }

    /// Starts the same instance again with `BATON_CRASH_POINT` armed.
    pub fn restart_with(&mut self, crash_point: &str) {
        if self.child.is_some() {
            self.kill9();
        }
        self.spawn(Some(crash_point));
    }

    /// Waits until the current run's stderr contains `text`.
    #[track_caller]
    pub fn wait_log(&self, text: &str) {
        wait_for(&format!("baton-node to log {text:?}"), NODE_WAIT, || self.log().contains(text).then_some(()))
    }

    /// `baton-node status --data-dir D [ARGS]`.
    pub fn status_output(&self, json: bool) -> Output {
        node_status(&self.data_dir, json)
    }

    /// `baton-node status --data-dir D --json`, asserting exit 0.
    #[track_caller]
    pub fn status(&self) -> Value {
        let out = self.status_output(true);
        assert!(out.status.success(), "status exited {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    /// Waits until the node holds nothing open locally: nothing queued, running or unreported.
    #[track_caller]
    pub fn wait_idle(&self) -> Value {
        wait_for("the node to hold nothing open", NODE_WAIT, || {
            let s = self.status();
            let empty = |k: &str| s[k].as_array().is_some_and(|a| a.is_empty());
            (empty("open") && empty("running") && empty("awaiting_report")).then_some(s)
        })
    }

    /// Kills (SIGKILL, by process group) the harness processes this node started that still
    /// run: a node that was SIGKILLed or aborted leaves them behind.
    fn reap_harness_groups(&self) {
        let Ok(text) = fs::read_to_string(&self.pids) else { return };
        let marker = self.exec_log.display().to_string();
        for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            // Only a process that still is our harness (its command line names our exec log).
            let is_ours = fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker.as_str()));
            if is_ours {
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
            }
        }
    }
}

/// `baton-node status --data-dir D [--json]`.
pub fn node_status(data_dir: &Path, json: bool) -> Output {
    let mut cmd = scrubbed(&node_bin());
    cmd.arg("status").arg("--data-dir").arg(data_dir);
    if json {
        cmd.arg("--json");
    }
    output_within(cmd, EVENT_WAIT)
}

/// Whether process `pid` is gone (a zombie waiting for its reaper counts as gone).
pub fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}
