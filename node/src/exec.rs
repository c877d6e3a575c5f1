//! The executor: runs one harness turn and says how it ended.
//!
//! The configured argv runs directly (no shell) in its own process group, with the payload on
//! stdin and the delivery's ids (and the message's producer, `BATON_PRODUCER`, and its trace,
//! `TRACEPARENT`) in the environment. stdout is kept up to `result_bytes_max` and
//! the rest drained, so the child never blocks on a full pipe; stderr goes to the node's log,
//! bounded, and its last `stderr_tail_bytes` go with the attempt's report (`tail`).
//!
//! The gate. A turn starts as `baton-node turn-gate -- ARGV…` (`Gate`), in a new process group
//! whose id is its pid. The gate reads one byte from stdin and only then becomes the harness
//! (`exec`, which keeps the pid, the group and the start time). Between `spawn` and
//! `Spawned::run`, the caller writes the start marker together with the group's
//! `ProcessIdentity` (`Db::begin_attempt`); `run` writes the release byte and then the payload.
//! So the harness cannot have any effect before its start marker and process group are on disk:
//! if the node dies before that, the gate reads end-of-file and exits without ever becoming the
//! harness, and with no start marker the turn simply runs after the restart.
//!
//! Stopping. A timeout or a shutdown sends SIGTERM to the whole group, waits up to `kill_grace`
//! for it to end, then sends SIGKILL to what is left (`nix::sys::signal::killpg`, a safe
//! wrapper, since this crate forbids `unsafe`).
//!
//! Why one file over 700 lines: one turn's life from spawn to its ending (the gate's release,
//! the pipes read while it runs, the limits that stop it, the stop itself) shares the turn's
//! private state, and every way a turn ends is decided in `Spawned::run`; a third of the file is
//! its unit tests' harness scripts. Where it splits when it grows: the stop (`Stop`, the
//! signals) from the spawn and the reading of the pipes.

use crate::group::{self, ProcessIdentity};
use crate::limits::{GROUP_POLL_PACE, PIPE_DRAIN_AFTER_EXIT, STDERR_LOG_BYTES_MAX};
use crate::progress::Sink;
use crate::store::{Ending, StartedTurn};
use crate::tail::{StderrTail, Tail};
use baton_shared::states::{Outcome, StoppedBy};
use baton_shared::traceparent::TRACEPARENT_ENV;
use nix::sys::signal::Signal;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, ChildStdin};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The reason recorded when a turn ran past `exec_timeout` starts with this word.
pub const REASON_TIMEOUT: &str = "timeout";
/// The reason recorded when a turn was stopped because the node shut down starts with this word.
pub const REASON_SHUTDOWN: &str = "shutdown";
/// The reason recorded when a running turn was cancelled starts with this word.
pub const REASON_CANCELLED: &str = "cancelled";

pub use crate::turn_gate::{CancelHandle, GATE_EXEC_FAILED_STATUS, GATE_RELEASE, GATE_SUBCOMMAND, Gate, gate};

/// How to run turns.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    /// The harness argv; the first element is the program.
    pub argv: Vec<String>,
    /// Longest a turn may run.
    pub timeout: Duration,
    /// How long a group sent SIGTERM (timeout, shutdown) may take to end before SIGKILL.
    pub kill_grace: Duration,
    /// How long a cancelled turn's group sent SIGTERM may take to end before SIGKILL.
    pub cancel_grace: Duration,
    /// Most stdout bytes kept as the result (the truncation marker included).
    pub result_bytes_max: usize,
    /// Most bytes of the end of stderr sent with the report (`stderr_tail_bytes`; 0: none).
    pub stderr_tail_bytes: usize,
    /// This node instance, given to the harness as `BATON_INSTANCE_ID`.
    pub instance_id: String,
    /// How the turn's process starts.
    pub gate: Gate,
    /// Longest progress line kept (`progress_event_bytes_max`).
    pub progress_line_bytes_max: usize,
}

/// A turn's process, spawned and held at the gate: it has done nothing yet.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    /// The process group id (= the gate's pid, and later the harness's).
    pgid: i32,
    started: Instant,
    stdin: Option<ChildStdin>,
    stdout: Option<JoinHandle<(Vec<u8>, u64)>>,
    stderr: Option<JoinHandle<Option<StderrTail>>>,
    /// The read end of the progress channel (`BATON_PROGRESS_FD`), read from the release on.
    progress: Option<tokio::net::unix::pipe::Receiver>,
}

