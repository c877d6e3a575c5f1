//! Claims (with fences evaluated in the claim's own transaction), holdings, and the holder's
//! mirrored / ack / reject (SPEC §2, §4, §5, §6).
//!
//! Invariant (order): for each (host, conversation), a claim hands out a delivery with `seq` s
//! only when no earlier message of the conversation routed to that host still has a pending
//! fan-out obligation, none has a delivery that is queued (a retry waiting for its `not_before`
//! included) or held, and none of a message with `max_attempts > 1` is claimed, mirrored or
//! delivered without an outcome of its current run (the retry barrier). A redrive is handed out
//! whatever came before it and holds nothing back: the one run allowed out of order. It is
//! checked inside the claim transaction for every candidate, after the earlier candidates of the
//! same claim were handed out, so one batch may carry several turns of a conversation, in
//! order; a conversation found waiting is skipped for the rest of the claim. A pause or hold of the conversation
//! therefore keeps everything after it back too, and releasing a later held delivery does not
//! let it pass an earlier one.
//!
//! Invariant (fairness): the conversations with queued work for a host take turns within a
//! claim, one delivery per turn, least recently served first (`conversation_queues.served`,
//! a per-host tick; among those not served since they gained work, the one waiting longest),
//! and a claim looks at no more than `CLAIM_HEADS_MAX` queue heads; each look is one indexed
//! lookup, so a claim's cost does not grow with the backlog.
//!
//! Invariant (claims at once): on PostgreSQL a transaction of claims only takes the record's
//! write lock in shared mode (`Db::begin_claims`), so claims on several hubs run at the same
//! time, and every other writer still runs alone. What keeps claims apart are row locks, taken
//! in one order: the host's row first (`host_row`: shared while the claimant is the bound
//! instance of an active host, so one instance's claims may overlap; exclusive when the claim
//! may change the binding or fail a retired host's work), then each conversation queue the
//! claim turns to, `FOR UPDATE SKIP LOCKED`: a queue another claim of the host holds is skipped
//! for this claim, so no two claims look at one conversation's turns at once and `seq` order
//! holds; then the queue's deliveries, moved by guarded transitions (row counts checked).
//! Claims of different hosts share no row but a message's (settling it when a fence or the
//! registry fails its last delivery); a cycle there is the server's deadlock error, retried by
//! the node like any storage failure.
//!
//! Invariant: a host has at most one bound node instance. A claim from another instance is
//! refused (`InstanceConflict`) while the bound one still holds anything; once it holds
//! nothing, the new instance takes the binding (recorded as an operator-visible event).
//!
//! Why one file over 700 lines: the claim's transaction (fences, order, the retry barrier,
//! fairness, instance binding, several hubs at once) and the holder's steps after it share
//! their guards and row readers; the handoff steps (`mirrored`, `ack`, `handoff`, `reject`) are
//! the part to move out when the store's modules are grouped by concern.

use crate::store::Store;
use crate::store::engine::{Db, Dialect, Row};
use crate::store::handle::Conns;
use crate::store::lifecycle::transition::{self, Change, Holder};
use crate::store::lifecycle::turns;
use crate::store::registry::fences::{self, ClaimScan, Fence, FenceKind};
use crate::store::registry::hosts;
use crate::store::registry::hosts::Standing;
use crate::store::registry::sessions;
use crate::store::writer::StandingClaim;
use crate::store::{
    Actor, StoreError, StoreResult, json_column, new_token, parse_column_opt, registry::members, state_column,
};
use baton_shared::clock::SharedClock;
use baton_shared::crash_point;
use baton_shared::limits::{INSTANCE_REBIND_WINDOW, INSTANCE_REBINDS_PER_WINDOW_MAX};
use baton_shared::states::DeliveryState::{self, *};
use baton_shared::states::Rerun;
use baton_shared::wire::CancelNotice;
use baton_shared::wire::{ClaimedDelivery, TransitionResponse};
use rusqlite::{OptionalExtension, named_params};
use std::collections::{HashMap, VecDeque};

/// The claim of `Store::claim` (and `Store::stand_claim`): up to `max` deliveries for the
/// claimant, with its pending cancel notices and the next retry, in the caller's transaction.
/// It may run more than once (a claim the server ended in a conflict runs again).
fn claim_job(
    who: Claimer,
    max: u32,
    clock: SharedClock,
) -> impl Fn(&dyn Db) -> StoreResult<Claimed> + Clone + Send + 'static {
    move |c| {
        let now = clock.now_ms();
        sessions::check(c, &who.host, who.session)?;
        let deliveries = claim_as(c, who.claimant(), max, now)?;
        let cancels = turns::cancels_for(c, &who.host, &who.instance_id)?;
        // A retired host's claim hands out nothing; only an empty one asks why.
        let retired = deliveries.is_empty() && hosts::standing(c, &who.host)? == Standing::Retired;
        let next_retry_at_ms = turns::next_retry_at(c, &who.host, now)?;
        Ok(Claimed { deliveries, cancels, next_retry_at_ms, retired })
    }
}

/// A claimant: the host (from its certificate), the certificate's serial, the node instance and
/// its node session.
#[derive(Debug, Clone)]
pub struct Claimer {
    /// The host.
    pub host: String,
    /// The presenting certificate's serial; re-checked inside the claim.
    pub serial: String,
    /// The node instance.
    pub instance_id: String,
    /// The request's node session (`None` for a node that predates sessions).
    pub session: Option<u64>,
    /// How often the host may change its bound instance.
    pub rebind: RebindLimit,
}

impl Claimer {
    fn claimant(&self) -> Claimant<'_> {
        Claimant { host: &self.host, serial: Some(&self.serial), instance_id: &self.instance_id, rebind: self.rebind }
    }
}

/// What a look before a claim found (a read; nothing changes).
#[derive(Debug, Clone)]
pub struct ClaimLook {
    /// Something may be handed out (or a retired host's work failed, or the instance bound):
    /// the claim itself must run.
    pub worth_claiming: bool,
    /// Cancel notices pending for the instance (empty when `worth_claiming`).
    pub cancels: Vec<CancelNotice>,
    /// When the host's next retry becomes due (`None` when `worth_claiming`).
    pub next_retry_at_ms: Option<i64>,
}

/// What a claim did.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The deliveries handed out.
    pub deliveries: Vec<ClaimedDelivery>,
    /// Cancel notices pending for the instance.
    pub cancels: Vec<CancelNotice>,
    /// When the host's next retry becomes due.
    pub next_retry_at_ms: Option<i64>,
    /// Nothing was handed out because the host is retired.
    pub retired: bool,
}

/// A holder's step on one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// claimed → mirrored.
    Mirrored,
    /// mirrored → delivered.
    Ack,
    /// Both, in one transaction: claimed → mirrored → delivered (from `mirrored`, the ack
    /// alone). The node's local copy is committed before it asks, as for `mirrored`.
    Handoff,
}

/// The node a holder's request comes from: its host and its node session.
#[derive(Debug, Clone)]
pub struct NodeAt {
    /// The host, from the certificate.
    pub host: String,
    /// The request's node session (`None` for a node that predates sessions).
    pub session: Option<u64>,
}

/// The holder a node's step names: its instance and the claim token.
#[derive(Debug, Clone)]
pub struct HolderOf {
    /// The holding instance.
    pub instance_id: String,
    /// The claim token.
    pub claim_token: String,
}

impl HolderOf {
    fn as_holder(&self) -> Holder<'_> {
        Holder { instance_id: &self.instance_id, claim_token: &self.claim_token }
    }
}

/// A holder's step, applied on `conn`.
pub(super) fn apply_step(
    conn: &dyn Db,
    step: Step,
    node: &NodeAt,
    id: &str,
    h: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let host = node.host.as_str();
    let answer = match step {
        Step::Mirrored => return mirrored(conn, host, id, h, now_ms),
        Step::Ack => ack(conn, host, id, h, now_ms)?,
        Step::Handoff => handoff(conn, host, id, h, now_ms)?,
    };
    // The session whose ack made the run `delivered`: a newer session is not granted its
    // start while this one's start lease lasts (`turns::start`).
    if let Some(session) = node.session
        && answer.changed
        && answer.state == baton_shared::states::DeliveryState::Delivered
    {
        record_acked_session(conn, id, session)?;
    }
    Ok(answer)
}

impl Store {
    /// The look before a claim, at `now_ms` (a read): whether a claim may hand something out,
    /// and otherwise the pending cancel notices and the next retry.
    pub async fn claim_look(&self, who: Claimer, now_ms: i64) -> StoreResult<ClaimLook> {
        self.conns
            .read(move |c| {
                sessions::check(c, &who.host, who.session)?;
                if worth_claiming(c, who.claimant(), now_ms)? {
                    return Ok(ClaimLook { worth_claiming: true, cancels: Vec::new(), next_retry_at_ms: None });
                }
                Ok(ClaimLook {
                    worth_claiming: false,
                    cancels: turns::cancels_for(c, &who.host, &who.instance_id)?,
                    next_retry_at_ms: turns::next_retry_at(c, &who.host, now_ms)?,
                })
            })
            .await
    }

    /// The claim: up to `max` deliveries for the claimant, with its pending cancel notices and
    /// the next retry, in one transaction.
    pub async fn claim(&self, who: Claimer, max: u32) -> StoreResult<Claimed> {
        self.conns.write_claims(who.host.clone(), claim_job(who, max, self.clock.clone())).await
    }

