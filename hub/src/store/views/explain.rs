//! Why a delivery is where it is: the fence that keeps it, the earlier turn of its conversation
//! it waits behind and where that one is, its host's liveness, the run in progress and for how
//! long, the report outstanding, a retry's not-before time and a cancel asked for. One
//! `Explanation` per delivery (`deliveries explain`), and its one-line `Reason` for every row
//! `deliveries list` shows that is not final. Read-only.
//!
//! The reasons follow the claim's own rules (`fences::strongest`, the per-(host, conversation)
//! order of `claim`, the retry barrier, a redrive's exemption), read from the record; they
//! explain, they decide nothing.

use crate::store::Store;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::engine::{Db, DbResult, Row};
use crate::store::registry::fences::{self, Fence, FenceKind, FenceScope};
use crate::store::views::fleet::{self, HostRow, HostState};
use crate::store::views::read::DeliveryRow;
use crate::store::{StoreError, StoreResult, parse_column, parse_column_opt, state_column};
use baton_shared::duration::human_ms;
use baton_shared::states::{DeliveryState, Outcome, Rerun};
use std::collections::HashMap;

impl Store {
    /// Why a delivery is where it is, at `now_ms`.
    pub async fn explain(&self, delivery_id: String, now_ms: i64, silence_warn_ms: i64) -> StoreResult<Explanation> {
        self.conns.read(move |c| explain_id(c, &delivery_id, now_ms, silence_warn_ms)).await
    }
}

/// The fence that keeps a delivery where it is, as the record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceHold {
    /// Its id.
    pub id: i64,
    /// Pause, hold or block.
    pub kind: FenceKind,
    /// Conversation, host or all.
    pub scope: FenceScope,
    /// The conversation or host it names (none for all).
    pub target: Option<String>,
    /// Who set it.
    pub set_by: String,
    /// When (unix ms).
    pub set_at_ms: i64,
    /// Why.
    pub reason: String,
    /// When the hub lifts it (unix ms), for a time-boxed fence.
    pub expires_at_ms: Option<i64>,
}

/// The earlier turn of the same (host, conversation) a delivery waits behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behind {
    /// An earlier delivery not yet out of the way.
    Delivery {
        /// Its id.
        delivery_id: String,
        /// Its sequence number.
        seq: i64,
        /// Its state.
        state: DeliveryState,
        /// Its host (the same host: order is per host).
        host: String,
        /// Whether its current run has an outcome (it is then past the retry barrier).
        has_outcome: bool,
    },
    /// An earlier message routed to the host whose fan-out has not created its delivery yet.
    FanOut {
        /// The message.
        message_id: String,
        /// Its sequence number.
        seq: i64,
    },
}

/// What the record knows of the host's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Liveness {
    /// The host.
    pub host: String,
    /// Active, revoked or retired (`None`: never enrolled).
    pub state: Option<HostState>,
    /// The node instance bound to the host.
    pub instance_id: Option<String>,
    /// Its newest node session.
    pub session: Option<i64>,
    /// That session's last contact (unix ms; flushed every few seconds, so a little behind).
    pub last_contact_at_ms: Option<i64>,
    /// When that session ended (unix ms), if it did.
    pub session_ended_at_ms: Option<i64>,
    /// How long the open session has been silent (ms), when one is open.
    pub silent_for_ms: Option<i64>,
    /// The `host_silence_warn` it is measured against (ms).
    pub silence_warn_ms: i64,
}

impl Liveness {
    /// Whether an open session has been silent longer than the warning (as `status` flags it).
    pub fn silent(&self) -> bool {
        self.silent_for_ms.is_some_and(|s| s > self.silence_warn_ms)
    }

    /// Whether a node of the host is connected: an open session, not silent, host active.
    fn connected(&self) -> bool {
        self.state == Some(HostState::Active) && self.silent_for_ms.is_some() && !self.silent()
    }