/// Spawns the turn's process at the gate, in its own process group. Fails (as the turn's
/// ending) when the harness program cannot be found or the process cannot be spawned.
pub fn spawn(spec: &ExecSpec, turn: &StartedTurn) -> Result<Spawned, Ending> {
    let started = Instant::now();
    let cannot_start = |why: String| Ending {
        outcome: Outcome::Failed,
        exit_code: None,
        duration_ms: Some(elapsed_ms(started)),
        result: None,
        reason: Some(format!("cannot start {:?}: {why}", spec.argv.first().map_or("", String::as_str))),
        signal: None,
        stderr: None,
        stopped_by: None,
    };
    let Some(program) = spec.argv.first() else { return Err(cannot_start("the command is empty".into())) };
    if find_program(program).is_none() {
        return Err(cannot_start("no such executable file".into()));
    }
    let Some((gate, gate_args)) = spec.gate.argv().split_first() else {
        return Err(cannot_start("the gate is empty".into()));
    };
    let mut cmd = tokio::process::Command::new(gate);
    cmd.args(gate_args)
        .args(&spec.argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .env("BATON_DELIVERY_ID", &turn.delivery_id)
        .env("BATON_MESSAGE_ID", &turn.message_id)
        .env("BATON_CONVERSATION", &turn.conversation)
        .env("BATON_SEQ", turn.seq.to_string())
        .env("BATON_PRODUCER", turn.producer.as_deref().unwrap_or_default())
        .env("BATON_ATTEMPT_ID", &turn.attempt_id)
        .env("BATON_ATTEMPT", turn.run.to_string())
        .env("BATON_INSTANCE_ID", &spec.instance_id);
    // Absent on the first run, so a harness can tell a rerun by the variable alone.
    match turn.rerun {
        Some(rerun) => cmd.env("BATON_RERUN", rerun.as_str()),
        None => cmd.env_remove("BATON_RERUN"),
    };
    // The message's trace: the harness's own spans join the producer's trace. Never the node's
    // own environment's, which belongs to no turn.
    match &turn.traceparent {
        Some(tp) => cmd.env(TRACEPARENT_ENV, tp),
        None => cmd.env_remove(TRACEPARENT_ENV),
    };
    let (progress_tx, progress_rx) = tokio::net::unix::pipe::pipe()
        .map_err(|e| cannot_start(format!("opening the progress channel failed: {e}")))?;
    // Blocking for the harness: a full pipe makes its write wait, never fail.
    let progress_tx = progress_tx
        .into_blocking_fd()
        .map_err(|e| cannot_start(format!("opening the progress channel failed: {e}")))?;
    let mut child = spawn_with_progress_fd(&mut cmd, progress_tx)
        .map_err(|e| cannot_start(format!("spawning {gate:?} failed: {e}")))?;
    // The child has its own copy; ours goes with the command, so the channel ends when the
    // harness group's copies do.
    drop(cmd);
    // With process_group(0) the child leads a new group whose id is its pid.
    let Some(pgid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
        return Err(cannot_start("the spawned process has no pid".into()));
    };
    let stdout = child.stdout.take().map(|r| tokio::spawn(read_bounded(r, spec.result_bytes_max)));
    let stderr =
        child.stderr.take().map(|r| tokio::spawn(read_stderr(r, turn.delivery_id.clone(), spec.stderr_tail_bytes)));
    let stdin = child.stdin.take();
    Ok(Spawned { child, pgid, started, stdin, stdout, stderr, progress: Some(progress_rx) })
}

/// The environment variable that names the progress channel's file descriptor in the harness.
pub const PROGRESS_FD_ENV: &str = "BATON_PROGRESS_FD";
/// The progress channel's file descriptor in the harness: one digit, so every shell can name it
/// (`echo … >&3`; dash takes no larger number in a redirection).
pub const PROGRESS_FD: std::os::fd::RawFd = 3;

/// Spawns `cmd` with `write_end` at `PROGRESS_FD` in the child (put there between fork and
/// exec, without close-on-exec, so it survives the gate's `exec` into the harness), named in
/// `PROGRESS_FD_ENV`. Ours stays close-on-exec, so no other turn's spawn inherits it, and it
/// closes when `cmd` is dropped.
fn spawn_with_progress_fd(
    cmd: &mut tokio::process::Command,
    write_end: std::os::fd::OwnedFd,
) -> std::io::Result<Child> {
    use command_fds::{CommandFdExt as _, FdMapping};
    cmd.fd_mappings(vec![FdMapping { parent_fd: write_end, child_fd: PROGRESS_FD }]).map_err(std::io::Error::other)?;
    cmd.env(PROGRESS_FD_ENV, PROGRESS_FD.to_string());
    cmd.spawn()
}

/// `program` as the gate will find it: a path with a slash as it is, else the first match on
/// `PATH`; only an executable regular file counts.
fn find_program(program: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| executable(p))
}

enum Waited {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    /// Past the message's `deadline_ms` (shorter than `exec_timeout`).
    Deadline(Duration),
    /// No progress for the message's `stall_ms`.
    Stalled(Duration),
    Killed,
    Cancelled,
}

/// The reason recorded when a turn ran past its message's `deadline_ms` starts with this word.
pub const REASON_DEADLINE: &str = "deadline";
/// The reason recorded when a turn went without progress for its message's `stall_ms` starts
/// with this word.
pub const REASON_STALL: &str = "stall";

/// Waits until the turn has gone `stall` without a progress line (counted from `started`, then
/// from its last line, as `progress` saw them).
async fn stalled(stall: Duration, started: tokio::time::Instant, progress: Option<&Sink>) {
    loop {
        let last = progress.and_then(Sink::last).map_or(started, |(_, at)| at.max(started));
        let due = last + stall;
        if tokio::time::Instant::now() >= due {
            return;
        }
        tokio::time::sleep_until(due).await;
    }
}