    /// Leaves the claim `claim` would make with the writer, to run in the transaction of the
    /// next change that gives the claimant's host claimable work (an accept's fan-out; see
    /// `Writer::stand_claim`). `None` where there is no writer thread (a one-shot process).
    pub fn stand_claim(&self, who: Claimer, max: u32) -> Option<StandingClaim<Claimed>> {
        match &self.conns {
            Conns::Served { writer, .. } => {
                Some(writer.stand_claim(who.host.clone(), claim_job(who, max, self.clock.clone())))
            }
            Conns::Direct(_) => None,
        }
    }

    /// One page of what the instance holds (claimed, mirrored, delivered without an outcome):
    /// at most `limit` after queue position `after_n`, and where the next page starts.
    pub async fn holdings(
        &self,
        node: NodeAt,
        instance_id: String,
        after_n: i64,
        limit: u32,
    ) -> StoreResult<(Vec<ClaimedDelivery>, Option<i64>)> {
        self.conns
            .read(move |c| {
                sessions::check(c, &node.host, node.session)?;
                holdings_page(c, &node.host, &instance_id, after_n, limit)
            })
            .await
    }

    /// The holder recorded its local copy: claimed → mirrored. Repeating it changes nothing.
    pub async fn mirrored(
        &self,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
    ) -> StoreResult<TransitionResponse> {
        self.holder_step(Step::Mirrored, node, delivery_id, holder).await
    }

    /// The holder acked the durable handoff: mirrored → delivered. Repeating it changes nothing.
    pub async fn ack(&self, node: NodeAt, delivery_id: String, holder: HolderOf) -> StoreResult<TransitionResponse> {
        self.holder_step(Step::Ack, node, delivery_id, holder).await
    }

    /// A holder's `step` on one delivery, after the session check.
    pub async fn holder_step(
        &self,
        step: Step,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
    ) -> StoreResult<TransitionResponse> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let h = holder.as_holder();
                apply_step(c, step, &node, &delivery_id, h, clock.now_ms())
            })
            .await
    }

    /// The holder refuses the delivery: claimed or mirrored → failed, with its reason.
    pub async fn reject(
        &self,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
        reason: String,
    ) -> StoreResult<TransitionResponse> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let h = holder.as_holder();
                reject(c, &node.host, &delivery_id, h, &reason, clock.now_ms())
            })
            .await
    }
}

/// The host's row as a claim reads it: its bound instance and when it was retired, or `None`
/// when it is not enrolled. On PostgreSQL, where claims of several hubs run at once, the row is
/// locked: shared while `instance_id` is the bound instance of an active host (nothing about the
/// host changes then, and claims of that instance may overlap), exclusively otherwise, since the
/// claim may bind another instance or fail the retired host's queued work (the row is read again
/// under that lock). On SQLite the claim holds the file's write lock and runs alone.
fn host_row(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<Option<(Option<String>, Option<i64>)>> {
    let read = |sql: &str| -> StoreResult<Option<(Option<String>, Option<i64>)>> {
        Ok(conn.prepare_cached(sql)?.query_row([host], |r| Ok((r.get(0)?, r.get(1)?))).optional()?)
    };
    if conn.dialect() == Dialect::Sqlite {
        return read("SELECT instance_id, retired_at FROM hosts WHERE name = ?1");
    }
    match read("SELECT instance_id, retired_at FROM hosts WHERE name = ?1 FOR SHARE")? {
        Some((bound, None)) if bound.as_deref() == Some(instance_id) => Ok(Some((bound, None))),
        None => Ok(None),
        Some(_) => read("SELECT instance_id, retired_at FROM hosts WHERE name = ?1 FOR UPDATE"),
    }
}

/// A retired host's claim: its queued work fails (`host retired`).
fn fail_retired_work(conn: &dyn Db, host: &str, now_ms: i64) -> StoreResult<()> {
    let ids: Vec<String> = conn
        .prepare_cached("SELECT id FROM deliveries WHERE host = ?1 AND state = 'queued'")?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for id in ids {
        let change = Change {
            delivery_id: &id,
            from: Queued,
            to: Failed,
            expect_holder: None,
            new_holder: None,
            reason: Some("host retired"),
        };
        transition::apply(conn, change, &Actor::hub(), now_ms)?;
    }
    Ok(())
}

/// How many deliveries `instance_id` holds on `host`: claimed, mirrored, or delivered with no
/// outcome of the current run. Instance ids are scoped per host: another host's deliveries under
/// the same id are not counted.
pub fn holding_count(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM deliveries d WHERE d.host = ?1 AND d.instance_id = ?2
               AND (d.state IN ('claimed', 'mirrored')
                    OR (d.state = 'delivered' AND NOT EXISTS (
                        SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))",
        )?
        .query_row([host, instance_id], |r| r.get(0))?)
}

/// How often one host may change its bound node instance (`limits.instance_rebinds_max`) and over
/// what sliding window (`limits.instance_rebind_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebindLimit {
    /// Most changes within `window`.
    pub max: i64,
    /// The window they are counted over.
    pub window: std::time::Duration,
}

impl Default for RebindLimit {
    fn default() -> Self {
        RebindLimit { max: INSTANCE_REBINDS_PER_WINDOW_MAX, window: INSTANCE_REBIND_WINDOW }
    }
}

/// Binds `instance_id` to `host`, or refuses when another instance of the host still holds work
/// (`InstanceConflict`) or the host changed its binding too often (`OverCapacity`). The same
/// instance again changes nothing and records nothing; each actual change is one operator event.
pub(crate) fn bind_instance(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    rebind: RebindLimit,
    now_ms: i64,
) -> StoreResult<()> {
    let bound: Option<String> =
        conn.prepare_cached("SELECT instance_id FROM hosts WHERE name = ?1")?.query_row([host], |r| r.get(0))?;
    bind_over(conn, host, instance_id, bound, rebind, now_ms)
}

/// `bind_instance` over the binding `bound` the claim already read (`host_row`).
fn bind_over(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    bound: Option<String>,
    rebind: RebindLimit,
    now_ms: i64,
) -> StoreResult<()> {
    if bound.as_deref() == Some(instance_id) {
        return Ok(());
    }
    if let Some(old) = &bound {
        let held = holding_count(conn, host, old)?;
        if held > 0 {
            return Err(StoreError::InstanceConflict(format!(
                "instance {old} of host {host} still holds {held} deliveries; only one instance of a host may be \
                 active (restart it with its own data directory, or requeue its claims with \
                 `baton-hub requeue --instance {old}` if it is gone for good)"
            )));
        }
    }
    let since = now_ms.saturating_sub(rebind.window.as_millis() as i64);
    let recent: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM operator_events WHERE action = 'bind_instance' AND subject = ?1 AND at > ?2",
        )?
        .query_row(rusqlite::params![host, since], |r| r.get(0))?;
    if recent >= rebind.max {
        return Err(StoreError::OverCapacity(format!(
            "host {host} changed its node instance {recent} times in the last {}s; at most {} are allowed \
             (limits.instance_rebinds_max per limits.instance_rebind_window): keep one instance id per data \
             directory",
            rebind.window.as_secs(),
            rebind.max
        )));
    }
    conn.prepare_cached("UPDATE hosts SET instance_id = ?2, instance_since = ?3 WHERE name = ?1")?
        .execute(rusqlite::params![host, instance_id, now_ms])?;
    conn.prepare_cached(
        "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES ('bind_instance', ?1, 'hub', ?2, ?3)",
    )?
    .execute(rusqlite::params![
        host,
        format!("instance {instance_id} replaces {}", bound.as_deref().unwrap_or("none")),
        now_ms
    ])?;
    Ok(())
}

/// `claim_as` without a certificate to re-check (in-process callers: tests, benchmarks).
pub fn claim(conn: &dyn Db, host: &str, instance_id: &str, max: u32, now_ms: i64) -> StoreResult<Vec<ClaimedDelivery>> {
    claim_as(conn, Claimant { host, serial: None, instance_id, rebind: RebindLimit::default() }, max, now_ms)
}

/// Who is claiming: the host, the certificate it presented, and its instance.
#[derive(Debug, Clone, Copy)]
pub struct Claimant<'a> {
    /// The host, from the certificate.
    pub host: &'a str,
    /// The presenting certificate's serial; re-checked inside the claim.
    pub serial: Option<&'a str>,
    /// The node instance.
    pub instance_id: &'a str,
    /// How often the host may change its bound instance.
    pub rebind: RebindLimit,
}

