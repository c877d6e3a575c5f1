//! A pool as the operator sees it: each member host's standing for the pool's work (active,
//! busy, fenced, silent), and for one conversation whether it is bound to a member, kept for
//! its last host, or free (`deliveries explain`, `pools list|show`, the status page). Read-only.
//!
//! The words follow the claim's own rules (`lifecycle::scan`, "order in a pool"), read from the
//! record: a fence on a host keeps it from pool work (`fences::pool_turn`); while a turn of a
//! conversation is in flight on a member, only that member claims its next turns
//! (`pool_queues.bound_host`); once nothing is in flight, the last host alone claims them for
//! `limits.pool_affinity_wait` while it is still a member. They explain, they decide nothing.
//!
//! Cost: one indexed read per member (its standing, its fence from the active fences read
//! once, its bound conversations through `pool_queues_bound`) and one per pool
//! (`pools::show`), however deep the pool's backlog.

use crate::store::Store;
use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::registry::fences::{self, Fence, FenceScope};
use crate::store::registry::pools::{self, PoolSummary};
use crate::store::views::fleet::{self, HostState, Liveness};
use crate::store::{StoreResult, state_column};
use baton_shared::states::DeliveryState;

/// The thresholds the views judge a pool's members and conversations by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judging {
    /// The moment judged (unix ms).
    pub now_ms: i64,
    /// `host_silence_warn` (ms): an open node session silent longer is flagged silent.
    pub silence_warn_ms: i64,
    /// `limits.pool_affinity_wait` (ms): how long a free conversation's last host is preferred.
    pub affinity_wait_ms: i64,
}

impl Store {
    /// Every pool (or the one named: `NotFound` when there is none) with its members'
    /// standing, judged by `judging`.
    pub async fn pool_standings(&self, pool: Option<String>, judging: Judging) -> StoreResult<Vec<PoolStanding>> {
        self.conns
            .read(move |c| {
                let fences = fences::active(c)?;
                let summaries = match pool {
                    Some(p) => vec![pools::show(c, &p)?],
                    None => pools::list(c)?,
                };
                summaries
                    .into_iter()
                    .map(|s| standing(c, s, &fences, judging.now_ms, judging.silence_warn_ms))
                    .collect()
            })
            .await
    }
}

/// One member host's standing for its pool's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStanding {
    /// What the record knows of the host's node (its standing, session, silence).
    pub liveness: Liveness,
    /// The pool's deliveries it holds in flight (claimed, mirrored, or delivered without an
    /// outcome of their run), counted over the conversations bound to it.
    pub in_flight: i64,
    /// The pool's conversations bound to it (a turn of each in flight on it).
    pub bound_conversations: i64,
    /// The oldest active fence on the host (any kind keeps it from pool work), if any.
    pub fence: Option<Fence>,
}

impl MemberStanding {
    /// Whether the host is active (enrolled, not retired, with a valid certificate).
    pub fn active(&self) -> bool {
        self.liveness.state == Some(HostState::Active)
    }

    /// Whether it holds pool work in flight.
    pub fn busy(&self) -> bool {
        self.in_flight > 0
    }

    /// Whether a fence on the host keeps it from the pool's work.
    pub fn fenced(&self) -> bool {
        self.fence.is_some()
    }

    /// Whether its open node session has been silent longer than `host_silence_warn`.
    pub fn silent(&self) -> bool {
        self.liveness.silent()
    }

    /// Whether its node is connected (active, an open session, not silent).
    pub fn connected(&self) -> bool {
        self.liveness.connected()
    }

    /// Whether its claims may take the pool's work now: active and not fenced.
    pub fn may_claim(&self) -> bool {
        self.active() && !self.fenced()
    }

    /// The standing in a word for tables: `retired`, `revoked`, `not enrolled`, `fenced`,
    /// `silent`, `no node`, or `active`; `busy` after it when it holds pool work.
    pub fn words(&self) -> String {
        let word = match self.liveness.state {
            Some(HostState::Retired) => "retired",
            Some(HostState::Revoked) => "revoked",
            None => "not enrolled",
            Some(HostState::Active) if self.fenced() => "fenced",
            Some(HostState::Active) if self.silent() => "silent",
            Some(HostState::Active) if !self.connected() => "no node",
            Some(HostState::Active) => "active",
        };
        if self.busy() { format!("{word}, busy") } else { word.to_string() }
    }
}

/// A pool with its members' standing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStanding {
    /// The pool's counts (`pools::show`).
    pub summary: PoolSummary,
    /// Its members, by host name.
    pub members: Vec<MemberStanding>,
}