/// What a stopped turn's reason says of its progress: the last event kept and how long before
/// the stop, or that there was none.
fn last_progress(progress: Option<&Sink>) -> String {
    match progress.and_then(Sink::last) {
        Some((0, at)) => format!("last progress: none kept (a line {} before)", ago(at)),
        Some((seq, at)) => format!("last progress: event #{seq}, {} before", ago(at)),
        None => "last progress: none".to_string(),
    }
}

fn ago(at: tokio::time::Instant) -> String {
    baton_shared::duration::human(tokio::time::Instant::now().saturating_duration_since(at))
}

impl Spawned {
    /// The process group id.
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// The group's identity, to be stored before `run`.
    pub fn identity(&self) -> std::io::Result<ProcessIdentity> {
        ProcessIdentity::of_leader(self.pgid)
    }

    /// Never releases the gate: the process ends without having become the harness.
    pub async fn abandon(mut self) {
        // Only the gate is in the group, and it has not been released: nothing to be gentle with.
        group::signal_group(self.pgid, Signal::SIGKILL);
        drop(self.stdin.take());
        let _ = self.child.wait().await;
    }

    /// Releases the gate, feeds the payload, and waits for the turn to end. `kill` is cancelled
    /// when the node stops waiting (shutdown after its grace): the group is then stopped and the
    /// turn ends `failed`. A `cancel` stops the group the same way (with `cancel_grace`) and the
    /// turn ends `cancelled`.
    pub async fn run(
        mut self,
        spec: &ExecSpec,
        turn: &StartedTurn,
        kill: &CancellationToken,
        cancel: &CancelHandle,
        progress: Option<Sink>,
    ) -> Ending {
        let sink = progress.clone();
        let progress_reader =
            self.progress.take().map(|r| tokio::spawn(read_progress(r, progress, spec.progress_line_bytes_max)));
        let began = tokio::time::Instant::now();
        // The message's deadline when it is shorter than the node's own bound.
        let deadline = turn.deadline_ms.map(Duration::from_millis).filter(|d| *d < spec.timeout);
        let stall = turn.stall_ms.map(Duration::from_millis);
        let stall_watch = async {
            match stall {
                Some(stall) => stalled(stall, began, sink.as_ref()).await,
                None => std::future::pending().await,
            }
        };
        let stdin = self.stdin.take().map(|mut w| {
            let payload = turn.payload.clone().into_bytes();
            tokio::spawn(async move {
                // A harness that does not read its stdin closes the pipe: that is its business.
                // A failed release means the gate is gone; its exit status says how.
                if w.write_all(&[GATE_RELEASE]).await.is_ok() {
                    baton_shared::crash_point("node.exec.during_effect");
                    let _ = w.write_all(&payload).await;
                }
                let _ = w.shutdown().await;
            })
        });
        let waited = tokio::select! {
            r = self.child.wait() => Waited::Exited(r),
            _ = tokio::time::sleep(deadline.unwrap_or(spec.timeout)) => match deadline {
                Some(d) => Waited::Deadline(d),
                None => Waited::TimedOut,
            },
            _ = stall_watch => Waited::Stalled(stall.unwrap_or_default()),
            _ = kill.cancelled() => Waited::Killed,
            _ = cancel.requested() => Waited::Cancelled,
        };
        let mut stopped_by = None;
        let mut outcome_if_stopped = Outcome::Failed;
        let (status, stopped_for) = match waited {
            Waited::Exited(r) => (r, None),
            Waited::Cancelled => {
                let (status, how) = stop_group(self.pgid, &mut self.child, spec.cancel_grace).await;
                outcome_if_stopped = Outcome::Cancelled;
                let how = how.describe("cancel_grace", spec.cancel_grace);
                (status, Some(format!("{REASON_CANCELLED}: {}; {how}", cancel.reason())))
            }
            Waited::TimedOut => {
                let ran = ago(began);
                let (status, how) = stop_group(self.pgid, &mut self.child, spec.kill_grace).await;
                let why = format!("ran past exec_timeout ({})", humantime::format_duration(spec.timeout));
                // A message's deadline at or above the node's bound: the node's bound stopped it.
                let why = match turn.deadline_ms {
                    Some(ms) => {
                        stopped_by = Some(StoppedBy::Deadline);
                        format!("{why}, shorter than deadline_ms = {ms}, after {ran}; {}", last_progress(sink.as_ref()))
                    }
                    None => why,
                };
                (status, Some(format!("{REASON_TIMEOUT}: {why}; {}", how.describe("kill_grace", spec.kill_grace))))
            }
            Waited::Deadline(d) => {
                let (ran, last) = (ago(began), last_progress(sink.as_ref()));
                let (status, how) = stop_group(self.pgid, &mut self.child, spec.kill_grace).await;
                stopped_by = Some(StoppedBy::Deadline);
                let why = format!(
                    "ran past deadline_ms = {} after {ran}; {last}; {}",
                    d.as_millis(),
                    how.describe("kill_grace", spec.kill_grace)
                );
                (status, Some(format!("{REASON_DEADLINE}: {why}")))
            }
            Waited::Stalled(d) => {
                let (ran, last) = (ago(began), last_progress(sink.as_ref()));
                let (status, how) = stop_group(self.pgid, &mut self.child, spec.kill_grace).await;
                stopped_by = Some(StoppedBy::Stall);
                let why = format!(
                    "no progress for stall_ms = {} (ran {ran}); {last}; {}",
                    d.as_millis(),
                    how.describe("kill_grace", spec.kill_grace)
                );
                (status, Some(format!("{REASON_STALL}: {why}")))
            }
            Waited::Killed => {
                let (status, how) = stop_group(self.pgid, &mut self.child, spec.kill_grace).await;
                let why = "still running when the node shut down after shutdown_grace";
                (status, Some(format!("{REASON_SHUTDOWN}: {why}; {}", how.describe("kill_grace", spec.kill_grace))))
            }
        };
        let duration_ms = Some(elapsed_ms(self.started));
        // The harness is gone; a process it left behind may still hold the pipes open.
        let deadline = tokio::time::Instant::now() + PIPE_DRAIN_AFTER_EXIT;
        let pipes_open =
            !finished_by(&mut self.stdout, deadline).await || !finished_by(&mut self.stderr, deadline).await;
        if pipes_open {
            tracing::warn!(delivery_id = %turn.delivery_id, "the harness exited but left processes holding its output open; killing its process group");
            group::signal_group(self.pgid, Signal::SIGKILL);
        }
        let (captured, total) = match self.stdout.take() {
            Some(h) => match h.await {
                Ok(read) => read,
                Err(e) => {
                    // The reader task cannot fail short of a panic; say so rather than report an
                    // empty result as if the harness had printed nothing.
                    tracing::error!(delivery_id = %turn.delivery_id, "reading the harness's stdout failed: {e}");
                    (Vec::new(), 0)
                }
            },
            None => (Vec::new(), 0),
        };
        let stderr = match self.stderr.take() {
            Some(h) => h.await.unwrap_or_else(|e| {
                tracing::error!(delivery_id = %turn.delivery_id, "reading the harness's stderr failed: {e}");
                None
            }),
            None => None,
        };
        if let Some(h) = stdin {
            h.abort();
        }
        // The channel's last lines were read with the pipes above; a process left holding it
        // open is not waited for.
        if let Some(h) = progress_reader {
            h.abort();
        }
        let result = Some(bounded_result(&captured, total, spec.result_bytes_max));
        let signal = status.as_ref().ok().and_then(|s| s.signal());
        let (outcome, exit_code, reason) = match (stopped_for, status) {
            // A turn the node stopped is reported for that reason, whatever its status says; a
            // cancelled one with the status its process returned.
            (Some(reason), Ok(s)) if outcome_if_stopped == Outcome::Cancelled => {
                (Outcome::Cancelled, s.code(), Some(reason))
            }
            (Some(reason), _) => (outcome_if_stopped, None, Some(reason)),
            (None, Ok(s)) => match (s.code(), s.signal()) {
                (Some(0), _) => (Outcome::Succeeded, Some(0), None),
                (Some(code), _) => (Outcome::Failed, Some(code), Some(format!("exited with status {code}"))),
                (None, Some(sig)) => (Outcome::Failed, None, Some(format!("killed by signal {}", signal_name(sig)))),
                (None, None) => (Outcome::Failed, None, Some("ended without a status".into())),
            },
            (None, Err(e)) => (Outcome::Failed, None, Some(format!("waiting for the harness failed: {e}"))),
        };
        Ending { outcome, exit_code, duration_ms, result, reason, signal, stderr, stopped_by }
    }
}

