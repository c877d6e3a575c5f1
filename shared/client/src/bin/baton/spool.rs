//! The spool on the command line: `baton send --spool DIR` (commit the message to the spool,
//! then deliver everything waiting before returning), `baton spool flush` (deliver), `status`
//! (what waits), `discard` and `retry` (a failed message). Built on `baton_client::Spooler`.
//!
//! Who runs the delivering loop: every `baton send --spool DIR` and every `baton spool flush
//! --spool DIR`, oldest message first, for as long as their wait allows; nothing runs in the
//! background. A cron job or a service unit running `baton spool flush --wait 5m` drains a
//! spool whose producer sends rarely.

use crate::error::{CliError, call_failed, failure, printed, usage};
use crate::output::{self, esc};
use baton_client::spool::{FlushReport, Settled, Spool, SpoolStatus, Spooled};
use baton_client::{Client, SpoolError, SpoolLimits, Spooler};
use baton_shared::exit;
use baton_shared::wire::SubmitRequest;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The spool's bounds, each with its environment variable.
#[derive(Debug, Clone, Args)]
pub(crate) struct SpoolBounds {
    /// Messages the spool holds at most (waiting and failed); a send past it is refused.
    #[arg(long, env = "BATON_SPOOL_MESSAGES_MAX", value_name = "N",
          default_value_t = baton_client::limits::SPOOL_MESSAGES_MAX_DEFAULT)]
    pub(crate) spool_messages_max: u64,
    /// Bytes of spooled requests the spool holds at most; a send past it is refused.
    #[arg(long, env = "BATON_SPOOL_BYTES_MAX", value_name = "BYTES",
          default_value_t = baton_client::limits::SPOOL_BYTES_MAX_DEFAULT)]
    pub(crate) spool_bytes_max: u64,
}

impl SpoolBounds {
    fn limits(&self) -> SpoolLimits {
        SpoolLimits { messages_max: self.spool_messages_max, bytes_max: self.spool_bytes_max }
    }
}

/// `baton send`'s spool flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct SpoolSend {
    /// Commit the message to the spool in this directory first (`DIR/spool.db`, created if
    /// missing), then deliver everything waiting there, oldest first, before returning. Exit 0
    /// when this message was accepted, 10 when it waits in the spool (no hub answered).
    #[arg(long, value_name = "DIR")]
    pub(crate) spool: Option<PathBuf>,
    /// With --spool: keep trying a hub that does not answer for this long ("1m"); default: one
    /// try.
    #[arg(long, requires = "spool", value_parser = |s: &str| baton_shared::duration::parse("--spool-wait", s), value_name = "DURATION")]
    pub(crate) spool_wait: Option<Duration>,
    /// The spool's bounds.
    #[command(flatten)]
    pub(crate) bounds: SpoolBounds,
}

/// `baton spool`: the producer's durable outbox.
#[derive(Debug, Subcommand)]
pub(crate) enum SpoolCommand {
    /// Deliver every waiting message, oldest first, each once; exit 0 when none waits after.
    Flush {
        /// The spool's directory.
        #[arg(long, value_name = "DIR")]
        spool: PathBuf,
        /// Keep trying a hub that does not answer for this long ("5m"); default: one try.
        #[arg(long, value_parser = |s: &str| baton_shared::duration::parse("--wait", s), value_name = "DURATION")]
        wait: Option<Duration>,
        /// The spool's bounds.
        #[command(flatten)]
        bounds: SpoolBounds,
    },
    /// Show what waits: count, oldest age, last error, and every failed message.
    Status {
        /// The spool's directory.
        #[arg(long, value_name = "DIR")]
        spool: PathBuf,
        /// The spool's bounds (shown).
        #[command(flatten)]
        bounds: SpoolBounds,
    },
    /// Remove a failed message for good: the later messages of its conversation go on.
    Discard {
        /// The spool's directory.
        #[arg(long, value_name = "DIR")]
        spool: PathBuf,
        /// The failed message's position (`baton spool status`).
        position: i64,
    },
    /// Make a failed message wait again, in its place (say, after its scope was widened).
    Retry {
        /// The spool's directory.
        #[arg(long, value_name = "DIR")]
        spool: PathBuf,
        /// The failed message's position (`baton spool status`).
        position: i64,
    },
}

/// A spool that could not be used: a refused file is 3, a full spool 4, a key conflict 2.
fn spool_failed(e: SpoolError) -> CliError {
    let status = match &e {
        _ if e.is_refused() => exit::REFUSED,
        SpoolError::KeyConflict { .. } | SpoolError::Limits(_) | SpoolError::NotFailed { .. } => exit::USAGE,
        _ => exit::FAILURE,
    };
    CliError { status, message: e.to_string() }
}

