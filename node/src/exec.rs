//! The executor: runs one harness turn and says how it ended.
//!
//! The configured argv runs directly (no shell) in its own process group, with the payload on
//! stdin and the delivery's ids (and the message's producer, `BATON_PRODUCER`) in the environment. A timeout or a shutdown kills the whole
//! group with SIGKILL (through `nix::sys::signal::killpg`, a safe wrapper, since this crate
//! forbids `unsafe`). stdout is kept up to `result_bytes_max` and the rest drained, so the child
//! never blocks on a full pipe; stderr goes to the node's log, bounded.

use crate::limits::{PIPE_DRAIN_AFTER_EXIT, STDERR_LOG_BYTES_MAX};
use crate::store::{Ending, StartedTurn};
use baton_shared::states::Outcome;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The reason recorded when a turn ran past `exec_timeout`.
pub const REASON_TIMEOUT: &str = "timeout";
/// The reason recorded when a turn was killed because the node shut down.
pub const REASON_SHUTDOWN: &str = "shutdown";

/// How to run turns.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    /// The harness argv; the first element is the program.
    pub argv: Vec<String>,
    /// Longest a turn may run.
    pub timeout: Duration,
    /// Most stdout bytes kept as the result (the truncation marker included).
    pub result_bytes_max: usize,
    /// This node instance, given to the harness as `BATON_INSTANCE_ID`.
    pub instance_id: String,
}

enum Waited {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    Killed,
}

/// Runs one turn of the command harness. `kill` is cancelled when the node stops waiting
/// (shutdown after the grace period): the group is then killed and the turn ends `failed`.
pub async fn run_command(spec: &ExecSpec, turn: &StartedTurn, kill: &CancellationToken) -> Ending {
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
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
        .env("BATON_INSTANCE_ID", &spec.instance_id);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Ending {
                outcome: Outcome::Failed,
                exit_code: None,
                duration_ms: Some(elapsed_ms(started)),
                result: None,
                reason: Some(format!("cannot start {:?}: {e}", spec.argv[0])),
            };
        }
    };
    baton_shared::crash_point("node.exec.during_effect");
    // With process_group(0) the child leads a new group whose id is its pid.
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    let stdin = child.stdin.take().map(|mut w| {
        let payload = turn.payload.clone().into_bytes();
        tokio::spawn(async move {
            // A harness that does not read its stdin closes the pipe: that is its business.
            let _ = w.write_all(&payload).await;
            let _ = w.shutdown().await;
        })
    });
    let mut stdout = child.stdout.take().map(|r| tokio::spawn(read_bounded(r, spec.result_bytes_max)));
    let mut stderr = child.stderr.take().map(|r| tokio::spawn(log_stderr(r, turn.delivery_id.clone())));
    let waited = tokio::select! {
        r = child.wait() => Waited::Exited(r),
        _ = tokio::time::sleep(spec.timeout) => Waited::TimedOut,
        _ = kill.cancelled() => Waited::Killed,
    };
    let (status, killed_for) = match waited {
        Waited::Exited(r) => (r, None),
        Waited::TimedOut => (kill_and_reap(group, &mut child).await, Some(REASON_TIMEOUT)),
        Waited::Killed => (kill_and_reap(group, &mut child).await, Some(REASON_SHUTDOWN)),
    };
    let duration_ms = Some(elapsed_ms(started));
    // The harness is gone; a process it left behind may still hold the pipes open.
    let deadline = tokio::time::Instant::now() + PIPE_DRAIN_AFTER_EXIT;
    let pipes_open = !finished_by(&mut stdout, deadline).await || !finished_by(&mut stderr, deadline).await;
    if pipes_open {
        tracing::warn!(delivery_id = %turn.delivery_id, "the harness exited but left processes holding its output open; killing its process group");
        kill_group(group);
    }
    let (captured, total) = match stdout {
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
    if let Some(h) = stderr {
        let _ = h.await;
    }
    if let Some(h) = stdin {
        h.abort();
    }
    let result = Some(bounded_result(&captured, total, spec.result_bytes_max));
    let (outcome, exit_code, reason) = match (killed_for, status) {
        // A turn the node killed is reported for that reason, whatever its status says.
        (Some(reason), _) => (Outcome::Failed, None, Some(reason.to_string())),
        (None, Ok(s)) => match (s.code(), s.signal()) {
            (Some(0), _) => (Outcome::Succeeded, Some(0), None),
            (Some(code), _) => (Outcome::Failed, Some(code), Some(format!("exited with status {code}"))),
            (None, Some(sig)) => (Outcome::Failed, None, Some(format!("killed by signal {}", signal_name(sig)))),
            (None, None) => (Outcome::Failed, None, Some("ended without a status".into())),
        },
        (None, Err(e)) => (Outcome::Failed, None, Some(format!("waiting for the harness failed: {e}"))),
    };
    Ending { outcome, exit_code, duration_ms, result, reason }
}

