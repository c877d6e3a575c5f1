//! The scheduler: starts queued turns whose gate is open, one at a time per conversation in
//! sequence order, and at most `parallel_conversations` at once; at shutdown it gives running
//! turns `shutdown_grace` and then stops them (SIGTERM, SIGKILL after `kill_grace`).
//!
//! Starting a command turn: the process is spawned and held at the gate (`exec::spawn`), then
//! the start marker is written together with its process group (in the pass's one transaction,
//! `Db::fold_markers`, with the other turns' markers), and only then is it released
//! (`exec::Spawned::run`). A crash before the marker leaves no marker and a gate that reads
//! end-of-file and exits: the harness never ran, and the turn runs after the restart. A crash after it leaves a start marker without an end marker: the
//! next start stops what is left of the recorded group and reports the attempt `unknown`.

use crate::client::Hub;
use crate::config::Harness;
use crate::exec::{CancelHandle, ExecSpec, Spawned, run_noop};
use crate::group::ProcessIdentity;
use crate::limits::BACKOFF_BASE;
use crate::shared_state::Shared;
use crate::store::{Ending, QueuedTurn, StartedTurn, StoreError};
use baton_client::Backoff;
use baton_shared::crash_point;
use baton_shared::states::Outcome;
use baton_shared::wire::{StartItem, StartResult};
use baton_telemetry::{Attr, Kind};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Chooses the turns to start now.
///
/// `queued` is ordered by conversation then sequence. Only the head (lowest queued sequence)
/// of a conversation may start, only when its gate is open (`acked`) and no turn of that
/// conversation is running; at most `free` are chosen, oldest-queued conversations first.
pub fn pick(queued: &[QueuedTurn], running: &HashSet<String>, free: usize) -> Vec<QueuedTurn> {
    let mut heads: Vec<&QueuedTurn> = Vec::new();
    for t in queued {
        match heads.last() {
            Some(h) if h.conversation == t.conversation => {
                debug_assert!(h.seq <= t.seq, "queued turns come in sequence order");
            }
            _ => heads.push(t),
        }
    }
    heads.retain(|h| h.acked && !running.contains(&h.conversation));
    heads.sort_by(|a, b| (a.queued_at_ms, &a.conversation).cmp(&(b.queued_at_ms, &b.conversation)));
    heads.into_iter().take(free).cloned().collect()
}

/// The start answer's code for a run an older session of this instance acked and may still
/// start within its start lease: not refused, asked again when the lease has run out.
pub const START_LEASE_PENDING: &str = "start_lease_pending";

/// The reason a run is reported `unknown` with when the hub says another session of this
/// instance already started it: it never runs here again.
pub const REASON_STARTED_ELSEWHERE: &str = "started by an earlier session of this node instance";
/// The reason a run is reported `unknown` with when the hub recorded its start for this data
/// directory's previous process, which crashed before it wrote the local start marker.
pub const REASON_STOPPED_AFTER_HUB_START: &str =
    "the node stopped between the hub's start record and the harness start";

