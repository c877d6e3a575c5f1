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
    /// Set only when the record marks this execution as an operator's deliberate re-run (a
    /// retry or redrive) with its kind; such a line is exempt from the order invariant I15.
    /// Nothing sets it yet: the harness environment has no such marker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<String>,
}

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

/// The harness command that records one effect line in `ledger` and succeeds: it drains its
/// stdin (the payload) first, so an effect is recorded even when the node dies mid-turn, and it
/// never writes to stdout (whose reader may be gone). The line carries the turn's conversation
/// and `seq` and the wall-clock start and end of the execution, for the order invariant I15.
/// Conversation names are written verbatim, so they must need no JSON escaping.
pub fn ledger_harness(ledger: &Path, host: &str) -> Vec<String> {
    let script = format!(
        "s=$(date +%s%N); cat >/dev/null; \
         printf '{{\"delivery_id\":\"%s\",\"attempt_id\":\"%s\",\"host\":\"{host}\",\"instance\":\"\",\"nonce\":\"%s-%s\",\"conversation\":\"%s\",\"seq\":%s,\"started_ns\":%s,\"ended_ns\":%s}}\\n' \
         \"$BATON_DELIVERY_ID\" \"$BATON_ATTEMPT_ID\" \"$$\" \"$s\" \"$BATON_CONVERSATION\" \"$BATON_SEQ\" \"$s\" \"$(date +%s%N)\" >> '{}'",
        ledger.display()
    );
    vec!["sh".into(), "-c".into(), script]
}
