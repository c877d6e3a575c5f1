//! The report outbox: sends every ended attempt's report to `POST /delivery-report` until the
//! hub confirms it. A report's id is its attempt id, so a retry is counted once by the hub.
//!
//! Passing failures (no answer, 5xx, 429, 408, 401: `ClientError::retry_later`) are retried
//! with backoff, forever: nothing is lost. A revoked certificate stops the node (`Shared::finish`); the report stays stored. A final refusal (409 `report_conflict` or `stale_claim`, or another 4xx) is logged and
//! the entry marked dead: never retried forever, never silently dropped (`status` lists it).

use crate::client::Hub;
use crate::limits::{BACKOFF_BASE, OUTBOX_BATCH_MAX};
use crate::shared_state::Shared;
use crate::store::OutboxEntry;
use crate::store::StoreError;
use baton_client::{Backoff, ClientError};
use baton_shared::crash_point;
use baton_shared::limits::{BATCH_BYTES_MAX, BATCH_ITEMS_MAX};
use baton_shared::wire::ReportResponse;
use baton_telemetry::{Attr, Kind};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What one pass over the outbox achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Nothing was waiting.
    Idle,
    /// Every entry of the batch was confirmed or marked dead.
    Progress,
    /// The hub could not be reached; try again after a pause.
    HubDown,
}

/// Sends reports until `stop` is cancelled.
pub(crate) async fn outbox_loop<H: Hub>(sh: Arc<Shared<H>>, stop: CancellationToken) -> anyhow::Result<()> {
    let mut backoff = Backoff::new(BACKOFF_BASE, sh.config.backoff_max);
    loop {
        match send_pending(&sh).await? {
            Pass::Progress => backoff.reset(),
            Pass::Idle => tokio::select! {
                _ = sh.wake_outbox.notified() => {}
                _ = stop.cancelled() => return Ok(()),
            },
            Pass::HubDown => tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()) => {}
                _ = stop.cancelled() => return Ok(()),
            },
        }
    }
}

/// At shutdown: tries every waiting report once more, stopping at the first outage.
pub(crate) async fn flush<H: Hub>(sh: &Shared<H>) -> Result<(), StoreError> {
    loop {
        match send_pending(sh).await? {
            Pass::Progress => continue,
            Pass::Idle => return Ok(()),
            Pass::HubDown => {
                tracing::warn!("reports still waiting for the hub at shutdown; they are sent at the next start");
                return Ok(());
            }
        }
    }
}

/// One pass: sends up to `OUTBOX_BATCH_MAX` waiting reports, oldest first, and settles what
/// the hub answered in one local transaction (`Db::finish_reports`).
pub(crate) async fn send_pending<H: Hub>(sh: &Shared<H>) -> Result<Pass, StoreError> {
    let batch = sh.store.call(|db| db.pending_reports(OUTBOX_BATCH_MAX)).await?;
    if batch.is_empty() {
        return Ok(Pass::Idle);
    }
    // The ended turns' last progress events first: the hub takes none after their outcome.
    crate::renewal::flush_ended(sh).await;
    let started = sh.telemetry.started();
    let answers = send_batch(sh, &batch).await;
    let answered = sh.telemetry.started();
    let mut settle: Vec<(String, Option<String>)> = Vec::with_capacity(answers.len());
    let mut pass = Pass::Progress;
    let mut tried: Option<(Vec<String>, String)> = None;
    for (entry, answer) in batch.iter().zip(answers) {
        let report_id = entry.report_id.clone();
        match answer {
            Answer::Confirmed(resp) => {
                if resp.attempt.report_id != report_id {
                    tracing::warn!(report_id, hub_report_id = %resp.attempt.report_id, "the hub answered a report with another report id");
                }
                tracing::info!(
                    delivery_id = %entry.delivery_id, report_id, outcome = %entry.body.outcome,
                    duplicate = resp.duplicate, "report confirmed by the hub"
                );
                sh.telemetry.span_ending(
                    "report",
                    Kind::Client,
                    entry.traceparent.as_deref(),
                    started,
                    answered,
                    || {
                        vec![
                            Attr::Str("baton.delivery_id", entry.delivery_id.clone()),
                            Attr::Str("baton.report_id", entry.report_id.clone()),
                            Attr::Str("baton.outcome", entry.body.outcome.to_string()),
                            Attr::Int("baton.attempt", i64::from(resp.attempt.attempt)),
                        ]
                    },
                );
                settle.push((report_id, None));
            }
            Answer::Failed(e) if let Some(why) = e.refused_for_good() => {
                // Kept, not dead: a node started again with a renewed certificate sends it.
                sh.finish(why);
                tried.get_or_insert_with(|| (Vec::new(), e.to_string())).0.push(report_id);
                pass = Pass::HubDown;
            }
            Answer::Failed(e) if let Some(message) = e.superseded() => {
                // Not ours to report any more: the entry stays as it is.
                sh.supersede(&message);
                pass = Pass::HubDown;
            }
            Answer::Failed(e) if e.retry_later() => {
                tracing::warn!(delivery_id = %entry.delivery_id, report_id, "report not delivered yet: {e}");
                tried.get_or_insert_with(|| (Vec::new(), e.to_string())).0.push(report_id);
                pass = Pass::HubDown;
            }
            Answer::Failed(e) => {
                tracing::error!(
                    delivery_id = %entry.delivery_id, report_id,
                    "the hub refused this report for good; it will not be retried: {e}"
                );
                settle.push((report_id, Some(e.to_string())));
            }
            Answer::NotSent => pass = Pass::HubDown,
        }
    }
    if !settle.is_empty() {
        let now_ms = sh.now_ms();
        sh.store.call(move |db| db.finish_reports(&settle, now_ms)).await?;
    }
    if let Some((ids, detail)) = tried {
        let now_ms = sh.now_ms();
        sh.store.call(move |db| db.reports_tried(&ids, &detail, now_ms)).await?;
    }
    Ok(pass)
}

