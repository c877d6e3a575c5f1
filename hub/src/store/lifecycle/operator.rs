//! The operator's delivery transitions: releasing the held queue, retiring a host and
//! requeueing what a vanished instance held (cancel, retry and redrive are in `turns`). Each change carries who made it and why.
//! (Hosts and certificates are in `hosts`, fences in `fences`.)

use crate::store::By;
use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::lifecycle::transition::{self, Change};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::fences;
use crate::store::registry::hosts;
use crate::store::registry::hosts::Standing;
use crate::store::registry::members;
use crate::store::{Actor, StoreError, StoreResult, state_column};
use baton_shared::states::DeliveryState::{self, *};

/// What `release` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The deliveries released.
    Released(Vec<String>),
    /// Nothing was released: these active hold or block fences would catch the release again at
    /// the next claim (their descriptions).
    WouldHoldAgain(Vec<String>),
}

/// What a delivery selector names, owned (see `Selector`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// One delivery by id.
    Delivery(String),
    /// Every matching delivery of a conversation.
    Conversation(String),
}

impl Select {
    fn as_selector(&self) -> Selector<'_> {
        match self {
            Select::Delivery(id) => Selector::Delivery(id),
            Select::Conversation(c) => Selector::Conversation(c),
        }
    }
}

/// The active hold or block fences that would catch the selected held deliveries again at the
/// next claim, described; empty when a release would stick.
fn would_hold_again(conn: &dyn Db, sel: Selector<'_>) -> StoreResult<Vec<String>> {
    let active = fences::active(conn)?;
    let mut named: Vec<String> = Vec::new();
    for (conversation, target) in held_targets(conn, sel)? {
        // A pool delivery waits with no host: the fences on its pool, its conversation and
        // everything decide for it, whichever member would claim it (`fences::pool_turn`).
        let strongest = match target {
            HeldFor::Host(host) => fences::strongest(&active, &conversation, &host),
            HeldFor::Pool(pool) => match fences::pool_turn(&active, &conversation, &pool, "") {
                fences::PoolTurn::Fenced(f) => Some(f),
                _ => None,
            },
        };
        if let Some(f) = strongest
            && f.kind != fences::FenceKind::Pause
        {
            let d = f.describe();
            if !named.contains(&d) {
                named.push(d);
            }
        }
    }
    Ok(named)
}

impl Store {
    /// Releases held deliveries (after the fences whose time is up are lifted); unless `force`,
    /// refuses, releasing nothing, when an active hold or block fence would catch them again.
    pub async fn release(&self, sel: Select, by: By, force: bool) -> StoreResult<Release> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let now_ms = clock.now_ms();
                fences::lift_expired(c, now_ms)?;
                if !force {
                    let named = would_hold_again(c, sel.as_selector())?;
                    if !named.is_empty() {
                        return Ok(Release::WouldHoldAgain(named));
                    }
                }
                release(c, sel.as_selector(), &by.operator, &by.reason, now_ms).map(Release::Released)
            })
            .await
    }

    /// What `retire` would do to the host, changing nothing (`NotFound` as `retire`).
    pub async fn retire_plan(&self, host: String) -> StoreResult<RetirePlan> {
        self.conns.read(move |c| retire_plan(c, &host)).await
    }

    /// Retires the host: its pending work swept, every membership ended and every pool left,
    /// in one transaction. Returns what was swept, the conversations and the pools it left.
    pub async fn retire(&self, host: String, by: By) -> StoreResult<(Swept, Vec<String>, Vec<String>)> {
        let clock = self.clock.clone();
        self.conns.write(move |c| retire_everywhere(c, &host, &by.operator, &by.reason, clock.now_ms())).await
    }

    /// Requeues what the instance holds (on `host` only, when given; an unenrolled host is
    /// `Invalid`).
    pub async fn requeue(&self, instance: String, host: Option<String>, by: By) -> StoreResult<Swept> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| match host {
                Some(host) => {
                    if hosts::standing(c, &host)? == Standing::NotEnrolled {
                        return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
                    }
                    requeue_host_instance(c, &host, &instance, &by.operator, &by.reason, clock.now_ms())
                }
                None => requeue_instance(c, &instance, &by.operator, &by.reason, clock.now_ms()),
            })
            .await
    }
}

