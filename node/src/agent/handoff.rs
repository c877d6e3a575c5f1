//! The handoff of claimed deliveries (SPEC §4 step 3): each checked (`validate`, else
//! `reject`), mirrored into the local store, `mirrored` and `ack` told to the hub — as one
//! combined handoff batch, or as two batches, or one request per delivery for a hub that
//! predates them — and the execution gate opened for what the hub confirmed delivered
//! (`open_gates`). A transition the hub refused for good drops the local copy (`drop_local`).

use super::Stop;
use crate::client::Hub;
use crate::limits::BACKOFF_BASE;
use crate::shared_state::Shared;
use crate::store::Mirrored;
use baton_client::{Backoff, ClientError, ItemAnswer};
use baton_shared::crash_point;
use baton_shared::limits::BATCH_ITEMS_MAX;
use baton_shared::states::DeliveryState;
use baton_shared::wire::{ClaimedDelivery, HolderItem, TransitionResponse};
use baton_telemetry::Kind;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::task::JoinSet;

/// Checks a delivery from the hub before it is written to the store.
pub(super) fn validate(d: &ClaimedDelivery) -> Result<(), String> {
    let id_ok = |s: &str| !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_graphic() && c != '/');
    if !id_ok(&d.delivery_id) {
        return Err(format!("delivery_id {:?} is not a valid id", d.delivery_id));
    }
    if !id_ok(&d.message_id) {
        return Err(format!("message_id {:?} is not a valid id", d.message_id));
    }
    baton_shared::ids::check_name("conversation", &d.conversation).map_err(|e| e.to_string())?;
    baton_shared::ids::check_token("claim_token", &d.claim_token).map_err(|e| e.to_string())?;
    if d.seq < 0 {
        return Err(format!("seq {} is negative", d.seq));
    }
    Ok(())
}

/// Refuses a delivery the node cannot take (bad fields); best effort, never retried.
pub(super) async fn reject<H: Hub>(sh: &Shared<H>, d: &ClaimedDelivery, why: &str) {
    tracing::error!(delivery_id = %d.delivery_id, "refusing a delivery the hub sent: {why}");
    if let Err(e) = sh.hub.reject(&d.delivery_id, &d.claim_token, why).await {
        tracing::warn!(delivery_id = %d.delivery_id, "reject not delivered: {e}");
    }
}

/// Mirrors a fresh claim batch in one local transaction, then hands the batch off
/// (`handoff_batch`).
pub(super) async fn take_batch<H: Hub>(sh: &Arc<Shared<H>>, batch: Vec<ClaimedDelivery>) -> Result<(), Stop> {
    // The handoff's span covers the local mirror too.
    let started = sh.telemetry.started();
    let mut good = Vec::with_capacity(batch.len());
    for d in batch {
        match validate(&d) {
            Ok(()) => good.push(d),
            Err(why) => reject(sh, &d, &why).await,
        }
    }
    let (mirror, now_ms) = (good.clone(), sh.now_ms());
    let done = sh.store.call(move |db| db.mirror_batch(&mirror, now_ms)).await?;
    crash_point("node.mirror.after_commit");
    let mut items = Vec::with_capacity(good.len());
    for (d, m) in good.into_iter().zip(done) {
        if m == Mirrored::AlreadyRan {
            tracing::warn!(delivery_id = %d.delivery_id, "claimed again although it already ran here; not acking it");
            continue;
        }
        items.push((d, DeliveryState::Claimed));
    }
    handoff_batch(sh, items, started).await
}

/// One step of the handoff the hub records for a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `mirrored`: the local copy is committed.
    Mirrored,
    /// `ack`: the handoff is durable; the hub answers `delivered`.
    Ack,
    /// Both in one request (`POST /v1/batch/handoff`); the hub answers as the `ack` does.
    Handoff,
}

impl Step {
    fn as_str(self) -> &'static str {
        match self {
            Step::Mirrored => "mirrored",
            Step::Ack => "ack",
            Step::Handoff => "handoff",
        }
    }
}

