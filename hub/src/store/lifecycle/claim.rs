//! Claims (SPEC §5): the claim transaction and its door. A claim re-checks the presenting
//! certificate and the host's standing, binds the node instance (`registry::instances`), reads
//! the active fences once, and walks the host's conversation queues (`scan`: order, fairness,
//! each conversation's fence), all in one transaction; the look before it (`worth_claiming`)
//! is a read that spares a write job when nothing is claimable.
//!
//! Invariant (claims at once): on PostgreSQL a transaction of claims only takes the record's
//! write lock in shared mode (`Db::begin_shared`), so claims on several hubs run at the same
//! time, and every other writer still runs alone. What keeps claims apart are row locks, taken
//! in one order: the host's row first (`host_row`: shared while the claimant is the bound
//! instance of an active host, so one instance's claims may overlap; exclusive when the claim
//! may change the binding or fail a retired host's work), then each conversation queue the
//! claim turns to, `FOR UPDATE SKIP LOCKED`: a queue another claim of the host holds is skipped
//! for this claim, so no two claims look at one conversation's turns at once and `seq` order
//! holds; then the queue's deliveries, moved by guarded transitions, sent unread and all
//! checked in one read before the claim commits (`transition::check_handed_out`: one found
//! unmoved fails the claim as a conflict).
//! Claims of different hosts share no row but a message's (settling it when a fence or the
//! registry fails its last delivery); a cycle there is the server's deadlock error, retried by
//! the node like any storage failure.

use crate::store::Store;
use crate::store::engine::{Db, OptionalExtension, dialect, params};
use crate::store::handle::Conns;
use crate::store::lifecycle::scan::Scan;
use crate::store::lifecycle::transition::{self, Change};
use crate::store::lifecycle::turns;
use crate::store::registry::fences::{self, ClaimScan};
use crate::store::registry::hosts::{self, Standing};
use crate::store::registry::instances::{RebindLimit, bind_over};
use crate::store::registry::sessions;
use crate::store::writer::StandingClaim;
use crate::store::{Actor, StoreError, StoreResult};
use baton_shared::clock::SharedClock;
use baton_shared::crash_point;
use baton_shared::states::DeliveryState::*;
use baton_shared::wire::{CancelNotice, ClaimedDelivery};

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
        let next_retry_at_ms = next_due_at(c, &who.host, now, who.affinity_wait_ms())?;
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
    /// `limits.pool_affinity_wait`: how long a pool conversation's last host is preferred.
    pub pool_affinity_wait: std::time::Duration,
}

impl Claimer {
    fn affinity_wait_ms(&self) -> i64 {
        i64::try_from(self.pool_affinity_wait.as_millis()).unwrap_or(i64::MAX)
    }

    fn claimant(&self) -> Claimant<'_> {
        Claimant {
            host: &self.host,
            serial: Some(&self.serial),
            instance_id: &self.instance_id,
            rebind: self.rebind,
            affinity_wait_ms: self.affinity_wait_ms(),
        }
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
                    next_retry_at_ms: next_due_at(c, &who.host, now_ms, who.affinity_wait_ms())?,
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
}