    fn from_row(host: &str, row: Option<&HostRow>, now_ms: i64, silence_warn_ms: i64) -> Liveness {
        let session = row.and_then(|r| r.session.as_ref());
        let ended = session.and_then(|s| s.ended_at_ms);
        Liveness {
            host: host.to_string(),
            state: row.map(|r| r.state),
            instance_id: row.and_then(|r| r.instance.as_ref().map(|(i, _)| i.clone())),
            session: session.map(|s| s.session),
            last_contact_at_ms: session.map(|s| s.last_contact_at_ms),
            session_ended_at_ms: ended,
            silent_for_ms: session.filter(|s| s.ended_at_ms.is_none()).map(|s| (now_ms - s.last_contact_at_ms).max(0)),
            silence_warn_ms,
        }
    }
}

/// A cancel asked for and not yet taken effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelAsked {
    /// When (unix ms).
    pub at_ms: i64,
    /// Who.
    pub by: String,
    /// Why.
    pub reason: Option<String>,
}

/// The delivery's current run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Its number (1, then one more per retry or redrive).
    pub attempt: i64,
    /// The message's bound on runs.
    pub max_attempts: i64,
    /// Why it runs again, when it is not the first.
    pub rerun: Option<Rerun>,
    /// A retry's not-before time (unix ms).
    pub not_before_ms: Option<i64>,
    /// When the hub recorded its start (unix ms), and for which node session.
    pub started: Option<(i64, i64)>,
    /// Its outcome, once reported.
    pub outcome: Option<Outcome>,
    /// A cancel asked for.
    pub cancel: Option<CancelAsked>,
    /// The run's progress, when its harness sent any.
    pub progress: Option<crate::store::lifecycle::progress::LastProgress>,
}

/// Why, in one line: a stable code for scripts and a sentence for people (stored text inside
/// it is raw; human output escapes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// `final`, `paused`, `will_hold`, `will_block`, `retry_wait`, `behind`, `host_retired`,
    /// `host_revoked`, `no_node`, `host_silent`, `claimable`, `held`, `claimed`, `mirrored`,
    /// `cancel_requested`, `running`, `not_started`.
    pub code: &'static str,
    /// The sentence.
    pub text: String,
}

/// Everything `deliveries explain` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The delivery.
    pub delivery: DeliveryRow,
    /// Its current run.
    pub run: Run,
    /// The strongest active fence covering it, if any.
    pub fence: Option<FenceHold>,
    /// The earlier turn it waits behind, if any.
    pub behind: Option<Behind>,
    /// Its host's liveness.
    pub host: Liveness,
    /// The one-line reason.
    pub reason: Reason,
}

/// What explaining many rows shares: the active fences, and each host's liveness read once.
pub struct Explainer<'c> {
    conn: &'c dyn Db,
    now_ms: i64,
    silence_warn_ms: i64,
    fences: Vec<Fence>,
    hosts: HashMap<String, Liveness>,
}

