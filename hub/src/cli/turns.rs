//! Stopping and repeating turns: `deliveries cancel`, `deliveries retry` and `redrive`.

use super::args::{CancelArgs, RedriveArgs, RetryArgs};
use super::confirm::{self, Decision};
use super::{CliError, CliResult, Context, Record, output};
use crate::store::By;
use crate::store::lifecycle::turns::CancelOf;
use crate::store::lifecycle::turns::{self, RedriveFilter};
use baton_shared::limits::REASON_CHARS_MAX;
use baton_shared::wire::CancelResult;
use baton_shared::{duration, exit};
use serde_json::json;

impl RedriveArgs {
    /// Whether a filter narrows the selection; without one, every delivery that ended with
    /// the outcome is re-run, which is destructive (it undoes every such ending at once).
    fn filtered(&self) -> bool {
        self.conversation.is_some() || self.host.is_some() || self.since.is_some() || self.limit.is_some()
    }
}

/// Runs `deliveries cancel`.
pub(super) fn cancel(ctx: &Context, a: &CancelArgs) -> CliResult {
    check_reason(&a.why.reason)?;
    let scope = match (&a.id, &a.conversation, &a.host) {
        (Some(_), _, _) => None,
        (None, Some(c), _) => Some(CancelOf::Conversation(c.clone())),
        (None, None, Some(h)) => Some(CancelOf::Host(h.clone())),
        (None, None, None) => return Err(CliError::usage("give a delivery id, --conversation or --host")),
    };
    let record = ctx.open_write()?;
    let id = a.id.as_deref().map(|id| super::lookup::resolve_id(&record, id)).transpose()?;
    let which = match (id, scope) {
        (Some(id), _) => CancelOf::Delivery(id),
        (None, Some(scope)) => scope,
        (None, None) => return Err(CliError::usage("give a delivery id, --conversation or --host")),
    };
    let by = By { operator: ctx.operator.clone(), reason: a.why.reason.clone() };
    let results: Vec<CancelResult> = record.run(record.cancel(which, by, a.dry_run))?;
    if !a.dry_run {
        ctx.wake_hub();
    }
    if a.json {
        output::json(&json!({"dry_run": a.dry_run, "deliveries": results}))?;
    } else {
        let verb = if a.dry_run { "would be" } else { "is" };
        for r in &results {
            let at = match (&r.host, &r.pool) {
                (Some(h), _) => h.clone(),
                (None, p) => format!("pool {}", p.as_deref().unwrap_or("-")),
            };
            output::line(format!("{} ({at}): {} {verb} {}", r.delivery_id, effect_text(&r.effect), r.state))?;
        }
    }
    if results.is_empty() {
        return Err(CliError::new(exit::NOTHING, "nothing to cancel"));
    }
    // Asked to change something and changed nothing (every delivery had already ended): 1.
    if results.iter().all(|r| r.effect != turns::EFFECT_CANCELLED && r.effect != turns::EFFECT_REQUESTED) {
        return Err(CliError::new(exit::NOTHING, "nothing to cancel: every delivery had already ended"));
    }
    Ok(())
}

/// The API's rule for a cancel's reason (`POST /v1/messages/{id}/cancel`, and what the node
/// reports): 1..=`REASON_CHARS_MAX` characters, not only whitespace.
fn check_reason(reason: &str) -> CliResult {
    if reason.trim().is_empty() || reason.chars().count() > REASON_CHARS_MAX {
        return Err(CliError::usage(format!(
            "--reason: must be 1..={REASON_CHARS_MAX} characters, not only whitespace (given {} characters)",
            reason.chars().count()
        )));
    }
    Ok(())
}

fn effect_text(effect: &str) -> &'static str {
    match effect {
        turns::EFFECT_CANCELLED => "cancelled in the hub;",
        turns::EFFECT_REQUESTED => "cancel requested from its node;",
        _ => "already ended, unchanged;",
    }
}

/// Runs `deliveries retry`.
pub(super) fn retry(ctx: &Context, a: &RetryArgs) -> CliResult {
    let record = ctx.open_write()?;
    let id = super::lookup::resolve_id(&record, &a.id)?;
    let by = By { operator: ctx.operator.clone(), reason: a.why.reason.clone() };
    let run = record.run(record.retry(id.clone(), by))?;
    ctx.wake_hub();
    output::line(format!("{id} queued again as run {run} (a redrive)"))
}

/// Refuses (exit 2, an idempotency conflict) a repeat of `request_id` whose filters are not
/// the ones it was first run with (`recorded`, the JSON `record_redrive` kept): it would
/// change nothing, and exiting 0 would say the other selection was re-run.
fn check_same_filter(request_id: &str, recorded: &str, filter: &RedriveFilter) -> CliResult {
    let mut given = serde_json::to_value(filter).map_err(|e| CliError::failure(e.to_string()))?;
    let mut first: serde_json::Value = serde_json::from_str(recorded).map_err(|e| {
        CliError::failure(format!("redrive request {request_id}: its recorded filters do not parse: {e}"))
    })?;
    // The same duration ago, given twice, names two moments: the request is the same one.
    if let (Some(a), Some(b)) = (first.get("since_ago"), given.get("since_ago"))
        && a == b
        && let (Some(f), Some(g)) = (first.as_object_mut(), given.as_object_mut())
    {
        f.remove("since_ms");
        g.remove("since_ms");
    }
    if first == given {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "idempotency conflict: redrive request {request_id} was first run with other filters ({}); this one's \
         differ ({}); nothing changed; repeat it with the same filters, or give a new --request-id",
        output::esc(recorded),
        given
    )))
}

