//! Why a delivery is where it is: the fence that keeps it, the earlier turn of its conversation
//! it waits behind and where that one is, its host's liveness, the run in progress and for how
//! long, the report outstanding, a retry's not-before time and a cancel asked for. One
//! `Explanation` per delivery (`deliveries explain`), and its one-line `Reason` for every row
//! `deliveries list` shows that is not final. Read-only.
//!
//! A pool delivery is explained by the pool's rules: its pool, each member's standing (active,
//! busy, fenced, silent) and whether its conversation is bound to one member, kept for its
//! last host or free (`pool_standing`); while it waits in the pool no host's liveness is its
//! own, and once a member claimed it, it is that host's as any delivery.
//!
//! The reasons follow the claim's own rules (`fences::strongest` and `fences::pool_turn`, the
//! per-(host, conversation) and per-(pool, conversation) order of `claim`, the retry barrier,
//! a redrive's exemption, a pool conversation's binding), read from the record; they explain,
//! they decide nothing.
//!
//! Why one file over 700 lines: every reason is told by the one rule set the claim applies, and
//! a pool delivery's reason falls back to a host's once a member holds it, so the two read side
//! by side. Where it splits when it grows: the pool's words (`pool_reason`, `member_hindrance`)
//! beside `pool_standing`, once the words both use (`relative`, `liveness_words`) move below
//! them.

use crate::store::Store;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::engine::{Db, DbResult, Row};
use crate::store::registry::fences::{self, Fence, FenceKind, FenceScope};
pub use crate::store::views::fleet::Liveness;
use crate::store::views::fleet::{self, HostState};
use crate::store::views::pool_standing::{self, Binding, Judging, MemberStanding, PoolStanding};
use crate::store::views::read::DeliveryRow;
use crate::store::{StoreError, StoreResult, parse_column, parse_column_opt, state_column};
use baton_shared::duration::human_ms;
use baton_shared::states::{DeliveryState, Outcome, Rerun};
use std::collections::HashMap;

impl Store {
    /// Why a delivery is where it is, judged by `judging`.
    pub async fn explain(&self, delivery_id: String, judging: Judging) -> StoreResult<Explanation> {
        self.conns.read(move |c| explain_id(c, &delivery_id, judging)).await
    }
}

/// The fence that keeps a delivery where it is, as the record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceHold {
    /// Its id.
    pub id: i64,
    /// Pause, hold or block.
    pub kind: FenceKind,
    /// Conversation, host, pool or all.
    pub scope: FenceScope,
    /// The conversation, host or pool it names (none for all).
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
        /// Its host (the same host: order is per host); `None` for a pool's delivery no member
        /// has claimed.
        host: Option<String>,
        /// Its pool, when it is the same pool's (order is per pool too).
        pool: Option<String>,
        /// Whether its current run has an outcome (it is then past the retry barrier).
        has_outcome: bool,
    },
    /// An earlier message routed to the host (or pool) whose fan-out has not created its
    /// delivery yet.
    FanOut {
        /// The message.
        message_id: String,
        /// Its sequence number.
        seq: i64,
    },
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
    /// `cancel_requested`, `running`, `not_started`; for a pool delivery waiting in its pool
    /// also `pool_empty` (no members), `pool_bound` (its conversation is bound to the member a
    /// turn is in flight on), `pool_affinity` (kept for the last host a while) and
    /// `pool_fenced` (no member may take pool work: each is fenced or not active).
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
    /// Its host's liveness; `None` for a pool delivery no member has claimed.
    pub host: Option<Liveness>,
    /// For a pool delivery: its pool, members and conversation's binding.
    pub pool: Option<PoolExplain>,
    /// The one-line reason.
    pub reason: Reason,
}

/// What `deliveries explain` shows of a pool delivery's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolExplain {
    /// The pool's name.
    pub name: String,
    /// Its members' standing, by host name (none when the pool was left empty).
    pub members: Vec<MemberStanding>,
    /// Whether the delivery's conversation is bound to a member, kept for its last host, or free.
    pub binding: Binding,
}

/// What explaining many rows shares: the active fences, and each host's liveness read once.
pub struct Explainer<'c> {
    conn: &'c dyn Db,
    now_ms: i64,
    silence_warn_ms: i64,
    judging: Judging,
    fences: Vec<Fence>,
    hosts: HashMap<String, Liveness>,
    /// Each pool's members' standing, read once (`None`: the pool no longer exists).
    pools: HashMap<String, Option<PoolStanding>>,
}

