//! Fences (SPEC §5): operator rules on the record that gate claims — pause, hold, block — on a
//! conversation, a host, or everything. This module owns the fence types, setting, lifting and
//! listing them, and the one precedence rule the claim applies.
//!
//! Precedence: the fences that cover a delivery (conversation C, host H) are those on
//! everything, on H and on C. The strongest kind among them decides, block over hold over pause,
//! whatever their scopes; of two fences of that kind the older names itself in the reason. A
//! delivery no fence covers is claimable. `strongest` is that rule; `claim_scan` derives from it
//! which of a host's queued deliveries a claim need not read at all (those the rule pauses), so a
//! paused backlog costs a claim nothing.
//!
//! Invariant: each fence records the last delivery event committed before it was set and before
//! it was lifted, which places it exactly in the record's commit order.
//!
//! Why one file over 700 lines: about 130 of them are unit tests; the fence types, their
//! set/lift/list and the one precedence rule claims apply are one concept.

use crate::store::By;
use crate::store::Store;
use crate::store::engine::params;
use crate::store::engine::{Db, DbResult, dialect};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::hosts;
use crate::store::registry::hosts::Standing;
use crate::store::{StoreError, StoreResult, parse_column};

/// Why a fence's target looks like a typo: it matches nothing today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceTargetProblem {
    /// The host was never enrolled.
    NeverEnrolled,
    /// The host is retired.
    Retired,
    /// The conversation has no messages.
    NoMessages,
    /// No pool of that name exists.
    NoSuchPool,
}

/// What `fence_set` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceSetOutcome {
    /// The fence was set, with this id.
    Set(i64),
    /// Nothing was set: the target matches nothing today (and `force` was not given).
    TargetProblem(FenceTargetProblem),
    /// Nothing was set: the same fence is already active (its description).
    AlreadyActive(String),
}

/// What setting a fence would do, read before it is set, so an operator sees it first (SPEC
/// §9: a block fails what it covers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencePlan {
    /// Why the target looks like a typo, if it does (`fence_set` refuses it without `force`).
    pub problem: Option<FenceTargetProblem>,
    /// The same fence, already active (`fence_set` would set nothing), described.
    pub already: Option<String>,
    /// Queued deliveries the fence covers.
    pub queued: i64,
    /// Of those, how many an active pause fence holds back now.
    pub paused: i64,
}

/// Why a fence's target matches nothing today, if it does not.
fn fence_target_problem(conn: &dyn Db, scope: FenceScope, target: &str) -> StoreResult<Option<FenceTargetProblem>> {
    Ok(match scope {
        FenceScope::Host => match hosts::standing(conn, target)? {
            Standing::NotEnrolled => Some(FenceTargetProblem::NeverEnrolled),
            Standing::Retired => Some(FenceTargetProblem::Retired),
            Standing::Active => None,
        },
        FenceScope::Conversation if !conversation_has_messages(conn, target)? => Some(FenceTargetProblem::NoMessages),
        FenceScope::Pool if !crate::store::registry::pools::exists(conn, target)? => {
            Some(FenceTargetProblem::NoSuchPool)
        }
        _ => None,
    })
}

impl Store {
    /// When the next time-boxed fence's time is up, if any.
    pub async fn next_fence_expiry(&self) -> StoreResult<Option<i64>> {
        self.conns.read(next_expiry).await
    }

    /// Lifts the fences whose time is up at `now_ms`; returns their ids.
    pub async fn lift_expired_fences(&self, now_ms: i64) -> StoreResult<Vec<i64>> {
        self.conns.write(move |c| lift_expired(c, now_ms)).await
    }

    /// The fences: active ones, or (`all`) every one ever set.
    pub async fn fences(&self, all: bool) -> StoreResult<Vec<FenceRow>> {
        self.conns.read(move |c| list(c, all)).await
    }