impl<'c> Explainer<'c> {
    /// Reads the active fences; `silence_warn_ms` is the hub's `host_silence_warn`.
    pub fn new(conn: &'c dyn Db, now_ms: i64, silence_warn_ms: i64) -> StoreResult<Explainer<'c>> {
        Ok(Explainer { conn, now_ms, silence_warn_ms, fences: fences::active(conn)?, hosts: HashMap::new() })
    }

    fn liveness(&mut self, host: &str) -> StoreResult<Liveness> {
        if let Some(l) = self.hosts.get(host) {
            return Ok(l.clone());
        }
        let row = fleet::host_standing(self.conn, host)?;
        let l = Liveness::from_row(host, row.as_ref(), self.now_ms, self.silence_warn_ms);
        self.hosts.insert(host.to_string(), l.clone());
        Ok(l)
    }

    /// The whole explanation of one listed delivery.
    pub fn explain(&mut self, d: &DeliveryRow) -> StoreResult<Explanation> {
        let run = run_of(self.conn, &d.delivery_id)?;
        let fence = match fences::strongest(&self.fences, &d.conversation, &d.host) {
            Some(f) => Some(fence_hold(self.conn, f.id)?),
            None => None,
        };
        let behind =
            if run.rerun == Some(Rerun::Redrive) || settled(d.state, &run) { None } else { behind_of(self.conn, d)? };
        let host = self.liveness(&d.host)?;
        let reason = reason(d, &run, fence.as_ref(), behind.as_ref(), &host, self.now_ms);
        Ok(Explanation { delivery: d.clone(), run, fence, behind, host, reason })
    }

    /// The one-line reason of a listed delivery that is not final; `None` for a final one
    /// (its stored reason says why it ended).
    pub fn reason(&mut self, d: &DeliveryRow) -> StoreResult<Option<Reason>> {
        if matches!(d.state, DeliveryState::Failed | DeliveryState::Unknown) {
            return Ok(None);
        }
        let e = self.explain(d)?;
        Ok((e.reason.code != "final").then_some(e.reason))
    }
}

/// Whether the delivery is final: failed, unknown, or delivered with its current run's outcome.
fn settled(state: DeliveryState, run: &Run) -> bool {
    match state {
        DeliveryState::Failed | DeliveryState::Unknown => true,
        DeliveryState::Delivered => run.outcome.is_some(),
        _ => false,
    }
}

fn run_of(conn: &dyn Db, id: &str) -> StoreResult<Run> {
    conn.prepare_cached(
        "SELECT d.attempt, m.max_attempts, d.rerun, d.not_before, d.started_at, d.started_session,
                (SELECT outcome FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt
                 ORDER BY reported_at DESC LIMIT 1),
                d.cancel_requested_at, d.cancel_by, d.cancel_reason
         FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE d.id = $1",
    )?
    .query_row([id], |r| {
        let started = match (r.get::<_, Option<i64>>(4)?, r.get::<_, Option<i64>>(5)?) {
            (Some(at), Some(session)) => Some((at, session)),
            _ => None,
        };
        let cancel = match r.get::<_, Option<i64>>(7)? {
            Some(at_ms) => {
                Some(CancelAsked { at_ms, by: r.get::<_, Option<String>>(8)?.unwrap_or_default(), reason: r.get(9)? })
            }
            None => None,
        };
        Ok(Run {
            attempt: r.get(0)?,
            max_attempts: r.get(1)?,
            rerun: parse_column_opt(r, 2, "deliveries", id, "rerun", Rerun::parse)?,
            not_before_ms: r.get(3)?,
            started,
            outcome: parse_column_opt(r, 6, "attempts", &format!("of delivery {id}"), "outcome", Outcome::parse)?,
            cancel,
            progress: None,
        })
    })
    .optional()?
    .ok_or_else(|| StoreError::NotFound(format!("no delivery {id}")))
    .and_then(|mut run| {
        run.progress = crate::store::lifecycle::progress::last_progress(conn, id, run.attempt)?;
        Ok(run)
    })
}

fn fence_hold(conn: &dyn Db, id: i64) -> StoreResult<FenceHold> {
    Ok(conn
        .prepare_cached("SELECT id, kind, scope, target, set_by, set_at, reason, expires_at FROM fences WHERE id = $1")?
        .query_row([id], |r| {
            let row = id.to_string();
            Ok(FenceHold {
                id,
                kind: parse_column(r, 1, "fences", &row, "fence kind", FenceKind::parse)?,
                scope: parse_column(r, 2, "fences", &row, "fence scope", FenceScope::parse)?,
                target: r.get(3)?,
                set_by: r.get(4)?,
                set_at_ms: r.get(5)?,
                reason: r.get(6)?,
                expires_at_ms: r.get(7)?,
            })
        })?)
}

/// The earliest earlier turn of the same (host, conversation) that holds this one back. For a
/// delivery not yet handed out: a pending fan-out, a queued or held delivery, or one of a
/// retryable message (`max_attempts > 1`) in flight without its current run's outcome (the
/// retry barrier); once delivered, the node runs the conversation's turns one at a time, so
/// any earlier one in flight without an outcome. A redrive holds nothing back.
fn behind_of(conn: &dyn Db, d: &DeliveryRow) -> StoreResult<Option<Behind>> {
    let handed_out = matches!(d.state, DeliveryState::Claimed | DeliveryState::Mirrored | DeliveryState::Delivered);
    let p = params![d.host, d.conversation, d.seq, handed_out];
    let fan_out: Option<(String, i64)> = conn
        .prepare_cached(
            "SELECT m.id, m.seq FROM messages m
             JOIN fanout_obligations o ON o.message_id = m.id AND o.done_at IS NULL
             JOIN message_recipients r ON r.message_id = m.id AND r.host = $1
             WHERE m.conversation = $2 AND m.seq < $3 AND NOT $4 ORDER BY m.seq LIMIT 1",
        )?
        .query_row(p, |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    // Each candidate through its own index: the partial queued and held indexes, the small
    // `messages_retryable` for the retry barrier; only a delivered turn waiting on its node
    // (rare in a listing) reads the host's in-flight rows.
    let row = |r: &Row<'_>| -> DbResult<(i64, Behind)> {
        let id: String = r.get(0)?;
        let seq: i64 = r.get(1)?;
        Ok((
            seq,
            Behind::Delivery {
                seq,
                state: state_column(r, 2, "deliveries", &id)?,
                host: r.get(3)?,
                has_outcome: r.get(4)?,
                delivery_id: id,
            },
        ))
    };
    const COLUMNS: &str = "d.id, d.seq, d.state, d.host,
        EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)";
    const NO_OUTCOME: &str =
        "NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)";
    let queries: Vec<String> = if handed_out {
        vec![format!(
            "SELECT {COLUMNS} FROM deliveries d
             WHERE d.host = $1 AND d.state IN ('claimed', 'mirrored', 'delivered') AND d.conversation = $2
               AND d.seq < $3 AND d.rerun IS DISTINCT FROM 'redrive' AND {NO_OUTCOME} ORDER BY d.seq LIMIT 1"
        )]
    } else {
        vec![
            format!(
                "SELECT {COLUMNS} FROM deliveries d WHERE d.host = $1 AND d.conversation = $2 AND d.seq < $3
                   AND d.state = 'queued' AND d.rerun IS DISTINCT FROM 'redrive' ORDER BY d.seq LIMIT 1"
            ),
            format!(
                "SELECT {COLUMNS} FROM deliveries d WHERE d.host = $1 AND d.conversation = $2 AND d.seq < $3
                   AND d.state = 'held' AND d.rerun IS DISTINCT FROM 'redrive' ORDER BY d.seq LIMIT 1"
            ),
            format!(
                "SELECT {COLUMNS} FROM messages m JOIN deliveries d ON d.message_id = m.id AND d.host = $1
                 WHERE m.conversation = $2 AND m.seq < $3 AND m.max_attempts > 1
                   AND d.state IN ('claimed', 'mirrored', 'delivered') AND d.rerun IS DISTINCT FROM 'redrive' AND {NO_OUTCOME}
                 ORDER BY m.seq LIMIT 1"
            ),
        ]
    };
    let mut earlier: Option<(i64, Behind)> = None;
    for sql in &queries {
        let found = conn.prepare_cached(sql)?.query_row(params![d.host, d.conversation, d.seq], row).optional()?;
        if let Some(f) = found
            && earlier.as_ref().is_none_or(|(seq, _)| f.0 < *seq)
        {
            earlier = Some(f);
        }
    }
    let earlier = earlier.map(|(_, b)| b);
    Ok(match (fan_out, earlier) {
        (Some((message_id, seq)), Some(Behind::Delivery { seq: s, .. })) if seq < s => {
            Some(Behind::FanOut { message_id, seq })
        }
        (Some((message_id, seq)), None) => Some(Behind::FanOut { message_id, seq }),
        (_, e) => e,
    })
}