/// The claim transaction: up to `max` queued deliveries for the claimant's host, taken in turns
/// across the host's conversations and in `seq` order within each, with fences applied on the
/// way (pause skips, hold parks, block fails).
///
/// Authorization is re-checked here, inside the transaction that would hand work out: the
/// presenting certificate must not be revoked (else the claim is refused and nothing changes,
/// so the host's work waits for a renewed certificate), the host must not be retired (its
/// queued work fails with `host retired`), and each delivery's host must be authorized for the
/// message's `seq` by the membership registry (else it fails with `not a member`).
///
/// Order: a delivery (h, c, s) is handed out only when no earlier message of c routed to h is
/// still owed its fan-out, and none has a delivery that is queued or held. Fairness: the
/// conversations with queued work for the host take turns, least recently served first, one
/// delivery per turn, so a deep conversation cannot fill a batch while another one waits.
pub fn claim_as(conn: &dyn Db, who: Claimant<'_>, max: u32, now_ms: i64) -> StoreResult<Vec<ClaimedDelivery>> {
    let (host, instance_id) = (who.host, who.instance_id);
    if let Some(serial) = who.serial {
        let revoked: Option<bool> = conn
            .prepare_cached("SELECT revoked_at IS NOT NULL FROM certificates WHERE serial = ?1")?
            .query_row([serial], |r| r.get(0))
            .optional()?;
        if revoked != Some(false) {
            return Err(StoreError::CertificateRevoked(format!("certificate {serial} was revoked")));
        }
    }
    let Some((bound, retired)) = host_row(conn, host, instance_id)? else {
        return Err(StoreError::NotYours(format!("host {host} is not enrolled")));
    };
    if retired.is_some() {
        fail_retired_work(conn, host, now_ms)?;
        return Ok(Vec::new());
    }
    bind_over(conn, host, instance_id, bound, who.rebind, now_ms)?;
    let fences = fences::active(conn)?;
    crash_point("hub.claim.after_fence_eval");
    // Every delivery of the host paused by the precedence rule (and nothing stronger on any of
    // its conversations): nothing to look at. Otherwise each conversation's turn asks the same
    // rule (`fences::strongest`), so a hold or block under a pause still applies.
    if fences::claim_scan(&fences, host) == ClaimScan::Nothing || max == 0 {
        return Ok(Vec::new());
    }
    let mut scan = Scan::new(conn, host, instance_id, &fences, max as usize, now_ms)?;
    scan.run()?;
    scan.finish()
}

/// Whether a claim by `who` could change anything, read without writing: the claim handler
/// opens a write transaction (`claim_as`) only when this says so, so a waiting claim with
/// nothing claimable costs a read, not a write job. It refuses what `claim_as` refuses (a
/// revoked or unknown certificate, a host not enrolled) and says `true` whenever the write
/// might do something: the host is retired (its queued work fails), another instance is bound
/// (the binding or the conflict is decided there), or a queued delivery of the host is due and
/// not every one of them is paused.
pub fn worth_claiming(conn: &dyn Db, who: Claimant<'_>, now_ms: i64) -> StoreResult<bool> {
    if let Some(serial) = who.serial {
        let revoked: Option<bool> = conn
            .prepare_cached("SELECT revoked_at IS NOT NULL FROM certificates WHERE serial = ?1")?
            .query_row([serial], |r| r.get(0))
            .optional()?;
        if revoked != Some(false) {
            return Err(StoreError::CertificateRevoked(format!("certificate {serial} was revoked")));
        }
    }
    let bound: Option<(Option<String>, Option<i64>)> = conn
        .prepare_cached("SELECT instance_id, retired_at FROM hosts WHERE name = ?1")?
        .query_row([who.host], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((bound, retired)) = bound else {
        return Err(StoreError::NotYours(format!("host {} is not enrolled", who.host)));
    };
    if retired.is_some() || bound.as_deref() != Some(who.instance_id) {
        return Ok(true);
    }
    let due: bool = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM deliveries WHERE host = ?1 AND state = 'queued'
                              AND (not_before IS NULL OR not_before <= ?2 OR rerun = 'redrive'))",
        )?
        .query_row(rusqlite::params![who.host, now_ms], |r| r.get(0))?;
    if !due {
        return Ok(false);
    }
    Ok(fences::claim_scan(&fences::active(conn)?, who.host) != ClaimScan::Nothing)
}

/// Most queue heads one claim looks at (handed out, parked, failed, or found waiting behind an
/// earlier turn). It bounds the claim's transaction however deep the backlog is and however
/// many conversations are blocked; what is left is looked at by the next claim.
pub const CLAIM_HEADS_MAX: usize = 4096;

/// Conversation queues read per step while taking the first round of turns.
const CLAIM_TURNS_CHUNK: i64 = 64;

/// The host's conversation queues with work, least recently served first, after a position.
const QUEUES: &str = "SELECT served, since, conversation FROM conversation_queues
     WHERE host = :h AND queued > 0 AND (served, since, conversation) > (:s, :n, :c)
     ORDER BY served, since, conversation LIMIT :limit";

/// `QUEUES` on PostgreSQL: each queue returned is locked until the claim commits, and one that
/// another claim of the host holds is skipped (see the module's "claims at once").
const QUEUES_SKIP_LOCKED: &str = "SELECT served, since, conversation FROM conversation_queues
     WHERE host = :h AND queued > 0 AND (served, since, conversation) > (:s, :n, :c)
     ORDER BY served, since, conversation LIMIT :limit FOR UPDATE SKIP LOCKED";

/// What one turn of a conversation in a claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// One delivery was handed out; the conversation may have more.
    Claimed,
    /// Nothing may be handed out now (paused, an earlier turn queued, held or not fanned out,
    /// or held by the fence); skip it for the rest of this claim.
    Blocked,
    /// No queued delivery is left.
    Empty,
    /// The claim looked at `CLAIM_HEADS_MAX` heads; it stops here.
    Spent,
}

/// A queued delivery of a (host, conversation): the next turn, or one a fence covers.
struct Head {
    id: String,
    message_id: String,
    seq: i64,
    /// While waiting for a retry: not handed out before (unix ms).
    not_before: Option<i64>,
    /// An operator's redrive: handed out whatever the order rule says.
    redrive: bool,
}

impl Head {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Head> {
        Ok(Head {
            id: r.get(0)?,
            message_id: r.get(1)?,
            seq: r.get(2)?,
            not_before: r.get(3)?,
            redrive: r.get::<_, Option<String>>(4)?.as_deref() == Some("redrive"),
        })
    }
}

/// One claim's walk over the host's conversation queues.
struct Scan<'a> {
    conn: &'a dyn Db,
    host: &'a str,
    holder_instance: &'a str,
    fences: &'a [Fence],
    max: usize,
    now_ms: i64,
    out: Vec<ClaimedDelivery>,
    heads: usize,
    /// Whether any fan-out obligation is pending at all (then the order rule looks them up).
    obligations_pending: bool,
    /// Whether any message may be retried at all (then the retry barrier looks them up).
    retryable_messages: bool,
    /// The last tick given out; each turn taken (or found blocked) gets the next one.
    tick: i64,
    /// Conversations turned to in this claim, with their new tick, in turn order.
    turned: Vec<(String, i64)>,
    /// Whether each conversation looked at has ever had a member (else every host may have
    /// its posts, and the registry need not be asked per delivery).
    managed: HashMap<String, bool>,
}