/// How a group the node stopped ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Everything in it ended on SIGTERM within the grace.
    Terminated,
    /// Something still ran when the grace ended and was sent SIGKILL.
    Killed,
}

impl Stop {
    /// `grace_name` is the configuration key the grace came from.
    fn describe(self, grace_name: &str, grace: Duration) -> String {
        match self {
            Stop::Terminated => "its process group ended on SIGTERM".to_string(),
            Stop::Killed => {
                format!(
                    "its process group was killed with SIGKILL after {grace_name} ({})",
                    humantime::format_duration(grace)
                )
            }
        }
    }
}

/// Stops the group this node's child leads: SIGTERM to all of it, up to `grace` for all of it to
/// end, SIGKILL to what is left. Reaps the child.
async fn stop_group(
    pgid: i32,
    child: &mut Child,
    grace: Duration,
) -> (std::io::Result<std::process::ExitStatus>, Stop) {
    group::signal_group(pgid, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    let status = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            group::signal_group(pgid, Signal::SIGKILL);
            return (child.wait().await, Stop::Killed);
        }
    };
    // The leader ended. The rest of its group got the same SIGTERM and has what is left of the
    // grace. While any of them lives, the group id cannot be reused, so SIGKILL reaches only them.
    loop {
        let left = tokio::task::spawn_blocking(move || group::members(pgid)).await;
        match left {
            Ok(Ok(members)) if members.is_empty() => return (status, Stop::Terminated),
            Ok(Ok(_)) if tokio::time::Instant::now() >= deadline => {
                group::signal_group(pgid, Signal::SIGKILL);
                return (status, Stop::Killed);
            }
            Ok(Ok(_)) => tokio::time::sleep(GROUP_POLL_PACE).await,
            Ok(Err(e)) => {
                tracing::warn!(pgid, "cannot list the harness group ({e}); sending SIGKILL to what may be left");
                group::signal_group(pgid, Signal::SIGKILL);
                return (status, Stop::Killed);
            }
            Err(e) => {
                tracing::error!(pgid, "listing the harness group failed: {e}");
                group::signal_group(pgid, Signal::SIGKILL);
                return (status, Stop::Killed);
            }
        }
    }
}