/// "in 3m 0s" / "3m 0s ago": a moment relative to now.
fn relative(at_ms: i64, now_ms: i64) -> String {
    let secs = |ms: i64| human_ms(ms / 1000 * 1000);
    if at_ms >= now_ms { format!("in {}", secs(at_ms - now_ms)) } else { format!("{} ago", secs(now_ms - at_ms)) }
}

/// How a fence names itself in a reason.
fn fence_words(f: &FenceHold, now_ms: i64) -> String {
    let scope = match (&f.scope, &f.target) {
        (FenceScope::All, _) => "everything".to_string(),
        (s, Some(t)) => format!("{} {t}", s.as_str()),
        (s, None) => s.as_str().to_string(),
    };
    let until = f.expires_at_ms.map(|at| format!(", lifted {}", relative(at, now_ms))).unwrap_or_default();
    format!("{} fence {} on {scope} (set by {}: {}{until})", f.kind.as_str(), f.id, f.set_by, f.reason)
}

fn behind_words(b: &Behind) -> String {
    match b {
        Behind::Delivery { delivery_id, seq, state, host, .. } => {
            format!("waits behind seq {seq} (delivery {delivery_id}, {state} on {host})")
        }
        Behind::FanOut { message_id, seq } => format!("waits behind seq {seq} (message {message_id}, fan-out pending)"),
    }
}