/// `retire`, then the host leaves every conversation (`members::leave_all`) and every pool
/// (`pools::leave_all`): what was swept, the conversations and the pools it left. Call inside
/// a write transaction.
pub fn retire_everywhere(
    conn: &dyn Db,
    host: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<(Swept, Vec<String>, Vec<String>)> {
    let swept = retire(conn, host, operator, reason, now_ms)?;
    let left = members::leave_all(conn, host, operator, reason, now_ms)?;
    let pools = crate::store::registry::pools::leave_all(conn, host, operator, reason, now_ms)?;
    Ok((swept, left, pools))
}

fn ids_where(conn: &dyn Db, sql: &str, arg: &str) -> StoreResult<Vec<(String, DeliveryState)>> {
    let rows = conn
        .prepare_cached(sql)?
        .query_map([arg], |r| {
            let id: String = r.get(0)?;
            let state = state_column(r, 1, "deliveries", &id)?;
            Ok((id, state))
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Releases held deliveries back to queued: one by id, or all of a conversation. Returns the ids.
/// A delivery awaiting its message's approval is not released (`held approve` decides it): by
/// id it is refused naming the commands, in a conversation it is left held.
pub fn release(
    conn: &dyn Db,
    which: Selector<'_>,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    let rows = match which {
        Selector::Delivery(id) => ids_where(conn, "SELECT id, state FROM deliveries WHERE id = $1", id)?,
        Selector::Conversation(c) => ids_where(
            conn,
            "SELECT d.id, d.state FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.conversation = $1 AND d.state = 'held'
               AND NOT (m.approval = 'required' AND m.approval_decision IS NULL)
             ORDER BY d.n",
            c,
        )?,
    };
    if let Selector::Delivery(id) = which {
        match rows.first() {
            None => return Err(StoreError::NotFound(format!("no delivery {id}"))),
            Some((_, s)) if *s != Held => {
                return Err(StoreError::InvalidTransition(format!("delivery {id} is {s}, not held")));
            }
            _ if crate::store::lifecycle::approval::awaits_approval(conn, id)? => {
                return Err(StoreError::InvalidTransition(format!(
                    "delivery {id} awaits its message's approval: `held approve` or `held reject` it"
                )));
            }
            _ => {}
        }
    }
    let actor = Actor::operator(operator);
    let why = format!("released: {reason}");
    for (id, _) in &rows {
        let change = Change {
            delivery_id: id,
            from: Held,
            to: Queued,
            expect_holder: None,
            new_holder: None,
            reason: Some(&why),
        };
        transition::apply(conn, change, &actor, now_ms)?;
    }
    Ok(rows.into_iter().map(|(id, _)| id).collect())
}

/// The conversation and the host or pool of each held delivery `which` picks: what a release
/// would put back in front of the fences.
pub fn held_targets(conn: &dyn Db, which: Selector<'_>) -> StoreResult<Vec<(String, HeldFor)>> {
    let (sql, arg) = match which {
        Selector::Delivery(id) => {
            ("SELECT DISTINCT conversation, host, pool FROM deliveries WHERE id = $1 AND state = 'held'", id)
        }
        Selector::Conversation(c) => {
            ("SELECT DISTINCT conversation, host, pool FROM deliveries WHERE conversation = $1 AND state = 'held'", c)
        }
    };
    let rows: Vec<(String, Option<String>, Option<String>)> = conn
        .prepare_cached(sql)?
        .query_map([arg], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|(conversation, host, pool)| match (pool, host) {
            (Some(pool), _) => Ok((conversation, HeldFor::Pool(pool))),
            (None, Some(host)) => Ok((conversation, HeldFor::Host(host))),
            (None, None) => Err(StoreError::Corrupt(format!(
                "a held delivery of conversation {conversation} has neither a host nor a pool"
            ))),
        })
        .collect()
}

/// Whom a held delivery waits for: its host, or its pool (no host until a member claims it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldFor {
    /// A host delivery.
    Host(String),
    /// A pool delivery.
    Pool(String),
}

/// Picks deliveries for an operator command.
#[derive(Debug, Clone, Copy)]
pub enum Selector<'a> {
    /// One delivery by id.
    Delivery(&'a str),
    /// Every matching delivery of a conversation.
    Conversation(&'a str),
}

/// Records an `unknown` attempt for the current run of a delivered delivery that has no outcome
/// for it yet, written by the hub for an operator, so a delivery whose node is gone does not
/// stall silently. Returns whether it wrote one (a delivery with its outcome is left alone).
fn unknown_attempt(conn: &dyn Db, delivery_id: &str, why: &str, now_ms: i64) -> StoreResult<bool> {
    let row: Option<(String, String, u32, Option<String>, String, String)> = conn
        .prepare_cached(
            "SELECT d.host, d.instance_id, d.attempt, d.rerun, coalesce(d.rerun_by, 'producer:' || m.producer),
                    d.message_id
             FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE d.id = $1 AND d.state = 'delivered'
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)",
        )?
        .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
        .optional()?;
    let Some((host, instance, attempt, rerun, caused_by, message_id)) = row else { return Ok(false) };
    // The run's outcome: a pool delivery's run leaves flight (a node's report replacing this
    // one later ends nothing again).
    crate::store::lifecycle::pool_flight::ended_delivery(conn, delivery_id, now_ms)?;
    // The first run keeps the report id an earlier version gave it; later runs name theirs.
    let report_id = if attempt == 1 { format!("hub:{delivery_id}") } else { format!("hub:{delivery_id}:{attempt}") };
    conn.prepare_cached(
        "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reason,
                               reported_at, attempt, rerun, caused_by, event_n)
         VALUES ($1, $2, $3, $4, $5, '', 'unknown', $6, $7, $8, $9, $10, $11)",
    )?
    .execute(params![
        crate::store::new_id(),
        delivery_id,
        host,
        instance,
        report_id,
        why,
        now_ms,
        attempt,
        rerun,
        caused_by,
        crate::store::views::feed::draw(conn, 1)?
    ])?;
    // The run's outcome makes the delivery final: its message may be settled now.
    crate::store::lifecycle::settle::message(conn, &message_id, now_ms)?;
    Ok(true)
}

/// What retire or requeue did.
#[derive(Debug, Clone, Default)]
pub struct Swept {
    /// Deliveries moved to failed.
    pub failed: Vec<String>,
    /// Deliveries moved to unknown.
    pub unknown: Vec<String>,
    /// Deliveries moved back to queued.
    pub requeued: Vec<String>,
    /// Delivered deliveries given an `unknown` attempt because no outcome can come.
    pub outcome_unknown: Vec<String>,
}

/// What retiring a host would do, read without changing anything: the counts `retire` would
/// sweep, by the state each delivery is in now, and the conversations it would leave. An
/// operator is shown this before the retirement (SPEC §9); the retirement itself reports
/// what it did, which may differ by what changed in between.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetirePlan {
    /// Queued deliveries, to fail.
    pub queued: i64,
    /// Held deliveries, to fail.
    pub held: i64,
    /// Claimed deliveries, to fail.
    pub claimed: i64,
    /// Mirrored deliveries, to become unknown.
    pub mirrored: i64,
    /// Delivered deliveries whose current run has no outcome, to get an `unknown` attempt.
    pub outcome_unknown: i64,
    /// Pool deliveries it claimed or mirrored (never run), to go back to their pools.
    pub to_pools: i64,
    /// The conversations it is a member of now, which it would leave.
    pub leaves: Vec<String>,
}