async fn kill_and_reap(
    group: Option<Pid>,
    child: &mut tokio::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    kill_group(group);
    child.wait().await
}

/// Runs one turn of the no-op harness: succeeds at once with an empty result.
pub fn run_noop() -> Ending {
    Ending {
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        duration_ms: Some(0),
        result: Some(String::new()),
        reason: None,
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

fn kill_group(group: Option<Pid>) {
    let Some(pgid) = group else { return };
    match killpg(pgid, Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => tracing::error!(pgid = pgid.as_raw(), "killing the harness process group failed: {e}"),
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

/// Copies a harness's stderr to the log line by line, up to `STDERR_LOG_BYTES_MAX` bytes;
/// drains and counts the rest.
async fn log_stderr(mut r: impl AsyncRead + Unpin, delivery_id: String) {
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
        }
    }

    fn spec(script: &str, timeout: Duration, max: usize) -> ExecSpec {
        ExecSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            timeout,
            result_bytes_max: max,
            instance_id: "inst-1".into(),
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

    #[tokio::test]
    async fn nonzero_exit_fails_with_its_status() {
        let e = run("echo out; echo err >&2; exit 3").await;
        assert_eq!((e.outcome, e.exit_code), (Outcome::Failed, Some(3)));
        assert_eq!(e.result.as_deref(), Some("out\n"));
        assert_eq!(e.reason.as_deref(), Some("exited with status 3"));
    }

    #[tokio::test]
    async fn death_by_signal_is_named() {
        let e = run("kill -TERM $$").await;
        assert_eq!((e.outcome, e.exit_code), (Outcome::Failed, None));
        assert_eq!(e.reason.as_deref(), Some("killed by signal SIGTERM (15)"));
    }

    #[tokio::test]
    async fn missing_program_fails_without_panicking() {
        let s = ExecSpec {
            argv: vec!["/nonexistent/harness".into()],
            timeout: Duration::from_secs(5),
            result_bytes_max: 10,
            instance_id: "inst-1".into(),
        };
        let e = run_command(&s, &turn("{}"), &CancellationToken::new()).await;
        assert_eq!(e.outcome, Outcome::Failed);
        assert!(e.reason.unwrap().contains("cannot start"));
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
        assert_eq!((e.outcome, e.reason.as_deref(), e.exit_code), (Outcome::Failed, Some(REASON_TIMEOUT), None));
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
        assert_eq!((e.outcome, e.reason.as_deref()), (Outcome::Failed, Some(REASON_SHUTDOWN)));
    }

    #[tokio::test]
    async fn a_background_process_holding_stdout_does_not_hang_the_turn() {
        let e = run("sleep 300 & echo done").await;
        assert_eq!(e.outcome, Outcome::Succeeded);
        assert_eq!(e.result.as_deref(), Some("done\n"));
    }

    /// Whether `pid` is gone (or a zombie awaiting its reaper) within `EVENT_WAIT`.
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