/// The spool commands that need no hub (`status`, `discard`, `retry`); `None` for `flush`.
pub(crate) fn run_local(cmd: &SpoolCommand, json: bool) -> Result<Option<u8>, CliError> {
    match cmd {
        SpoolCommand::Flush { .. } => Ok(None),
        SpoolCommand::Status { spool, bounds } => {
            let s = Spool::open_read_only(spool, bounds.limits()).map_err(spool_failed)?;
            let st = s.status().map_err(spool_failed)?;
            let now_ms = baton_shared::clock::system_now_ms();
            printed(if json {
                output::json(&status_json(&st, now_ms))
            } else {
                output::lines(&status_lines(&st, now_ms))
            })?;
            Ok(Some(exit::OK))
        }
        SpoolCommand::Discard { spool, position } | SpoolCommand::Retry { spool, position } => {
            let mut s = Spool::open(spool, SpoolLimits::default()).map_err(spool_failed)?;
            let (done, what) = match cmd {
                SpoolCommand::Discard { .. } => (s.discard(*position), "discarded"),
                _ => (s.retry(*position), "waits again"),
            };
            done.map_err(spool_failed)?;
            printed(output::lines(&[format!("spool position {position} {what}")]))?;
            Ok(Some(exit::OK))
        }
    }
}

/// `baton spool flush`.
pub(crate) async fn flush(client: &Client, cmd: SpoolCommand, json: bool) -> Result<u8, CliError> {
    let SpoolCommand::Flush { spool, wait, bounds } = cmd else {
        return Err(failure("not a flush"));
    };
    let spooler = open(&spool, &bounds, client)?;
    let report = spooler.flush(wait.unwrap_or_default()).await.map_err(spool_failed)?;
    let st = spooler.status().await.map_err(spool_failed)?;
    let status = match &report.stopped {
        Some(e) if !e.is_transient() => call_failed(e.clone()).status,
        _ if !st.failed.is_empty() => exit::SPOOL_FAILED,
        _ if st.waiting > 0 => exit::SPOOLED,
        _ => exit::OK,
    };
    let now_ms = baton_shared::clock::system_now_ms();
    if json {
        printed(output::json(&serde_json::json!({
            "flush": report_json(&report), "spool": status_json(&st, now_ms)
        })))?;
    } else {
        let mut lines = report_lines(&report);
        lines.extend(status_lines(&st, now_ms));
        printed(output::lines(&lines))?;
    }
    Ok(status)
}

fn open(dir: &Path, bounds: &SpoolBounds, client: &Client) -> Result<Spooler, CliError> {
    Spooler::open(dir, bounds.limits(), client, baton_shared::clock::system()).map_err(spool_failed)
}

/// `baton send --spool DIR`: commits `req` to the spool, then flushes it. The exit status is
/// this message's: 0 accepted, 10 still waiting, a refusal's own status (2, 9) when the hub
/// refused it (kept in the spool as failed), 9 when the hub refused this producer.
pub(crate) async fn send(client: &Client, req: SubmitRequest, args: &SpoolSend, json: bool) -> Result<u8, CliError> {
    let Some(dir) = &args.spool else { return Err(usage("--spool: no directory")) };
    let spooler = open(dir, &args.bounds, client)?;
    let spooled = spooler.spool(req).await.map_err(spool_failed)?;
    if !json {
        // Said before delivering: the message is safe whatever happens next.
        let again = if spooled.already { " (already spooled, same content)" } else { "" };
        printed(output::lines(&[format!(
            "spooled {} at position {}{again}",
            esc(&spooled.idempotency_key),
            spooled.position
        )]))?;
    }
    let report = spooler.flush(args.spool_wait.unwrap_or_default()).await.map_err(spool_failed)?;
    let mine = report.settled.iter().find(|s| position_of(s) == spooled.position);
    let (status, refusal) = match (mine, &report.stopped) {
        (Some(Settled::Accepted { .. }), _) => (exit::OK, None),
        (Some(Settled::Refused { error, .. }), _) => {
            let e = call_failed(error.clone());
            (e.status, Some(e.message))
        }
        (None, Some(e)) if !e.is_transient() => (call_failed(e.clone()).status, None),
        (None, _) => (exit::SPOOLED, None),
    };
    let st = spooler.status().await.map_err(spool_failed)?;
    if json {
        printed(output::json(&serde_json::json!({
            "spooled": spooled_json(&spooled), "flush": report_json(&report), "spool": status_json(&st, now())
        })))?;
    } else {
        let mut lines = report_lines(&report);
        lines.extend(status_lines(&st, now()));
        printed(output::lines(&lines))?;
    }
    if let Some(message) = refusal {
        return Err(CliError {
            status,
            message: format!(
                "{message}; kept in the spool as failed at position {} (`baton spool discard` or `retry`)",
                spooled.position
            ),
        });
    }
    Ok(status)
}

