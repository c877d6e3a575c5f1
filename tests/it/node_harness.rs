//! Node-side fixtures for the end-to-end tests: real `baton-node run` processes (through the
//! test kit's `Node`), the execution log their harness command appends to, and the hub views a
//! node test asks for (outcomes, attempts, events).
//!
//! - `Hub::node_process(host)` builds one node for the hub's enrolled `host`; `NodeProc` is one
//!   `baton-node run --config F` process for one data directory (= one instance). `kill9`,
//!   `term` and `restart` keep the data directory; its log holds every run (the kit prints it
//!   when a test fails).
//! - `ExecLog` is the file the test harness command appends `DELIVERY CONVERSATION SEQ HOST`
//!   to, one `echo >>` per turn (atomic for a short line), before anything else it does.
//!
//! Processes are reaped in `Drop`, and so are harness process groups a node left behind.

use crate::harness::{Hub, bins};
use baton_testkit::{Harness, NodeConfig, Signal};
use serde_json::Value;
use std::collections::HashMap;
use std::fs;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::time::Duration;

/// How long a test waits for a node-side event (a turn, a report, an exit): generous, since a
/// shared 2-core machine under a parallel build can stall a process for many seconds.
pub const NODE_WAIT: Duration = Duration::from_secs(90);

/// Polls `f` until it returns `Some`, failing the test after `limit`.
#[track_caller]
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    match baton_testkit::wait::until(what, limit, || Ok(f())) {
        Ok(v) => v,
        Err(e) => panic!("{e:#}"),
    }
}

/// Whether `status` is a death by SIGABRT (what a crash point's `abort()` leaves).
pub fn aborted(status: ExitStatus) -> bool {
    status.signal() == Some(Signal::SIGABRT as i32)
}

// ---------------------------------------------------------------------------------------------
// The hub, as node tests see it