    /// Sets a fence lifted by the hub at `expires_at_ms` (`None`: by an operator), after the
    /// fences whose time is up are lifted; refuses a target that matches nothing today (unless
    /// `force`) and a fence already active, setting nothing.
    pub async fn fence_set(
        &self,
        kind: FenceKind,
        scope: FenceScope,
        target: Option<String>,
        by: By,
        expires_at_ms: Option<i64>,
        force: bool,
    ) -> StoreResult<FenceSetOutcome> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let now_ms = clock.now_ms();
                lift_expired(c, now_ms)?;
                if let (Some(t), false) = (&target, force)
                    && let Some(problem) = fence_target_problem(c, scope, t)?
                {
                    return Ok(FenceSetOutcome::TargetProblem(problem));
                }
                if let Some(existing) = active_same(c, kind, scope, target.as_deref())? {
                    return Ok(FenceSetOutcome::AlreadyActive(existing.describe()));
                }
                let new =
                    NewFence { kind, scope, target: target.as_deref(), operator: &by.operator, reason: &by.reason };
                set_until(c, new, expires_at_ms, now_ms).map(FenceSetOutcome::Set)
            })
            .await
    }

    /// What `fence_set` of `kind` on `scope` and `target` would find, changing nothing: its
    /// target's problem, the same fence already active, and the queued deliveries it covers
    /// (of which how many are paused now).
    pub async fn fence_plan(
        &self,
        kind: FenceKind,
        scope: FenceScope,
        target: Option<String>,
    ) -> StoreResult<FencePlan> {
        self.conns
            .read(move |c| {
                let problem = match &target {
                    Some(t) => fence_target_problem(c, scope, t)?,
                    None => None,
                };
                let already = active_same(c, kind, scope, target.as_deref())?.map(|f| f.describe());
                let active = active(c)?;
                let (mut queued, mut paused) = (0, 0);
                for (conversation, host, n) in queued_by_pair(c, scope, target.as_deref())? {
                    queued += n;
                    if strongest(&active, &conversation, &host).map(|f| f.kind) == Some(FenceKind::Pause) {
                        paused += n;
                    }
                }
                Ok(FencePlan { problem, already, queued, paused })
            })
            .await
    }

    /// Lifts the active fence `id` (after the fences whose time is up); `NotFound` when it is
    /// not active.
    pub async fn fence_lift(&self, id: i64, by: By) -> StoreResult<()> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                lift_expired(c, clock.now_ms())?;
                lift(c, id, &by.operator, &by.reason, clock.now_ms())
            })
            .await
    }
}

/// What a fence does at claim time. Ordered by strength: `Block` > `Hold` > `Pause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FenceKind {
    /// Not handed out; stays queued.
    Pause,
    /// Parked in the held queue until released.
    Hold,
    /// Refused: failed.
    Block,
}