impl PoolStanding {
    /// How many members may take its work now (active, not fenced).
    pub fn may_claim(&self) -> usize {
        self.members.iter().filter(|m| m.may_claim()).count()
    }
}

/// A pool's members' standing at `now_ms` (silent: past `silence_warn_ms`), with the active
/// `fences` read once.
pub fn standing(
    conn: &dyn Db,
    summary: PoolSummary,
    fences: &[Fence],
    now_ms: i64,
    silence_warn_ms: i64,
) -> StoreResult<PoolStanding> {
    let members = summary
        .members
        .iter()
        .map(|host| member(conn, &summary.name, host, fences, now_ms, silence_warn_ms))
        .collect::<StoreResult<_>>()?;
    Ok(PoolStanding { summary, members })
}

/// One member's standing in `pool`.
fn member(
    conn: &dyn Db,
    pool: &str,
    host: &str,
    fences: &[Fence],
    now_ms: i64,
    silence_warn_ms: i64,
) -> StoreResult<MemberStanding> {
    let row = fleet::host_standing(conn, host)?;
    let liveness = Liveness::from_row(host, row.as_ref(), now_ms, silence_warn_ms);
    let (in_flight, bound_conversations): (i64, i64) = conn
        .prepare_cached(
            "SELECT coalesce(sum(in_flight), 0), count(*) FROM pool_queues WHERE bound_host = $1 AND pool = $2",
        )?
        .query_row(params![host, pool], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(MemberStanding { liveness, in_flight, bound_conversations, fence: host_fence(fences, host).cloned() })
}

/// The oldest active fence on `host` itself: whatever its kind, it keeps the host from pool work
/// (`fences::pool_turn`).
pub fn host_fence<'a>(fences: &'a [Fence], host: &str) -> Option<&'a Fence> {
    fences.iter().filter(|f| f.scope == FenceScope::Host && f.target.as_deref() == Some(host)).min_by_key(|f| f.id)
}

/// The turn in flight that binds a pool conversation to its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightTurn {
    /// Its delivery.
    pub delivery_id: String,
    /// Its sequence number.
    pub seq: i64,
    /// Claimed, mirrored or delivered (without an outcome of its run).
    pub state: DeliveryState,
}

/// Where a pool conversation's next turn may go, by the claim's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// A turn is in flight on `host`: only it claims the next turns, after that one.
    Bound {
        /// The host.
        host: String,
        /// How many turns are in flight there.
        in_flight: i64,
        /// The earliest of them, when the record names it.
        turn: Option<FlightTurn>,
    },
    /// Nothing is in flight; `host` ran the last turn and alone claims the next until
    /// `until_ms` (`limits.pool_affinity_wait` after that turn left flight).
    Preferred {
        /// The last host.
        host: String,
        /// When any member may claim (unix ms).
        until_ms: i64,
    },
    /// Any member may claim the next turn.
    Free {
        /// The host that ran the last turn, if any did.
        last_host: Option<String>,
    },
}

/// A pool conversation's queue row as the claim keeps it: `in_flight`, `bound_host`,
/// `last_host`, `last_settled_at`.
type QueueFlight = (i64, Option<String>, Option<String>, Option<i64>);