impl<'a> Scan<'a> {
    fn new(
        conn: &'a dyn Db,
        host: &'a str,
        holder_instance: &'a str,
        fences: &'a [Fence],
        max: usize,
        now_ms: i64,
    ) -> StoreResult<Scan<'a>> {
        // The newest tick among the queues with work (read backwards along the index).
        let tick: i64 = conn
            .prepare_cached(
                "SELECT served FROM conversation_queues WHERE host = ?1 AND queued > 0
                 ORDER BY served DESC, since DESC, conversation DESC LIMIT 1",
            )?
            .query_row([host], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        let obligations_pending: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM fanout_obligations WHERE done_at IS NULL)")?
            .query_row([], |r| r.get(0))?;
        let retryable_messages: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM messages WHERE max_attempts > 1)")?
            .query_row([], |r| r.get(0))?;
        Ok(Scan {
            conn,
            host,
            holder_instance,
            fences,
            max,
            now_ms,
            out: Vec::new(),
            heads: 0,
            obligations_pending,
            retryable_messages,
            tick,
            turned: Vec::new(),
            managed: HashMap::new(),
        })
    }

    /// Queues to read per step: a few more than the batch still needs (some may be blocked).
    /// On PostgreSQL, where each queue read is locked for the claim, only as many as it still
    /// needs: a queue read and not turned to would keep another claim of the host from it.
    fn chunk(&self) -> i64 {
        let needed = (self.max - self.out.len()) as i64;
        let spare = match self.conn.dialect() {
            Dialect::Sqlite => 8,
            Dialect::Postgres => 0,
        };
        (needed + spare).min(CLAIM_TURNS_CHUNK)
    }

    fn done(&self) -> bool {
        self.out.len() >= self.max || self.heads >= CLAIM_HEADS_MAX
    }

    /// First round: every conversation with queued work, least recently served first, one turn
    /// each; then further rounds over those that handed one out, until the batch is full.
    fn run(&mut self) -> StoreResult<()> {
        let mut again: VecDeque<String> = VecDeque::new();
        let mut after: (i64, i64, String) = (i64::MIN, i64::MIN, String::new());
        'first: loop {
            let queues: Vec<(i64, i64, String)> = self
                .conn
                .prepare_cached(match self.conn.dialect() {
                    Dialect::Sqlite => QUEUES,
                    Dialect::Postgres => QUEUES_SKIP_LOCKED,
                })?
                .query_map(
                    named_params! {
                        ":h": self.host, ":s": after.0, ":n": after.1, ":c": after.2, ":limit": self.chunk(),
                    },
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?
                .collect::<Result<_, _>>()?;
            if queues.is_empty() {
                break;
            }
            for (served, since, conversation) in queues {
                if self.done() {
                    break 'first;
                }
                match self.turn(&conversation)? {
                    Turn::Claimed => {
                        self.turned_to(&conversation);
                        again.push_back(conversation.clone());
                    }
                    Turn::Blocked => self.turned_to(&conversation),
                    Turn::Empty => {}
                    Turn::Spent => break 'first,
                }
                after = (served, since, conversation);
            }
        }
        while !self.done() {
            let Some(conversation) = again.pop_front() else { break };
            match self.turn(&conversation)? {
                Turn::Claimed => {
                    self.turned_to(&conversation);
                    again.push_back(conversation);
                }
                Turn::Blocked => self.turned_to(&conversation),
                Turn::Empty => {}
                Turn::Spent => break,
            }
        }
        Ok(())
    }

    fn turned_to(&mut self, conversation: &str) {
        self.tick += 1;
        self.turned.push((conversation.to_string(), self.tick));
    }

    /// Records when each conversation was last turned to, and returns the batch.
    fn finish(self) -> StoreResult<Vec<ClaimedDelivery>> {
        let mut stmt = self
            .conn
            .prepare_cached("UPDATE conversation_queues SET served = :t WHERE host = :h AND conversation = :c")?;
        for (conversation, tick) in &self.turned {
            stmt.execute(named_params! {":t": tick, ":h": self.host, ":c": conversation})?;
        }
        Ok(self.out)
    }

    /// The lowest-`seq` queued delivery of `conversation` on this host after `seq`.
    fn next_queued(&self, conversation: &str, seq: i64) -> StoreResult<Option<Head>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id, message_id, seq, not_before, rerun FROM deliveries
                 WHERE host = :h AND conversation = :c AND state = 'queued' AND seq > :s
                 ORDER BY seq LIMIT 1",
            )?
            .query_row(named_params! {":h": self.host, ":c": conversation, ":s": seq}, Head::from_row)
            .optional()?)
    }

    /// The lowest-`seq` queued redrive of `conversation` on this host (not held back by order).
    fn next_redrive(&self, conversation: &str) -> StoreResult<Option<Head>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT id, message_id, seq, not_before, rerun FROM deliveries
                 WHERE host = :h AND conversation = :c AND state = 'queued' AND rerun = 'redrive'
                 ORDER BY seq LIMIT 1",
            )?
            .query_row(named_params! {":h": self.host, ":c": conversation}, Head::from_row)
            .optional()?)
    }

    /// The retry barrier: whether an earlier delivery of `conversation` on this host, of a
    /// message that may be retried, was handed out and has no outcome of its current run yet
    /// (its retry would come back before this turn). A redrive is no barrier.
    fn retry_pending_before(&self, conversation: &str, seq: i64) -> StoreResult<bool> {
        if !self.retryable_messages {
            return Ok(false);
        }
        Ok(self
            .conn
            .prepare_cached(
                "SELECT EXISTS (
                    SELECT 1 FROM messages m JOIN deliveries d ON d.message_id = m.id AND d.host = :h
                    WHERE m.conversation = :c AND m.seq < :s AND m.max_attempts > 1
                      AND d.state IN ('claimed', 'mirrored', 'delivered')
                      AND (d.rerun IS NULL OR d.rerun <> 'redrive')
                      AND (d.state <> 'delivered' OR NOT EXISTS (
                            SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))",
            )?
            .query_row(named_params! {":h": self.host, ":c": conversation, ":s": seq}, |r| r.get(0))?)
    }

    /// Whether `conversation` has a held delivery on this host before `seq`.
    fn held_before(&self, conversation: &str, seq: i64) -> StoreResult<bool> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM deliveries
                                WHERE host = :h AND conversation = :c AND state = 'held' AND seq < :s)",
            )?
            .query_row(named_params! {":h": self.host, ":c": conversation, ":s": seq}, |r| r.get(0))?)
    }

    /// Whether an earlier message of `conversation` routed to this host is still owed its
    /// fan-out (its delivery does not exist yet).
    fn earlier_not_fanned_out(&self, conversation: &str, seq: i64) -> StoreResult<bool> {
        if !self.obligations_pending {
            return Ok(false);
        }
        // CROSS JOIN keeps the (tiny) pending set as the outer loop.
        Ok(self
            .conn
            .prepare_cached(
                "SELECT EXISTS (
                    SELECT 1 FROM fanout_obligations o CROSS JOIN messages m ON m.id = o.message_id
                    WHERE o.done_at IS NULL AND m.conversation = :c AND m.seq < :s
                      AND EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = o.message_id AND r.host = :h))",
            )?
            .query_row(named_params! {":c": conversation, ":s": seq, ":h": self.host}, |r| r.get(0))?)
    }

    /// Whether this host may receive post `seq` of `conversation` (the registry's re-check).
    /// A conversation that never had a member (most) is looked up once per claim.
    fn authorized(&mut self, conversation: &str, seq: i64) -> StoreResult<bool> {
        let managed = match self.managed.get(conversation) {
            Some(m) => *m,
            None => {
                let m = members::has_membership(self.conn, conversation)?;
                self.managed.insert(conversation.to_string(), m);
                m
            }
        };
        if !managed {
            return Ok(true);
        }
        members::authorized(self.conn, conversation, self.host, seq)
    }

    /// Moves a queued delivery on without handing it out (held by a fence, failed by a fence
    /// or by the re-authorization).
    fn settle(&mut self, id: &str, to: DeliveryState, reason: &str) -> StoreResult<()> {
        self.heads += 1;
        let change =
            Change { delivery_id: id, from: Queued, to, expect_holder: None, new_holder: None, reason: Some(reason) };
        transition::apply(self.conn, change, &Actor::hub(), self.now_ms)
    }

    /// One turn of `conversation`: hand out its next delivery if the order rule, the fences
    /// and the registry allow it.
    fn turn(&mut self, conversation: &str) -> StoreResult<Turn> {
        match fences::strongest(self.fences, conversation, self.host) {
            Some(f) if f.kind == FenceKind::Pause => return Ok(Turn::Blocked),
            Some(f) => {
                // Every queued delivery the fence covers is parked or failed, in seq order.
                let (to, reason) = match f.kind {
                    FenceKind::Hold => (Held, format!("held by {}", f.describe())),
                    _ => (Failed, format!("blocked by {}", f.describe())),
                };
                let mut after = i64::MIN;
                while let Some(head) = self.next_queued(conversation, after)? {
                    if self.heads >= CLAIM_HEADS_MAX {
                        return Ok(Turn::Spent);
                    }
                    self.settle(&head.id, to, &reason)?;
                    after = head.seq;
                }
                return Ok(if to == Held { Turn::Blocked } else { Turn::Empty });
            }
            None => {}
        }
        loop {
            if self.heads >= CLAIM_HEADS_MAX {
                return Ok(Turn::Spent);
            }
            // Queued turns before this one were handed out or failed already in this loop.
            let Some(head) = self.next_queued(conversation, i64::MIN)? else { return Ok(Turn::Empty) };
            // A redrive is handed out whatever came before it; anything else keeps the order,
            // and a retry waits for its not-before time (holding later turns back).
            let waits = !head.redrive
                && (head.not_before.is_some_and(|t| t > self.now_ms)
                    || self.held_before(conversation, head.seq)?
                    || self.earlier_not_fanned_out(conversation, head.seq)?
                    || self.retry_pending_before(conversation, head.seq)?);
            if waits {
                self.heads += 1;
                let Some(redrive) = self.next_redrive(conversation)? else { return Ok(Turn::Blocked) };
                if !self.authorized(conversation, redrive.seq)? {
                    self.settle(&redrive.id, Failed, NOT_A_MEMBER)?;
                    continue;
                }
                self.hand_out(conversation, redrive)?;
                return Ok(Turn::Claimed);
            }
            if !self.authorized(conversation, head.seq)? {
                self.settle(&head.id, Failed, NOT_A_MEMBER)?;
                continue;
            }
            self.hand_out(conversation, head)?;
            return Ok(Turn::Claimed);
        }
    }

    /// queued → claimed for the claiming instance, and into the batch.
    fn hand_out(&mut self, conversation: &str, head: Head) -> StoreResult<()> {
        self.heads += 1;
        let (payload, producer, max_attempts, deadline_ms, stall_ms, traceparent): MessageTerms = self
            .conn
            .prepare_cached(
                "SELECT payload, producer, max_attempts, deadline_ms, stall_ms, traceparent FROM messages WHERE id = ?1",
            )?
            .query_row([&head.message_id], |r| {
                Ok((
                    json_column(r, 0, "messages", &head.message_id)?,
                    r.get(1)?,
                    r.get(2)?,
                    bound(r, 3, &head.message_id)?,
                    bound(r, 4, &head.message_id)?,
                    r.get(5)?,
                ))
            })?;
        let token = new_token();
        let holder = Holder { instance_id: self.holder_instance, claim_token: &token };
        let change = Change {
            delivery_id: &head.id,
            from: Queued,
            to: Claimed,
            expect_holder: None,
            new_holder: Some(holder),
            reason: None,
        };
        transition::apply(self.conn, change, &Actor::node(self.host), self.now_ms)?;
        let (attempt, rerun): (u32, Option<Rerun>) = self
            .conn
            .prepare_cached("SELECT attempt, rerun FROM deliveries WHERE id = ?1")?
            .query_row([&head.id], |r| {
                Ok((r.get(0)?, parse_column_opt(r, 1, "deliveries", &head.id, "rerun", Rerun::parse)?))
            })?;
        self.out.push(ClaimedDelivery {
            delivery_id: head.id,
            message_id: head.message_id,
            conversation: conversation.to_string(),
            seq: head.seq,
            payload,
            claim_token: token,
            state: Claimed,
            producer: Some(producer),
            attempt,
            max_attempts,
            rerun,
            cancel_requested: false,
            deadline_ms,
            stall_ms,
            traceparent,
        });
        Ok(())
    }
}