impl<'c> Explainer<'c> {
    /// Reads the active fences; `judging` holds the moment and the hub's thresholds.
    pub fn new(conn: &'c dyn Db, judging: Judging) -> StoreResult<Explainer<'c>> {
        Ok(Explainer {
            conn,
            now_ms: judging.now_ms,
            silence_warn_ms: judging.silence_warn_ms,
            judging,
            fences: fences::active(conn)?,
            hosts: HashMap::new(),
            pools: HashMap::new(),
        })
    }

    fn pool_standing(&mut self, pool: &str) -> StoreResult<Option<PoolStanding>> {
        if let Some(p) = self.pools.get(pool) {
            return Ok(p.clone());
        }
        let found = match crate::store::registry::pools::show(self.conn, pool) {
            Ok(summary) => {
                Some(pool_standing::standing(self.conn, summary, &self.fences, self.now_ms, self.silence_warn_ms)?)
            }
            Err(StoreError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        self.pools.insert(pool.to_string(), found.clone());
        Ok(found)
    }

    /// The pool part of a pool delivery's explanation.
    fn pool_explain(&mut self, pool: &str, conversation: &str) -> StoreResult<PoolExplain> {
        let members = self.pool_standing(pool)?.map(|p| p.members).unwrap_or_default();
        let binding = pool_standing::binding(self.conn, pool, conversation, self.judging)?;
        Ok(PoolExplain { name: pool.to_string(), members, binding })
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
        // A pool delivery is covered by its pool's, its conversation's and everything's fences
        // whoever holds it; a fence on a host keeps that host from it (the members' part).
        let covering = match (&d.pool, &d.host) {
            (Some(pool), _) => strongest_for_pool(&self.fences, &d.conversation, pool),
            (None, Some(host)) => fences::strongest(&self.fences, &d.conversation, host),
            (None, None) => None,
        };
        let fence = match covering {
            Some(f) => Some(fence_hold(self.conn, f.id)?),
            None => None,
        };
        let behind =
            if run.rerun == Some(Rerun::Redrive) || settled(d.state, &run) { None } else { behind_of(self.conn, d)? };
        let host = match &d.host {
            Some(h) => Some(self.liveness(h)?),
            None => None,
        };
        let pool = match &d.pool {
            Some(p) => Some(self.pool_explain(p, &d.conversation)?),
            None => None,
        };
        let at = Facts {
            run: &run,
            fence: fence.as_ref(),
            behind: behind.as_ref(),
            host: host.as_ref(),
            pool: pool.as_ref(),
        };
        let reason = reason(d, &at, self.now_ms);
        Ok(Explanation { delivery: d.clone(), run, fence, behind, host, pool, reason })
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

/// The strongest active fence covering a pool delivery itself (its pool, its conversation,
/// everything), by the precedence of `fences::strongest`: block over hold over pause, the
/// oldest of that kind. A fence on a host is its members' part (`pool_standing`).
fn strongest_for_pool<'f>(fences: &'f [Fence], conversation: &str, pool: &str) -> Option<&'f Fence> {
    fences.iter().filter(|f| f.covers_pool(conversation, pool)).max_by_key(|f| (f.kind, std::cmp::Reverse(f.id)))
}

/// The earliest earlier turn of the same (host, conversation) — for a pool delivery waiting in
/// its pool, of the same (pool, conversation) — that holds this one back. For a delivery not
/// yet handed out: a pending fan-out, a queued or held delivery, or one of a retryable message
/// (`max_attempts > 1`) in flight without its current run's outcome (the retry barrier); once
/// delivered, the node runs the conversation's turns one at a time, so any earlier one in
/// flight without an outcome. A redrive holds nothing back.
fn behind_of(conn: &dyn Db, d: &DeliveryRow) -> StoreResult<Option<Behind>> {
    let handed_out = matches!(d.state, DeliveryState::Claimed | DeliveryState::Mirrored | DeliveryState::Delivered);
    // The lane whose order the delivery keeps: its pool's until a member holds it (a pool
    // delivery back in its pool, by a requeue or a retry, is the pool's again), else its host's.
    let (in_pool, key) = match (&d.pool, &d.host) {
        (Some(pool), _) if !handed_out => (true, pool.as_str()),
        (_, Some(host)) => (false, host.as_str()),
        // Handed out without a host: the record's CHECK forbids it; nothing to wait behind.
        (_, None) => return Ok(None),
    };
    let fan_out_sql = if in_pool {
        "SELECT m.id, m.seq FROM messages m
         JOIN fanout_obligations o ON o.message_id = m.id AND o.done_at IS NULL
         JOIN message_pool_recipients r ON r.message_id = m.id AND r.pool = $1
         WHERE m.conversation = $2 AND m.seq < $3 AND NOT $4 ORDER BY m.seq LIMIT 1"
    } else {
        "SELECT m.id, m.seq FROM messages m
         JOIN fanout_obligations o ON o.message_id = m.id AND o.done_at IS NULL
         JOIN message_recipients r ON r.message_id = m.id AND r.host = $1
         WHERE m.conversation = $2 AND m.seq < $3 AND NOT $4 ORDER BY m.seq LIMIT 1"
    };
    let fan_out: Option<(String, i64)> = conn
        .prepare_cached(fan_out_sql)?
        .query_row(params![key, d.conversation, d.seq, handed_out], |r| Ok((r.get(0)?, r.get(1)?)))
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
                pool: r.get(5)?,
                has_outcome: r.get(4)?,
                delivery_id: id,
            },
        ))
    };
    const COLUMNS: &str = "d.id, d.seq, d.state, d.host,
        EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt), d.pool";
    const NO_OUTCOME: &str =
        "NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)";
    // The lane's column: a pool's deliveries and a host's own keep their orders apart.
    let lane = if in_pool { "d.pool = $1" } else { "d.host = $1" };
    let own = if in_pool { "" } else { " AND d.pool IS NULL" };
    let queries: Vec<String> = if handed_out {
        vec![format!(
            "SELECT {COLUMNS} FROM deliveries d
             WHERE d.host = $1 AND d.state IN ('claimed', 'mirrored', 'delivered') AND d.conversation = $2
               AND d.seq < $3 AND d.rerun IS DISTINCT FROM 'redrive' AND {NO_OUTCOME} ORDER BY d.seq LIMIT 1"
        )]
    } else {
        vec![
            format!(
                "SELECT {COLUMNS} FROM deliveries d WHERE {lane} AND d.conversation = $2 AND d.seq < $3
                   AND d.state = 'queued' AND d.rerun IS DISTINCT FROM 'redrive' ORDER BY d.seq LIMIT 1"
            ),
            format!(
                "SELECT {COLUMNS} FROM deliveries d WHERE {lane} AND d.conversation = $2 AND d.seq < $3
                   AND d.state = 'held' AND d.rerun IS DISTINCT FROM 'redrive' ORDER BY d.seq LIMIT 1"
            ),
            format!(
                "SELECT {COLUMNS} FROM messages m JOIN deliveries d ON d.message_id = m.id AND {lane}{own}
                 WHERE m.conversation = $2 AND m.seq < $3 AND m.max_attempts > 1
                   AND d.state IN ('claimed', 'mirrored', 'delivered') AND d.rerun IS DISTINCT FROM 'redrive' AND {NO_OUTCOME}
                 ORDER BY m.seq LIMIT 1"
            ),
        ]
    };
    let mut earlier: Option<(i64, Behind)> = None;
    for sql in &queries {
        let found = conn.prepare_cached(sql)?.query_row(params![key, d.conversation, d.seq], row).optional()?;
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
        Behind::Delivery { delivery_id, seq, state, host: Some(host), .. } => {
            format!("waits behind seq {seq} (delivery {delivery_id}, {state} on {host})")
        }
        Behind::Delivery { delivery_id, seq, state, host: None, pool, .. } => {
            format!(
                "waits behind seq {seq} (delivery {delivery_id}, {state} in pool {})",
                pool.as_deref().unwrap_or("?")
            )
        }
        Behind::FanOut { message_id, seq } => format!("waits behind seq {seq} (message {message_id}, fan-out pending)"),
    }
}