impl FenceKind {
    /// Every kind, weakest first.
    pub const ALL: [FenceKind; 3] = [FenceKind::Pause, FenceKind::Hold, FenceKind::Block];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceKind::Pause => "pause",
            FenceKind::Hold => "hold",
            FenceKind::Block => "block",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<FenceKind> {
        FenceKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What a fence covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceScope {
    /// One conversation.
    Conversation,
    /// One host.
    Host,
    /// One pool: its deliveries, whichever member would claim them.
    Pool,
    /// Everything.
    All,
}

impl FenceScope {
    /// Every scope.
    pub const ALL: [FenceScope; 4] = [FenceScope::Conversation, FenceScope::Host, FenceScope::Pool, FenceScope::All];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceScope::Conversation => "conversation",
            FenceScope::Host => "host",
            FenceScope::Pool => "pool",
            FenceScope::All => "all",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<FenceScope> {
        FenceScope::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One active fence, as the claim sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Its id (also its age: ids grow).
    pub id: i64,
    /// Pause, hold or block.
    pub kind: FenceKind,
    /// Conversation, host or all.
    pub scope: FenceScope,
    /// The conversation or host, for those scopes.
    pub target: Option<String>,
    /// Why it was set.
    pub reason: String,
}

impl Fence {
    /// Whether the fence covers a delivery of `conversation` to `host`.
    pub fn covers(&self, conversation: &str, host: &str) -> bool {
        match self.scope {
            FenceScope::All => true,
            FenceScope::Host => self.target.as_deref() == Some(host),
            FenceScope::Conversation => self.target.as_deref() == Some(conversation),
            FenceScope::Pool => false,
        }
    }

    /// Whether the fence covers a delivery of `conversation` to `pool` (whichever member would
    /// claim it: a fence on a host keeps that host from pool work instead, `pool_turn`).
    pub fn covers_pool(&self, conversation: &str, pool: &str) -> bool {
        match self.scope {
            FenceScope::All => true,
            FenceScope::Pool => self.target.as_deref() == Some(pool),
            FenceScope::Conversation => self.target.as_deref() == Some(conversation),
            FenceScope::Host => false,
        }
    }

    /// Whether the fence covers every delivery of `host`, whatever its conversation.
    fn covers_host(&self, host: &str) -> bool {
        match self.scope {
            FenceScope::All => true,
            FenceScope::Host => self.target.as_deref() == Some(host),
            FenceScope::Conversation | FenceScope::Pool => false,
        }
    }

    /// How the fence names itself in a delivery's reason.
    pub fn describe(&self) -> String {
        let scope = match (&self.scope, &self.target) {
            (FenceScope::All, _) => "everything".to_string(),
            (s, Some(t)) => format!("{} {t}", s.as_str()),
            (s, None) => s.as_str().to_string(),
        };
        format!("{} fence {} on {scope}: {}", self.kind.as_str(), self.id, self.reason)
    }
}

/// The precedence rule: the strongest fence covering a delivery of `conversation` to `host`
/// (block over hold over pause; the oldest of that kind), or `None` when it is claimable.
pub fn strongest<'a>(fences: &'a [Fence], conversation: &str, host: &str) -> Option<&'a Fence> {
    fences.iter().filter(|f| f.covers(conversation, host)).max_by_key(|f| (f.kind, std::cmp::Reverse(f.id)))
}

/// What a claim by `host` does with a pool delivery of `conversation` to `pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolTurn<'a> {
    /// It may be handed to this host.
    Open,
    /// Not by this host, not now: a fence on the host (any kind: a held or blocked host drains
    /// its own deliveries, and the pool's other members take the pool's work), or a pause of
    /// the pool, the conversation or everything.
    Skip,
    /// The strongest fence covering it holds or blocks it, whoever would claim it.
    Fenced(&'a Fence),
}

/// The precedence rule for pool deliveries: the strongest fence covering the delivery itself
/// (its conversation, its pool, everything) decides as for a host delivery, except that any
/// fence on the claiming host keeps that host from the pool's work without touching it.
pub fn pool_turn<'a>(fences: &'a [Fence], conversation: &str, pool: &str, host: &str) -> PoolTurn<'a> {
    let own =
        fences.iter().filter(|f| f.covers_pool(conversation, pool)).max_by_key(|f| (f.kind, std::cmp::Reverse(f.id)));
    match own {
        Some(f) if f.kind != FenceKind::Pause => PoolTurn::Fenced(f),
        Some(_) => PoolTurn::Skip,
        None if fences.iter().any(|f| f.scope == FenceScope::Host && f.target.as_deref() == Some(host)) => {
            PoolTurn::Skip
        }
        None => PoolTurn::Open,
    }
}

/// Which of a host's queued deliveries a claim must read: exactly those `strongest` does not
/// pause. Rows it leaves out are paused and stay queued untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimScan {
    /// None: every delivery of the host is paused.
    Nothing,
    /// Only these conversations' deliveries (the host is paused; these conversations carry a
    /// stronger fence of their own).
    Only(Vec<String>),
    /// Every delivery except these conversations' (paused, with nothing stronger).
    Except(Vec<String>),
}

impl ClaimScan {
    /// Whether a delivery of `conversation` is read by the claim.
    pub fn reads(&self, conversation: &str) -> bool {
        match self {
            ClaimScan::Nothing => false,
            ClaimScan::Only(c) => c.iter().any(|x| x == conversation),
            ClaimScan::Except(c) => !c.iter().any(|x| x == conversation),
        }
    }
}

/// Derives the claim's scan for `host` from the precedence rule.
///
/// The fences on everything and on the host cover every delivery of the host; call the
/// strongest kind among them K. If K is hold or block, nothing is paused and the scan reads
/// everything. If K is pause, a delivery escapes the pause only through a hold or block on its
/// own conversation: the scan reads only those conversations. Without K, exactly the
/// conversations whose strongest own fence is a pause are left out.
pub fn claim_scan(fences: &[Fence], host: &str) -> ClaimScan {
    let host_kind = fences.iter().filter(|f| f.covers_host(host)).map(|f| f.kind).max();
    let mut own: Vec<(&str, FenceKind)> = Vec::new();
    for f in fences.iter().filter(|f| f.scope == FenceScope::Conversation) {
        let Some(c) = f.target.as_deref() else { continue };
        match own.iter_mut().find(|(name, _)| *name == c) {
            Some(entry) => entry.1 = entry.1.max(f.kind),
            None => own.push((c, f.kind)),
        }
    }
    let names = |keep: fn(FenceKind) -> bool| -> Vec<String> {
        let mut v: Vec<String> = own.iter().filter(|(_, k)| keep(*k)).map(|(c, _)| c.to_string()).collect();
        v.sort();
        v
    };
    match host_kind {
        Some(FenceKind::Hold | FenceKind::Block) => ClaimScan::Except(Vec::new()),
        Some(FenceKind::Pause) => {
            let stronger = names(|k| k > FenceKind::Pause);
            if stronger.is_empty() { ClaimScan::Nothing } else { ClaimScan::Only(stronger) }
        }
        None => ClaimScan::Except(names(|k| k == FenceKind::Pause)),
    }
}