/// Runs the scheduler until shutdown, then drains or kills the running turns.
///
/// Each pass asks the hub, in one `POST /v1/starts`, to record the start of every turn it is
/// about to start, and starts only those the hub answered `start: true` (order: the hub's
/// start record, then the local start marker, then the harness). A pass writes its markers in
/// one local transaction (`Db::fold_markers`): the end markers of the turns that ended since
/// the last pass, then the start markers of the turns it releases.
pub(crate) async fn scheduler<H: Hub>(sh: Arc<Shared<H>>) -> anyhow::Result<()> {
    let kill = sh.kill_turns.clone();
    let limit = sh.config.parallel_conversations as usize;
    let mut turns_running = Running::default();
    let mut backoff = Backoff::new(BACKOFF_BASE, sh.config.backoff_max);
    while !sh.shutdown.is_cancelled() {
        while let Some(done) = turns_running.tasks.try_join_next_with_id() {
            turns_running.joined(done);
        }
        let queued = sh.store.call(|db| db.queued_turns()).await?;
        let ids: Vec<String> =
            pick(&queued, &turns_running.conversations, limit.saturating_sub(turns_running.conversations.len()))
                .into_iter()
                .map(|t| t.delivery_id)
                .collect();
        let turns = if ids.is_empty() {
            Vec::new()
        } else {
            sh.store
                .call(move |db| {
                    let mut out = Vec::with_capacity(ids.len());
                    for id in &ids {
                        out.extend(db.next_attempt(id)?);
                    }
                    Ok(out)
                })
                .await?
        };
        let mut retry_in = None;
        let mut confirmed = Vec::new();
        if !turns.is_empty() {
            let later;
            (confirmed, later) = confirm_starts(&sh, turns).await?;
            match later {
                Later::No => backoff.reset(),
                Later::Backoff => retry_in = Some(backoff.next_delay()),
                Later::After(d) => retry_in = Some(d.max(BACKOFF_BASE)),
            }
        }
        let mut prepared = Vec::with_capacity(confirmed.len());
        for turn in confirmed {
            let (start, process) = prepare(&sh, &turn).await;
            prepared.push((turn, start, process));
        }
        for (turn, start) in fold(&sh, &mut turns_running.ended, prepared).await? {
            turns_running.conversations.insert(turn.conversation.clone());
            let conversation = turn.conversation.clone();
            let handle = turns_running.tasks.spawn(execute(Arc::clone(&sh), turn, start, kill.clone()));
            turns_running.by_task.insert(handle.id(), conversation);
        }
        let renew_in = renew_lease_if_due(&sh).await;
        let retry = async {
            match retry_in {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let renew = async {
            match renew_in {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sh.wake_scheduler.notified() => {}
            _ = retry => {}
            _ = renew => {}
            Some(done) = turns_running.tasks.join_next_with_id() => turns_running.joined(done),
            _ = sh.shutdown.cancelled() => {}
        }
    }
    let tasks = &mut turns_running.tasks;
    if !tasks.is_empty() {
        let grace = if sh.superseded.get().is_some() { std::time::Duration::ZERO } else { sh.config.shutdown_grace };
        tracing::info!(
            "shutting down: waiting up to {} for {} running turn(s)",
            humantime::format_duration(grace),
            tasks.len()
        );
        let mut ended = Vec::new();
        let drained = tokio::time::timeout(grace, async {
            while let Some(done) = tasks.join_next().await {
                ended.extend(done.ok());
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "stopping {} turn(s) still running after shutdown_grace (SIGTERM, then SIGKILL after kill_grace); \
                 they are reported failed (shutdown)",
                tasks.len()
            );
            kill.cancel();
            while let Some(done) = tasks.join_next().await {
                ended.extend(done.ok());
            }
        }
        turns_running.ended.extend(ended);
    }
    if !turns_running.ended.is_empty() {
        fold(&sh, &mut turns_running.ended, Vec::new()).await?;
    }
    Ok(())
}

/// The scheduler's running turns: their tasks, the conversations they occupy, and the turns
/// that ended and wait for the next pass to write their end markers.
#[derive(Default)]
struct Running {
    /// One task per running turn; each ends with its turn and how it ended.
    tasks: JoinSet<(StartedTurn, Ending)>,
    /// The conversation of each task.
    by_task: HashMap<tokio::task::Id, String>,
    /// The conversations with a running turn (one turn per conversation at a time).
    conversations: HashSet<String>,
    /// Ended turns whose end marker the next pass writes.
    ended: Vec<(StartedTurn, Ending)>,
}

impl Running {
    /// A turn's task ended: its conversation is free, its end marker waits for the fold. A task
    /// that failed (a panic) leaves its attempt started: reported `unknown` at the next start.
    fn joined(&mut self, done: Result<(tokio::task::Id, (StartedTurn, Ending)), tokio::task::JoinError>) {
        let id = match done {
            Ok((id, ended)) => {
                self.ended.push(ended);
                id
            }
            Err(e) => {
                tracing::error!("a turn's task failed: {e}; its attempt will be reported unknown at the next start");
                e.id()
            }
        };
        if let Some(c) = self.by_task.remove(&id) {
            self.conversations.remove(&c);
        }
    }
}

/// Writes one pass's markers in one local transaction: the end markers of `ended` (taken
/// out), then the start markers of `prepared`. Returns the turns to release (their start
/// marker is written); a prepared turn that cannot start after all is let go (its process
/// leaves the gate without running anything) and forgotten.
async fn fold<H: Hub>(
    sh: &Shared<H>,
    ended: &mut Vec<(StartedTurn, Ending)>,
    prepared: Vec<(StartedTurn, Start, Option<ProcessIdentity>)>,
) -> Result<Vec<(StartedTurn, Start)>, StoreError> {
    if ended.is_empty() && prepared.is_empty() {
        return Ok(Vec::new());
    }
    let ends: Vec<(StartedTurn, Ending)> = std::mem::take(ended);
    let end_markers: Vec<(String, Ending)> = ends.iter().map(|(t, e)| (t.attempt_id.clone(), e.clone())).collect();
    let start_markers: Vec<(StartedTurn, Option<ProcessIdentity>)> =
        prepared.iter().map(|(t, _, p)| (t.clone(), p.clone())).collect();
    let now_ms = sh.now_ms();
    let folded = sh.store.call(move |db| db.fold_markers(&end_markers, &start_markers, now_ms)).await;
    let folded = match folded {
        Ok(f) => f,
        Err(e) => {
            for (turn, _) in &ends {
                forget(sh, turn);
            }
            for (turn, start, _) in prepared {
                if let Start::Command(spawned) = start {
                    spawned.abandon().await;
                }
                forget(sh, &turn);
            }
            return Err(e);
        }
    };
    for (turn, _) in &ends {
        forget(sh, turn);
    }
    if !ends.is_empty() {
        crash_point("node.exec.after_end_marker");
        sh.wake_outbox.notify_one();
    }
    // Fewer executions wait unstarted, or a turn ended: the claim loop may ask for more.
    sh.wake_claimer.notify_one();
    let mut release = Vec::with_capacity(prepared.len());
    for ((turn, start, _), begun) in prepared.into_iter().zip(folded.begun) {
        if begun {
            release.push((turn, start));
        } else {
            if let Start::Command(spawned) = start {
                spawned.abandon().await;
            }
            forget(sh, &turn);
        }
    }
    if !release.is_empty() {
        crash_point("node.exec.after_start_marker");
    }
    Ok(release)
}

/// Whether, and when, a pass asks the hub again about turns it could not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Later {
    /// Every turn was settled.
    No,
    /// Some could not be asked about now: ask again after the scheduler's backoff.
    Backoff,
    /// Some wait for an older session's start lease to run out: ask again after this long.
    After(std::time::Duration),
}

impl Later {
    /// Both at once: the sooner wins, a backoff over a fixed time.
    fn and(self, other: Later) -> Later {
        match (self, other) {
            (Later::No, o) | (o, Later::No) => o,
            (Later::Backoff, _) | (_, Later::Backoff) => Later::Backoff,
            (Later::After(a), Later::After(b)) => Later::After(a.min(b)),
        }
    }
}

/// What the hub said about the turns a pass is about to start.
enum Confirmed {
    /// Start these (the hub recorded their start for this session, or the hub cannot be reached
    /// and this session's own ack and start lease make them ours), and whether to ask again
    /// about the others.
    Start(Vec<StartedTurn>, Later),
    /// The hub could not be asked now: try again after a pause.
    Later,
}

/// While runs this process acked wait to start (`acked_here`: behind a running turn of their
/// conversation, or the parallel limit), keeps the session's start lease alive: an empty `POST /v1/starts`
/// once less than `START_LEASE_RENEW_PERCENT_MARGIN` of it is left, so that should the hub become
/// unreachable they may still start within the lease. Returns when to look again (none: no
/// lease to keep).
async fn renew_lease_if_due<H: Hub>(sh: &Shared<H>) -> Option<std::time::Duration> {
    if sh.starts_unconfirmed.load(Ordering::Relaxed) || sh.session.get().is_none() {
        return None;
    }
    let newest_ack = sh.acked_here.lock().unwrap_or_else(|p| p.into_inner()).values().max().copied();
    let newest_ack = newest_ack?;
    let lease = *sh.start_lease();
    // A run acked since the last renewal may not start on the node's own until a renewal covers
    // it: renew at once, then on the lease's own schedule.
    let due = if lease.length.is_some() && !lease.covers(newest_ack) {
        std::time::Duration::ZERO
    } else {
        lease.renew_in(tokio::time::Instant::now())?
    };
    if !due.is_zero() {
        return Some(due);
    }
    let sent = tokio::time::Instant::now();
    let answer = tokio::select! {
        r = sh.hub.starts(Vec::new()) => r,
        _ = sh.shutdown.cancelled() => return None,
    };
    match answer {
        Ok(_) => {
            sh.start_lease().renewed(sent);
            sh.start_lease().renew_in(tokio::time::Instant::now())
        }
        Err(e) if let Some(message) = e.superseded() => {
            sh.supersede(&message);
            None
        }
        Err(e) => {
            tracing::debug!("renewing the start lease failed: {e}");
            Some(BACKOFF_BASE.max(sh.start_lease().left(tokio::time::Instant::now()).min(RENEW_RETRY_PACE)))
        }
    }
}

/// How soon a failed renewal of the start lease is tried again (at most; sooner when the lease
/// is about to end anyway).
const RENEW_RETRY_PACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Asks the hub to record the start of `turns`, in one request (more only past
/// `claim_batch_max` turns, the hub's bound on one request), and settles the refused ones.
/// Returns the turns to start, and whether some could not be asked about now (try later).
async fn confirm_starts<H: Hub>(
    sh: &Shared<H>,
    turns: Vec<StartedTurn>,
) -> Result<(Vec<StartedTurn>, Later), StoreError> {
    let per_request = (sh.config.claim_batch_max as usize).max(1);
    let (mut start, mut later) = (Vec::new(), Later::No);
    let mut turns = turns.into_iter().peekable();
    while turns.peek().is_some() {
        let chunk: Vec<StartedTurn> = turns.by_ref().take(per_request).collect();
        match confirm_chunk(sh, chunk).await? {
            Confirmed::Start(confirmed, left_out) => {
                start.extend(confirmed);
                later = later.and(left_out);
            }
            Confirmed::Later => later = later.and(Later::Backoff),
        }
    }
    Ok((start, later))
}

/// One `POST /v1/starts` for `turns`; settles the refused ones: `cancelled` → reported
/// `cancelled`, never started; `started_elsewhere` → reported `unknown`; `stale_claim`,
/// `not_found` (or anything else) → dropped locally, never run here.
async fn confirm_chunk<H: Hub>(sh: &Shared<H>, turns: Vec<StartedTurn>) -> Result<Confirmed, StoreError> {
    if sh.starts_unconfirmed.load(Ordering::Relaxed) {
        sh.started_offline.store(true, Ordering::Relaxed);
        return Ok(Confirmed::Start(turns, Later::No));
    }
    let items = turns
        .iter()
        .map(|t| StartItem { delivery_id: t.delivery_id.clone(), claim_token: t.claim_token.clone(), attempt: t.run })
        .collect();
    let sent = tokio::time::Instant::now();
    let started = sh.telemetry.started();
    let results = tokio::select! {
        r = sh.hub.starts(items) => r,
        _ = sh.shutdown.cancelled() => return Ok(Confirmed::Later),
    };
    let results = match results {
        Ok(results) => results,
        Err(e) if let Some(why) = e.refused_for_good() => {
            sh.finish(why);
            return Ok(Confirmed::Later);
        }
        Err(e) if let Some(message) = e.superseded() => {
            sh.supersede(&message);
            return Ok(Confirmed::Later);
        }
        Err(e) if e.route_unknown() => {
            tracing::warn!("the hub does not know hub-confirmed starts ({e}); starting turns on the local gate alone");
            sh.starts_unconfirmed.store(true, Ordering::Relaxed);
            sh.started_offline.store(true, Ordering::Relaxed);
            return Ok(Confirmed::Start(turns, Later::No));
        }
        Err(e) if e.retry_later() => {
            // The hub cannot be reached (or is failing): start what this process's own ack
            // made ours, and only while this session's start lease lasts (a newer session of
            // this instance is granted none of these runs before the hub's lease ran out); the
            // rest waits for the hub.
            let left = if baton_shared::crash::mutation("node.start.ignore_lease") {
                std::time::Duration::MAX
            } else {
                sh.start_lease().left(tokio::time::Instant::now())
            };
            let (offline, wait): (Vec<StartedTurn>, Vec<StartedTurn>) = if left.is_zero() {
                (Vec::new(), turns)
            } else {
                let acked = sh.acked_here.lock().unwrap_or_else(|p| p.into_inner());
                let lease = *sh.start_lease();
                let ignore = baton_shared::crash::mutation("node.start.ignore_lease");
                turns.into_iter().partition(|t| {
                    acked.get(&(t.delivery_id.clone(), t.run)).is_some_and(|at| ignore || lease.covers(*at))
                })
            };
            if !offline.is_empty() {
                sh.started_offline.store(true, Ordering::Relaxed);
                tracing::warn!(
                    turns = offline.len(),
                    lease_left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    "the hub cannot record starts now ({e}); starting the turns this process's ack made ours on the \
                     local gate, within this session's start lease"
                );
            }
            if !wait.is_empty() {
                if left.is_zero() {
                    tracing::warn!(
                        turns = wait.len(),
                        "the hub cannot record starts now ({e}) and this session's start lease has ended: starting \
                         nothing until the hub answers"
                    );
                } else {
                    tracing::warn!(turns = wait.len(), "asking the hub to start turns failed; trying again: {e}");
                }
            }
            let left = if wait.is_empty() { Later::No } else { Later::Backoff };
            return Ok(Confirmed::Start(offline, left));
        }
        Err(e) => {
            tracing::warn!(turns = turns.len(), "asking the hub to start turns failed; trying again: {e}");
            return Ok(Confirmed::Later);
        }
    };
    sh.start_lease().renewed(sent);
    if results.iter().any(|r| r.start) {
        crash_point("node.start.after_hub");
    }
    let mut answers: HashMap<String, StartResult> = results.into_iter().map(|r| (r.delivery_id.clone(), r)).collect();
    let mut start = Vec::new();
    let mut later = Later::No;
    for turn in turns {
        let Some(answer) = answers.remove(&turn.delivery_id) else {
            tracing::warn!(delivery_id = %turn.delivery_id, "the hub's start answer leaves this turn out; asking again later");
            later = later.and(Later::Backoff);
            continue;
        };
        if answer.start {
            sh.telemetry.span("start", Kind::Client, turn.traceparent.as_deref(), started, || {
                baton_telemetry::delivery_attrs(
                    &turn.delivery_id,
                    &turn.message_id,
                    &turn.conversation,
                    turn.seq,
                    turn.run,
                )
            });
            start.push(turn);
            continue;
        }
        if answer.code.as_deref() == Some(START_LEASE_PENDING) {
            let wait = std::time::Duration::from_millis(answer.retry_after_ms.unwrap_or(0));
            tracing::info!(
                delivery_id = %turn.delivery_id,
                attempt = turn.run,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "an earlier session of this node instance acked this turn and may still start it within its start \
                 lease; asking again when the lease has run out"
            );
            later = later.and(Later::After(wait));
            continue;
        }
        settle_refused_start(sh, &turn, &answer).await?;
    }
    Ok(Confirmed::Start(start, later))
}

/// A turn the hub refused to start: it never runs here.
async fn settle_refused_start<H: Hub>(
    sh: &Shared<H>,
    turn: &StartedTurn,
    answer: &StartResult,
) -> Result<(), StoreError> {
    let (id, run, now_ms) = (turn.delivery_id.clone(), turn.run, sh.now_ms());
    sh.acked_here.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id.clone(), run));
    let message = answer.message.clone().unwrap_or_default();
    match answer.code.as_deref() {
        Some("cancelled") => {
            let why = if message.is_empty() {
                "cancelled before it started".to_string()
            } else {
                format!("cancelled before it started: {message}")
            };
            tracing::warn!(delivery_id = %id, attempt = run, "the hub refused the start: cancelled; reporting it cancelled, never started");
            sh.store.call(move |db| db.cancel_unstarted(&id, run, &why, now_ms)).await?;
            sh.wake_outbox.notify_one();
        }
        Some("started_elsewhere") => {
            tracing::error!(delivery_id = %id, attempt = run, "the hub says an earlier session of this instance started this turn; never running it here, reporting it unknown");
            let why = if sh.after_own_crash.get() == Some(&true) {
                REASON_STOPPED_AFTER_HUB_START
            } else {
                REASON_STARTED_ELSEWHERE
            };
            let ending = Ending::unstarted(Outcome::Unknown, why);
            sh.store.call(move |db| db.end_unstarted(&id, run, &ending, now_ms)).await?;
            sh.wake_outbox.notify_one();
        }
        code => {
            tracing::warn!(delivery_id = %id, attempt = run, code = code.unwrap_or(""), "the hub refused the start ({message}); dropping the local copy, it will not run here");
            let why = format!("start refused: {} {message}", code.unwrap_or(""));
            sh.store.call(move |db| db.drop_unstarted(&id, &why, now_ms)).await?;
        }
    }
    // The conversation's next turn may start now, and the local queue shrank.
    sh.wake_scheduler.notify_one();
    sh.wake_claimer.notify_one();
    Ok(())
}

/// A turn whose start marker is written, and what runs it.
enum Start {
    /// The in-process no-op harness.
    Noop,
    /// The command's process, held at the gate; its group is stored with the start marker.
    Command(Spawned),
    /// The command could not be started; this is how the attempt ends.
    Failed(Ending),
}

/// Readies `turn` to start: registers its cancel handle (before its start marker, so a cancel
/// that finds it started finds the handle) and, for a command, spawns its process held at the
/// gate, with the process group the start marker stores. Nothing is written here: the pass's
/// `fold` writes the marker, then the turn is released (or let go).
async fn prepare<H: Hub>(sh: &Shared<H>, turn: &StartedTurn) -> (Start, Option<ProcessIdentity>) {
    sh.acked_here.lock().unwrap_or_else(|p| p.into_inner()).remove(&(turn.delivery_id.clone(), turn.run));
    sh.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(turn.delivery_id.clone(), (turn.run, CancelHandle::default()));
    match sh.config.harness {
        Harness::Noop => (Start::Noop, None),
        Harness::Command => match crate::exec::spawn(&spec(sh), turn) {
            Err(ending) => (Start::Failed(ending), None),
            Ok(spawned) => {
                crash_point("node.exec.after_spawn");
                match spawned.identity() {
                    Ok(process) => (Start::Command(spawned), Some(process)),
                    Err(e) => {
                        // Never released: the harness does not run, and nothing of it is left.
                        tracing::error!(delivery_id = %turn.delivery_id, pgid = spawned.pgid(), "not running the turn: cannot read its process group from /proc: {e}");
                        spawned.abandon().await;
                        let ending = Ending::unstarted(
                            Outcome::Failed,
                            format!("not started: cannot read its process group from /proc: {e}"),
                        );
                        (Start::Failed(ending), None)
                    }
                }
            }
        },
    }
}

/// Removes `turn`'s cancel handle (it did not start, or its end marker is written).
fn forget<H>(sh: &Shared<H>, turn: &StartedTurn) {
    let mut running = sh.running.lock().unwrap_or_else(|p| p.into_inner());
    if running.get(&turn.delivery_id).is_some_and(|(run, _)| *run == turn.run) {
        running.remove(&turn.delivery_id);
    }
}

fn spec<H>(sh: &Shared<H>) -> ExecSpec {
    ExecSpec {
        argv: sh.config.command.clone(),
        timeout: sh.config.exec_timeout,
        kill_grace: sh.config.kill_grace,
        cancel_grace: sh.config.cancel_grace,
        result_bytes_max: sh.config.result_bytes_max,
        stderr_tail_bytes: sh.config.stderr_tail_bytes,
        instance_id: sh.instance_id.clone(),
        gate: sh.gate.clone(),
        progress_line_bytes_max: sh.config.progress_event_bytes_max,
    }
}

/// Runs one started turn; returns how it ended, for the next pass to write its end marker
/// (which queues its report).
async fn execute<H: Hub>(
    sh: Arc<Shared<H>>,
    turn: StartedTurn,
    start: Start,
    kill: CancellationToken,
) -> (StartedTurn, Ending) {
    tracing::info!(delivery_id = %turn.delivery_id, attempt_id = %turn.attempt_id, conversation = %turn.conversation, seq = turn.seq, attempt = turn.run, "running turn");
    let cancel = sh.running_turn(&turn.delivery_id, turn.run).unwrap_or_default();
    let started = sh.telemetry.started();
    let ending = match start {
        // Cancelled between the start marker and the release: the harness never runs.
        Start::Noop | Start::Command(_) if cancel.is_requested() => {
            if let Start::Command(spawned) = start {
                spawned.abandon().await;
            }
            Ending::unstarted(Outcome::Cancelled, format!("cancelled before it started: {}", cancel.reason()))
        }
        Start::Noop => {
            crash_point("node.exec.during_effect");
            run_noop()
        }
        Start::Command(spawned) => {
            let sink = sh.progress.start(&turn.delivery_id, turn.run, &turn.claim_token);
            let ending = spawned.run(&spec(&sh), &turn, &kill, &cancel, Some(sink)).await;
            let dropped = sh.progress.end(&turn.delivery_id, turn.run);
            if dropped > 0 {
                tracing::warn!(delivery_id = %turn.delivery_id, attempt = turn.run, dropped, "progress events of this turn were dropped (bounds, rate or buffer); the hub counts them with the run");
            }
            ending
        }
        Start::Failed(ending) => ending,
    };
    tracing::info!(
        delivery_id = %turn.delivery_id, attempt_id = %turn.attempt_id, outcome = %ending.outcome,
        exit_code = ending.exit_code, duration_ms = ending.duration_ms, signal = ending.signal,
        reason = ending.reason.as_deref(), "turn ended"
    );
    sh.telemetry.span("run", Kind::Internal, turn.traceparent.as_deref(), started, || {
        let mut attrs = baton_telemetry::delivery_attrs(
            &turn.delivery_id,
            &turn.message_id,
            &turn.conversation,
            turn.seq,
            turn.run,
        );
        attrs.push(Attr::Str("baton.outcome", ending.outcome.to_string()));
        attrs.extend(ending.exit_code.map(|c| Attr::Int("baton.exit_code", i64::from(c))));
        attrs
    });
    (turn, ending)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: &str, conversation: &str, seq: i64, acked: bool, queued_at_ms: i64) -> QueuedTurn {
        QueuedTurn { delivery_id: id.into(), conversation: conversation.into(), seq, acked, queued_at_ms }
    }

    fn check(queued: &[QueuedTurn], running: &[&str], free: usize, expected: &[&str]) {
        let running = running.iter().map(|s| s.to_string()).collect();
        let got: Vec<String> = pick(queued, &running, free).into_iter().map(|t| t.delivery_id).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn one_turn_per_conversation_in_sequence_order() {
        let queued = [q("a1", "a", 1, true, 0), q("a2", "a", 2, true, 0), q("b5", "b", 5, true, 1)];
        check(&queued, &[], 10, &["a1", "b5"]);
        check(&queued, &["a"], 10, &["b5"]);
        check(&queued, &["a", "b"], 10, &[]);
    }

    #[test]
    fn parallel_limit_and_oldest_first() {
        let queued = [q("a1", "a", 1, true, 30), q("b1", "b", 1, true, 10), q("c1", "c", 1, true, 20)];
        check(&queued, &[], 2, &["b1", "c1"]);
        check(&queued, &[], 0, &[]);
    }

    #[test]
    fn an_unacked_head_holds_its_conversation() {
        let queued = [q("a1", "a", 1, false, 0), q("a2", "a", 2, true, 0), q("b1", "b", 1, true, 0)];
        check(&queued, &[], 10, &["b1"]);
    }
}