/// `redrive --since`: unix milliseconds (digits alone, as before), a duration ago (returned
/// with its text, for the idempotency check), or a time.
fn since_moment(ctx: &Context, text: &str) -> Result<(i64, Option<String>), CliError> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let ms = text.parse().map_err(|_| CliError::usage(format!("--since {text:?}: too large")))?;
        return Ok((ms, None));
    }
    if duration::parse("--since", text).is_ok() {
        return Ok((super::lookup::moment_ms(ctx, "--since", text)?, Some(text.to_string())));
    }
    Ok((super::lookup::moment_ms(ctx, "--since", text)?, None))
}

/// Runs `redrive`: in transactions of at most `limits.redrive_batch_max` deliveries each.
pub(super) fn redrive(ctx: &Context, a: &RedriveArgs) -> CliResult {
    if !matches!(a.outcome.as_str(), "failed" | "unknown" | "cancelled") {
        return Err(CliError::usage(format!("--outcome {:?} is not one of failed, unknown, cancelled", a.outcome)));
    }
    if a.limit == Some(0) {
        return Err(CliError::usage("--limit must be at least 1"));
    }
    let batch_max = ctx.config(None)?.limits.redrive_batch_max;
    let (since_ms, since_ago) = match a.since.as_deref() {
        None => (None, None),
        Some(text) => {
            let (ms, ago) = since_moment(ctx, text)?;
            (Some(ms), ago)
        }
    };
    let filter = RedriveFilter {
        outcome: a.outcome.clone(),
        conversation: a.conversation.clone(),
        host: a.host.clone(),
        since_ms,
        since_ago,
        limit: a.limit,
    };
    let reason = if a.filtered() { a.why.text() } else { a.why.required("redrive without a filter")? };
    let dry_run = a.confirm.dry_run;
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    if let Some(request_id) = &a.request_id
        && let Some(done) = record.run(record.recorded_redrive(request_id.clone()))?
    {
        check_same_filter(request_id, &done.filter, &filter)?;
        let text = format!(
            "request {request_id} was already run by {} at {}: {} deliveries re-run ({}); nothing changed",
            done.operator,
            output::fmt_ms(done.at_ms),
            done.redriven,
            done.filter
        );
        return if a.json {
            output::json(&json!({"request_id": request_id, "repeat": true, "redriven": done.redriven}))
        } else {
            output::line(text)
        };
    }
    // Nothing to re-run is not worth a question: it ends below with exit 1.
    if !a.filtered()
        && !dry_run
        && let n = select(&record, &filter, batch_max, None)?.len()
        && n > 0
    {
        let plan = format!(
            "redrive without a filter (reason: {}): {n} deliveries that ended {} would re-run, every one in the \
             record",
            output::esc(reason),
            a.outcome
        );
        if confirm::decide(&a.confirm, &plan, None)? == Decision::DryRun {
            return Ok(());
        }
    }
    let ids = select(&record, &filter, batch_max, (!dry_run).then_some(&by))?;
    if !dry_run {
        if let Some(request_id) = &a.request_id {
            let n = ids.len() as i64;
            record.run(record.record_redrive(request_id.clone(), by, filter, n))?;
        }
        ctx.wake_hub();
    }
    if a.json {
        output::json(&json!({"dry_run": dry_run, "request_id": a.request_id, "repeat": false, "deliveries": ids}))?;
    } else {
        for id in &ids {
            output::line(id)?;
        }
        let verb = if dry_run { "would be re-run" } else { "re-run" };
        output::line(format!("{} deliveries {verb}", ids.len()))?;
    }
    if ids.is_empty() {
        return Err(CliError::new(exit::NOTHING, "nothing matched"));
    }
    Ok(())
}

/// The deliveries `filter` picks, a batch of at most `batch_max` at a time: re-run, one
/// transaction per batch, when `by` is given; only read otherwise (a dry run, a plan).
fn select(record: &Record, filter: &RedriveFilter, batch_max: u32, by: Option<&By>) -> Result<Vec<String>, CliError> {
    let mut after = i64::MIN;
    let mut ids: Vec<String> = Vec::new();
    loop {
        let room = filter.limit.map_or(batch_max, |l| batch_max.min(l - ids.len() as u32));
        if room == 0 {
            break;
        }
        let batch = match by {
            None => record.run(record.redrive_preview(filter.clone(), after, room))?,
            Some(by) => record.run(record.redrive_batch(filter.clone(), after, room, by.clone()))?,
        };
        let Some((_, last)) = batch.last() else { break };
        after = *last;
        let full = batch.len() as u32 == room;
        ids.extend(batch.into_iter().map(|(id, _)| id));
        if !full {
            break;
        }
    }
    Ok(ids)
}
