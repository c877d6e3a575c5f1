//! The scheduler: starts queued turns whose gate is open, one at a time per conversation in
//! sequence order, and at most `parallel_conversations` at once; at shutdown it gives running
//! turns `shutdown_grace` and then stops them (SIGTERM, SIGKILL after `kill_grace`).
//!
//! Starting a command turn: the process is spawned and held at the gate (`exec::spawn`), then
//! the start marker is written together with its process group (`Db::begin_attempt`, one
//! transaction), and only then is it released (`exec::Spawned::run`). A crash before the marker
//! leaves no marker and a gate that reads end-of-file and exits: the harness never ran, and the
//! turn runs after the restart. A crash after it leaves a start marker without an end marker: the
//! next start stops what is left of the recorded group and reports the attempt `unknown`.

use crate::client::Hub;
use crate::config::Harness;
use crate::exec::{ExecSpec, Spawned, run_noop};
use crate::shared_state::Shared;
use crate::store::{Ending, QueuedTurn, StartedTurn, StoreError};
use baton_shared::crash_point;
use baton_shared::states::Outcome;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
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

/// Runs the scheduler until shutdown, then drains or kills the running turns.
pub(crate) async fn scheduler<H: Hub>(sh: Arc<Shared<H>>) -> anyhow::Result<()> {
    let kill = CancellationToken::new();
    let limit = sh.config.parallel_conversations as usize;
    let mut running: HashSet<String> = HashSet::new();
    let mut by_task: HashMap<tokio::task::Id, String> = HashMap::new();
    let mut tasks: JoinSet<()> = JoinSet::new();
    while !sh.shutdown.is_cancelled() {
        let queued = sh.store.call(|db| db.queued_turns()).await?;
        for t in pick(&queued, &running, limit.saturating_sub(running.len())) {
            let id = t.delivery_id.clone();
            let Some(turn) = sh.store.call(move |db| db.next_attempt(&id)).await? else {
                continue;
            };
            let Some(start) = start(&sh, &turn).await? else {
                continue;
            };
            crash_point("node.exec.after_start_marker");
            running.insert(turn.conversation.clone());
            let conversation = turn.conversation.clone();
            let handle = tasks.spawn(execute(Arc::clone(&sh), turn, start, kill.clone()));
            by_task.insert(handle.id(), conversation);
        }
        tokio::select! {
            _ = sh.wake_scheduler.notified() => {}
            Some(done) = tasks.join_next_with_id() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => {
                        tracing::error!("a turn's task failed: {e}");
                        e.id()
                    }
                };
                if let Some(c) = by_task.remove(&id) {
                    running.remove(&c);
                }
                sh.wake_claimer.notify_one();
            }
            _ = sh.shutdown.cancelled() => {}
        }
    }
    if !tasks.is_empty() {
        let grace = sh.config.shutdown_grace;
        tracing::info!(
            "shutting down: waiting up to {} for {} running turn(s)",
            humantime::format_duration(grace),
            tasks.len()
        );
        let drained = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                "stopping {} turn(s) still running after shutdown_grace (SIGTERM, then SIGKILL after kill_grace); \
                 they are reported failed (shutdown)",
                tasks.len()
            );
            kill.cancel();
            while tasks.join_next().await.is_some() {}
        }
    }
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

/// Writes `turn`'s start marker; for a command, spawns its process at the gate first and stores
/// its process group in the same transaction. `None` when the turn cannot start after all
/// (nothing was written, and a spawned process is let go without running anything).
async fn start<H: Hub>(sh: &Shared<H>, turn: &StartedTurn) -> Result<Option<Start>, StoreError> {
    let (start, process) = match sh.config.harness {
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
                        let ending = Ending {
                            outcome: Outcome::Failed,
                            exit_code: None,
                            duration_ms: None,
                            result: None,
                            reason: Some(format!("not started: cannot read its process group from /proc: {e}")),
                        };
                        (Start::Failed(ending), None)
                    }
                }
            }
        },
    };
    let (t, now_ms) = (turn.clone(), sh.now_ms());
    let begun = sh.store.call(move |db| db.begin_attempt(&t, process.as_ref(), now_ms)).await?;
    if begun {
        return Ok(Some(start));
    }
    if let Start::Command(spawned) = start {
        spawned.abandon().await;
    }
    Ok(None)
}

fn spec<H>(sh: &Shared<H>) -> ExecSpec {
    ExecSpec {
        argv: sh.config.command.clone(),
        timeout: sh.config.exec_timeout,
        kill_grace: sh.config.kill_grace,
        result_bytes_max: sh.config.result_bytes_max,
        instance_id: sh.instance_id.clone(),
        gate: sh.gate.clone(),
    }
}

/// Runs one started turn and writes its end marker (which queues its report).
async fn execute<H: Hub>(sh: Arc<Shared<H>>, turn: StartedTurn, start: Start, kill: CancellationToken) {
    tracing::info!(delivery_id = %turn.delivery_id, attempt_id = %turn.attempt_id, conversation = %turn.conversation, seq = turn.seq, "running turn");
    let ending = match start {
        Start::Noop => {
            crash_point("node.exec.during_effect");
            run_noop()
        }
        Start::Command(spawned) => spawned.run(&spec(&sh), &turn, &kill).await,
        Start::Failed(ending) => ending,
    };
    tracing::info!(
        delivery_id = %turn.delivery_id, attempt_id = %turn.attempt_id, outcome = %ending.outcome,
        exit_code = ?ending.exit_code, duration_ms = ?ending.duration_ms, reason = ?ending.reason, "turn ended"
    );
    let (attempt_id, now_ms) = (turn.attempt_id.clone(), sh.now_ms());
    match sh.store.call(move |db| db.end_attempt(&attempt_id, &ending, now_ms)).await {
        Ok(()) => {
            crash_point("node.exec.after_end_marker");
            sh.wake_outbox.notify_one();
        }
        Err(e) => tracing::error!(
            attempt_id = %turn.attempt_id,
            "writing the end marker failed: {e}; the attempt will be reported unknown at the next start"
        ),
    }
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