/// Runs one turn of the no-op harness: succeeds at once with an empty result.
pub fn run_noop() -> Ending {
    Ending {
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        duration_ms: Some(0),
        result: Some(String::new()),
        reason: None,
        signal: None,
        stderr: None,
        stopped_by: None,
    }
}

async fn finished_by<T>(handle: &mut Option<JoinHandle<T>>, deadline: tokio::time::Instant) -> bool {
    match handle {
        None => true,
        Some(h) if h.is_finished() => true,
        Some(h) => tokio::time::timeout_at(deadline, async {
            while !h.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok(),
    }
}

fn elapsed_ms(since: Instant) -> u64 {
    since.elapsed().as_millis().try_into().unwrap_or(u64::MAX)
}

fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => format!("{} ({sig})", s.as_str()),
        Err(_) => format!("{sig}"),
    }
}

/// Reads the progress channel to its end, handing each line to `sink` (a line over `line_max`
/// bytes is skipped and counted, not read whole); without a sink the lines are read and
/// dropped, so a harness writing progress never blocks on a full pipe or dies of SIGPIPE.
async fn read_progress(mut r: impl AsyncRead + Unpin, sink: Option<Sink>, line_max: usize) {
    let mut line = Vec::new();
    let mut skipping = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match chunk.split_last() {
                Some((b'\n', body)) => (body, true),
                _ => (chunk, false),
            };
            if !skipping {
                if line.len() + body.len() > line_max {
                    skipping = true;
                    line.clear();
                    if let Some(s) = &sink {
                        s.too_large();
                    }
                } else {
                    line.extend_from_slice(body);
                }
            }
            if ends {
                if !skipping && let Some(s) = &sink {
                    s.line(&line);
                }
                line.clear();
                skipping = false;
            }
        }
    }
    // A last line without its newline (the harness ended mid-line) still counts.
    if !skipping
        && !line.is_empty()
        && let Some(s) = &sink
    {
        s.line(&line);
    }
}

/// Reads a pipe to its end, keeping the first `keep` bytes and counting all of them.
async fn read_bounded(mut r: impl AsyncRead + Unpin, keep: usize) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n as u64;
                let room = keep.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, total)
}

/// Copies a harness's stderr to the log line by line, up to `STDERR_LOG_BYTES_MAX` bytes, and
/// drains and counts the rest; returns its last `tail_bytes` bytes for the report.
async fn read_stderr(mut r: impl AsyncRead + Unpin, delivery_id: String, tail_bytes: usize) -> Option<StderrTail> {
    let mut tail = Tail::new(tail_bytes);
    const LINE_BYTES_MAX: usize = 4096;
    let mut logged = 0usize;
    let mut dropped = 0u64;
    let mut line = Vec::new();
    let mut buf = vec![0u8; 8 * 1024];
    let emit = |line: &mut Vec<u8>, logged: &mut usize, dropped: &mut u64| {
        if line.is_empty() {
            return;
        }
        if *logged + line.len() <= STDERR_LOG_BYTES_MAX {
            *logged += line.len();
            tracing::info!(delivery_id = %delivery_id, "harness stderr: {}", String::from_utf8_lossy(line));
        } else {
            *dropped += line.len() as u64;
        }
        line.clear();
    };
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tail.push(&buf[..n]);
        for &b in &buf[..n] {
            if b == b'\n' {
                emit(&mut line, &mut logged, &mut dropped);
            } else if line.len() < LINE_BYTES_MAX {
                line.push(b);
            } else {
                dropped += 1;
            }
        }
    }
    emit(&mut line, &mut logged, &mut dropped);
    if dropped > 0 {
        tracing::warn!(delivery_id = %delivery_id, "harness stderr: {dropped} more bytes not logged");
    }
    tail.finish()
}

