//! The turn gate of the real `baton-node` binary: a harness process held until the node
//! releases it, becoming the harness in the same process, and never running when not released.

use baton_node::exec::{self, ExecSpec, GATE_EXEC_FAILED_STATUS, GATE_RELEASE, GATE_SUBCOMMAND, Gate};
use baton_node::store::StartedTurn;
use baton_shared::states::Outcome;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_baton-node"))
}

fn turn() -> StartedTurn {
    StartedTurn {
        attempt_id: "att-1".into(),
        delivery_id: "del-1".into(),
        message_id: "msg-1".into(),
        conversation: "conv".into(),
        seq: 1,
        payload: r#"{"turn":1}"#.into(),
        producer: Some("prod".into()),
        run: 1,
        rerun: None,
        claim_token: "tok-1".into(),
        deadline_ms: None,
        stall_ms: None,
        traceparent: None,
    }
}

/// The gate by hand: `baton-node turn-gate -- ARGV` with stdin piped.
fn gate_by_hand(script: &str) -> std::process::Child {
    Command::new(bin())
        .args([GATE_SUBCOMMAND, "--", "sh", "-c", script])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn the_released_gate_becomes_the_harness_in_the_same_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let spec = ExecSpec {
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!("touch {}; echo $$ $(cut -d' ' -f5 /proc/$$/stat); cat", ran.display()),
        ],
        timeout: Duration::from_secs(60),
        kill_grace: Duration::from_secs(10),
        cancel_grace: Duration::from_secs(10),
        result_bytes_max: 4096,
        stderr_tail_bytes: 4096,
        instance_id: "inst-1".into(),
        gate: Gate::binary(bin()),
        progress_line_bytes_max: 4096,
    };
    let spawned = exec::spawn(&spec, &turn()).unwrap();
    let identity = spawned.identity().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ran.exists(), "the harness ran before it was released");
    let ending =
        spawned.run(&spec, &turn(), &CancellationToken::new(), &baton_node::exec::CancelHandle::default(), None).await;
    assert_eq!(ending.outcome, Outcome::Succeeded, "{ending:?}");
    let out = ending.result.unwrap();
    let (ids, payload) = out.split_once('\n').unwrap();
    let ids: Vec<i32> = ids.split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(ids, [identity.pgid, identity.pgid], "the harness is the recorded process and leads its group");
    assert_eq!(payload, r#"{"turn":1}"#, "the payload follows the release byte untouched");
}

#[test]
fn a_gate_that_is_never_released_never_runs_the_harness() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let mut gate = gate_by_hand(&format!("touch {}", ran.display()));
    // The node died before the release: its end of the pipe closes.
    drop(gate.stdin.take());
    let status = gate.wait().unwrap();
    assert_eq!(status.code(), Some(i32::from(baton_shared::exit::NOTHING)));
    assert!(!ran.exists());
    // Anything but the release byte is no release either.
    let mut gate = gate_by_hand(&format!("touch {}", ran.display()));
    gate.stdin.take().unwrap().write_all(b"x").unwrap();
    assert_eq!(gate.wait().unwrap().code(), Some(i32::from(baton_shared::exit::NOTHING)));
    assert!(!ran.exists());
}

#[test]
fn a_harness_that_cannot_be_started_is_reported_by_the_gate() {
    let mut gate = Command::new(bin())
        .args([GATE_SUBCOMMAND, "--", "/nonexistent/harness"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    gate.stdin.take().unwrap().write_all(&[GATE_RELEASE]).unwrap();
    let out = gate.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(GATE_EXEC_FAILED_STATUS)));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot start \"/nonexistent/harness\""), "{err}");
}

#[test]
fn the_gate_is_not_in_the_help() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(GATE_SUBCOMMAND));
}

/// The progress channel survives the real gate's `exec` into the harness: what the harness (and
/// a child it starts) writes to `BATON_PROGRESS_FD` reaches the turn's sink line by line, in
/// order, a line that is not a JSON object or is too long is dropped, and a harness that writes
/// nothing more ends normally (the node's copy of the write end is closed).
#[tokio::test]
async fn the_progress_channel_reaches_the_sink_through_the_gate() {
    use baton_node::progress::{Progress, ProgressLimits};
    let long = "x".repeat(100);
    let script = format!(
        "echo '{{\"n\":1}}' >&$BATON_PROGRESS_FD; echo 'not json' >&$BATON_PROGRESS_FD; \
         echo '{{\"n\":\"{long}\"}}' >&$BATON_PROGRESS_FD; \
         sh -c 'echo \"{{\\\"n\\\":2}}\" >&$BATON_PROGRESS_FD'; printf '{{\"n\":3}}' >&$BATON_PROGRESS_FD; echo done"
    );
    let spec = ExecSpec {
        argv: vec!["sh".into(), "-c".into(), script],
        timeout: Duration::from_secs(60),
        kill_grace: Duration::from_secs(10),
        cancel_grace: Duration::from_secs(10),
        result_bytes_max: 4096,
        stderr_tail_bytes: 4096,
        instance_id: "inst-1".into(),
        gate: Gate::binary(bin()),
        progress_line_bytes_max: 64,
    };
    let limits = ProgressLimits {
        event_bytes_max: 64,
        events_per_turn_max: 100,
        events_per_second_max: 100,
        buffer_events_max: 100,
    };
    let progress = std::sync::Arc::new(Progress::new(limits));
    let sink = progress.start("del-1", 1, "tok-1");
    let spawned = exec::spawn(&spec, &turn()).unwrap();
    let ending = tokio::time::timeout(
        Duration::from_secs(60),
        spawned.run(&spec, &turn(), &CancellationToken::new(), &exec::CancelHandle::default(), Some(sink)),
    )
    .await
    .expect("the turn ends");
    assert_eq!((ending.outcome, ending.result.as_deref()), (Outcome::Succeeded, Some("done\n")), "{ending:?}");
    let events = progress.waiting_events("del-1", 1);
    let bodies: Vec<&str> = events.iter().map(|e| e.progress.as_str()).collect();
    assert_eq!(bodies, [r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]);
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
}