/// The active (not lifted) fences, oldest first.
pub fn active(conn: &dyn Db) -> StoreResult<Vec<Fence>> {
    let rows = conn
        .prepare_cached("SELECT id, kind, scope, target, reason FROM fences WHERE lifted_at IS NULL ORDER BY id")?
        .query_map([], |r| {
            let id: i64 = r.get(0)?;
            let row = id.to_string();
            Ok(Fence {
                id,
                kind: parse_column(r, 1, "fences", &row, "fence kind", FenceKind::parse)?,
                scope: parse_column(r, 2, "fences", &row, "fence scope", FenceScope::parse)?,
                target: r.get(3)?,
                reason: r.get(4)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// A new fence: what it does, what it covers, who sets it and why.
#[derive(Debug, Clone, Copy)]
pub struct NewFence<'a> {
    /// Pause, hold or block.
    pub kind: FenceKind,
    /// Conversation, host or all.
    pub scope: FenceScope,
    /// The conversation or host; `None` exactly when the scope is all.
    pub target: Option<&'a str>,
    /// The operator.
    pub operator: &'a str,
    /// Why (recorded).
    pub reason: &'a str,
}

/// Sets a fence. Returns its id.
///
/// The fence records the last delivery event committed before it (and its lift the same), which
/// places it exactly in the record's commit order: a claim event with a higher id committed
/// after the fence. Checkers use this to prove no claim slipped past an active fence.
pub fn set(conn: &dyn Db, f: NewFence<'_>, now_ms: i64) -> StoreResult<i64> {
    set_until(conn, f, None, now_ms)
}

/// Sets a fence that the hub lifts at `expires_at_ms` (unix ms; `None`: until an operator
/// lifts it). Returns its id. See `set`.
pub fn set_until(conn: &dyn Db, f: NewFence<'_>, expires_at_ms: Option<i64>, now_ms: i64) -> StoreResult<i64> {
    if (f.scope == FenceScope::All) != f.target.is_none() {
        return Err(StoreError::Invalid("a fence names a conversation or a host, or covers all".into()));
    }
    if let Some(at) = expires_at_ms
        && at <= now_ms
    {
        return Err(StoreError::Invalid("a fence's expiry must lie in the future".into()));
    }
    let id: i64 = conn.prepare_cached(dialect::FENCE_INSERT.of(conn))?.query_row(
        params![f.kind.as_str(), f.scope.as_str(), f.target, f.operator, now_ms, f.reason, expires_at_ms],
        |r| r.get(0),
    )?;
    let action = format!("fence_{}", f.kind.as_str());
    record_operator_event(conn, &action, &format!("fence {id}"), f.operator, Some(f.reason), now_ms)?;
    Ok(id)
}

/// The active fence of exactly this kind and scope (and target), if one exists: a second one
/// would change nothing.
pub fn active_same(
    conn: &dyn Db,
    kind: FenceKind,
    scope: FenceScope,
    target: Option<&str>,
) -> StoreResult<Option<Fence>> {
    Ok(active(conn)?.into_iter().find(|f| f.kind == kind && f.scope == scope && f.target.as_deref() == target))
}

/// Whether any message was ever accepted into `conversation` (a fence on one that has none is
/// most likely a typo).
pub fn conversation_has_messages(conn: &dyn Db, conversation: &str) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM messages WHERE conversation = $1)")?
        .query_row([conversation], |r| r.get(0))?)
}

/// The queued deliveries a fence of `scope` on `target` covers, counted by (conversation,
/// host): what a block there would fail at the hosts' next claims.
pub fn queued_by_pair(
    conn: &dyn Db,
    scope: FenceScope,
    target: Option<&str>,
) -> StoreResult<Vec<(String, String, i64)>> {
    fn row(r: &crate::store::engine::Row<'_>) -> DbResult<(String, String, i64)> {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    }
    let (sql, arg) = match (scope, target) {
        (FenceScope::Host, Some(h)) => (
            "SELECT conversation, host, count(*) FROM deliveries WHERE state = 'queued' AND host = $1
             GROUP BY conversation, host",
            h,
        ),
        (FenceScope::Conversation, Some(c)) => (
            "SELECT conversation, coalesce(host, 'pool ' || pool), count(*) FROM deliveries
             WHERE state = 'queued' AND conversation = $1 GROUP BY conversation, coalesce(host, 'pool ' || pool)",
            c,
        ),
        (FenceScope::Pool, Some(p)) => {
            return Ok(conn
                .prepare_cached(
                    "SELECT conversation, 'pool ' || pool, count(*) FROM deliveries WHERE state = 'queued' AND pool = $1
                     GROUP BY conversation, pool",
                )?
                .query_map([p], row)?
                .collect::<Result<_, _>>()?);
        }
        (FenceScope::All, None) => {
            return Ok(conn
                .prepare_cached(
                    "SELECT conversation, coalesce(host, 'pool ' || pool), count(*) FROM deliveries WHERE state = 'queued'
                     GROUP BY conversation, coalesce(host, 'pool ' || pool)",
                )?
                .query_map([], row)?
                .collect::<Result<_, _>>()?);
        }
        _ => return Err(StoreError::Invalid("a fence names a conversation, a host or a pool, or covers all".into())),
    };
    Ok(conn.prepare_cached(sql)?.query_map([arg], row)?.collect::<Result<_, _>>()?)
}

/// The actor recorded for a fence the hub lifted because its time was up.
pub const EXPIRY_ACTOR: &str = "hub";

/// The earliest expiry (unix ms) of an active time-boxed fence, if any: a cheap read that tells
/// the hub whether `lift_expired` has anything to do.
pub fn next_expiry(conn: &dyn Db) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT min(expires_at) FROM fences WHERE lifted_at IS NULL AND expires_at IS NOT NULL")?
        .query_row([], |r| r.get(0))?)
}