/// The result body: stdout as text, at most `max` bytes. When anything was cut, a marker
/// `…[truncated N bytes]` ends it (counted inside `max`, so the hub's bound is never passed).
pub fn bounded_result(captured: &[u8], total: u64, max: usize) -> String {
    let text = String::from_utf8_lossy(captured);
    let unread = total.saturating_sub(captured.len() as u64);
    if unread == 0 && text.len() <= max {
        return text.into_owned();
    }
    let whole = text.len() as u64 + unread;
    let mut keep = floor_boundary(&text, max.min(text.len()));
    loop {
        let marker = format!("…[truncated {} bytes]", whole - keep as u64);
        if keep + marker.len() <= max {
            return format!("{}{marker}", &text[..keep]);
        }
        if keep == 0 {
            // `max` is smaller than the marker itself: keep what fits of the marker.
            return marker[..floor_boundary(&marker, max)].to_string();
        }
        keep = floor_boundary(&text, max.saturating_sub(marker.len()).min(keep - 1));
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a test waits for an event before it fails: far beyond what a loaded machine needs.
    const EVENT_WAIT: Duration = Duration::from_secs(60);

    fn turn(payload: &str) -> StartedTurn {
        StartedTurn {
            attempt_id: "att-1".into(),
            delivery_id: "del-1".into(),
            message_id: "msg-1".into(),
            conversation: "conv-a".into(),
            seq: 7,
            payload: payload.into(),
            producer: Some("prod-a".into()),
            run: 1,
            rerun: None,
            claim_token: "tok-1".into(),
            deadline_ms: None,
            stall_ms: None,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        }
    }

    fn spec(script: &str, timeout: Duration, max: usize) -> ExecSpec {
        ExecSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            timeout,
            kill_grace: Duration::from_secs(20),
            cancel_grace: Duration::from_secs(20),
            result_bytes_max: max,
            stderr_tail_bytes: 64,
            instance_id: "inst-1".into(),
            gate: Gate::shell(),
            progress_line_bytes_max: 4096,
        }
    }

    /// Spawns at the gate and runs, as the scheduler does minus the stored process record.
    async fn run_command(spec: &ExecSpec, turn: &StartedTurn, kill: &CancellationToken) -> Ending {
        match spawn(spec, turn) {
            Ok(spawned) => {
                assert_eq!(spawned.identity().unwrap().pgid, spawned.pgid());
                spawned.run(spec, turn, kill, &CancelHandle::default(), None).await
            }
            Err(ending) => ending,
        }
    }

    async fn run(script: &str) -> Ending {
        run_command(&spec(script, Duration::from_secs(20), 1024), &turn(r#"{"q":1}"#), &CancellationToken::new()).await
    }

    #[tokio::test]
    async fn exit_zero_succeeds_and_stdin_carries_the_payload() {
        let e = run("cat").await;
        assert_eq!((e.outcome, e.exit_code, e.reason), (Outcome::Succeeded, Some(0), None));
        assert_eq!(e.result.as_deref(), Some(r#"{"q":1}"#));
    }

    #[tokio::test]
    async fn environment_names_the_delivery() {
        let e = run(r#"printf '%s|%s|%s|%s|%s|%s|%s' "$BATON_DELIVERY_ID" "$BATON_MESSAGE_ID" "$BATON_CONVERSATION" "$BATON_SEQ" "$BATON_ATTEMPT_ID" "$BATON_INSTANCE_ID" "$BATON_PRODUCER""#).await;
        assert_eq!(e.result.as_deref(), Some("del-1|msg-1|conv-a|7|att-1|inst-1|prod-a"));
    }

    /// The message's trace reaches the harness as `TRACEPARENT`; a turn without one gets none,
    /// not whatever the node's own environment held.
    #[tokio::test]
    async fn the_harness_finds_the_message_s_traceparent() {
        let script = r#"printf '%s' "${TRACEPARENT-unset}""#;
        let e = run(script).await;
        assert_eq!(e.result.as_deref(), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        let spec = spec(script, EVENT_WAIT, 1024);
        let untraced = StartedTurn { traceparent: None, ..turn("{}") };
        let e = run_command(&spec, &untraced, &CancellationToken::new()).await;
        assert_eq!(e.result.as_deref(), Some("unset"));
    }

    #[tokio::test]
    async fn nonzero_exit_fails_with_its_status() {
        let e = run("echo out; echo err >&2; exit 3").await;
        assert_eq!((e.outcome, e.exit_code), (Outcome::Failed, Some(3)));
        assert_eq!(e.result.as_deref(), Some("out\n"));
        assert_eq!(e.reason.as_deref(), Some("exited with status 3"));
    }

    /// The end of stderr comes with the ending: all of it when short, else exactly its last
    /// `stderr_tail_bytes` with how many came before.
    #[tokio::test]
    async fn the_end_of_stderr_comes_with_the_ending() {
        let e = run("echo out; echo one >&2; echo two >&2; exit 3").await;
        assert_eq!(e.stderr, Some(StderrTail { text: "one\ntwo\n".into(), dropped_bytes: 0 }));
        assert_eq!(run("echo quiet").await.stderr, None, "nothing written, no tail");
        // 100,000 bytes then END: the tail (64 bytes in these tests) is its last 64.
        let e = run("head -c 100000 /dev/zero | tr '\\0' e >&2; printf END >&2; exit 1").await;
        let tail = e.stderr.expect("a tail");
        assert_eq!(tail.text, format!("{}END", "e".repeat(61)));
        assert_eq!(tail.dropped_bytes, 100_003 - 64);
    }

    #[tokio::test]
    async fn death_by_signal_is_named() {
        let e = run("kill -TERM $$").await;
        assert_eq!((e.outcome, e.exit_code), (Outcome::Failed, None));
        assert_eq!(e.reason.as_deref(), Some("killed by signal SIGTERM (15)"));
    }

    #[tokio::test]
    async fn missing_program_fails_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let not_executable = dir.path().join("harness.txt");
        std::fs::write(&not_executable, "echo hi\n").unwrap();
        let not_executable = not_executable.display().to_string();
        for program in ["/nonexistent/harness", "no-such-harness-on-path", not_executable.as_str()] {
            let s = ExecSpec { argv: vec![program.into()], ..spec("", Duration::from_secs(5), 10) };
            let e = run_command(&s, &turn("{}"), &CancellationToken::new()).await;
            assert_eq!(e.outcome, Outcome::Failed);
            assert!(e.reason.as_deref().is_some_and(|r| r.contains("cannot start")), "{program}: {e:?}");
        }
    }

    #[tokio::test]
    async fn large_stdout_is_truncated_marked_and_drained() {
        // 1 MiB of output through a 100-byte window: the child must not block on the pipe.
        let s = spec("head -c 1048576 /dev/zero | tr '\\0' x", Duration::from_secs(20), 100);
        let e = run_command(&s, &turn("{}"), &CancellationToken::new()).await;
        assert_eq!(e.outcome, Outcome::Succeeded);
        let r = e.result.unwrap();
        assert!(r.len() <= 100, "{}", r.len());
        assert!(r.starts_with("xxxx"));
        assert!(r.ends_with(&format!("…[truncated {} bytes]", 1048576 - r.find('…').unwrap())), "{r}");
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group_including_a_grandchild() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let s = spec(&script, Duration::from_millis(500), 100);
        // The deadline only keeps a broken kill from hanging the suite; the reason says why
        // the turn ended.
        let e = tokio::time::timeout(EVENT_WAIT, run_command(&s, &turn("{}"), &CancellationToken::new()))
            .await
            .expect("a timed-out turn ends");
        assert_eq!((e.outcome, e.exit_code), (Outcome::Failed, None));
        let reason = e.reason.unwrap();
        assert!(reason.starts_with(&format!("{REASON_TIMEOUT}: ran past exec_timeout")), "{reason}");
        assert!(reason.ends_with("ended on SIGTERM"), "{reason}");
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(gone(pid).await, "grandchild {pid} outlived the timeout");
    }

    #[tokio::test]
    async fn kill_token_stops_the_turn_as_shutdown() {
        let kill = CancellationToken::new();
        let k = kill.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            k.cancel();
        });
        let e = run_command(&spec("sleep 300", Duration::from_secs(60), 100), &turn("{}"), &kill).await;
        assert_eq!(e.outcome, Outcome::Failed);
        assert!(e.reason.as_deref().is_some_and(|r| r.starts_with(REASON_SHUTDOWN)), "{e:?}");
    }

    /// A cancel of a running turn whose harness exits on SIGTERM: `cancelled`, with the exit
    /// status it chose and no signal.
    #[tokio::test]
    async fn a_cancel_ends_the_turn_cancelled_with_what_the_process_returned() {
        let s = spec("trap 'exit 3' TERM; while :; do sleep 0.05; done", Duration::from_secs(60), 100);
        let spawned = spawn(&s, &turn("{}")).unwrap();
        let cancel = CancelHandle::default();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.request("wrong prompt");
        });
        let e =
            tokio::time::timeout(EVENT_WAIT, spawned.run(&s, &turn("{}"), &CancellationToken::new(), &cancel, None))
                .await
                .expect("a cancelled turn ends");
        assert_eq!((e.outcome, e.exit_code, e.signal), (Outcome::Cancelled, Some(3), None));
        assert_eq!(e.reason.as_deref(), Some("cancelled: wrong prompt; its process group ended on SIGTERM"));
        assert!(e.duration_ms.is_some());
    }

    #[tokio::test]
    async fn a_background_process_holding_stdout_does_not_hang_the_turn() {
        let e = run("sleep 300 & echo done").await;
        assert_eq!(e.outcome, Outcome::Succeeded);
        assert_eq!(e.result.as_deref(), Some("done\n"));
    }

    /// A harness that ignores SIGTERM: the timeout sends SIGTERM first (it records it and keeps
    /// going, which shows SIGKILL did not come with it), and SIGKILL only after `kill_grace`.
    #[tokio::test]
    async fn timeout_sends_sigterm_first_and_sigkill_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("signals");
        let script = format!(
            "trap 'echo TERM >> {log}' TERM; echo start >> {log}; while :; do echo tick >> {log}; sleep 0.05; done",
            log = log.display()
        );
        let s = ExecSpec { kill_grace: Duration::from_millis(500), ..spec(&script, Duration::from_millis(300), 100) };
        let e = tokio::time::timeout(EVENT_WAIT, run_command(&s, &turn("{}"), &CancellationToken::new()))
            .await
            .expect("a timed-out turn ends");
        let reason = e.reason.unwrap();
        assert!(reason.starts_with(REASON_TIMEOUT), "{reason}");
        assert!(reason.ends_with("killed with SIGKILL after kill_grace (500ms)"), "{reason}");
        let lines: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(String::from).collect();
        let term = lines.iter().position(|l| l == "TERM").expect("the harness got SIGTERM");
        assert!(lines[term..].iter().any(|l| l == "tick"), "it still ran after SIGTERM: {lines:?}");
    }

    /// The gate holds the harness until it is released: nothing the harness does happens before
    /// `run`, and an abandoned gate never becomes the harness.
    #[tokio::test]
    async fn nothing_runs_before_the_release_and_an_abandoned_gate_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let s = spec(&format!("touch {}; cat", ran.display()), Duration::from_secs(20), 100);
        let spawned = spawn(&s, &turn("{}")).unwrap();
        let id = spawned.identity().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!ran.exists(), "the harness ran before it was released");
        spawned.abandon().await;
        assert_eq!(group::left_of(&id).unwrap(), group::Left::Gone);
        assert!(!ran.exists(), "an abandoned gate became the harness");
        let e = run_command(&s, &turn(r#"{"after":"release"}"#), &CancellationToken::new()).await;
        assert_eq!(e.result.as_deref(), Some(r#"{"after":"release"}"#), "the payload follows the release byte");
        assert!(ran.exists());
    }

    /// Whether `pid` is gone (or a zombie awaiting its reaper) within `EVENT_WAIT`.
    /// Runs `script` with the message's bounds `deadline_ms` and `stall_ms` and a progress sink.
    async fn bounded(script: &str, deadline_ms: Option<u64>, stall_ms: Option<u64>) -> Ending {
        use crate::progress::{Progress, ProgressLimits};
        let limits = ProgressLimits {
            event_bytes_max: 64,
            events_per_turn_max: 100,
            events_per_second_max: 100,
            buffer_events_max: 100,
        };
        let progress = std::sync::Arc::new(Progress::new(limits));
        let t = StartedTurn { deadline_ms, stall_ms, ..turn("{}") };
        let sink = progress.start(&t.delivery_id, t.run, &t.claim_token);
        let s = ExecSpec { kill_grace: Duration::from_millis(500), ..spec(script, Duration::from_secs(60), 100) };
        let spawned = spawn(&s, &t).unwrap();
        tokio::time::timeout(
            EVENT_WAIT,
            spawned.run(&s, &t, &CancellationToken::new(), &CancelHandle::default(), Some(sink)),
        )
        .await
        .expect("a stopped turn ends")
    }

    /// Past its message's deadline (shorter than exec_timeout) a turn's whole group is stopped
    /// and it fails naming the deadline, how long it ran and its last progress; the report says
    /// the deadline stopped it.
    #[tokio::test]
    async fn a_deadline_stops_the_group_and_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("echo '{{\"step\":1}}' >&3; sleep 300 & echo $! > {}; wait", pidfile.display());
        let e = bounded(&script, Some(400), None).await;
        assert_eq!((e.outcome, e.exit_code, e.stopped_by), (Outcome::Failed, None, Some(StoppedBy::Deadline)));
        let reason = e.reason.unwrap();
        assert!(reason.starts_with("deadline: ran past deadline_ms = 400 after "), "{reason}");
        assert!(reason.contains("last progress: event #1, "), "{reason}");
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(gone(pid).await, "grandchild {pid} outlived the deadline");
        // A deadline at or past exec_timeout: the node's own bound stops it, and says so.
        let e = run_command(
            &spec("sleep 300", Duration::from_millis(300), 100),
            &StartedTurn { deadline_ms: Some(60_000), ..turn("{}") },
            &CancellationToken::new(),
        )
        .await;
        let reason = e.reason.unwrap();
        assert!(
            reason.starts_with("timeout: ran past exec_timeout (300ms), shorter than deadline_ms = 60000"),
            "{reason}"
        );
        assert_eq!(e.stopped_by, Some(StoppedBy::Deadline));
    }

    /// A turn that writes progress is not stalled; one that stops writing for stall_ms is
    /// stopped and fails naming the stall and its last progress.
    #[tokio::test]
    async fn a_stall_counts_from_the_last_progress_line() {
        let script = "for i in 1 2 3 4; do echo \"{\\\"i\\\":$i}\" >&3; sleep 0.2; done; sleep 300";
        let e = bounded(script, None, Some(600)).await;
        assert_eq!((e.outcome, e.stopped_by), (Outcome::Failed, Some(StoppedBy::Stall)));
        let reason = e.reason.unwrap();
        assert!(reason.starts_with("stall: no progress for stall_ms = 600 (ran "), "{reason}");
        assert!(reason.contains("last progress: event #4, "), "{reason}");
        assert!(e.duration_ms.unwrap() >= 1_200, "it ran past its fourth event plus the stall: {:?}", e.duration_ms);
        // Without progress at all, the stall counts from the start.
        let e = bounded("sleep 300", None, Some(300)).await;
        assert!(e.reason.unwrap().contains("last progress: none"));
        // Ending in time, a bounded turn succeeds.
        let e = bounded("echo '{}' >&3; echo ok", Some(30_000), Some(30_000)).await;
        assert_eq!((e.outcome, e.stopped_by), (Outcome::Succeeded, None));
    }

    async fn gone(pid: i32) -> bool {
        let deadline = Instant::now() + EVENT_WAIT;
        while Instant::now() < deadline {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat) if stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')) => {
                    return true;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        false
    }

    fn check(captured: &str, total: u64, max: usize, expected: &str) {
        let got = bounded_result(captured.as_bytes(), total, max);
        assert_eq!(got, expected);
        assert!(got.len() <= max);
    }

    #[test]
    fn bounded_results() {
        check("hello", 5, 10, "hello");
        check("hello", 5, 5, "hello");
        check(&"a".repeat(40), 1000, 30, &format!("{}…[truncated 994 bytes]", "a".repeat(6)));
        check("ééééé", 10, 10, "ééééé");
        check("abc", 100, 3, "…");
        check("abc", 100, 2, "");
        check("abc", 100, 1, "");
    }
}