/// Why a queued delivery has not been handed out.
fn queued_reason(
    run: &Run,
    fence: Option<&FenceHold>,
    behind: Option<&Behind>,
    host: &Liveness,
    now_ms: i64,
) -> Reason {
    let r = |code: &'static str, text: String| Reason { code, text };
    if let Some(f) = fence {
        return match f.kind {
            FenceKind::Pause => r("paused", format!("paused by {}", fence_words(f, now_ms))),
            FenceKind::Hold => r("will_hold", format!("the next claim holds it: {}", fence_words(f, now_ms))),
            FenceKind::Block => r("will_block", format!("the next claim fails it: {}", fence_words(f, now_ms))),
        };
    }
    if let Some(at) = run.not_before_ms.filter(|at| *at > now_ms) {
        return r(
            "retry_wait",
            format!("run {} of {} waits for its retry time, {}", run.attempt, run.max_attempts, relative(at, now_ms)),
        );
    }
    if let Some(b) = behind {
        return r("behind", behind_words(b));
    }
    match host.state {
        Some(HostState::Retired) => return r("host_retired", format!("host {} is retired", host.host)),
        Some(HostState::Revoked) => {
            return r("host_revoked", format!("host {} has no valid certificate: no node can claim", host.host));
        }
        None => return r("no_node", format!("host {} is not enrolled", host.host)),
        Some(HostState::Active) => {}
    }
    if host.silent() {
        return r("host_silent", format!("waiting for host {}, {}", host.host, liveness_words(host, now_ms)));
    }
    if !host.connected() {
        return r("no_node", format!("waiting for a node of host {}: {}", host.host, liveness_words(host, now_ms)));
    }
    r("claimable", format!("waiting for the next claim of host {} ({})", host.host, liveness_words(host, now_ms)))
}

/// The host's liveness in words: "no node session yet", "its node said goodbye 3m ago",
/// "silent for 12m 0s (host_silence_warn 5m 0s)", "last contact 2s ago".
pub fn liveness_words(host: &Liveness, now_ms: i64) -> String {
    match (host.session, host.session_ended_at_ms, host.last_contact_at_ms) {
        (None, _, _) => "no node session yet".into(),
        (Some(s), Some(ended), _) => format!("its node session {s} ended {}", relative(ended, now_ms)),
        (Some(s), None, Some(at)) if host.silent() => format!(
            "node session {s} silent for {} (host_silence_warn {})",
            human_ms((now_ms - at).max(0) / 1000 * 1000),
            human_ms(host.silence_warn_ms)
        ),
        (Some(s), None, Some(at)) => format!("node session {s}, last contact {}", relative(at, now_ms)),
        (Some(s), None, None) => format!("node session {s}"),
    }
}

