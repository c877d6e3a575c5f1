//! `Proc`: one restartable child process (a hub's `serve`, one node) and its logs.
//!
//! Each run's stdout and stderr are appended to `DIR/STEM.stdout` and `DIR/STEM.log`; the
//! offsets where a run starts are remembered, so the current run's output and the whole
//! history both stay readable after restarts. A dropped `Proc` stops its child (SIGKILL, or
//! SIGTERM first with `set_drop_grace`) and reaps it; when the drop happens because a test
//! panics, the end of both files is printed, so a CI failure shows what the process said.
//!
//! Invariant: a child is in `LIVE` from its spawn until it is reaped, so `stop_all_on_signal`
//! can stop what `Drop` will not reach when the whole program is signalled.

use crate::bins::EXIT_POLL;
use anyhow::{Context, anyhow, bail};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;

/// Lines of the log printed when a test panics while the `Proc` is alive.
const PANIC_TAIL_LINES: usize = 80;
/// Lines of the log quoted in the error when a process exited early.
const ERROR_TAIL_LINES: usize = 20;
/// How long `stop_all_on_signal` gives the children between SIGTERM and SIGKILL.
const SIGNAL_STOP_GRACE: Duration = Duration::from_secs(2);

/// Process ids of the children started and not yet reaped.
static LIVE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn live(f: impl FnOnce(&mut BTreeSet<u32>)) {
    if let Ok(mut set) = LIVE.lock() {
        f(&mut set);
    }
}

fn pid_of(pid: u32) -> anyhow::Result<Pid> {
    Ok(Pid::from_raw(i32::try_from(pid).map_err(|_| anyhow!("pid {pid} is out of range"))?))
}

/// Sends `sig` to every process of the process group `pgid` (a harness command runs in its
/// own group, which a killed node can leave behind).
pub fn signal_group(pgid: u32, sig: Signal) -> anyhow::Result<()> {
    nix::sys::signal::killpg(pid_of(pgid)?, sig).with_context(|| format!("killpg({pgid}, {sig})"))
}

/// Waits for SIGINT or SIGTERM to this program, then stops every child a `Proc` started that is
/// still alive (SIGTERM, then SIGKILL after two seconds) and exits with status 130. `Drop` does
/// not run when a program is signalled, so a program that starts children (the benchmark)
/// spawns this on its runtime at start; `who` prefixes the one line it prints.
pub async fn stop_all_on_signal(who: &str) {
    let Ok(token) = baton_shared::signal::shutdown_token() else { return };
    token.cancelled().await;
    let _ = writeln!(std::io::stderr(), "{who}: interrupted; stopping the hub and nodes");
    let pids: Vec<u32> = LIVE.lock().map(|s| s.iter().copied().collect()).unwrap_or_default();
    for sig in [Signal::SIGTERM, Signal::SIGKILL] {
        for pid in &pids {
            if let Ok(p) = pid_of(*pid) {
                let _ = nix::sys::signal::kill(p, sig);
            }
        }
        if sig == Signal::SIGTERM {
            tokio::time::sleep(SIGNAL_STOP_GRACE).await;
        }
    }
    std::process::exit(130);
}

/// One restartable child process and its log files.
#[derive(Debug)]
pub struct Proc {
    /// Names the process in messages and its log files.
    stem: String,
    stdout: PathBuf,
    stderr: PathBuf,
    /// (stdout offset, stderr offset) where each run's output starts.
    runs: Vec<(u64, u64)>,
    child: Option<Child>,
    /// How the latest run ended, once it was reaped.
    status: Option<ExitStatus>,
    /// SIGTERM and this long before SIGKILL when dropped; zero kills at once.
    drop_grace: Duration,
}

impl Proc {
    /// A process slot named `stem` whose runs append to `dir/STEM.stdout` and `dir/STEM.log`
    /// (stderr). Nothing runs until `spawn`.
    pub fn new(dir: &Path, stem: &str) -> Proc {
        Proc {
            stem: stem.to_string(),
            stdout: dir.join(format!("{stem}.stdout")),
            stderr: dir.join(format!("{stem}.log")),
            runs: Vec::new(),
            child: None,
            status: None,
            drop_grace: Duration::ZERO,
        }
    }

