//! The JSON-lines records the workload and the harness write: the client history (one line per
//! accept attempt phase) and the effects ledger (one line per harness execution).
//!
//! Both are append-only files written one `write` per line, so a line survives the writer being
//! killed; a torn last line (a crash mid-write) is skipped by the reader and counted.

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

/// One client history line: a phase of one accept attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryLine {
    /// Always `accept` for now.
    pub op: String,
    /// `invoke` (about to send), `ok` (2xx with a message id), `fail` (a definite refusal: 4xx),
    /// `info` (indeterminate: timeout, connection error, 5xx).
    pub phase: String,
    /// The idempotency key.
    pub key: String,
    /// A hash of the submitted content; same key with another hash must have been refused.
    pub payload_hash: String,
    /// The message id the hub answered (ok only).
    #[serde(default)]
    pub message_id: Option<String>,
    /// The HTTP status, when one arrived.
    #[serde(default)]
    pub http: Option<u16>,
    /// The producer identity the key is scoped to; absent means "the only producer".
    #[serde(default)]
    pub producer: Option<String>,
    /// Why an attempt failed or is indeterminate.
    #[serde(default)]
    pub err: Option<String>,
}

/// One effects-ledger line: one harness execution, the outside world's record of a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectLine {
    /// The delivery the harness ran (`BATON_DELIVERY_ID`).
    pub delivery_id: String,
    /// The node's attempt id (`BATON_ATTEMPT_ID`), which is also the report id.
    pub attempt_id: String,
    /// The host whose node ran it.
    pub host: String,
    /// The node instance, when the harness knows it (empty otherwise; the checker derives it).
    #[serde(default)]
    pub instance: String,
    /// A value unique to this execution (a pid and a clock reading).
    #[serde(default)]
    pub nonce: String,
    /// The conversation of the turn (`BATON_CONVERSATION`); empty in ledgers written before
    /// the order invariant I15 was checked.
    #[serde(default)]
    pub conversation: String,
    /// The turn's `seq` in its conversation (`BATON_SEQ`); a line without one is not ordered.
    #[serde(default)]
    pub seq: Option<i64>,
    /// Wall-clock nanoseconds when the harness started (before it read its payload).
    #[serde(default)]
    pub started_ns: Option<u64>,
    /// Wall-clock nanoseconds when the harness ended (just before it wrote this line).
    #[serde(default)]
    pub ended_ns: Option<u64>,
    /// The run of the delivery this execution was (`BATON_ATTEMPT`: 1 for the first run, then
    /// one more for each retry or redrive); absent in ledgers written before runs existed, and
    /// read as 1 then (`EffectLine::run_number`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<i64>,
    /// Why this run happened when it is not the first (`BATON_RERUN`): `retry` (the harness
    /// asked; it keeps the conversation's order) or `redrive` (an operator's deliberate re-run,
    /// the only execution exempt from the order invariant I15). Absent for a first run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<String>,
    /// The node session that ran it, when the node passes one to the harness
    /// (`BATON_SESSION`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The signal that ended the harness (`TERM`, `INT` or `HUP`, recorded by its trap), when
    /// it was terminated instead of ending by itself; absent otherwise. A SIGKILL leaves no line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// The status the harness exited with by itself (75 asks for a retry); absent when it was
    /// ended by a signal or in older ledgers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

impl EffectLine {
    /// The run this execution was: `run`, or 1 for a line written before runs were recorded.
    pub fn run_number(&self) -> i64 {
        self.run.unwrap_or(1)
    }

    /// Whether the record marks this execution as an operator's redrive (`rerun = redrive`),
    /// the one kind of run allowed out of `seq` order. A harness-requested retry is not.
    pub fn is_redrive(&self) -> bool {
        self.rerun.as_deref() == Some(REDRIVE)
    }
}

/// The `rerun` value of an operator's retry or redrive (the wire's `Rerun::Redrive`).
pub const REDRIVE: &str = "redrive";
/// The `rerun` value of a run the harness asked for with exit status 75 (`Rerun::Retry`).
pub const RETRY: &str = "retry";
/// The exit status with which a harness asks for its turn to be run again (`EX_TEMPFAIL`).
pub const EXIT_RETRY: i32 = 75;

/// Lines read from a JSON-lines file, with the count of unreadable (torn) lines.
#[derive(Debug, Clone)]
pub struct Lines<T> {
    /// The parsed lines, in file order.
    pub items: Vec<T>,
    /// Lines that did not parse (a torn final write).
    pub unreadable: usize,
}

/// Reads a JSON-lines file. A missing file reads as empty.
pub fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Lines<T>> {
    let mut out = Lines { items: Vec::new(), unreadable: 0 };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    };
    for line in BufReader::new(file).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(v) => out.items.push(v),
            Err(_) => out.unreadable += 1,
        }
    }
    Ok(out)
}

/// An append-only JSON-lines writer: one `write` per line, flushed at once.
#[derive(Debug)]
pub struct LineWriter {
    file: File,
}