impl RetirePlan {
    /// How many deliveries would fail (queued, held and claimed).
    pub fn failing(&self) -> i64 {
        self.queued + self.held + self.claimed
    }
}

/// What `retire` would do to `host` (see `RetirePlan`); `NotFound`, as `retire`, for a host
/// that is not enrolled or already retired.
pub fn retire_plan(conn: &dyn Db, host: &str) -> StoreResult<RetirePlan> {
    let active: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM hosts WHERE name = $1 AND retired_at IS NULL)")?
        .query_row([host], |r| r.get(0))?;
    if !active {
        return Err(StoreError::NotFound(format!("no enrolled, unretired host {host}")));
    }
    let mut plan = RetirePlan::default();
    let counts: Vec<(String, i64)> = conn
        .prepare_cached(
            "SELECT CASE WHEN pool IS NULL THEN state ELSE 'to_pools' END, count(*) FROM deliveries
             WHERE host = $1 AND state IN ('queued', 'held', 'claimed', 'mirrored')
             GROUP BY CASE WHEN pool IS NULL THEN state ELSE 'to_pools' END",
        )?
        .query_map([host], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (state, n) in counts {
        match state.as_str() {
            "queued" => plan.queued = n,
            "held" => plan.held = n,
            "claimed" => plan.claimed = n,
            "to_pools" => plan.to_pools = n,
            _ => plan.mirrored = n,
        }
    }
    plan.outcome_unknown = conn
        .prepare_cached(
            "SELECT count(*) FROM deliveries d WHERE d.host = $1 AND d.state = 'delivered'
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)",
        )?
        .query_row([host], |r| r.get(0))?;
    plan.leaves = crate::store::registry::members::memberships_of(conn, host)?;
    Ok(plan)
}