/// What became of one report of a pass.
enum Answer {
    /// The hub recorded it (or had already: the same report id counts once).
    Confirmed(ReportResponse),
    /// The hub refused it, or could not be reached.
    Failed(ClientError),
    /// Not sent in this pass (an earlier one found the hub unreachable).
    NotSent,
}

/// Sends `batch`, one answer per entry in order: in batch requests (`POST /v1/batch/reports`,
/// each within `BATCH_ITEMS_MAX` items and `BATCH_BYTES_MAX` bytes), or one report per
/// request to a hub that predates batches, to a batch the hub refused whole for what it carried,
/// and for a report too large to share a batch. Stops at the first request that cannot be
/// delivered now (an outage, a refusal of this node): the rest wait for the next pass.
async fn send_batch<H: Hub>(sh: &Shared<H>, batch: &[OutboxEntry]) -> Vec<Answer> {
    let mut answers = Vec::with_capacity(batch.len());
    for chunk in chunks(batch) {
        if answers.iter().any(|a| matches!(a, Answer::Failed(e) if stops_pass(e))) {
            answers.extend(chunk.iter().map(|_| Answer::NotSent));
            continue;
        }
        if !sh.batches() || (chunk.len() == 1 && too_large_for_a_batch(&chunk[0])) {
            answers.extend(send_singles(sh, chunk).await);
            continue;
        }
        match sh.hub.report_batch(chunk.iter().map(|e| e.body.clone()).collect()).await {
            Ok(results) => {
                crash_point("node.report.after_response");
                answers.extend(results.into_iter().map(|r| match r {
                    Ok(resp) => Answer::Confirmed(resp),
                    Err(e) => Answer::Failed(e),
                }));
            }
            Err(e) if e.route_unknown() => {
                sh.no_batches(&e);
                answers.extend(send_singles(sh, chunk).await);
            }
            Err(e) if stops_pass(&e) => {
                answers.push(Answer::Failed(e));
                answers.extend(chunk[1..].iter().map(|_| Answer::NotSent));
            }
            Err(e) => {
                tracing::warn!("the hub refused a batch of reports whole ({e}); sending them one by one");
                answers.extend(send_singles(sh, chunk).await);
            }
        }
    }
    answers
}

/// The bytes of a batch of reports beyond the reports themselves (`{"reports":[…]}`).
const FRAMING_BYTES: u64 = 16;

/// Splits `batch` into runs that each fit one batch request: at most `BATCH_ITEMS_MAX` reports
/// and, with the request's own framing, `BATCH_BYTES_MAX` bytes. A report too large to share a
/// request is a run of its own (sent alone to the single endpoint).
fn chunks(batch: &[OutboxEntry]) -> Vec<&[OutboxEntry]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, FRAMING_BYTES);
    for (i, entry) in batch.iter().enumerate() {
        let size = serde_json::to_vec(&entry.body).map_or(BATCH_BYTES_MAX, |b| b.len() as u64 + 1);
        if i > start && (i - start >= BATCH_ITEMS_MAX || bytes + size > BATCH_BYTES_MAX) {
            out.push(&batch[start..i]);
            (start, bytes) = (i, FRAMING_BYTES);
        }
        bytes += size;
    }
    if start < batch.len() {
        out.push(&batch[start..]);
    }
    out
}

/// Whether a report cannot share a batch request (alone it would pass `BATCH_BYTES_MAX`): it
/// goes to the single endpoint, whose bound is the hub's request body limit.
fn too_large_for_a_batch(entry: &OutboxEntry) -> bool {
    serde_json::to_vec(&entry.body).map_or(true, |b| b.len() as u64 + FRAMING_BYTES + 1 > BATCH_BYTES_MAX)
}

/// Sends each of `entries` in its own request, in order, stopping at the first that cannot be
/// delivered now.
async fn send_singles<H: Hub>(sh: &Shared<H>, entries: &[OutboxEntry]) -> Vec<Answer> {
    let mut answers = Vec::with_capacity(entries.len());
    for entry in entries {
        if answers.iter().any(|a| matches!(a, Answer::Failed(e) if stops_pass(e))) {
            answers.push(Answer::NotSent);
            continue;
        }
        match sh.hub.report(&entry.body).await {
            Ok(resp) => {
                crash_point("node.report.after_response");
                answers.push(Answer::Confirmed(resp));
            }
            Err(e) => answers.push(Answer::Failed(e)),
        }
    }
    answers
}

/// Whether a failed report means the rest of the pass cannot be sent now.
fn stops_pass(e: &ClientError) -> bool {
    e.refused_for_good().is_some() || e.superseded().is_some() || e.retry_later()
}