impl LineWriter {
    /// Opens (creating) `path` for appending.
    pub fn append(path: &Path) -> anyhow::Result<LineWriter> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LineWriter { file })
    }

    /// Appends one record as one line.
    pub fn write<T: Serialize>(&mut self, record: &T) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        Ok(())
    }
}

/// A payload field that makes the ledger harness exit 75 (ask for a retry) on the first run of
/// its turn (`BATON_ATTEMPT` absent or 1) and succeed on every later run.
pub const RETRY_FIRST_RUN: &str = "retry_first_run";
/// A payload field that makes the ledger harness sleep `SLOW_TURN_SECS` before it ends, so a
/// cancel can reach it while it runs.
pub const SLOW: &str = "slow";
/// How long a turn marked `SLOW` runs.
pub const SLOW_TURN_SECS: u32 = 2;
/// A payload field that makes the ledger harness write `PROGRESS_EVENTS` progress events on its
/// progress channel (`BATON_PROGRESS_FD`) before it ends.
pub const PROGRESS: &str = "progress";
/// How many progress events a turn marked `PROGRESS` writes.
pub const PROGRESS_EVENTS: u32 = 5;
/// A payload field that makes the ledger harness wait, before it ends, until the file
/// `hold_release(ledger)` exists: a turn the test keeps running until it lets it go.
pub const HOLD: &str = "hold";

/// The file whose existence ends every turn marked `HOLD` that the harness of `ledger` runs
/// (create it to let them go; they notice within a tenth of a second).
pub fn hold_release(ledger: &Path) -> std::path::PathBuf {
    let mut name = ledger.as_os_str().to_owned();
    name.push(".release");
    name.into()
}