/// Whether `conversation` in `pool` is bound to a host, kept for its last host, or free, at
/// `judging` (the claim's `dialect::CLAIM_POOL_QUEUES` rule).
pub fn binding(conn: &dyn Db, pool: &str, conversation: &str, judging: Judging) -> StoreResult<Binding> {
    let row: Option<QueueFlight> = conn
        .prepare_cached(
            "SELECT in_flight, bound_host, last_host, last_settled_at FROM pool_queues
             WHERE pool = $1 AND conversation = $2",
        )?
        .query_row(params![pool, conversation], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((in_flight, bound, last, settled_at)) = row else { return Ok(Binding::Free { last_host: None }) };
    if let Some(host) = bound {
        let turn = conn
            .prepare_cached(
                "SELECT d.id, d.seq, d.state FROM deliveries d
                 WHERE d.conversation = $2 AND d.state IN ('claimed', 'mirrored', 'delivered') AND d.pool = $1
                   AND d.host = $3
                   AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
                 ORDER BY d.seq LIMIT 1",
            )?
            .query_row(params![pool, conversation, host], |r| {
                let id: String = r.get(0)?;
                Ok(FlightTurn { seq: r.get(1)?, state: state_column(r, 2, "deliveries", &id)?, delivery_id: id })
            })
            .optional()?;
        return Ok(Binding::Bound { host, in_flight, turn });
    }
    if let (Some(host), Some(at)) = (&last, settled_at) {
        let until_ms = at.saturating_add(judging.affinity_wait_ms);
        let still_member: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM pool_members WHERE pool = $1 AND host = $2)")?
            .query_row(params![pool, host], |r| r.get(0))?;
        if until_ms > judging.now_ms && still_member {
            return Ok(Binding::Preferred { host: host.clone(), until_ms });
        }
    }
    Ok(Binding::Free { last_host: last })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::pool_flight;
    use crate::store::testing;

    const J: Judging = Judging { now_ms: 10_000, silence_warn_ms: 60_000, affinity_wait_ms: 2_000 };

    fn queue(c: &dyn Db, conversation: &str) {
        c.execute(
            "INSERT INTO pool_queues (pool, conversation, queued, since) VALUES ('gpu', $1, 1, 1)",
            params![conversation],
        )
        .unwrap();
    }

    /// A conversation is bound while a turn is in flight, kept for its last host for the wait
    /// (while that host is still a member), then free; the members' counts and the pool's
    /// follow `pool_queues`.
    #[test]
    fn a_conversation_is_bound_then_preferred_then_free() {
        let db = testing::db();
        let c = &*db.conn;
        pools::add(c, "gpu", &["host-a".into(), "host-b".into()], "op", "r", 1).unwrap();
        queue(c, "c");
        queue(c, "d");
        assert_eq!(binding(c, "gpu", "c", J).unwrap(), Binding::Free { last_host: None });
        assert_eq!(binding(c, "gpu", "never", J).unwrap(), Binding::Free { last_host: None });
        pool_flight::began(c, "gpu", "c", "host-a").unwrap();
        pool_flight::began(c, "gpu", "c", "host-a").unwrap();
        assert!(matches!(binding(c, "gpu", "c", J).unwrap(),
            Binding::Bound { host, in_flight: 2, turn: None } if host == "host-a"));
        let s = pools::show(c, "gpu").unwrap();
        assert_eq!((s.in_flight, s.bound_conversations), (2, 1));
        let st = standing(c, s, &[], J.now_ms, J.silence_warn_ms).unwrap();
        let a = &st.members[0];
        assert_eq!((a.liveness.host.as_str(), a.in_flight, a.bound_conversations, a.busy()), ("host-a", 2, 1, true));
        assert!(!st.members[1].busy());
        pool_flight::ended(c, "gpu", "c", "host-a", 9_000).unwrap();
        pool_flight::ended(c, "gpu", "c", "host-a", 9_500).unwrap();
        assert_eq!(binding(c, "gpu", "c", J).unwrap(), Binding::Preferred { host: "host-a".into(), until_ms: 11_500 });
        let later = Judging { now_ms: 11_500, ..J };
        assert_eq!(binding(c, "gpu", "c", later).unwrap(), Binding::Free { last_host: Some("host-a".into()) });
        pools::remove(c, "gpu", &["host-a".into()], "op", "r", 2).unwrap();
        assert!(
            matches!(binding(c, "gpu", "c", J).unwrap(), Binding::Free { .. }),
            "a host that left is not waited for"
        );
        let s = pools::show(c, "gpu").unwrap();
        assert_eq!((s.in_flight, s.bound_conversations), (0, 0));
    }

    /// Any fence on a member keeps it from pool work; the oldest names itself.
    #[test]
    fn a_fence_on_a_member_marks_it_fenced() {
        let db = testing::db();
        let c = &*db.conn;
        pools::add(c, "gpu", &["host-a".into(), "host-b".into()], "op", "r", 1).unwrap();
        let new = |kind, scope, target| fences::NewFence { kind, scope, target, operator: "op", reason: "r" };
        let hold = fences::set(c, new(fences::FenceKind::Hold, FenceScope::Host, Some("host-b")), 2).unwrap();
        fences::set(c, new(fences::FenceKind::Pause, FenceScope::Host, Some("host-b")), 3).unwrap();
        fences::set(c, new(fences::FenceKind::Pause, FenceScope::Pool, Some("gpu")), 3).unwrap();
        let active = fences::active(c).unwrap();
        let st = standing(c, pools::show(c, "gpu").unwrap(), &active, J.now_ms, J.silence_warn_ms).unwrap();
        assert!(!st.members[0].fenced(), "a fence on the pool is the pool's, not a member's");
        assert_eq!(st.members[1].fence.as_ref().map(|f| f.id), Some(hold));
        assert_eq!(st.may_claim(), 1);
        assert_eq!(st.members[1].words(), "fenced");
        assert_eq!(st.members[0].words(), "no node");
    }
}