/// What a claim hands out of its message: the payload, the producer, `max_attempts` and the
/// turn's bounds (`deadline_ms`, `stall_ms`) and its trace context (`traceparent`).
type MessageTerms = (baton_shared::wire::Payload, String, u32, Option<u64>, Option<u64>, Option<String>);

/// A message's `deadline_ms` or `stall_ms` (column `idx`): positive when set (the schema's
/// CHECK), else the row is corrupt.
fn bound(r: &Row<'_>, idx: usize, message_id: &str) -> rusqlite::Result<Option<u64>> {
    match r.get::<_, Option<i64>>(idx)? {
        None => Ok(None),
        Some(ms) => u64::try_from(ms).map(Some).map_err(|_| {
            crate::store::corrupt(r, idx, "messages", message_id, "bound in milliseconds", &ms.to_string())
        }),
    }
}

/// The reason a delivery fails with when its host is not a member for the message's `seq`.
pub const NOT_A_MEMBER: &str = "not a member";

/// What `instance_id` holds on `host`: claimed, mirrored, or delivered without an outcome of the
/// current run; each with its run and whether a cancel was asked for. Every holding, unpaged:
/// for the store's own checks; the node reads them through `holdings_page`.
pub fn holdings(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<Vec<ClaimedDelivery>> {
    Ok(holdings_page(conn, host, instance_id, 0, u32::MAX)?.0)
}

/// One page of `holdings`: at most `limit` deliveries whose queue position (`deliveries.n`) is
/// after `after_n`, oldest first, and the position the next page starts after while more may
/// follow. The cursor is a position in the queue order, which never changes for a delivery, so
/// a holding that stays held is on exactly one page however the others move meanwhile.
pub fn holdings_page(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    after_n: i64,
    limit: u32,
) -> StoreResult<(Vec<ClaimedDelivery>, Option<i64>)> {
    let mut rows: Vec<(i64, ClaimedDelivery)> = conn
        .prepare_cached(
            "SELECT d.id, d.message_id, d.conversation, d.seq, m.payload, d.claim_token, d.state, m.producer,
                    d.attempt, m.max_attempts, d.rerun, d.cancel_requested_at IS NOT NULL, d.n, m.deadline_ms,
                    m.stall_ms, m.traceparent
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.instance_id = :i AND d.host = :h AND d.n > :after
               AND (d.state IN ('claimed', 'mirrored')
                    OR (d.state = 'delivered' AND NOT EXISTS (
                        SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))
             ORDER BY d.n LIMIT :lim",
        )?
        .query_map(
            named_params! {":i": instance_id, ":h": host, ":after": after_n, ":lim": i64::from(limit).saturating_add(1)},
            |r| {
                let delivery_id: String = r.get(0)?;
                let message_id: String = r.get(1)?;
                let n: i64 = r.get(12)?;
                let (deadline_ms, stall_ms) = (bound(r, 13, &message_id)?, bound(r, 14, &message_id)?);
                Ok((
                    n,
                    ClaimedDelivery {
                        payload: json_column(r, 4, "messages", &message_id)?,
                        state: state_column(r, 6, "deliveries", &delivery_id)?,
                        message_id,
                        conversation: r.get(2)?,
                        seq: r.get(3)?,
                        claim_token: r.get(5)?,
                        producer: Some(r.get(7)?),
                        attempt: r.get(8)?,
                        max_attempts: r.get(9)?,
                        rerun: parse_column_opt(r, 10, "deliveries", &delivery_id, "rerun", Rerun::parse)?,
                        cancel_requested: r.get(11)?,
                        deadline_ms,
                        stall_ms,
                        traceparent: r.get(15)?,
                        delivery_id,
                    },
                ))
            },
        )?
        .collect::<Result<_, _>>()?;
    // One row past the page says whether another page follows, without a count.
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = if more { rows.last().map(|(n, _)| *n) } else { None };
    Ok((rows.into_iter().map(|(_, d)| d).collect(), next))
}

/// A delivery's host, state and holder, for the holder checks.
struct HeldRow {
    host: String,
    state: DeliveryState,
    instance_id: Option<String>,
    claim_token: Option<String>,
}

fn load(conn: &dyn Db, delivery_id: &str, host: &str) -> StoreResult<HeldRow> {
    let row = conn
        .prepare_cached("SELECT host, state, instance_id, claim_token FROM deliveries WHERE id = ?1")?
        .query_row([delivery_id], |r| {
            Ok(HeldRow {
                host: r.get(0)?,
                state: state_column(r, 1, "deliveries", delivery_id)?,
                instance_id: r.get(2)?,
                claim_token: r.get(3)?,
            })
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {delivery_id}")))?;
    if row.host != host {
        return Err(StoreError::NotYours(format!("delivery {delivery_id} is not for host {host}")));
    }
    Ok(row)
}

fn check_holder(row: &HeldRow, delivery_id: &str, holder: Holder<'_>) -> StoreResult<()> {
    if row.instance_id.as_deref() == Some(holder.instance_id) && row.claim_token.as_deref() == Some(holder.claim_token)
    {
        return Ok(());
    }
    Err(StoreError::StaleClaim(format!(
        "delivery {delivery_id} is {} and not held by instance {} with that claim token",
        row.state, holder.instance_id
    )))
}

/// The holder recorded its local copy: claimed → mirrored. Repeating it changes nothing.
pub fn mirrored(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let row = load(conn, delivery_id, host)?;
    check_holder(&row, delivery_id, holder)?;
    holder_step(conn, host, delivery_id, holder, row.state, Claimed, Mirrored, &[Mirrored, Delivered], now_ms)
}

/// The holder acked the durable handoff: mirrored → delivered. Repeating it changes nothing.
pub fn ack(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let row = load(conn, delivery_id, host)?;
    check_holder(&row, delivery_id, holder)?;
    holder_step(conn, host, delivery_id, holder, row.state, Mirrored, Delivered, &[Delivered], now_ms)
}

/// The holder's whole handoff in one step: claimed → mirrored → delivered, each transition
/// guarded and recorded as `mirrored` and `ack` record it; from `mirrored` only the ack.
/// Repeating it changes nothing. The answer is the ack's; `changed` when either step changed.
pub fn handoff(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    // First `mirrored` itself: its refusal is the answer, word for word.
    let m = mirrored(conn, host, delivery_id, holder, now_ms)?;
    let a = holder_step(conn, host, delivery_id, holder, m.state, Mirrored, Delivered, &[Delivered], now_ms)?;
    Ok(TransitionResponse { changed: m.changed || a.changed, ..a })
}

/// Records `session` as the one whose ack made the current run of `delivery_id` delivered.
pub fn record_acked_session(conn: &dyn Db, delivery_id: &str, session: u64) -> StoreResult<()> {
    conn.prepare_cached("UPDATE deliveries SET acked_session = ?2 WHERE id = ?1")?
        .execute(rusqlite::params![delivery_id, session as i64])?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn holder_step(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    state: DeliveryState,
    from: DeliveryState,
    to: DeliveryState,
    already: &[DeliveryState],
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    if already.contains(&state) {
        return Ok(TransitionResponse { delivery_id: delivery_id.into(), state, changed: false });
    }
    if state != from {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {delivery_id} is {state}; it must be {from} to become {to}"
        )));
    }
    let change = Change { delivery_id, from, to, expect_holder: Some(holder), new_holder: None, reason: None };
    transition::apply(conn, change, &Actor::node(host), now_ms)?;
    Ok(TransitionResponse { delivery_id: delivery_id.into(), state: to, changed: true })
}

/// The holder refuses the delivery: claimed or mirrored → failed, with its reason.
pub fn reject(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    reason: &str,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let row = load(conn, delivery_id, host)?;
    if row.state == Failed {
        // A repeated reject by the same instance is a no-op success.
        let last: Option<(String, Option<String>)> = conn
            .prepare_cached(
                "SELECT actor_kind, instance_id FROM delivery_events WHERE delivery_id = ?1 ORDER BY id DESC LIMIT 1",
            )?
            .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((kind, Some(inst))) = last
            && kind == "node"
            && inst == holder.instance_id
        {
            return Ok(TransitionResponse { delivery_id: delivery_id.into(), state: Failed, changed: false });
        }
    }
    check_holder(&row, delivery_id, holder)?;
    if !matches!(row.state, Claimed | Mirrored) {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {delivery_id} is {}; only claimed or mirrored deliveries can be rejected",
            row.state
        )));
    }
    let why = format!("rejected by node: {reason}");
    let change = Change {
        delivery_id,
        from: row.state,
        to: Failed,
        expect_holder: Some(holder),
        new_holder: None,
        reason: Some(&why),
    };
    transition::apply(conn, change, &Actor::node(host), now_ms)?;
    Ok(TransitionResponse { delivery_id: delivery_id.into(), state: Failed, changed: true })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::fan_out;
    use crate::store::lifecycle::accept::testing::{accept_one, accept_only};
    use crate::store::lifecycle::operator::{Selector, release};
    use crate::store::registry::fences::{FenceScope, NewFence, lift as fence_lift};
    use crate::store::testing;
    use FenceKind::*;

    fn fence_set(
        conn: &dyn Db,
        kind: FenceKind,
        scope: FenceScope,
        target: Option<&str>,
        reason: &str,
        now_ms: i64,
    ) -> StoreResult<i64> {
        fences::set(conn, NewFence { kind, scope, target, operator: "op", reason }, now_ms)
    }

    /// The (conversation, seq) of each claimed delivery, in batch order.
    fn turns(got: &[ClaimedDelivery]) -> Vec<(&str, i64)> {
        got.iter().map(|d| (d.conversation.as_str(), d.seq)).collect()
    }

    fn delivery_of(conn: &dyn Db, message_id: &str, host: &str) -> String {
        conn.query_row("SELECT id FROM deliveries WHERE message_id = ?1 AND host = ?2", [message_id, host], |r| {
            r.get(0)
        })
        .unwrap()
    }

    /// Accept and fan-out are separate writer jobs: a later message can be fanned out (and its
    /// delivery be claimable) before an earlier one is. The claim waits for the earlier one.
    #[test]
    fn a_later_turn_waits_for_an_earlier_one_still_owed_its_fan_out() {
        let db = testing::db();
        let c = &db.conn;
        let m1 = accept_only(c, "c", "k1", &["host-a", "host-b"]);
        let m2 = accept_only(c, "c", "k2", &["host-a"]);
        fan_out(c, &m2, 1).unwrap();
        // An earlier message routed only elsewhere does not hold host-a back.
        let other = accept_only(c, "d", "k3", &["host-b"]);
        let later = accept_only(c, "d", "k4", &["host-a"]);
        fan_out(c, &later, 1).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 2).unwrap()), [("d", 2)]);
        assert!(claim(c, "host-a", "i", 10, 2).unwrap().is_empty(), "c #2 waits for c #1's fan-out");
        fan_out(c, &m1, 3).unwrap();
        fan_out(c, &other, 3).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 4).unwrap()), [("c", 1), ("c", 2)], "both, in seq order");
        assert_eq!(turns(&claim(c, "host-b", "j", 10, 4).unwrap()), [("c", 1), ("d", 1)]);
    }

    /// Deliveries created out of seq order (fan-out of #3 before #2) are handed out by seq.
    #[test]
    fn turns_are_handed_out_by_seq_not_by_creation() {
        let db = testing::db();
        let c = &db.conn;
        let ids: Vec<String> = (1..=3).map(|i| accept_only(c, "c", &format!("k{i}"), &["host-a"])).collect();
        for i in [0, 2, 1] {
            fan_out(c, &ids[i], 1).unwrap();
        }
        assert_eq!(turns(&claim(c, "host-a", "i", 2, 2).unwrap()), [("c", 1), ("c", 2)]);
        assert_eq!(turns(&claim(c, "host-a", "i", 2, 2).unwrap()), [("c", 3)]);
    }

    /// A hold parks a conversation's queued turns; while an earlier one is held, a later one
    /// (accepted after the hold was lifted) is not handed out; after the release both go, in order.
    #[test]
    fn a_held_earlier_turn_keeps_later_ones_back() {
        let db = testing::db();
        let c = &db.conn;
        let hold = fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("c"), "look", 1).unwrap();
        let m1 = accept_one(c, "c", "k1", &["host-a"]);
        accept_one(c, "x", "k0", &["host-a"]);
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 2).unwrap()), [("x", 1)]);
        assert_eq!(state_of_msg(c, &m1).0, "held");
        fence_lift(c, hold, "op", "done", 3).unwrap();
        accept_one(c, "c", "k2", &["host-a"]);
        assert!(claim(c, "host-a", "i", 10, 4).unwrap().is_empty(), "c #2 waits behind the held c #1");
        release(c, Selector::Conversation("c"), "op", "ok", 5).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 6).unwrap()), [("c", 1), ("c", 2)]);
    }

    /// A pause of the conversation keeps every turn back, and the lift lets them go in order.
    #[test]
    fn a_paused_conversation_hands_out_nothing_until_the_lift() {
        let db = testing::db();
        let c = &db.conn;
        let pause = fence_set(c, FenceKind::Pause, FenceScope::Conversation, Some("c"), "r", 1).unwrap();
        for i in 1..=3 {
            accept_one(c, "c", &format!("k{i}"), &["host-a"]);
        }
        assert!(claim(c, "host-a", "i", 10, 2).unwrap().is_empty());
        fence_lift(c, pause, "op", "r", 3).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 4).unwrap()), [("c", 1), ("c", 2), ("c", 3)]);
    }

    /// Releasing a later held turn does not let it pass an earlier one that is still held.
    #[test]
    fn releasing_a_later_held_turn_does_not_jump_an_earlier_held_one() {
        let db = testing::db();
        let c = &db.conn;
        let hold = fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("c"), "r", 1).unwrap();
        let ms: Vec<String> = (1..=3).map(|i| accept_one(c, "c", &format!("k{i}"), &["host-a"])).collect();
        assert!(claim(c, "host-a", "i", 10, 2).unwrap().is_empty());
        for m in &ms {
            assert_eq!(state_of_msg(c, m).0, "held", "the hold parks every queued turn");
        }
        fence_lift(c, hold, "op", "r", 3).unwrap();
        let d2 = delivery_of(c, &ms[1], "host-a");
        release(c, Selector::Delivery(&d2), "op", "r", 4).unwrap();
        assert!(claim(c, "host-a", "i", 10, 5).unwrap().is_empty(), "c #2 must not pass the held c #1");
        let d1 = delivery_of(c, &ms[0], "host-a");
        release(c, Selector::Delivery(&d1), "op", "r", 6).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 7).unwrap()), [("c", 1), ("c", 2)], "c #3 is still held");
    }

    /// 5,000 queued turns in A and 20 in B on one host: B's turns all go out while A still has
    /// almost all of its backlog, and each conversation's turns go out in seq order.
    #[test]
    fn a_deep_conversation_does_not_starve_a_light_one() {
        let db = testing::db();
        let c = &db.conn;
        c.execute_batch("BEGIN").unwrap();
        for i in 0..5_000 {
            accept_one(c, "deep", &format!("a{i}"), &["host-a"]);
        }
        for i in 0..20 {
            accept_one(c, "light", &format!("b{i}"), &["host-a"]);
        }
        c.execute_batch("COMMIT").unwrap();
        let mut seen: Vec<(String, i64)> = Vec::new();
        while seen.iter().filter(|(conv, _)| conv == "light").count() < 20 {
            let got = claim(c, "host-a", "i", 16, 2).unwrap();
            assert!(!got.is_empty());
            seen.extend(got.iter().map(|d| (d.conversation.clone(), d.seq)));
        }
        let deep = seen.iter().filter(|(conv, _)| conv == "deep").count();
        assert!(deep <= 32, "light finished after {deep} deep turns were handed out");
        for conv in ["deep", "light"] {
            let seqs: Vec<i64> = seen.iter().filter(|(c, _)| c == conv).map(|(_, s)| *s).collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{conv} in order: {seqs:?}");
        }
    }

    /// Claims of one take turns: the least recently served conversation goes first.
    #[test]
    fn single_claims_alternate_between_conversations() {
        let db = testing::db();
        let c = &db.conn;
        for i in 0..3 {
            accept_one(c, "a", &format!("a{i}"), &["host-a"]);
        }
        for i in 0..2 {
            accept_one(c, "b", &format!("b{i}"), &["host-a"]);
        }
        let mut order = Vec::new();
        for _ in 0..6 {
            order.extend(claim(c, "host-a", "i", 1, 2).unwrap().into_iter().map(|d| (d.conversation, d.seq)));
        }
        let order: Vec<(&str, i64)> = order.iter().map(|(c, s)| (c.as_str(), *s)).collect();
        assert_eq!(order, [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]);
    }

    /// A conversation that gains work after being idle is served before those that kept busy;
    /// among conversations not yet served, the one waiting longest goes first.
    #[test]
    fn a_conversation_back_from_idle_goes_first() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "b", "b0", &["host-a"]);
        for i in 0..4 {
            accept_one(c, "a", &format!("a{i}"), &["host-a"]);
        }
        // Neither served yet: the one waiting longest (b) first.
        assert_eq!(turns(&claim(c, "host-a", "i", 3, 2).unwrap()), [("b", 1), ("a", 1), ("a", 2)]);
        accept_one(c, "b", "b1", &["host-a"]);
        assert_eq!(turns(&claim(c, "host-a", "i", 1, 3).unwrap()), [("b", 2)]);
    }

    /// The claim carries the producer that wrote the turn.
    #[test]
    fn a_claim_names_the_producer() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let got = claim(&db.conn, "host-a", "i", 10, 2).unwrap();
        assert_eq!(got[0].producer.as_deref(), Some("prod"));
        assert_eq!(holdings(&db.conn, "host-a", "i").unwrap()[0].producer.as_deref(), Some("prod"));
    }

    /// Re-authorization at release: a delivery whose host holds no membership interval for its
    /// seq is failed with `not a member`, never handed out. The registry and routing cannot
    /// disagree through the store's own functions (routing is decided from the registry in the
    /// accept's transaction), so this fixture writes a registry that does, as a faulty or older
    /// writer could have.
    #[test]
    fn a_host_not_a_member_at_the_seq_gets_not_a_member() {
        let db = testing::db();
        let c = &db.conn;
        let m1 = accept_one(c, "c", "k1", &["host-a"]);
        let m2 = accept_one(c, "c", "k2", &["host-a"]);
        c.execute(
            "INSERT INTO memberships (conversation, host, join_seq, joined_at, joined_by, join_reason)
             VALUES ('c', 'host-b', 0, 1, 'op', 'fixture'), ('c', 'host-a', 1, 1, 'op', 'fixture')",
            [],
        )
        .unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 2).unwrap()), [("c", 2)], "seq 2 is in host-a's interval");
        assert_eq!(state_of_msg(c, &m1), ("failed".to_string(), Some(NOT_A_MEMBER.to_string())));
        assert_eq!(state_of_msg(c, &m2).0, "claimed");
        let last: (String, String) = c
            .query_row(
                "SELECT actor_kind, to_state FROM delivery_events WHERE delivery_id = ?1 ORDER BY id DESC LIMIT 1",
                [delivery_of(c, &m1, "host-a")],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(last, ("hub".to_string(), "failed".to_string()));
    }

    /// A store written before the queue bookkeeping existed gets it filled by the migration,
    /// and its backlog is claimed in seq order.
    #[test]
    fn an_older_store_gets_its_queue_counts_on_upgrade() {
        use baton_shared::sqlite::{OpenOptions, Synchronous};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        {
            let opts = OpenOptions { synchronous: Synchronous::Normal, ..Default::default() };
            let old = baton_shared::sqlite::open(&path, &crate::store::MIGRATIONS[..1], opts).unwrap();
            old.execute_batch(
                "INSERT INTO hosts (name, enrolled_at) VALUES ('host-a', 1);
                 INSERT INTO host_backlog (host, waiting) VALUES ('host-a', 2);
                 INSERT INTO conversations (name, last_seq) VALUES ('c', 3);
                 INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at)
                 VALUES ('m1', 'c', 1, 'p', 'k1', 'h', '{}', 1), ('m2', 'c', 2, 'p', 'k2', 'h', '{}', 1),
                        ('m3', 'c', 3, 'p', 'k3', 'h', '{}', 1);
                 INSERT INTO message_recipients (message_id, host) VALUES ('m1', 'host-a'), ('m2', 'host-a'), ('m3', 'host-a');
                 INSERT INTO fanout_obligations (message_id, created_at, done_at) VALUES ('m1', 1, 1), ('m2', 1, 1), ('m3', 1, 1);
                 INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
                 VALUES ('d3', 'm3', 'host-a', 'c', 3, 'queued', 1, 1), ('d2', 'm2', 'host-a', 'c', 2, 'queued', 1, 1),
                        ('d1', 'm1', 'host-a', 'c', 1, 'failed', 1, 1);",
            )
            .unwrap();
        }
        let c = crate::store::open_write(&path, Synchronous::Normal).unwrap();
        let queued: i64 = c
            .query_row("SELECT queued FROM conversation_queues WHERE host = 'host-a' AND conversation = 'c'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(queued, 2);
        assert_eq!(turns(&claim(&c, "host-a", "i", 10, 2).unwrap()), [("c", 2), ("c", 3)]);
    }

    /// The per-(host, conversation) queue counts stay equal to the queued deliveries through
    /// every kind of change.
    #[test]
    fn queue_counts_follow_every_transition() {
        let db = testing::db();
        let c = &db.conn;
        let hold = fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("h"), "r", 1).unwrap();
        for i in 0..4 {
            accept_one(c, "h", &format!("h{i}"), &["host-a", "host-b"]);
            accept_one(c, "q", &format!("q{i}"), &["host-a"]);
        }
        claim(c, "host-a", "i", 3, 2).unwrap();
        fence_lift(c, hold, "op", "r", 3).unwrap();
        release(c, Selector::Conversation("h"), "op", "r", 4).unwrap();
        crate::store::lifecycle::operator::retire(c, "host-b", "op", "r", 5).unwrap();
        let mismatched: i64 = c
            .query_row(
                "SELECT count(*) FROM (
                    SELECT host, conversation, count(*) AS n FROM deliveries WHERE state = 'queued' GROUP BY host, conversation
                 ) d FULL JOIN (SELECT host, conversation, queued AS n FROM conversation_queues WHERE queued > 0) q
                   USING (host, conversation)
                 WHERE d.n IS DISTINCT FROM q.n",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(mismatched, 0);
        let total: i64 = c.query_row("SELECT sum(queued) FROM conversation_queues", [], |r| r.get(0)).unwrap();
        // host-a: the 4 of h parked and released, 1 of q left after 3 claims (the hold kept h
        // out of the claim); host-b's 4 of h failed at retire.
        assert_eq!(total, 5);
    }

    #[test]
    fn a_revoked_certificate_is_handed_nothing() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        let role = baton_shared::ids::Role::Node;
        crate::store::registry::hosts::record_certificate(&db.conn, "aa01", role, "host-a", i64::MAX, 1).unwrap();
        let who = Claimant { host: "host-a", serial: Some("aa01"), instance_id: "i", rebind: RebindLimit::default() };
        crate::store::registry::hosts::revoke(&db.conn, "aa01", "op", "lost", 2).unwrap();
        assert!(matches!(claim_as(&db.conn, who, 10, 3), Err(StoreError::CertificateRevoked(_))));
        let unknown = Claimant { serial: Some("bb02"), ..who };
        assert!(matches!(claim_as(&db.conn, unknown, 10, 3), Err(StoreError::CertificateRevoked(_))));
        let state: String = db.conn.query_row("SELECT state FROM deliveries", [], |r| r.get(0)).unwrap();
        assert_eq!(state, "queued", "nothing was handed out or failed");
    }

    fn state_of_msg(conn: &dyn Db, msg: &str) -> (String, Option<String>) {
        conn.query_row("SELECT state, reason FROM deliveries WHERE message_id = ?1", [msg], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    }

    /// One case: a fence on some scope, a message in conversation `conv` to `host-a`, and the
    /// state the claim leaves it in.
    fn check(kind: FenceKind, scope: FenceScope, target: Option<&str>, conv: &str, expected: &str) {
        let db = testing::db();
        let msg = accept_one(&db.conn, conv, "k", &["host-a"]);
        let id = fence_set(&db.conn, kind, scope, target, "because", 1).unwrap();
        let got = claim(&db.conn, "host-a", "inst", 10, 2).unwrap();
        let (state, reason) = state_of_msg(&db.conn, &msg);
        assert_eq!(state, expected, "{kind:?} {scope:?} {target:?} on {conv}");
        assert_eq!(got.len(), usize::from(expected == "claimed"));
        if expected == "held" || expected == "failed" {
            let reason = reason.unwrap();
            assert!(reason.contains(&format!("fence {id}")) && reason.contains("because"), "{reason}");
        }
    }

    #[test]
    fn fences_by_kind_and_scope() {
        use FenceKind::*;
        use FenceScope::*;
        for (kind, covered) in [(Pause, "queued"), (Hold, "held"), (Block, "failed")] {
            check(kind, Conversation, Some("c1"), "c1", covered);
            check(kind, Conversation, Some("c2"), "c1", "claimed");
            check(kind, Host, Some("host-a"), "c1", covered);
            check(kind, Host, Some("host-b"), "c1", "claimed");
            check(kind, All, None, "c1", covered);
        }
    }

    #[test]
    fn paused_conversation_does_not_block_others_and_order_is_oldest_first() {
        let db = testing::db();
        let a1 = accept_one(&db.conn, "a", "k1", &["host-a"]);
        let _b1 = accept_one(&db.conn, "b", "k2", &["host-a"]);
        let a2 = accept_one(&db.conn, "a", "k3", &["host-a"]);
        fence_set(&db.conn, FenceKind::Pause, FenceScope::Conversation, Some("b"), "r", 1).unwrap();
        let got = claim(&db.conn, "host-a", "inst", 10, 2).unwrap();
        let ids: Vec<&str> = got.iter().map(|d| d.message_id.as_str()).collect();
        assert_eq!(ids, vec![a1.as_str(), a2.as_str()]);
        assert!(got.iter().all(|d| d.claim_token.len() == 32));
    }

    #[test]
    fn batch_is_bounded_and_other_hosts_get_nothing() {
        let db = testing::db();
        for i in 0..5 {
            accept_one(&db.conn, "c", &format!("k{i}"), &["host-a"]);
        }
        assert!(claim(&db.conn, "host-b", "inst-b", 10, 1).unwrap().is_empty());
        assert_eq!(claim(&db.conn, "host-a", "inst", 2, 1).unwrap().len(), 2);
        assert_eq!(claim(&db.conn, "host-a", "inst", 10, 1).unwrap().len(), 3);
        assert!(claim(&db.conn, "host-a", "inst", 10, 1).unwrap().is_empty());
    }

    #[test]
    fn one_active_instance_per_host() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        let got = claim(&db.conn, "host-a", "first", 10, 1).unwrap();
        assert_eq!(got.len(), 1);
        // A clone with the same certificate is refused while the first holds work.
        assert!(matches!(claim(&db.conn, "host-a", "clone", 10, 1), Err(StoreError::InstanceConflict(_))));
        assert!(holdings(&db.conn, "host-a", "clone").unwrap().is_empty());
        let d = &got[0];
        let clone_holder = Holder { instance_id: "clone", claim_token: &d.claim_token };
        assert!(matches!(
            mirrored(&db.conn, "host-a", &d.delivery_id, clone_holder, 2),
            Err(StoreError::StaleClaim(_))
        ));
        // Once the first instance holds nothing, a new instance may take over.
        let h = Holder { instance_id: "first", claim_token: &d.claim_token };
        reject(&db.conn, "host-a", &d.delivery_id, h, "no", 3).unwrap();
        assert!(claim(&db.conn, "host-a", "clone", 10, 4).unwrap().is_empty());
        assert!(claim(&db.conn, "host-a", "other", 10, 5).is_ok());
    }

    /// Instance ids are scoped per host: host-b presenting host-a's instance id neither blocks
    /// host-a from re-binding nor lets a requeue of that id act on host-a's work.
    #[test]
    fn instance_ids_are_scoped_per_host() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        accept_one(&db.conn, "c2", "k2", &["host-b"]);
        assert_eq!(claim(&db.conn, "host-b", "shared-id", 10, 1).unwrap().len(), 1);
        assert!(claim(&db.conn, "host-a", "shared-id", 10, 2).unwrap().len() == 1);
        // host-a's instance holds work, so its own new instance is refused; host-b's holding
        // under the same id counts for host-b only.
        assert_eq!(holding_count(&db.conn, "host-a", "shared-id").unwrap(), 1);
        assert_eq!(holding_count(&db.conn, "host-b", "shared-id").unwrap(), 1);
        // A requeue of an id two hosts use acts on neither.
        let e =
            crate::store::lifecycle::operator::requeue_instance(&db.conn, "shared-id", "op", "gone", 3).unwrap_err();
        assert!(matches!(&e, StoreError::Invalid(t) if t.contains("host-a") && t.contains("host-b")), "{e:?}");
        let swept =
            crate::store::lifecycle::operator::requeue_host_instance(&db.conn, "host-b", "shared-id", "op", "gone", 4)
                .unwrap();
        assert_eq!(swept.requeued.len(), 1);
        assert_eq!(holding_count(&db.conn, "host-a", "shared-id").unwrap(), 1, "host-a's claim is untouched");
        let bound: Option<String> =
            db.conn.query_row("SELECT instance_id FROM hosts WHERE name = 'host-a'", [], |r| r.get(0)).unwrap();
        assert_eq!(bound.as_deref(), Some("shared-id"), "host-a stays bound");
    }

    /// Re-presenting the bound instance records nothing; each change is one operator event, and
    /// a host changing its instance more than INSTANCE_REBINDS_PER_WINDOW_MAX times within the
    /// window is refused until the window moves on.
    #[test]
    fn binding_changes_are_recorded_once_and_bounded() {
        let db = testing::db();
        let events = || -> i64 {
            db.conn
                .query_row("SELECT count(*) FROM operator_events WHERE action = 'bind_instance'", [], |r| r.get(0))
                .unwrap()
        };
        for now in 1..20 {
            claim(&db.conn, "host-a", "same", 10, now).unwrap();
        }
        assert_eq!(events(), 1, "one binding, however many claims");
        for i in 1..INSTANCE_REBINDS_PER_WINDOW_MAX {
            claim(&db.conn, "host-a", &format!("i-{i}"), 10, 100 + i).unwrap();
        }
        assert_eq!(events(), INSTANCE_REBINDS_PER_WINDOW_MAX);
        let e = claim(&db.conn, "host-a", "one-more", 10, 200).unwrap_err();
        assert!(matches!(&e, StoreError::OverCapacity(t) if t.contains("limits.instance_rebinds_max")), "{e:?}");
        assert_eq!(events(), INSTANCE_REBINDS_PER_WINDOW_MAX, "a refused rebind records nothing");
        // The bound instance keeps working, and other hosts are not limited by host-a.
        claim(&db.conn, "host-a", &format!("i-{}", INSTANCE_REBINDS_PER_WINDOW_MAX - 1), 10, 201).unwrap();
        claim(&db.conn, "host-b", "fresh", 10, 202).unwrap();
        let later = 200 + INSTANCE_REBIND_WINDOW.as_millis() as i64;
        claim(&db.conn, "host-a", "one-more", 10, later).unwrap();
    }

    #[test]
    fn holder_steps_repeat_as_no_ops() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        let d = claim(&db.conn, "host-a", "i", 10, 1).unwrap().remove(0);
        let h = Holder { instance_id: "i", claim_token: &d.claim_token };
        assert!(matches!(ack(&db.conn, "host-a", &d.delivery_id, h, 2), Err(StoreError::InvalidTransition(_))));
        assert!(mirrored(&db.conn, "host-a", &d.delivery_id, h, 2).unwrap().changed);
        assert!(!mirrored(&db.conn, "host-a", &d.delivery_id, h, 3).unwrap().changed);
        assert!(ack(&db.conn, "host-a", &d.delivery_id, h, 4).unwrap().changed);
        assert!(!ack(&db.conn, "host-a", &d.delivery_id, h, 5).unwrap().changed);
        assert!(matches!(reject(&db.conn, "host-a", &d.delivery_id, h, "x", 6), Err(StoreError::InvalidTransition(_))));
        assert!(matches!(mirrored(&db.conn, "host-b", &d.delivery_id, h, 6), Err(StoreError::NotYours(_))));
        assert_eq!(holdings(&db.conn, "host-a", "i").unwrap().len(), 1, "delivered without outcome is still held");
    }

    /// Regression: a covering conversation pause was applied before the precedence rule (the
    /// claim's SQL dropped paused conversations, and a pause on everything or on the host ended
    /// the claim early), so a hold or block under a pause never applied. Block > hold > pause now
    /// holds whatever the scopes.
    #[test]
    fn fence_precedence_holds_under_a_pause() {
        use FenceKind::*;
        use FenceScope::*;
        type Case<'a> = (&'a [(FenceKind, FenceScope, Option<&'a str>)], &'a str, &'a str);
        let cases: [Case<'_>; 6] = [
            (&[(Pause, Conversation, Some("c1")), (Hold, Conversation, Some("c1"))], "c1", "held"),
            (&[(Pause, Conversation, Some("c1")), (Block, Host, Some("host-a"))], "c1", "failed"),
            (&[(Pause, Conversation, Some("c1")), (Hold, All, None)], "c1", "held"),
            (&[(Pause, All, None), (Block, Conversation, Some("c1"))], "c1", "failed"),
            (&[(Pause, Host, Some("host-a")), (Hold, Conversation, Some("c1"))], "c1", "held"),
            (&[(Pause, All, None), (Block, Conversation, Some("c1"))], "c2", "queued"),
        ];
        for (set, conv, expected) in cases {
            let db = testing::db();
            let msg = accept_one(&db.conn, conv, "k", &["host-a"]);
            for (kind, scope, target) in set {
                fence_set(&db.conn, *kind, *scope, *target, "r", 1).unwrap();
            }
            assert!(claim(&db.conn, "host-a", "inst", 10, 2).unwrap().is_empty());
            assert_eq!(state_of_msg(&db.conn, &msg).0, expected, "{conv} under {set:?}");
        }
    }

    #[test]
    fn lift_takes_effect_on_next_claim() {
        let db = testing::db();
        let m1 = accept_one(&db.conn, "c1", "k1", &["host-a"]);
        let m2 = accept_one(&db.conn, "c2", "k2", &["host-a"]);
        let pause = fence_set(&db.conn, Pause, FenceScope::All, None, "r", 1).unwrap();
        let _hold = fence_set(&db.conn, Hold, FenceScope::Conversation, Some("c1"), "r", 1).unwrap();
        assert!(claim(&db.conn, "host-a", "inst", 10, 2).unwrap().is_empty());
        assert_eq!(
            (state_of_msg(&db.conn, &m1).0.as_str(), state_of_msg(&db.conn, &m2).0.as_str()),
            ("held", "queued")
        );
        fence_lift(&db.conn, pause, "op", "r", 3).unwrap();
        let got = claim(&db.conn, "host-a", "inst", 10, 4).unwrap();
        assert_eq!(got.iter().map(|d| d.message_id.as_str()).collect::<Vec<_>>(), vec![m2.as_str()]);
    }

    /// A stored payload that is not JSON is an error naming the message, never a `null` payload
    /// handed to a node; nothing is claimed.
    #[test]
    fn a_corrupt_payload_is_an_error_naming_the_message() {
        let db = testing::db();
        let msg = accept_one(&db.conn, "c", "k", &["host-a"]);
        db.conn.execute("UPDATE messages SET payload = '{not json' WHERE id = ?1", [&msg]).unwrap();
        let e = crate::store::in_write_txn(&db.conn, |c| claim(c, "host-a", "inst", 10, 2)).unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt(t) if t.contains(&msg) && t.contains("payload")), "{e:?}");
        assert_eq!(state_of_msg(&db.conn, &msg).0, "queued");
    }

    /// Holdings come in pages in queue order; following the cursor yields each holding once,
    /// also when one in the middle settles between two pages.
    #[test]
    fn holdings_come_in_pages_that_the_cursor_walks_once_each() {
        let db = testing::db();
        let c = &db.conn;
        for i in 0..5 {
            crate::store::lifecycle::accept::testing::accept_one(c, &format!("c{i}"), &format!("k{i}"), &["host-a"]);
        }
        let got = claim(c, "host-a", "i", 5, 2).unwrap();
        assert_eq!(got.len(), 5);
        let (first, next) = holdings_page(c, "host-a", "i", 0, 2).unwrap();
        assert_eq!(
            first.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
            [&got[0].delivery_id, &got[1].delivery_id]
        );
        let next = next.expect("more follow");
        // The third one leaves the holdings (its node rejects it) before the next page is read.
        let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &got[2].claim_token };
        reject(c, "host-a", &got[2].delivery_id, h, "no", 3).unwrap();
        let (second, next) = holdings_page(c, "host-a", "i", next, 2).unwrap();
        assert_eq!(
            second.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
            [&got[3].delivery_id, &got[4].delivery_id]
        );
        assert_eq!(next, None, "the last page says so");
        let (exact, next) = holdings_page(c, "host-a", "i", 0, 4).unwrap();
        assert_eq!((exact.len(), next), (4, None), "four holdings, a page of four: no next page");
        assert_eq!(holdings(c, "host-a", "i").unwrap().len(), 4);
    }
}