/// The host's row as a claim reads it: its bound instance and when it was retired, or `None`
/// when it is not enrolled. On PostgreSQL, where claims of several hubs run at once, the row is
/// locked: shared while `instance_id` is the bound instance of an active host (nothing about the
/// host changes then, and claims of that instance may overlap), exclusively otherwise, since the
/// claim may bind another instance or fail the retired host's queued work (the row is read again
/// under that lock). On SQLite the claim holds the file's write lock and runs alone: one read.
fn host_row(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<Option<(Option<String>, Option<i64>)>> {
    let read = |sql: &str| -> StoreResult<Option<(Option<String>, Option<i64>)>> {
        Ok(conn.prepare_cached(sql)?.query_row([host], |r| Ok((r.get(0)?, r.get(1)?))).optional()?)
    };
    match read(dialect::CLAIM_HOST_ROW.of(conn))? {
        Some((bound, None)) if bound.as_deref() == Some(instance_id) => Ok(Some((bound, None))),
        None => Ok(None),
        Some(row) => match dialect::CLAIM_HOST_ROW_TO_CHANGE.of(conn) {
            Some(sql) => read(sql),
            None => Ok(Some(row)),
        },
    }
}

/// A retired host's claim: its queued work fails (`host retired`).
fn fail_retired_work(conn: &dyn Db, host: &str, now_ms: i64) -> StoreResult<()> {
    let ids: Vec<String> = conn
        .prepare_cached("SELECT id FROM deliveries WHERE host = $1 AND state = 'queued'")?
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

/// `claim_as` without a certificate to re-check (in-process callers: tests, benchmarks), with
/// the default pool affinity wait.
pub fn claim(conn: &dyn Db, host: &str, instance_id: &str, max: u32, now_ms: i64) -> StoreResult<Vec<ClaimedDelivery>> {
    let affinity_wait_ms = i64::try_from(baton_shared::limits::POOL_AFFINITY_WAIT.as_millis()).unwrap_or(i64::MAX);
    let who = Claimant { host, serial: None, instance_id, rebind: RebindLimit::default(), affinity_wait_ms };
    claim_as(conn, who, max, now_ms)
}

/// When something may become claimable for `host` without any other change: its next retry's
/// not-before time, a retry's in one of its pools, or the end of another member's affinity
/// wait on a pool conversation with queued work (`None`: nothing is waiting for a time).
pub fn next_due_at(conn: &dyn Db, host: &str, now_ms: i64, affinity_wait_ms: i64) -> StoreResult<Option<i64>> {
    let own = turns::next_retry_at(conn, host, now_ms)?;
    let pool_retry: Option<i64> = conn
        .prepare_cached(
            "SELECT min(d.not_before) FROM pool_members pm
             JOIN deliveries d ON d.pool = pm.pool AND d.state = 'queued' AND d.not_before IS NOT NULL
             WHERE pm.host = $1 AND d.not_before > $2",
        )?
        .query_row(params![host, now_ms], |r| r.get(0))?;
    let affinity_end: Option<i64> = conn
        .prepare_cached(
            "SELECT min(q.last_settled_at) FROM pool_members pm JOIN pool_queues q ON q.pool = pm.pool
             WHERE pm.host = $1 AND q.queued > 0 AND q.bound_host IS NULL AND q.last_host <> $1
               AND q.last_settled_at > $2
               AND EXISTS (SELECT 1 FROM pool_members m WHERE m.pool = q.pool AND m.host = q.last_host)",
        )?
        .query_row(params![host, now_ms.saturating_sub(affinity_wait_ms)], |r| r.get::<_, Option<i64>>(0))?
        .map(|settled| settled.saturating_add(affinity_wait_ms));
    Ok([own, pool_retry, affinity_end].into_iter().flatten().min())
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
    /// `limits.pool_affinity_wait` in milliseconds.
    pub affinity_wait_ms: i64,
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
            .prepare_cached("SELECT revoked_at IS NOT NULL FROM certificates WHERE serial = $1")?
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
    let mut scan = Scan::new(conn, host, instance_id, &fences, max as usize, now_ms, who.affinity_wait_ms)?;
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
            .prepare_cached("SELECT revoked_at IS NOT NULL FROM certificates WHERE serial = $1")?
            .query_row([serial], |r| r.get(0))
            .optional()?;
        if revoked != Some(false) {
            return Err(StoreError::CertificateRevoked(format!("certificate {serial} was revoked")));
        }
    }
    let bound: Option<(Option<String>, Option<i64>)> = conn
        .prepare_cached("SELECT instance_id, retired_at FROM hosts WHERE name = $1")?
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
            "SELECT EXISTS (SELECT 1 FROM deliveries WHERE host = $1 AND state = 'queued'
                              AND (not_before IS NULL OR not_before <= $2 OR rerun = 'redrive'))",
        )?
        .query_row(params![who.host, now_ms], |r| r.get(0))?;
    // A pool conversation with queued work this host may take now (the claim decides whether
    // its next turn may go: a retry's time, the order rule, the fences).
    let pool_due = || -> StoreResult<bool> {
        Ok(conn
            .prepare_cached(
                "SELECT EXISTS (
                    SELECT 1 FROM pool_members pm JOIN pool_queues q ON q.pool = pm.pool
                    WHERE pm.host = $1 AND q.queued > 0 AND (q.bound_host IS NULL OR q.bound_host = $1)
                      AND (q.bound_host IS NOT NULL OR q.last_host IS NULL OR q.last_host = $1
                           OR q.last_settled_at <= $2
                           OR NOT EXISTS (SELECT 1 FROM pool_members m WHERE m.pool = q.pool AND m.host = q.last_host)))",
            )?
            .query_row(params![who.host, now_ms.saturating_sub(who.affinity_wait_ms)], |r| r.get(0))?)
    };
    if !due && !pool_due()? {
        return Ok(false);
    }
    Ok(fences::claim_scan(&fences::active(conn)?, who.host) != ClaimScan::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::handoff::{holdings, mirrored, reject};
    use crate::store::lifecycle::scan::testing::{delivery_of, fence_set, state_of_msg};
    use crate::store::lifecycle::scan::{self, NOT_A_MEMBER};
    use crate::store::lifecycle::transition::Holder;
    use crate::store::registry::fences::{FenceKind, FenceScope, lift as fence_lift};
    use crate::store::registry::instances::holding_count;
    use crate::store::testing;
    use FenceKind::*;
    use baton_shared::limits::{INSTANCE_REBIND_WINDOW, INSTANCE_REBINDS_PER_WINDOW_MAX};

    #[test]
    fn a_revoked_certificate_is_handed_nothing() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        let role = baton_shared::ids::Role::Node;
        crate::store::registry::hosts::record_certificate(&db.conn, "aa01", role, "host-a", i64::MAX, 1).unwrap();
        let who = Claimant {
            host: "host-a",
            serial: Some("aa01"),
            instance_id: "i",
            rebind: RebindLimit::default(),
            affinity_wait_ms: 2_000,
        };
        crate::store::registry::hosts::revoke(&db.conn, "aa01", "op", "lost", 2).unwrap();
        assert!(matches!(claim_as(&db.conn, who, 10, 3), Err(StoreError::CertificateRevoked(_))));
        let unknown = Claimant { serial: Some("bb02"), ..who };
        assert!(matches!(claim_as(&db.conn, unknown, 10, 3), Err(StoreError::CertificateRevoked(_))));
        let state: String = db.conn.query_row("SELECT state FROM deliveries", [], |r| r.get(0)).unwrap();
        assert_eq!(state, "queued", "nothing was handed out or failed");
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
        assert_eq!(
            scan::testing::turns(&claim(c, "host-a", "i", 10, 2).unwrap()),
            [("c", 2)],
            "seq 2 is in host-a's interval"
        );
        assert_eq!(state_of_msg(c, &m1), ("failed".to_string(), Some(NOT_A_MEMBER.to_string())));
        assert_eq!(state_of_msg(c, &m2).0, "claimed");
        let last: (String, String) = c
            .query_row(
                "SELECT actor_kind, to_state FROM delivery_events WHERE delivery_id = $1 ORDER BY id DESC LIMIT 1",
                [delivery_of(c, &m1, "host-a")],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(last, ("hub".to_string(), "failed".to_string()));
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

    /// A stored payload that is not JSON is an error naming the message, never a `null` payload
    /// handed to a node; nothing is claimed.
    #[test]
    fn a_corrupt_payload_is_an_error_naming_the_message() {
        let db = testing::db();
        let msg = accept_one(&db.conn, "c", "k", &["host-a"]);
        db.conn.execute("UPDATE messages SET payload = '{not json' WHERE id = $1", [&msg]).unwrap();
        let e = crate::store::in_write_txn(&db.conn, |c| claim(c, "host-a", "inst", 10, 2)).unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt(t) if t.contains(&msg) && t.contains("payload")), "{e:?}");
        assert_eq!(state_of_msg(&db.conn, &msg).0, "queued");
    }
}