/// The one-line reason.
fn reason(
    d: &DeliveryRow,
    run: &Run,
    fence: Option<&FenceHold>,
    behind: Option<&Behind>,
    host: &Liveness,
    now_ms: i64,
) -> Reason {
    let r = |code: &'static str, text: String| Reason { code, text };
    let silent = if host.silent() { format!("; {}", liveness_words(host, now_ms)) } else { String::new() };
    let instance = d.instance_id.as_deref().unwrap_or("?");
    if settled(d.state, run) {
        let outcome = run.outcome.map(|o| format!(" ({o})")).unwrap_or_default();
        let why = d.reason.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        return r("final", format!("{}{outcome}{why}", d.state));
    }
    match d.state {
        DeliveryState::Queued => queued_reason(run, fence, behind, host, now_ms),
        DeliveryState::Held => {
            let still = match fence {
                Some(f) if f.kind == FenceKind::Hold => format!("; {} is still active", fence_words(f, now_ms)),
                _ => String::new(),
            };
            let why = d.reason.as_deref().unwrap_or("held");
            r("held", format!("{why}; waits for an operator's `held release`{still}"))
        }
        DeliveryState::Claimed => {
            r("claimed", format!("claimed by instance {instance}; waiting for its node to mirror it{silent}"))
        }
        DeliveryState::Mirrored => {
            r("mirrored", format!("mirrored by instance {instance}; waiting for its node's ack{silent}"))
        }
        _ => delivered_reason(run, behind, instance, &silent, now_ms),
    }
}

/// Why a delivered delivery has no outcome of its current run yet.
fn delivered_reason(run: &Run, behind: Option<&Behind>, instance: &str, silent: &str, now_ms: i64) -> Reason {
    let r = |code: &'static str, text: String| Reason { code, text };
    if let Some(c) = &run.cancel {
        let why = c.reason.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        return r(
            "cancel_requested",
            format!(
                "cancel asked by {} {}{why}; waiting for its node to stop run {}{silent}",
                c.by,
                relative(c.at_ms, now_ms),
                run.attempt
            ),
        );
    }
    if let Some((at, session)) = run.started {
        let progress = match &run.progress {
            Some(crate::store::lifecycle::progress::LastProgress { events, last: Some((seq, at, _)), .. }) => {
                format!("; last progress #{seq} of {events} {}", relative(*at, now_ms))
            }
            _ => "; no progress sent".to_string(),
        };
        return r(
            "running",
            format!(
                "run {} started {} (node session {session}) on instance {instance}{progress}; its report is \
                 outstanding{silent}",
                run.attempt,
                relative(at, now_ms)
            ),
        );
    }
    if let Some(b) = behind {
        return r("behind", format!("delivered; on its node it {}{silent}", behind_words(b)));
    }
    r(
        "not_started",
        format!("delivered to instance {instance}; its node has not started run {} yet{silent}", run.attempt),
    )
}

/// The explanation of one delivery.
pub fn explain(conn: &dyn Db, d: &DeliveryRow, now_ms: i64, silence_warn_ms: i64) -> StoreResult<Explanation> {
    Explainer::new(conn, now_ms, silence_warn_ms)?.explain(d)
}

/// The explanation of the delivery with this id.
pub fn explain_id(conn: &dyn Db, id: &str, now_ms: i64, silence_warn_ms: i64) -> StoreResult<Explanation> {
    let d = conn
        .prepare_cached(
            concat!(
                "SELECT d.id, d.message_id, coalesce(d.host, ''), d.conversation, d.seq, d.state, d.instance_id, d.reason, d.updated_at, ",
                crate::store::views::read::outcome_sql!(),
                " FROM deliveries d WHERE d.id = $1"
            ),
        )?
        .query_row([id], crate::store::views::read::delivery_row)
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {id}")))?;
    explain(conn, &d, now_ms, silence_warn_ms)
}