fn now() -> i64 {
    baton_shared::clock::system_now_ms()
}

fn position_of(s: &Settled) -> i64 {
    match s {
        Settled::Accepted { position, .. } | Settled::Refused { position, .. } => *position,
    }
}

fn spooled_json(s: &Spooled) -> serde_json::Value {
    serde_json::json!({"idempotency_key": s.idempotency_key, "position": s.position, "already": s.already})
}

fn report_json(r: &FlushReport) -> serde_json::Value {
    let settled: Vec<serde_json::Value> = r
        .settled
        .iter()
        .map(|s| match s {
            Settled::Accepted { position, conversation, response } => serde_json::json!({
                "position": position, "conversation": conversation, "result": "accepted",
                "message_id": response.message_id, "seq": response.seq, "duplicate": response.duplicate,
            }),
            Settled::Refused { position, idempotency_key, error } => serde_json::json!({
                "position": position, "idempotency_key": idempotency_key, "result": "failed",
                "status": error.api().map(|a| a.status), "code": error.api().map(|a| a.code_text.clone()),
                "error": error.to_string(),
            }),
        })
        .collect();
    serde_json::json!({"settled": settled, "stopped": r.stopped.as_ref().map(ToString::to_string)})
}

fn report_lines(r: &FlushReport) -> Vec<String> {
    let mut out = Vec::new();
    for s in &r.settled {
        out.push(match s {
            Settled::Accepted { position, conversation, response } => {
                let what = if response.duplicate { "already accepted" } else { "accepted" };
                format!(
                    "position {position}: message {} {what}: {} #{}",
                    esc(&response.message_id),
                    esc(conversation),
                    response.seq
                )
            }
            Settled::Refused { position, idempotency_key, error } => format!(
                "position {position} (key {}): {}; kept as failed",
                esc(idempotency_key),
                esc(&error.to_string())
            ),
        });
    }
    if let Some(e) = &r.stopped {
        out.push(format!("delivery stopped: {}", esc(&e.to_string())));
    }
    out
}

fn status_json(st: &SpoolStatus, now_ms: i64) -> serde_json::Value {
    let failed: Vec<serde_json::Value> = st
        .failed
        .iter()
        .map(|f| {
            serde_json::json!({"position": f.position, "idempotency_key": f.idempotency_key,
                "conversation": f.conversation, "status": f.status, "code": f.code, "error": f.error})
        })
        .collect();
    serde_json::json!({
        "path": st.path.display().to_string(),
        "waiting": st.waiting,
        "blocked": st.blocked,
        "failed": failed,
        "bytes": st.bytes,
        "oldest_spooled_at_ms": st.oldest_spooled_at_ms,
        "oldest_age_ms": st.oldest_spooled_at_ms.map(|t| (now_ms - t).max(0)),
        "last_error": st.last_error.as_ref().map(|(at, e)| serde_json::json!({"at_ms": at, "error": e})),
        "spool_messages_max": st.limits.messages_max,
        "spool_bytes_max": st.limits.bytes_max,
    })
}

fn ago(now_ms: i64, then_ms: i64) -> String {
    baton_shared::duration::human(Duration::from_millis(u64::try_from(now_ms - then_ms).unwrap_or(0)))
}

fn status_lines(st: &SpoolStatus, now_ms: i64) -> Vec<String> {
    let mut out = vec![format!("spool {}", esc(&st.path.display().to_string()))];
    let oldest =
        st.oldest_spooled_at_ms.map(|t| format!(", oldest spooled {} ago", ago(now_ms, t))).unwrap_or_default();
    let blocked = if st.blocked > 0 { format!(" ({} behind a failed message)", st.blocked) } else { String::new() };
    out.push(format!("  waiting {}{blocked}{oldest}", st.waiting));
    out.push(format!(
        "  held {} of {} messages, {} of {} bytes",
        st.waiting + st.failed.len() as u64,
        st.limits.messages_max,
        st.bytes,
        st.limits.bytes_max
    ));
    if let Some((at, e)) = &st.last_error {
        out.push(format!("  last error ({} ago): {}", ago(now_ms, *at), esc(e)));
    }
    for f in &st.failed {
        out.push(format!(
            "  failed: position {}, key {}, conversation {}: {}",
            f.position,
            esc(&f.idempotency_key),
            esc(&f.conversation),
            esc(&f.error)
        ));
    }
    out
}