/// Retires a host: it takes no more work; its waiting and claimed deliveries fail, its mirrored
/// ones become unknown, and delivered ones without an outcome get an `unknown` attempt. A pool
/// delivery it claimed or mirrored (never delivered, so never run) goes back to its pool for
/// the other members instead.
pub fn retire(conn: &dyn Db, host: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<Swept> {
    let n = conn
        .prepare_cached(
            "UPDATE hosts SET retired_at = $2, retired_by = $3, retired_reason = $4, instance_id = NULL
             WHERE name = $1 AND retired_at IS NULL",
        )?
        .execute(params![host, now_ms, operator, reason])?;
    if n != 1 {
        return Err(StoreError::NotFound(format!("no enrolled, unretired host {host}")));
    }
    record_operator_event(conn, "retire", host, operator, Some(reason), now_ms)?;
    let rows = ids_where(
        conn,
        "SELECT id, state FROM deliveries WHERE host = $1 AND state IN ('queued', 'held', 'claimed', 'mirrored', 'delivered') ORDER BY n",
        host,
    )?;
    let pooled: Vec<String> = conn
        .prepare_cached(
            "SELECT id FROM deliveries WHERE host = $1 AND pool IS NOT NULL AND state IN ('claimed', 'mirrored')",
        )?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let actor = Actor::operator(operator);
    let why = format!("host retired by operator {operator}: {reason}");
    let mut swept = Swept::default();
    for (id, state) in rows {
        match state {
            Delivered => {
                if unknown_attempt(conn, &id, &why, now_ms)? {
                    swept.outcome_unknown.push(id);
                }
            }
            Claimed | Mirrored if pooled.contains(&id) => {
                let change = Change {
                    delivery_id: &id,
                    from: state,
                    to: Queued,
                    expect_holder: None,
                    new_holder: None,
                    reason: Some(&why),
                };
                transition::apply(conn, change, &actor, now_ms)?;
                swept.requeued.push(id);
            }
            _ => {
                let to = if state == Mirrored { Unknown } else { Failed };
                let change = Change {
                    delivery_id: &id,
                    from: state,
                    to,
                    expect_holder: None,
                    new_holder: None,
                    reason: Some(&why),
                };
                transition::apply(conn, change, &actor, now_ms)?;
                if to == Unknown { swept.unknown.push(id) } else { swept.failed.push(id) }
            }
        }
    }
    Ok(swept)
}

/// Requeues what a node instance that is gone for good holds (`requeue_host_instance`), on the
/// one host that uses the instance id. Instance ids are scoped per host: when the id is bound or
/// holds work on more than one host, nothing is done (`StoreError::Invalid` naming the hosts),
/// so one host presenting another's instance id cannot make a requeue act on its work.
pub fn requeue_instance(
    conn: &dyn Db,
    instance_id: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Swept> {
    let hosts: Vec<String> = conn
        .prepare_cached(
            "SELECT host FROM deliveries WHERE instance_id = $1 AND state IN ('claimed', 'mirrored', 'delivered')
             UNION SELECT name FROM hosts WHERE instance_id = $1 ORDER BY 1",
        )?
        .query_map([instance_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    match hosts.as_slice() {
        [] => {
            record_operator_event(conn, "requeue_instance", instance_id, operator, Some(reason), now_ms)?;
            Ok(Swept::default())
        }
        [host] => requeue_host_instance(conn, host, instance_id, operator, reason, now_ms),
        many => Err(StoreError::Invalid(format!(
            "instance id {instance_id} is used by hosts {}; instance ids are scoped per host, and a requeue acts \
             on one host's work only (retire or re-provision the host that should not use it first)",
            many.join(", ")
        ))),
    }
}

/// Requeues what `host`'s node instance `instance_id`, gone for good, holds: claimed and
/// mirrored go back to queued (nothing ran: the execution gate), and delivered ones without an
/// outcome get an `unknown` attempt (they may have run). The host is unbound from that instance.
/// Another host's deliveries under the same id are not touched.
pub fn requeue_host_instance(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Swept> {
    let rows: Vec<(String, DeliveryState)> = conn
        .prepare_cached(
            "SELECT id, state FROM deliveries WHERE host = $1 AND instance_id = $2
               AND state IN ('claimed', 'mirrored', 'delivered') ORDER BY n",
        )?
        .query_map([host, instance_id], |r| {
            let id: String = r.get(0)?;
            let state = state_column(r, 1, "deliveries", &id)?;
            Ok((id, state))
        })?
        .collect::<Result<_, _>>()?;
    let actor = Actor::operator(operator);
    let why = format!("requeued by operator {operator}: {reason}");
    let mut swept = Swept::default();
    for (id, state) in rows {
        if state == Delivered {
            if unknown_attempt(conn, &id, &format!("instance {instance_id} gone; {why}"), now_ms)? {
                swept.outcome_unknown.push(id);
            }
        } else {
            let change = Change {
                delivery_id: &id,
                from: state,
                to: Queued,
                expect_holder: None,
                new_holder: None,
                reason: Some(&why),
            };
            transition::apply(conn, change, &actor, now_ms)?;
            swept.requeued.push(id);
        }
    }
    conn.prepare_cached("UPDATE hosts SET instance_id = NULL WHERE name = $1 AND instance_id = $2")?
        .execute([host, instance_id])?;
    record_operator_event(conn, "requeue_instance", instance_id, operator, Some(reason), now_ms)?;
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::transition::Holder;
    use crate::store::{lifecycle::claim, registry::members, testing};

    /// The plan read before a retirement counts exactly what the retirement then sweeps, by
    /// state, and names the conversations it leaves; a host already retired has no plan.
    #[test]
    fn the_retire_plan_counts_what_retire_sweeps() {
        let db = testing::db();
        let c = &*db.conn;
        members::add(c, "team", &["host-a".to_string()], "op", "r", 1).unwrap();
        for (conversation, key) in [("c1", "k1"), ("c2", "k2"), ("c3", "k3"), ("c4", "k4")] {
            accept_one(c, conversation, key, &["host-a"]);
        }
        let got = claim::claim(c, "host-a", "i", 3, 3).unwrap();
        assert_eq!(got.len(), 3);
        let h = Holder { instance_id: "i", claim_token: &got[0].claim_token };
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &got[0].delivery_id, h, 4).unwrap();
        let h = Holder { instance_id: "i", claim_token: &got[1].claim_token };
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &got[1].delivery_id, h, 4).unwrap();
        crate::store::lifecycle::handoff::ack(c, "host-a", &got[1].delivery_id, h, 5).unwrap();

        let plan = retire_plan(c, "host-a").unwrap();
        let expected = RetirePlan {
            queued: 1,
            held: 0,
            claimed: 1,
            mirrored: 1,
            outcome_unknown: 1,
            to_pools: 0,
            leaves: vec!["team".to_string()],
        };
        assert_eq!(plan, expected);
        assert_eq!(plan.failing(), 2);
        let swept = retire(c, "host-a", "op", "r", 6).unwrap();
        let left = members::leave_all(c, "host-a", "op", "r", 6).unwrap();
        assert_eq!(swept.failed.len() as i64, plan.failing());
        assert_eq!(swept.unknown.len() as i64, plan.mirrored);
        assert_eq!(swept.outcome_unknown.len() as i64, plan.outcome_unknown);
        assert_eq!(left, plan.leaves);
        assert!(matches!(retire_plan(c, "host-a"), Err(StoreError::NotFound(_))));
        assert!(matches!(retire_plan(c, "nobody"), Err(StoreError::NotFound(_))));
    }
}