/// Lifts every active fence whose expiry is at or before `now_ms`, recorded as lifted by the
/// hub. Returns their ids. The hub runs this on its own pace; changing CLI commands run it too.
pub fn lift_expired(conn: &dyn Db, now_ms: i64) -> StoreResult<Vec<i64>> {
    let ids: Vec<i64> = conn
        .prepare_cached(
            "SELECT id FROM fences WHERE lifted_at IS NULL AND expires_at IS NOT NULL AND expires_at <= $1 ORDER BY id",
        )?
        .query_map([now_ms], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for id in &ids {
        lift_as(conn, *id, EXPIRY_ACTOR, "its time was up", "fence_expired", now_ms)?;
    }
    Ok(ids)
}

/// Lifts an active fence.
pub fn lift(conn: &dyn Db, id: i64, operator: &str, reason: &str, now_ms: i64) -> StoreResult<()> {
    lift_as(conn, id, operator, reason, "fence_lift", now_ms)
}

/// Lifts an active fence, recording `action` in the operator event log.
fn lift_as(conn: &dyn Db, id: i64, operator: &str, reason: &str, action: &str, now_ms: i64) -> StoreResult<()> {
    let n = conn.prepare_cached(dialect::FENCE_LIFT.of(conn))?.execute(params![id, now_ms, operator, reason])?;
    if n != 1 {
        return Err(StoreError::NotFound(format!("no active fence {id}")));
    }
    record_operator_event(conn, action, &format!("fence {id}"), operator, Some(reason), now_ms)
}

/// A fence as listed for operators, active or lifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRow {
    /// Its id.
    pub id: i64,
    /// Pause, hold or block.
    pub kind: FenceKind,
    /// Conversation, host or all.
    pub scope: FenceScope,
    /// The conversation or host.
    pub target: Option<String>,
    /// Who set it.
    pub set_by: String,
    /// When (unix ms).
    pub set_at_ms: i64,
    /// Why.
    pub reason: String,
    /// When it was lifted, if it was.
    pub lifted_at_ms: Option<i64>,
    /// Who lifted it (`hub` when its time was up).
    pub lifted_by: Option<String>,
    /// When the hub lifts it (unix ms), for a time-boxed fence.
    pub expires_at_ms: Option<i64>,
}