impl Hub {
    /// `baton-hub send` one message; returns host → delivery id.
    pub fn send(&self, conversation: &str, key: &str, to: &[&str]) -> Vec<(String, String)> {
        let to = to.join(",");
        let payload = format!("{{\"key\":\"{key}\"}}");
        let v = self.cli_json([
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
        self.show(id)["delivery"].clone()
    }

    /// The delivery's attempts.
    pub fn attempts(&self, id: &str) -> Vec<Value> {
        self.show(id)["attempts"].as_array().expect("attempts").clone()
    }

    /// Waits until the delivery has an outcome; returns the whole `deliveries show` value.
    #[track_caller]
    pub fn wait_outcome(&self, id: &str) -> Value {
        wait_for(&format!("an outcome for delivery {id}"), NODE_WAIT, || {
            let v = self.show(id);
            (!v["delivery"]["outcome"].is_null()).then_some(v)
        })
    }

    /// Asserts the delivery ended with exactly one attempt of `outcome`; returns the attempt.
    #[track_caller]
    pub fn assert_one_attempt(&self, id: &str, outcome: &str) -> Value {
        let v = self.show(id);
        let attempts = v["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "exactly one attempt for {id}: {v:#}");
        assert_eq!(attempts[0]["outcome"], outcome, "attempt outcome of {id}: {v:#}");
        assert_eq!(v["delivery"]["outcome"], outcome, "delivery outcome of {id}: {v:#}");
        attempts[0].clone()
    }

    /// How many times the delivery's events enter `to_state`.
    pub fn entered(&self, id: &str, to_state: &str) -> usize {
        self.show(id)["events"].as_array().expect("events").iter().filter(|e| e["to_state"] == to_state).count()
    }

    /// A real `baton-node` for `host` (its data directory is `SCRATCH/node-host/data`).
    pub fn node_process(&self, host: &str) -> NodeBuilder<'_> {
        NodeBuilder {
            hub: self,
            host: host.to_string(),
            name: host.to_string(),
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
    /// Creates the (empty) log at `path`.
    pub fn create(path: &Path) -> ExecLog {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).expect("exec log dir");
        }
        fs::write(path, "").expect("create exec log");
        ExecLog { path: path.to_path_buf() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Prints the log (when a test fails), unless it is empty.
    pub fn print(&self) {
        let text = fs::read_to_string(&self.path).unwrap_or_default();
        if !text.is_empty() {
            eprintln!("----- exec log -----\n{text}");
        }
    }

    /// Every turn start so far, in append order.
    pub fn lines(&self) -> Vec<Ran> {
        self.events().into_iter().filter(|(_, end)| !end).map(|(r, _)| r).collect()
    }

    /// Every start and (with `trace_ends`) end so far, in append order; `true` for an end.
    pub fn events(&self) -> Vec<(Ran, bool)> {
        let text = fs::read_to_string(&self.path).expect("read exec log");
        // A harness may be writing its line right now: only lines with their newline are whole.
        let whole = text.rfind('\n').map_or("", |i| &text[..i]);
        whole
            .lines()
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
    hub: &'a Hub,
    /// The enrolled host whose certificate the node presents.
    host: String,
    /// Its data directory (`SCRATCH/node-NAME`) and exec-log label.
    name: String,
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

    /// Another data directory (`SCRATCH/node-name`) and exec-log label for the same certificate.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
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
        let pids = dir.join("harness.pids");
        let log = self.hub.exec_log().path();
        // The harness: logs the turn first (one short `echo >>`, atomic), records its process
        // group so the test can reap what a killed node left behind, then does `then`.
        let line = format!("$BATON_DELIVERY_ID $BATON_CONVERSATION $BATON_SEQ {}", self.name);
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
        let harness = Harness::Command(vec!["sh".to_string(), "-c".to_string(), script]);
        let mut config = NodeConfig::new(&self.hub.url(), self.hub.identity(&self.host), &dir.join("data"), harness);
        for (k, v) in &self.settings {
            config = config.set(k, v);
        }
        let mut node =
            baton_testkit::Node::create(bins(), &dir, &self.name, &config).unwrap_or_else(|e| panic!("{e:#}"));
        for (k, v) in &self.env {
            node.set_env(k, v);
        }
        node.start(self.crash_point.as_deref()).unwrap_or_else(|e| panic!("{e:#}"));
        NodeProc { node, pids, exec_log: log.to_path_buf() }
    }
}

/// One node instance: a data directory and, while it runs, its `baton-node run` process.
pub struct NodeProc {
    node: baton_testkit::Node,
    pids: PathBuf,
    exec_log: PathBuf,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        // The node first, so it starts no new harness while its groups are reaped.
        let _ = self.node.proc_mut().kill();
        self.reap_harness_groups();
    }
}

impl NodeProc {
    /// The stderr of every run so far.
    pub fn logs(&self) -> String {
        self.node.proc().stderr_all()
    }

    /// The stderr of the current (latest) run.
    pub fn log(&self) -> String {
        self.node.proc().stderr()
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        self.node.proc_mut().running()
    }

    /// Waits up to `limit` for the node to exit on its own; reaps it.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.node.proc_mut().wait_exit(limit).expect("wait for baton-node")
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

    /// SIGTERM, then waits (up to `NODE_WAIT`) for the exit and returns its status.
    #[track_caller]
    pub fn term(&mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM)
    }

    /// Sends `sig` (`SIGTERM`, `SIGINT`), then waits (up to `NODE_WAIT`) for the exit.
    #[track_caller]
    pub fn signal(&mut self, sig: Signal) -> ExitStatus {
        self.node.proc().signal(sig).unwrap_or_else(|e| panic!("{e:#}"));
        self.wait_exit(NODE_WAIT).unwrap_or_else(|| panic!("baton-node did not exit within {NODE_WAIT:?} of {sig}"))
    }

    /// Sends `sig` (`SIGSTOP`, `SIGCONT`) and returns at once.
    #[track_caller]
    pub fn signal_only(&self, sig: Signal) {
        self.node.proc().signal(sig).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// The node's data directory.
    pub fn data_dir(&self) -> &Path {
        self.node.data_dir()
    }

    /// Drops the extra environment for later runs.
    pub fn clear_env(&mut self) {
        self.node.clear_env();
    }

    /// Starts the same instance again (same data directory), without a crash point.
    pub fn restart(&mut self) {
        self.node.proc_mut().kill().expect("kill baton-node");
        self.node.start(None).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// A `baton-node run` command for this node's config, to start a second process by hand.
    pub fn second_run_command(&self) -> Command {
        self.node.run_command()
    }

    /// Starts the same instance again with `BATON_CRASH_POINT` armed.
    pub fn restart_with(&mut self, crash_point: &str) {
        self.node.proc_mut().kill().expect("kill baton-node");
        self.node.start(Some(crash_point)).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Waits until the current run's stderr contains `text`.
    #[track_caller]
    pub fn wait_log(&self, text: &str) {
        wait_for(&format!("baton-node to log {text:?}"), NODE_WAIT, || self.log().contains(text).then_some(()))
    }

    /// Waits until the current run's stderr contains `text` at least `n` times; returns the
    /// count.
    #[track_caller]
    pub fn wait_log_count(&self, text: &str, n: usize) -> usize {
        wait_for(&format!("baton-node to log {text:?} {n} times"), NODE_WAIT, || {
            let count = self.log().matches(text).count();
            (count >= n).then_some(count)
        })
    }

    /// `baton-node status --data-dir D [--json]`.
    pub fn status_output(&self, json: bool) -> Output {
        self.node.status(json).unwrap_or_else(|e| panic!("{e:#}"))
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
                let _ = baton_testkit::proc::signal_group(pid, Signal::SIGKILL);
            }
        }
    }
}

/// `baton-node status --data-dir D [--json]`.
pub fn node_status(data_dir: &Path, json: bool) -> Output {
    baton_testkit::node::status(bins(), data_dir, json).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Whether process `pid` is gone (a zombie waiting for its reaper counts as gone).
pub fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

// ---------------------------------------------------------------------------------------------
// Long turns that record the signals they get

/// The whole lines of `path` (none when it does not exist): a harness may be writing one now.
pub fn lines(path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |i| &text[..i]);
    whole.lines().map(str::to_string).collect()
}

/// A harness body that writes its pid to `SIGNALS.pid`, appends `started`, then `tick` every
/// 0.1 s for 60 s, and `TERM` to `signals` when it gets SIGTERM; `on_term` is what it does
/// then (`exit 143`, or `:` to ignore it). Its output goes to a file: once a killed node's
/// pipes have no reader, the shell's own "Terminated" line about its `sleep` would end it by
/// SIGPIPE before the trap could run.
pub fn long_turn(signals: &Path, on_term: &str) -> String {
    format!(
        "exec >> \"{s}.out\" 2>&1\n\
         echo $$ > \"{s}.pid\"\n\
         trap 'echo TERM >> \"{s}\"; {on_term}' TERM\n\
         echo started >> \"{s}\"\n\
         i=0; while [ $i -lt 600 ]; do echo tick >> \"{s}\"; sleep 0.1; i=$((i+1)); done",
        s = signals.display()
    )
}

/// Waits until a `long_turn` started; returns its pid (its process group).
#[track_caller]
pub fn wait_started(signals: &Path) -> u32 {
    wait_for("the turn to start", NODE_WAIT, || {
        lines(signals).contains(&"started".to_string()).then_some(())?;
        fs::read_to_string(signals.with_extension("pid")).ok()?.trim().parse().ok()
    })
}