/// Hands deliveries off, each from the hub state it is in, and opens the local gates of those
/// the hub confirmed `delivered` in one local transaction (`Db::mark_acked_batch`). With
/// `handoff = "combined"` (a hub that knows it) one request asks for `mirrored` and `ack`
/// together; otherwise the node tells the hub `mirrored` for those still `claimed`, then acks
/// them all. Transient failures are retried; a refusal of one item drops that local copy only,
/// exactly as the single answer would. Each delivery the hub confirmed gets a `handoff` span
/// from `started` (when tracing is on).
pub(super) async fn handoff_batch<H: Hub>(
    sh: &Arc<Shared<H>>,
    items: Vec<(ClaimedDelivery, DeliveryState)>,
    started: Option<std::time::SystemTime>,
) -> Result<(), Stop> {
    if items.is_empty() {
        return Ok(());
    }
    if sh.combined_handoff() {
        let all: Vec<ClaimedDelivery> = items.into_iter().map(|(d, _)| d).collect();
        let answers = transition_all(sh, Step::Handoff, &all).await?;
        crash_point("node.handoff.after_response");
        return open_gates(sh, Step::Handoff, all, answers, started).await;
    }
    let to_mirror: Vec<ClaimedDelivery> =
        items.iter().filter(|(_, st)| *st == DeliveryState::Claimed).map(|(d, _)| d.clone()).collect();
    let mut refused: HashSet<String> = HashSet::new();
    if !to_mirror.is_empty() {
        let answers = transition_all(sh, Step::Mirrored, &to_mirror).await?;
        crash_point("node.mirrored.after_response");
        for (d, answer) in to_mirror.iter().zip(answers) {
            if let Err(e) = answer {
                drop_local(sh, &d.delivery_id, "mirrored", &e).await?;
                refused.insert(d.delivery_id.clone());
            }
        }
    }
    let to_ack: Vec<ClaimedDelivery> =
        items.into_iter().map(|(d, _)| d).filter(|d| !refused.contains(&d.delivery_id)).collect();
    if to_ack.is_empty() {
        return Ok(());
    }
    let answers = transition_all(sh, Step::Ack, &to_ack).await?;
    crash_point("node.ack.after_response");
    open_gates(sh, Step::Ack, to_ack, answers, started).await
}

/// After the hub's answers to the `ack` (or the combined handoff, `step`) of `acked`: drops
/// the local copies the hub refused, and opens the gates of those it confirmed `delivered`, in
/// one local transaction.
async fn open_gates<H: Hub>(
    sh: &Arc<Shared<H>>,
    step: Step,
    acked: Vec<ClaimedDelivery>,
    answers: Vec<ItemAnswer<TransitionResponse>>,
    started: Option<std::time::SystemTime>,
) -> Result<(), Stop> {
    let mut open = Vec::with_capacity(acked.len());
    for (d, answer) in acked.iter().zip(answers) {
        match answer {
            Err(e) => drop_local(sh, &d.delivery_id, step.as_str(), &e).await?,
            Ok(t) if t.state != DeliveryState::Delivered => {
                tracing::error!(delivery_id = %d.delivery_id, state = %t.state, "the hub answered an ack without delivering; not running it");
            }
            Ok(_) => open.push(d),
        }
    }
    if open.is_empty() {
        return Ok(());
    }
    let (gates, now_ms): (Vec<(String, String)>, i64) =
        (open.iter().map(|d| (d.delivery_id.clone(), d.claim_token.clone())).collect(), sh.now_ms());
    let moved = sh.store.call(move |db| db.mark_acked_batch(&gates, now_ms)).await?;
    {
        let mut acked = sh.acked_here.lock().unwrap_or_else(|p| p.into_inner());
        let confirmed = tokio::time::Instant::now();
        for (d, moved) in open.iter().zip(moved) {
            if moved {
                tracing::debug!(delivery_id = %d.delivery_id, "acked: the execution gate is open");
            }
            acked.entry((d.delivery_id.clone(), d.attempt)).or_insert(confirmed);
        }
    }
    sh.wake_scheduler.notify_one();
    let ended = sh.telemetry.started();
    for d in &open {
        sh.telemetry.span_ending("handoff", Kind::Client, d.traceparent.as_deref(), started, ended, || {
            baton_telemetry::delivery_attrs(&d.delivery_id, &d.message_id, &d.conversation, d.seq, d.attempt)
        });
    }
    Ok(())
}

