//! `send`: submitting a message by hand, through the same acceptance and fan-out as the API.

use super::{CliError, CliResult, Context, output};
use crate::store::By;
use crate::store::lifecycle::accept::{AcceptLimits, Accepted, NewMessage};
use crate::store::upkeep::canonical;
use baton_shared::files::read_text_bounded;
use baton_shared::ids::{check_key, check_name};
use baton_shared::limits::PAYLOAD_FILE_BYTES_MAX;
use baton_shared::wire::Payload;
use std::path::Path;

/// What `send` was asked to submit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Submission<'a> {
    /// The conversation.
    pub(super) conversation: &'a str,
    /// Recipient hosts; empty means the conversation's current members.
    pub(super) to: &'a [String],
    /// The idempotency key.
    pub(super) key: &'a str,
    /// The payload as JSON text, if given inline.
    pub(super) payload: Option<&'a str>,
    /// A file holding the payload JSON, if given so.
    pub(super) payload_file: Option<&'a Path>,
    /// The producer the message is recorded under.
    pub(super) producer: &'a str,
    /// Why the operator sends it (recorded in the audit log with the operator's name).
    pub(super) reason: &'a str,
}

/// Validates the submission into a `NewMessage`, at most `payload_bytes_max` of payload.
fn validate(s: Submission<'_>, payload_bytes_max: u64) -> Result<NewMessage, CliError> {
    check_name("conversation", s.conversation)?;
    check_key("key", s.key)?;
    check_name("producer", s.producer)?;
    for h in s.to {
        check_name("to", h)?;
    }
    let text = match (s.payload, s.payload_file) {
        (Some(p), _) => p.to_string(),
        (None, Some(f)) => read_text_bounded(f, PAYLOAD_FILE_BYTES_MAX, "PAYLOAD_FILE_BYTES_MAX")
            .map_err(|e| CliError::usage(format!("--payload-file {}: {e}", f.display())))?,
        (None, None) => return Err(CliError::usage("give --payload JSON or --payload-file FILE")),
    };
    // Kept exactly as given (surrounding whitespace aside), as the API keeps it; refused for
    // what the API refuses (not one JSON value, duplicate keys, too deep, lone surrogates).
    let max = payload_bytes_max;
    let payload = Payload::from_text(text.trim().to_string())
        .map_err(|e| CliError::usage(format!("payload is not JSON: {e}")))?
        .as_str()
        .to_string();
    canonical::canonical(&payload).map_err(|e| CliError::usage(format!("payload: {e}")))?;
    if payload.len() as u64 > max {
        return Err(CliError::usage(format!("payload is {} bytes; at most {max} are accepted", payload.len())));
    }
    let mut to = s.to.to_vec();
    to.sort();
    to.dedup();
    Ok(NewMessage {
        // A trace of its own, not sampled: the command line records no span of it, and the
        // harness still finds a TRACEPARENT to continue.
        traceparent: Some(baton_shared::traceparent::TraceParent::generate(false).to_string()),
        producer: s.producer.into(),
        conversation: s.conversation.into(),
        idempotency_key: s.key.into(),
        payload,
        to,
        pools: Vec::new(),
    })
}

/// `send`: accepts and fans out one message in one write transaction, then wakes a running hub.
pub(super) fn send(ctx: &Context, s: Submission<'_>, json: bool) -> CliResult {
    let config = ctx.config(None)?;
    let msg = validate(s, config.limits.payload_bytes_max)?;
    let limits = AcceptLimits {
        queued_per_host_max: config.limits.queued_per_host_max,
        queued_per_pool_max: config.limits.queued_per_pool_max,
    };
    let record = ctx.open_write()?;
    // Accept and fan-out in one transaction: no claim can see this message half routed.
    let by = By { operator: ctx.operator.clone(), reason: s.reason.to_string() };
    let (accepted, deliveries) = record.run(record.send(msg, limits, by))?;
    let (id, seq, duplicate) = match accepted {
        Accepted::New { message_id, seq } => (message_id, seq, false),
        Accepted::Duplicate { message_id, seq } => (message_id, seq, true),
    };
    ctx.wake_hub();
    if json {
        let response = baton_shared::wire::SubmitResponse { message_id: id, seq, duplicate, deliveries };
        return output::json(&serde_json::to_value(response).map_err(|e| CliError::failure(e.to_string()))?);
    }
    output::line(format!("message {id} seq {seq}{}", if duplicate { " (duplicate: already accepted)" } else { "" }))?;
    for d in deliveries {
        let to = match (&d.host, &d.pool) {
            (Some(h), None) => h.clone(),
            (Some(h), Some(p)) => format!("{h} (pool {p})"),
            (None, p) => format!("pool {}", p.as_deref().unwrap_or("-")),
        };
        output::line(format!("  delivery {} -> {to} ({})", d.delivery_id, d.state))?;
    }
    Ok(())
}