/// The harness command that records one effect line in `ledger` per execution: the delivery,
/// the node's attempt id, the host, the instance, a nonce unique to the process, the turn's
/// conversation and `seq`, the wall-clock start and end (for the order invariant I15), the run
/// (`BATON_ATTEMPT`, 1 when absent), why it is a re-run (`BATON_RERUN`), the node session when
/// the node passes one (`BATON_SESSION`), and either the exit status it chose or the signal
/// that terminated it (a trap on TERM, INT and HUP writes the line and exits 128 + the signal).
///
/// It reads its stdin (the payload) first, so an effect is recorded even when the node dies
/// mid-turn, and it never writes to stdout (whose reader may be gone). A payload with
/// `"retry_first_run": true` exits 75 on run 1; one with `"slow": true` sleeps
/// `SLOW_TURN_SECS` (in a child it waits for, so a signal is handled at once); one with
/// `"hold": true` waits the same way until `hold_release(ledger)` exists. Other payloads
/// succeed at once. Conversation names are written verbatim, so they must need no JSON escaping.
pub fn ledger_harness(ledger: &Path, host: &str) -> Vec<String> {
    let script = format!(
        r#"s=$(date +%s%N); p=$(cat); code=0
q() {{ if [ -n "$1" ]; then printf '"%s"' "$1"; else printf null; fi; }}
rec() {{ printf '{{"delivery_id":"%s","attempt_id":"%s","host":"{host}","instance":"%s","nonce":"%s-%s","conversation":"%s","seq":%s,"started_ns":%s,"ended_ns":%s,"run":%s,"rerun":%s,"session":%s,"signal":%s,"exit_code":%s}}\n' "$BATON_DELIVERY_ID" "$BATON_ATTEMPT_ID" "$BATON_INSTANCE_ID" "$$" "$s" "$BATON_CONVERSATION" "$BATON_SEQ" "$s" "$(date +%s%N)" "${{BATON_ATTEMPT:-1}}" "$(q "$BATON_RERUN")" "$(q "$BATON_SESSION")" "$(q "$1")" "$2" >> '{ledger}'; }}
stop() {{ trap '' TERM INT HUP; rec "$1" null; exit "$2"; }}
trap 'stop TERM 143' TERM; trap 'stop INT 130' INT; trap 'stop HUP 129' HUP
case "$p" in *'"{retry}":true'*|*'"{retry}": true'*) [ "${{BATON_ATTEMPT:-1}}" = 1 ] && code={exit_retry};; esac
case "$p" in *'"{progress}":true'*|*'"{progress}": true'*) if [ -n "$BATON_PROGRESS_FD" ]; then i=1; while [ $i -le {events} ]; do echo "{{\"i\":$i}}" >&$BATON_PROGRESS_FD; i=$((i+1)); done; fi;; esac
case "$p" in *'"{slow}":true'*|*'"{slow}": true'*) sleep {secs} & wait $!;; esac
case "$p" in *'"{hold}":true'*|*'"{hold}": true'*) while [ ! -e '{release}' ]; do sleep 0.1 & wait $!; done;; esac
trap '' TERM INT HUP; rec '' "$code"; exit "$code""#,
        ledger = ledger.display(),
        retry = RETRY_FIRST_RUN,
        exit_retry = EXIT_RETRY,
        slow = SLOW,
        secs = SLOW_TURN_SECS,
        progress = PROGRESS,
        events = PROGRESS_EVENTS,
        hold = HOLD,
        release = hold_release(ledger).display(),
    );
    vec!["sh".into(), "-c".into(), script]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::process::{Command, Stdio};

    /// Runs the harness once with `env` and `payload`, returning its exit status and the line.
    fn run(payload: &str, env: &[(&str, &str)]) -> (Option<i32>, EffectLine) {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.jsonl");
        let argv = ledger_harness(&ledger, "host-a");
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in [
            ("BATON_DELIVERY_ID", "d1"),
            ("BATON_ATTEMPT_ID", "a1"),
            ("BATON_INSTANCE_ID", "i1"),
            ("BATON_CONVERSATION", "c0"),
            ("BATON_SEQ", "4"),
        ]
        .iter()
        .chain(env)
        {
            cmd.env(k, v);
        }
        let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), payload.as_bytes()).unwrap();
        let status = child.wait().unwrap();
        let mut lines = read_lines::<EffectLine>(&ledger).unwrap();
        assert_eq!((lines.items.len(), lines.unreadable), (1, 0), "{lines:?}");
        (status.code(), lines.items.remove(0))
    }

    #[test]
    fn a_first_run_records_run_one_and_no_rerun() {
        let (code, l) = run("{}", &[]);
        assert_eq!(code, Some(0));
        assert_eq!((l.delivery_id.as_str(), l.attempt_id.as_str(), l.instance.as_str()), ("d1", "a1", "i1"));
        assert_eq!((l.conversation.as_str(), l.seq, l.run, l.rerun.as_deref()), ("c0", Some(4), Some(1), None));
        assert_eq!((l.session, l.signal, l.exit_code), (None, None, Some(0)));
        assert!(l.started_ns.is_some() && l.started_ns <= l.ended_ns);
    }

    #[test]
    fn a_rerun_records_its_run_kind_and_session() {
        let env = [("BATON_ATTEMPT", "3"), ("BATON_RERUN", "redrive"), ("BATON_SESSION", "7")];
        let (_, l) = run("{}", &env);
        assert_eq!((l.run, l.rerun.as_deref(), l.session.as_deref()), (Some(3), Some("redrive"), Some("7")));
        assert!(l.is_redrive());
    }

    #[test]
    fn a_retry_marked_payload_exits_75_on_run_one_only() {
        let payload = r#"{"retry_first_run":true}"#;
        let (code, l) = run(payload, &[]);
        assert_eq!((code, l.exit_code), (Some(EXIT_RETRY), Some(EXIT_RETRY)));
        let (code, l) = run(payload, &[("BATON_ATTEMPT", "2"), ("BATON_RERUN", "retry")]);
        assert_eq!((code, l.exit_code, l.rerun.as_deref()), (Some(0), Some(0), Some(RETRY)));
        assert!(!l.is_redrive());
    }

    #[test]
    fn a_terminated_turn_records_the_signal() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.jsonl");
        let argv = ledger_harness(&ledger, "host-a");
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("BATON_DELIVERY_ID", "d1")
            .env("BATON_SEQ", "1")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), br#"{"slow":true}"#).unwrap();
        // Wait until the harness sleeps (its child exists), then terminate it.
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let sleeping = || {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            children
                .split_whitespace()
                .any(|c| std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|comm| comm.trim() == "sleep"))
        };
        while !sleeping() {
            assert!(std::time::Instant::now() < deadline, "the harness never started its sleep");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(143));
        let l = read_lines::<EffectLine>(&ledger).unwrap().items.remove(0);
        assert_eq!((l.signal.as_deref(), l.exit_code), (Some("TERM"), None));
    }

    #[test]
    fn a_held_turn_runs_until_its_release_exists() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.jsonl");
        let argv = ledger_harness(&ledger, "host-a");
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("BATON_DELIVERY_ID", "d1")
            .env("BATON_SEQ", "1")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), br#"{"hold":true}"#).unwrap();
        // Held: it waits in its sleep, again and again, and has recorded nothing.
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut naps = BTreeSet::new();
        while naps.len() < 3 {
            assert!(std::time::Instant::now() < deadline, "the held harness is not waiting: {naps:?}");
            assert!(child.try_wait().unwrap().is_none(), "the held harness ended by itself");
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            naps.extend(children.split_whitespace().map(str::to_string));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(read_lines::<EffectLine>(&ledger).unwrap().items.is_empty(), "a held turn has not ended");
        std::fs::write(hold_release(&ledger), b"").unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(0));
        let l = read_lines::<EffectLine>(&ledger).unwrap().items.remove(0);
        assert_eq!((l.delivery_id.as_str(), l.exit_code), ("d1", Some(0)));
    }

    #[test]
    fn rerun_names_match_the_wire() {
        use baton_shared::states::Rerun;
        assert_eq!(Rerun::parse(REDRIVE), Some(Rerun::Redrive));
        assert_eq!(Rerun::parse(RETRY), Some(Rerun::Retry));
    }
}