/// Lists fences, newest first; only active ones unless `all`.
pub fn list(conn: &dyn Db, all: bool) -> StoreResult<Vec<FenceRow>> {
    let rows = conn
        .prepare_cached(
            "SELECT id, kind, scope, target, set_by, set_at, reason, lifted_at, lifted_by, expires_at FROM fences
             WHERE $1 OR lifted_at IS NULL ORDER BY id DESC",
        )?
        .query_map([all], |r| {
            let id: i64 = r.get(0)?;
            let row = id.to_string();
            Ok(FenceRow {
                id,
                kind: parse_column(r, 1, "fences", &row, "fence kind", FenceKind::parse)?,
                scope: parse_column(r, 2, "fences", &row, "fence scope", FenceScope::parse)?,
                target: r.get(3)?,
                set_by: r.get(4)?,
                set_at_ms: r.get(5)?,
                reason: r.get(6)?,
                lifted_at_ms: r.get(7)?,
                lifted_by: r.get(8)?,
                expires_at_ms: r.get(9)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// How many fences are active.
pub fn active_count(conn: &dyn Db) -> StoreResult<i64> {
    Ok(conn.prepare_cached("SELECT count(*) FROM fences WHERE lifted_at IS NULL")?.query_row([], |r| r.get(0))?)
}

/// How many fences are active (as `active_count` counts them) per scope, every scope listed in
/// `FenceScope::ALL` order, zero included.
pub fn active_counts_by_scope(conn: &dyn Db) -> StoreResult<Vec<(FenceScope, i64)>> {
    let mut stmt = conn.prepare_cached("SELECT count(*) FROM fences WHERE lifted_at IS NULL AND scope = $1")?;
    let mut out = Vec::with_capacity(FenceScope::ALL.len());
    for scope in FenceScope::ALL {
        out.push((scope, stmt.query_row([scope.as_str()], |r| r.get(0))?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;
    use FenceKind::*;

    fn fence(id: i64, kind: FenceKind, scope: FenceScope, target: Option<&str>) -> Fence {
        Fence { id, kind, scope, target: target.map(str::to_string), reason: "r".into() }
    }

    /// One case of the rule: the fence (by id) that decides a delivery of `conv` to `host`.
    fn check(fences: &[Fence], conv: &str, host: &str, expected: Option<i64>) {
        assert_eq!(strongest(fences, conv, host).map(|f| f.id), expected, "{conv} to {host} under {fences:?}");
    }

    #[test]
    fn block_over_hold_over_pause_whatever_the_scope() {
        use FenceScope::*;
        let fences = [
            fence(1, Pause, All, None),
            fence(2, Block, Host, Some("host-a")),
            fence(3, Hold, Conversation, Some("c")),
            fence(4, Pause, Conversation, Some("d")),
            fence(5, Hold, Conversation, Some("d")),
            fence(6, Hold, Host, Some("host-c")),
            fence(7, Hold, All, None),
        ];
        check(&fences, "c", "host-a", Some(2));
        check(&fences, "c", "host-b", Some(3));
        check(&fences, "d", "host-b", Some(5));
        check(&fences, "e", "host-b", Some(7));
        check(&fences, "e", "host-c", Some(6));
        check(&fences[..1], "e", "host-b", Some(1));
        check(&fences[3..4], "e", "host-b", None);
    }

    /// Every fence a small world can hold: each kind on all, on two hosts, on two conversations.
    fn universe() -> Vec<Fence> {
        let mut all = Vec::new();
        let mut id = 0;
        for kind in FenceKind::ALL {
            for (scope, target) in [
                (FenceScope::All, None),
                (FenceScope::Host, Some("host-a")),
                (FenceScope::Host, Some("host-b")),
                (FenceScope::Conversation, Some("c1")),
                (FenceScope::Conversation, Some("c2")),
            ] {
                id += 1;
                all.push(fence(id, kind, scope, target));
            }
        }
        all
    }

    /// `claim_scan` reads a delivery exactly when the rule does not pause it, for every set of up
    /// to three fences of the universe and every conversation, fenced or not.
    #[test]
    fn the_scan_skips_exactly_what_the_rule_pauses() {
        let u = universe();
        let mut sets: Vec<Vec<Fence>> = vec![Vec::new()];
        for i in 0..u.len() {
            sets.push(vec![u[i].clone()]);
            for j in i + 1..u.len() {
                sets.push(vec![u[i].clone(), u[j].clone()]);
                for k in j + 1..u.len() {
                    sets.push(vec![u[i].clone(), u[j].clone(), u[k].clone()]);
                }
            }
        }
        for fences in &sets {
            let scan = claim_scan(fences, "host-a");
            for conv in ["c1", "c2", "c3"] {
                let paused = strongest(fences, conv, "host-a").map(|f| f.kind) == Some(Pause);
                assert_eq!(scan.reads(conv), !paused, "{conv} under {fences:?}: {scan:?}");
            }
        }
    }

    #[test]
    fn set_lift_and_list_round_trip() {
        let db = testing::db();
        let c = &db.conn;
        let f = NewFence { kind: Hold, scope: FenceScope::Host, target: Some("host-a"), operator: "op", reason: "why" };
        let id = set(c, f, 5).unwrap();
        assert!(matches!(set(c, NewFence { target: None, ..f }, 5), Err(StoreError::Invalid(_))));
        let mut expected = fence(id, Hold, FenceScope::Host, Some("host-a"));
        expected.reason = "why".into();
        assert_eq!(active(c).unwrap(), vec![expected]);
        lift(c, id, "op2", "done", 6).unwrap();
        assert!(matches!(lift(c, id, "op2", "again", 7), Err(StoreError::NotFound(_))));
        assert!(list(c, false).unwrap().is_empty());
        let rows = list(c, true).unwrap();
        assert_eq!((rows[0].kind, rows[0].lifted_at_ms, rows[0].lifted_by.as_deref()), (Hold, Some(6), Some("op2")));
    }

    /// A stored kind or scope that does not parse is an error naming the fence, never a block or
    /// a fence on everything.
    #[test]
    fn a_corrupt_fence_is_an_error_naming_it() {
        let db = testing::db();
        let c = &db.conn;
        let f = NewFence { kind: Pause, scope: FenceScope::All, target: None, operator: "op", reason: "r" };
        let id = set(c, f, 1).unwrap();
        c.execute_batch("PRAGMA ignore_check_constraints = ON").unwrap();
        c.execute("UPDATE fences SET kind = 'stop' WHERE id = $1", [id]).unwrap();
        for e in [active(c).unwrap_err(), list(c, true).unwrap_err()] {
            let StoreError::Corrupt(text) = &e else { panic!("{e:?}") };
            assert!(text.contains(&format!("fences {id}")) && text.contains("kind") && text.contains("stop"), "{text}");
        }
        c.execute("UPDATE fences SET kind = 'pause', scope = 'everywhere' WHERE id = $1", [id]).unwrap();
        assert!(matches!(active(c), Err(StoreError::Corrupt(t)) if t.contains("scope")));
    }

    #[test]
    fn a_time_boxed_fence_is_lifted_by_the_hub_once_its_time_is_up() {
        let db = testing::db();
        let c = &db.conn;
        let f = NewFence { kind: FenceKind::Pause, scope: FenceScope::All, target: None, operator: "op", reason: "r" };
        assert!(matches!(set_until(c, f, Some(100), 100), Err(StoreError::Invalid(_))), "an expiry in the past");
        let id = set_until(c, f, Some(200), 100).unwrap();
        assert_eq!(active_same(c, FenceKind::Pause, FenceScope::All, None).unwrap().map(|f| f.id), Some(id));
        assert_eq!(next_expiry(c).unwrap(), Some(200));
        assert!(lift_expired(c, 199).unwrap().is_empty());
        assert_eq!(active(c).unwrap().len(), 1, "active until the hub lifts it");
        assert_eq!(lift_expired(c, 200).unwrap(), vec![id]);
        let row = list(c, true).unwrap().remove(0);
        assert_eq!(
            (row.lifted_at_ms, row.lifted_by.as_deref(), row.expires_at_ms),
            (Some(200), Some("hub"), Some(200))
        );
        assert_eq!(next_expiry(c).unwrap(), None);
        assert!(active_same(c, FenceKind::Pause, FenceScope::All, None).unwrap().is_none());
    }
}