/// Asks the hub to make `step` for every delivery of `ds`; returns one final answer per item,
/// in order: the hub's answer, or its refusal of that item. Transient failures (of the whole
/// request or of an item) are retried with backoff until the hub answers; a refusal of this
/// node (revoked, superseded) or shutdown stops it.
async fn transition_all<H: Hub>(
    sh: &Arc<Shared<H>>,
    step: Step,
    ds: &[ClaimedDelivery],
) -> Result<Vec<ItemAnswer<TransitionResponse>>, Stop> {
    let mut answers: Vec<Option<ItemAnswer<TransitionResponse>>> = vec![None; ds.len()];
    let mut backoff = Backoff::new(BACKOFF_BASE, sh.config.backoff_max);
    loop {
        let pending: Vec<usize> = (0..ds.len()).filter(|i| answers[*i].is_none()).collect();
        if pending.is_empty() {
            return Ok(answers.into_iter().flatten().collect());
        }
        let items: Vec<(String, String)> =
            pending.iter().map(|i| (ds[*i].delivery_id.clone(), ds[*i].claim_token.clone())).collect();
        let sent = tokio::select! {
            r = send_step(sh, step, items) => r,
            _ = sh.shutdown.cancelled() => return Err(Stop::Shutdown),
        };
        let mut transient = None;
        for (i, answer) in pending.into_iter().zip(sent) {
            match answer {
                Ok(t) => answers[i] = Some(Ok(t)),
                Err(e) if let Some(why) = e.refused_for_good() => {
                    sh.finish(why);
                    return Err(Stop::Shutdown);
                }
                Err(e) if let Some(message) = e.superseded() => {
                    sh.supersede(&message);
                    return Err(Stop::Shutdown);
                }
                Err(e) if e.retry_later() => transient = Some(e),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        if let Some(e) = transient {
            tracing::warn!("hub call failed ({}), retrying: {e}", step.as_str());
            sh.pause(sh.retry_pause(&mut backoff, &e)).await;
            if sh.shutdown.is_cancelled() {
                return Err(Stop::Shutdown);
            }
        }
    }
}

/// `mirrored` for each of `items`, then `ack` for those the hub did not refuse: one answer per
/// item, in order (the refusal of its `mirrored`, else the answer to its `ack`). The combined
/// handoff sent as two batches, to a hub that does not take it; a hub's `mirrored` is a no-op
/// for a delivery it already has further along.
async fn send_apart<H: Hub>(sh: &Arc<Shared<H>>, items: Vec<(String, String)>) -> Vec<ItemAnswer<TransitionResponse>> {
    let mirrored = send_step(sh, Step::Mirrored, items.clone()).await;
    let to_ack = items.into_iter().zip(&mirrored).filter(|(_, m)| m.is_ok()).map(|(item, _)| item).collect();
    let mut acked = send_step(sh, Step::Ack, to_ack).await.into_iter();
    mirrored
        .into_iter()
        .map(|m| match m {
            Ok(_) => acked.next().unwrap_or_else(|| {
                Err(ClientError::Transport { detail: "no answer to the ack".into(), maybe_sent: true })
            }),
            Err(e) => Err(e),
        })
        .collect()
}

/// One round of `step` for `items` (delivery id, claim token): one answer per item, in order.
/// One batch request per `BATCH_ITEMS_MAX` items. Without it (a hub that predates the route,
/// or a batch the hub refused whole for what it carried, a bound) each item gets the answer
/// the step's other form gives: the combined handoff as `mirrored` then `ack` batches
/// (`send_apart`) while the hub takes batches, every step as single requests, sent
/// concurrently, to a hub that predates batches.
async fn send_step<H: Hub>(
    sh: &Arc<Shared<H>>,
    step: Step,
    items: Vec<(String, String)>,
) -> Vec<ItemAnswer<TransitionResponse>> {
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(BATCH_ITEMS_MAX) {
        let batched = match step {
            Step::Handoff => sh.combined_handoff(),
            Step::Mirrored | Step::Ack => sh.batches(),
        };
        if batched {
            let batch: Vec<HolderItem> = chunk
                .iter()
                .map(|(id, token)| HolderItem { delivery_id: id.clone(), claim_token: token.clone() })
                .collect();
            let answer = match step {
                Step::Mirrored => sh.hub.mirrored_batch(batch).await,
                Step::Ack => sh.hub.ack_batch(batch).await,
                Step::Handoff => sh.hub.handoff_batch(batch).await,
            };
            match answer {
                Ok(results) => {
                    out.extend(results);
                    continue;
                }
                Err(e) if e.retry_later() || e.refused_for_good().is_some() || e.superseded().is_some() => {
                    out.extend(chunk.iter().map(|_| Err(e.clone())));
                    continue;
                }
                Err(e) if e.route_unknown() => match step {
                    Step::Handoff => sh.no_combined_handoff(&e),
                    Step::Mirrored | Step::Ack => sh.no_batches(&e),
                },
                Err(e) => {
                    tracing::warn!("the hub refused a {} batch whole ({e}); sending its items apart", step.as_str());
                }
            }
        }
        if step == Step::Handoff && sh.batches() {
            out.extend(Box::pin(send_apart(sh, chunk.to_vec())).await);
        } else {
            out.extend(send_singles(sh, step, chunk.to_vec()).await);
        }
    }
    out
}

/// `step` for each of `items` in its own request, sent concurrently (the combined handoff as
/// `mirrored` then `ack` per item); one answer per item, in order.
async fn send_singles<H: Hub>(
    sh: &Arc<Shared<H>>,
    step: Step,
    items: Vec<(String, String)>,
) -> Vec<ItemAnswer<TransitionResponse>> {
    let mut calls = JoinSet::new();
    for (i, (id, token)) in items.into_iter().enumerate() {
        let sh = Arc::clone(sh);
        calls.spawn(async move {
            let r = match step {
                Step::Mirrored => sh.hub.mirrored(&id, &token).await,
                Step::Ack => sh.hub.ack(&id, &token).await,
                Step::Handoff => match sh.hub.mirrored(&id, &token).await {
                    Ok(_) => sh.hub.ack(&id, &token).await,
                    Err(e) => Err(e),
                },
            };
            (i, r)
        });
    }
    let mut out: Vec<Option<ItemAnswer<TransitionResponse>>> = vec![None; calls.len()];
    while let Some(joined) = calls.join_next().await {
        match joined {
            Ok((i, r)) => out[i] = Some(r),
            Err(e) => tracing::error!("a {} call's task failed: {e}", step.as_str()),
        }
    }
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(ClientError::Transport { detail: "the call's task failed".into(), maybe_sent: true })
            })
        })
        .collect()
}

/// The hub refused a transition for good: the delivery is not ours any more. It never runs.
async fn drop_local<H: Hub>(sh: &Shared<H>, id: &str, step: &str, e: &ClientError) -> Result<(), Stop> {
    tracing::warn!(delivery_id = id, "the hub refused {step}: {e}; dropping the local copy, it will not run here");
    let (i, why, now_ms) = (id.to_string(), format!("{step} refused: {e}"), sh.now_ms());
    sh.store.call(move |db| db.drop_delivery(&i, &why, now_ms)).await?;
    sh.wake_scheduler.notify_one();
    sh.wake_claimer.notify_one();
    Ok(())
}