    /// Starts a new run of `cmd` with stdin empty and output appended to the log files. Fails
    /// when the previous run is still alive.
    pub fn spawn(&mut self, mut cmd: Command) -> anyhow::Result<()> {
        if self.running() {
            bail!("{} is already running", self.stem);
        }
        let open =
            |p: &Path| OpenOptions::new().create(true).append(true).open(p).with_context(|| p.display().to_string());
        let (mut out, mut err) = (open(&self.stdout)?, open(&self.stderr)?);
        if !self.runs.is_empty() {
            writeln!(err, "----- {} run {} -----", self.stem, self.runs.len() + 1)?;
        }
        let offsets = (out.seek(SeekFrom::End(0))?, err.seek(SeekFrom::End(0))?);
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
        live(|s| {
            s.insert(child.id());
        });
        self.runs.push(offsets);
        self.child = Some(child);
        self.status = None;
        Ok(())
    }

    /// The name given to `new`.
    pub fn stem(&self) -> &str {
        &self.stem
    }

    /// The process id of the current run, while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the current run is alive (a stopped process is). Reaps it when it has exited.
    pub fn running(&mut self) -> bool {
        matches!(self.try_reap(), Ok(None)) && self.child.is_some()
    }

    /// Fails, quoting the end of the log, when the current run has exited or never started.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if self.running() {
            return Ok(());
        }
        let how = self.status.map_or_else(|| "never started".to_string(), |s| format!("exited early ({s})"));
        bail!("{} {how}; end of {}:\n{}", self.stem, self.stderr.display(), tail(&self.stderr(), ERROR_TAIL_LINES))
    }

    /// Sends `sig` to the current run. Fails when it is not running.
    pub fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow!("{} is not running", self.stem))?;
        nix::sys::signal::kill(pid_of(pid)?, sig).with_context(|| format!("kill({pid}, {sig}) for {}", self.stem))
    }

    /// Reaps the current run if it has exited; returns how it ended (also when it was reaped
    /// before), or `None` while it runs.
    fn try_reap(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else { return Ok(self.status) };
        let Some(status) = child.try_wait()? else { return Ok(None) };
        let pid = child.id();
        live(|s| {
            s.remove(&pid);
        });
        self.child = None;
        self.status = Some(status);
        Ok(Some(status))
    }

    /// Waits up to `limit` for the current run to exit on its own and reaps it. `None` when it
    /// still runs; fails when nothing was ever started.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<Option<ExitStatus>> {
        if self.runs.is_empty() {
            bail!("{} was never started", self.stem);
        }
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_reap()? {
                return Ok(Some(status));
            }
            if start.elapsed() >= limit {
                return Ok(None);
            }
            std::thread::sleep(EXIT_POLL);
        }
    }

    /// SIGKILLs the current run if it is alive and reaps it; returns how the run ended (`None`
    /// when nothing was ever started).
    pub fn kill(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let pid = child.id();
            let status = child.wait()?;
            live(|s| {
                s.remove(&pid);
            });
            self.child = None;
            self.status = Some(status);
        }
        Ok(self.status)
    }

    /// SIGTERM, up to `grace` for the exit, then SIGKILL; returns how the run ended.
    pub fn stop(&mut self, grace: Duration) -> anyhow::Result<Option<ExitStatus>> {
        if self.running() {
            let _ = self.signal(Signal::SIGTERM);
            if let Some(status) = self.wait_exit(grace)? {
                return Ok(Some(status));
            }
            let _ = writeln!(std::io::stderr(), "{} ignored SIGTERM for {grace:?}; killing it", self.stem);
        }
        self.kill()
    }

    /// Makes `Drop` stop the process gracefully (`stop(grace)`) instead of killing it at once.
    pub fn set_drop_grace(&mut self, grace: Duration) {
        self.drop_grace = grace;
    }

    /// The stdout of the current run.
    pub fn stdout(&self) -> String {
        read_from(&self.stdout, self.runs.last().map_or(0, |r| r.0))
    }

    /// The stderr (the log) of the current run.
    pub fn stderr(&self) -> String {
        read_from(&self.stderr, self.runs.last().map_or(0, |r| r.1))
    }

    /// The stderr of every run so far, each later run after a `----- STEM run N -----` line.
    pub fn stderr_all(&self) -> String {
        read_from(&self.stderr, 0)
    }

    /// The file holding every run's stderr.
    pub(crate) fn log_path(&self) -> &Path {
        &self.stderr
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = if self.drop_grace.is_zero() { self.kill() } else { self.stop(self.drop_grace) };
        if std::thread::panicking() {
            let _ = write!(std::io::stderr(), "{}", self.failure_report());
        }
    }
}

impl Proc {
    /// What a failing test shows of this process: the end of its stdout and of its log, each
    /// under a line naming the file (nothing for an empty file).
    fn failure_report(&self) -> String {
        let mut report = String::new();
        for path in [&self.stdout, &self.stderr] {
            let text = read_from(path, 0);
            if !text.is_empty() {
                let shown = tail(&text, PANIC_TAIL_LINES);
                let header = format!("----- {} (last {PANIC_TAIL_LINES} lines of {}) -----", self.stem, path.display());
                report.push_str(&format!("{header}\n{shown}\n"));
            }
        }
        report
    }
}