/// What one delivery's reason is made of.
struct Facts<'a> {
    run: &'a Run,
    fence: Option<&'a FenceHold>,
    behind: Option<&'a Behind>,
    host: Option<&'a Liveness>,
    pool: Option<&'a PoolExplain>,
}

/// Why a queued delivery has not been handed out.
fn queued_reason(at: &Facts<'_>, now_ms: i64) -> Reason {
    let r = |code: &'static str, text: String| Reason { code, text };
    let run = at.run;
    if let Some(f) = at.fence {
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
    if let Some(b) = at.behind {
        return r("behind", behind_words(b));
    }
    let host = match (at.host, at.pool) {
        (Some(host), _) => host,
        (None, Some(pool)) => return pool_reason(pool, now_ms),
        (None, None) => return r("no_node", "it has neither a host nor a pool".into()),
    };
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

/// Why a pool delivery waiting in its pool (no fence, retry time or earlier turn in the way)
/// has not been claimed: where its conversation is bound, and what its members can do.
fn pool_reason(pool: &PoolExplain, now_ms: i64) -> Reason {
    let r = |code: &'static str, text: String| Reason { code, text };
    let name = &pool.name;
    let member = |host: &str| pool.members.iter().find(|m| m.liveness.host == host);
    // A member's standing as the claim sees it, after its name: "" when it may claim now.
    let standing = |host: &str| match member(host) {
        None => format!("; {host} is no longer a member of the pool"),
        Some(m) => member_hindrance(m, now_ms).map(|w| format!("; {host} {w}")).unwrap_or_default(),
    };
    match &pool.binding {
        Binding::Bound { host, turn, .. } => {
            let turn = match turn {
                Some(t) => format!("seq {} (delivery {}, {})", t.seq, t.delivery_id, t.state),
                None => "a turn".to_string(),
            };
            return r(
                "pool_bound",
                format!(
                    "its conversation is bound to {host} in pool {name}: its turn {turn} is in flight there, and \
                     only {host} takes the next ones{}",
                    standing(host)
                ),
            );
        }
        Binding::Preferred { host, until_ms } => {
            return r(
                "pool_affinity",
                format!(
                    "kept for {host}, which ran its conversation's last turn in pool {name}, until {} \
                     (pool_affinity_wait); then any member{}",
                    relative(*until_ms, now_ms),
                    standing(host)
                ),
            );
        }
        Binding::Free { .. } => {}
    }
    if pool.members.is_empty() {
        return r("pool_empty", format!("pool {name} has no members: no host may claim it"));
    }
    let may: Vec<&MemberStanding> = pool.members.iter().filter(|m| m.may_claim()).collect();
    let others = || {
        pool.members
            .iter()
            .map(|m| {
                format!("{} {}", m.liveness.host, member_hindrance(m, now_ms).unwrap_or_else(|| "connected".into()))
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    if may.is_empty() {
        return r("pool_fenced", format!("no member of pool {name} may take its work: {}", others()));
    }
    let connected: Vec<&str> = may.iter().filter(|m| m.connected()).map(|m| m.liveness.host.as_str()).collect();
    if connected.is_empty() {
        let code = if may.iter().any(|m| m.silent()) { "host_silent" } else { "no_node" };
        return r(code, format!("waiting for a node of a member of pool {name}: {}", others()));
    }
    r(
        "claimable",
        format!(
            "waiting for the next claim of a member of pool {name} ({} of {} connected: {})",
            connected.len(),
            pool.members.len(),
            connected.join(", ")
        ),
    )
}

/// What keeps a member from claiming pool work now, in words: not active, fenced, silent, no
/// node; `None` when its node is connected and nothing keeps it.
pub fn member_hindrance(m: &MemberStanding, now_ms: i64) -> Option<String> {
    let l = &m.liveness;
    match l.state {
        Some(HostState::Retired) => return Some("is retired".into()),
        Some(HostState::Revoked) => return Some("has no valid certificate".into()),
        None => return Some("is not enrolled".into()),
        Some(HostState::Active) => {}
    }
    if let Some(f) = &m.fence {
        return Some(format!("is fenced, so it takes no pool work ({})", f.describe()));
    }
    if !m.connected() {
        return Some(format!("has no node connected: {}", liveness_words(l, now_ms)));
    }
    None
}

/// The one-line reason.
fn reason(d: &DeliveryRow, at: &Facts<'_>, now_ms: i64) -> Reason {
    let r = |code: &'static str, text: String| Reason { code, text };
    let (run, fence, behind) = (at.run, at.fence, at.behind);
    let silent = match at.host {
        Some(host) if host.silent() => format!("; {}", liveness_words(host, now_ms)),
        _ => String::new(),
    };
    let instance = d.instance_id.as_deref().unwrap_or("?");
    if settled(d.state, run) {
        let outcome = run.outcome.map(|o| format!(" ({o})")).unwrap_or_default();
        let why = d.reason.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        return r("final", format!("{}{outcome}{why}", d.state));
    }
    match d.state {
        DeliveryState::Queued => queued_reason(at, now_ms),
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
pub fn explain(conn: &dyn Db, d: &DeliveryRow, judging: Judging) -> StoreResult<Explanation> {
    Explainer::new(conn, judging)?.explain(d)
}

/// The explanation of the delivery with this id.
pub fn explain_id(conn: &dyn Db, id: &str, judging: Judging) -> StoreResult<Explanation> {
    let d = conn
        .prepare_cached(concat!(
            "SELECT ",
            crate::store::views::read::delivery_columns!(),
            " FROM deliveries d WHERE d.id = $1"
        ))?
        .query_row([id], crate::store::views::read::delivery_row)
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {id}")))?;
    explain(conn, &d, judging)
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