/// The text of `path` from byte `offset` on (empty when it cannot be read).
fn read_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = File::open(path)
        && f.seek(SeekFrom::Start(offset)).is_ok()
    {
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    /// Whether `pid` is gone (reaped, or a zombie nobody reaped yet).
    fn gone(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
    }

    /// Waits until the script said its trap is set.
    fn ready(p: &Proc) {
        crate::wait::until("the trap", Duration::from_secs(20), || Ok(p.stderr().contains("ready").then_some(())))
            .unwrap();
    }

    #[test]
    fn each_run_appends_and_the_current_run_reads_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::new(dir.path(), "p");
        for run in 1..=2 {
            p.spawn(sh(&format!("echo out{run}; echo err{run} >&2"))).unwrap();
            let status = p.wait_exit(Duration::from_secs(20)).unwrap().expect("exited");
            assert!(status.success());
            assert_eq!((p.stdout(), p.stderr()), (format!("out{run}\n"), format!("err{run}\n")));
        }
        assert_eq!(p.stderr_all(), "err1\n----- p run 2 -----\nerr2\n");
        assert_eq!(std::fs::read_to_string(dir.path().join("p.stdout")).unwrap(), "out1\nout2\n");
        assert_eq!(p.log_path(), dir.path().join("p.log"));
    }

    #[test]
    fn a_failing_test_is_shown_the_end_of_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::new(dir.path(), "chatty");
        assert_eq!(p.failure_report(), "", "nothing ran, nothing to show");
        p.spawn(sh("echo listening; i=0; while [ $i -lt 100 ]; do echo line-$i >&2; i=$((i+1)); done")).unwrap();
        p.wait_exit(Duration::from_secs(20)).unwrap().expect("exited");
        let report = p.failure_report();
        assert!(report.contains(&format!("chatty (last {PANIC_TAIL_LINES} lines of {}", p.stdout.display())));
        assert!(report.contains("listening\n"), "{report}");
        assert!(report.contains("line-99\n") && report.contains("line-20\n"), "{report}");
        assert!(!report.contains("line-19\n"), "only the last {PANIC_TAIL_LINES} lines: {report}");
    }

    #[test]
    fn a_running_process_is_not_started_twice_and_is_killed_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::new(dir.path(), "sleeper");
        assert!(p.wait_exit(Duration::ZERO).is_err(), "never started");
        p.spawn(sh("sleep 60")).unwrap();
        assert!(p.running());
        assert!(p.spawn(sh("true")).is_err(), "a second run while the first is alive");
        assert_eq!(p.wait_exit(Duration::from_millis(50)).unwrap(), None);
        let pid = p.pid().unwrap();
        let status = p.kill().unwrap().expect("it ran");
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
        assert!(gone(pid) && !p.running() && p.pid().is_none());
        let err = p.check_running().unwrap_err().to_string();
        assert!(err.contains("sleeper exited early"), "{err}");
    }

    #[test]
    fn signals_reach_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::new(dir.path(), "trap");
        p.spawn(sh("trap 'echo got-term >&2; exit 7' TERM; echo ready >&2; while :; do sleep 0.05; done")).unwrap();
        ready(&p);
        p.signal(Signal::SIGTERM).unwrap();
        let status = p.wait_exit(Duration::from_secs(20)).unwrap().expect("exited on SIGTERM");
        assert_eq!(status.code(), Some(7));
        assert!(p.stderr().contains("got-term"), "{}", p.stderr());
        assert!(p.signal(Signal::SIGTERM).is_err(), "nothing runs any more");
    }

    #[test]
    fn drop_kills_at_once_or_after_a_graceful_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Proc::new(dir.path(), "hard");
        p.spawn(sh("sleep 60")).unwrap();
        let pid = p.pid().unwrap();
        drop(p);
        assert!(gone(pid), "a dropped Proc leaves no process behind");

        let mut p = Proc::new(dir.path(), "soft");
        p.set_drop_grace(Duration::from_secs(20));
        p.spawn(sh("trap 'echo stopped-cleanly >&2; exit 0' TERM; echo ready >&2; while :; do sleep 0.05; done"))
            .unwrap();
        ready(&p);
        let pid = p.pid().unwrap();
        drop(p);
        assert!(gone(pid));
        let log = std::fs::read_to_string(dir.path().join("soft.log")).unwrap();
        assert!(log.contains("stopped-cleanly"), "SIGTERM came first: {log:?}");
    }
}
