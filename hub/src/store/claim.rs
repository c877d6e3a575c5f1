//! Claims (with fences evaluated in the claim's own transaction), holdings, and the holder's
//! mirrored / ack / reject (SPEC §2, §4, §5).
//!
//! Invariant: a host has at most one bound node instance. A claim from another instance is
//! refused (`InstanceConflict`) while the bound one still holds anything; once it holds
//! nothing, the new instance takes the binding (recorded as an operator-visible event).

use super::fences::{self, ClaimScan, Fence, FenceKind};
use super::transition::{self, Change, Holder};
use super::{Actor, StoreError, StoreResult, json_column, new_token, state_column};
use baton_shared::crash_point;
use baton_shared::states::DeliveryState::{self, *};
use baton_shared::wire::{ClaimedDelivery, TransitionResponse};
use rusqlite::{Connection, OptionalExtension, named_params};

/// Most rows read per step while scanning the queue in a claim.
const CLAIM_SCAN_CHUNK: i64 = 256;

/// Whether the host row exists and is not retired; fails its queued work when it is retired.
fn host_may_claim(conn: &Connection, host: &str, now_ms: i64) -> StoreResult<bool> {
    let retired: Option<Option<i64>> = conn
        .prepare_cached("SELECT retired_at FROM hosts WHERE name = ?1")?
        .query_row([host], |r| r.get(0))
        .optional()?;
    match retired {
        None => Err(StoreError::NotYours(format!("host {host} is not enrolled"))),
        Some(None) => Ok(true),
        Some(Some(_)) => {
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
            Ok(false)
        }
    }
}

/// How many deliveries `instance_id` holds: claimed, mirrored, or delivered with no attempt.
pub fn holding_count(conn: &Connection, instance_id: &str) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM deliveries d WHERE d.instance_id = ?1
               AND (d.state IN ('claimed', 'mirrored')
                    OR (d.state = 'delivered' AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id)))",
        )?
        .query_row([instance_id], |r| r.get(0))?)
}

/// Binds `instance_id` to `host`, or refuses when another instance still holds work.
fn bind_instance(conn: &Connection, host: &str, instance_id: &str, now_ms: i64) -> StoreResult<()> {
    let bound: Option<String> =
        conn.prepare_cached("SELECT instance_id FROM hosts WHERE name = ?1")?.query_row([host], |r| r.get(0))?;
    if bound.as_deref() == Some(instance_id) {
        return Ok(());
    }
    if let Some(old) = &bound {
        let held = holding_count(conn, old)?;
        if held > 0 {
            return Err(StoreError::InstanceConflict(format!(
                "instance {old} of host {host} still holds {held} deliveries; only one instance of a host may be \
                 active (restart it with its own data directory, or requeue its claims with \
                 `baton-hub requeue --instance {old}` if it is gone for good)"
            )));
        }
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
pub fn claim(
    conn: &Connection,
    host: &str,
    instance_id: &str,
    max: u32,
    now_ms: i64,
) -> StoreResult<Vec<ClaimedDelivery>> {
    claim_as(conn, Claimant { host, serial: None, instance_id }, max, now_ms)
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
}

/// The claim transaction: up to `max` queued deliveries for the claimant's host, oldest first,
/// with fences applied on the way (pause skips, hold parks, block fails). Authorization is
/// re-checked here, inside the transaction that would hand work out: the certificate must not
/// be revoked and the host not retired, so a long-poll that began before a revocation or a
/// retirement hands out nothing after it.
pub fn claim_as(conn: &Connection, who: Claimant<'_>, max: u32, now_ms: i64) -> StoreResult<Vec<ClaimedDelivery>> {
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
    if !host_may_claim(conn, host, now_ms)? {
        return Ok(Vec::new());
    }
    bind_instance(conn, host, instance_id, now_ms)?;
    let fences = fences::active(conn)?;
    crash_point("hub.claim.after_fence_eval");
    // The rows the precedence rule pauses are not read at all; every other row is decided below
    // by the same rule (`fences::strongest`), so a hold or block under a pause still applies.
    let (only, skip) = match fences::claim_scan(&fences, host) {
        ClaimScan::Nothing => return Ok(Vec::new()),
        ClaimScan::Only(c) => (Some(conversation_list(&c)?), conversation_list(&[])?),
        ClaimScan::Except(c) => (None, conversation_list(&c)?),
    };
    if max == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut after = 0i64;
    // Read a little more than asked (held and blocked rows do not count), never the whole queue.
    let chunk = (i64::from(max) * 2 + 8).min(CLAIM_SCAN_CHUNK);
    let node = Actor::node(host);
    let hub = Actor::hub();
    'scan: loop {
        let rows: Vec<(i64, String, String, String, i64, serde_json::Value)> = conn
            .prepare_cached(
                "SELECT d.n, d.id, d.message_id, d.conversation, d.seq, m.payload
                 FROM deliveries d JOIN messages m ON m.id = d.message_id
                 WHERE d.host = :host AND d.state = 'queued' AND d.n > :after
                   AND (:only IS NULL OR d.conversation IN (SELECT value FROM json_each(:only)))
                   AND d.conversation NOT IN (SELECT value FROM json_each(:skip))
                 ORDER BY d.n LIMIT :chunk",
            )?
            .query_map(
                named_params! {":host": host, ":after": after, ":chunk": chunk, ":only": only, ":skip": skip},
                |r| {
                    let message_id: String = r.get(2)?;
                    let payload = json_column(r, 5, "messages", &message_id)?;
                    Ok((r.get(0)?, r.get(1)?, message_id, r.get(3)?, r.get(4)?, payload))
                },
            )?
            .collect::<Result<_, _>>()?;
        if rows.is_empty() {
            break;
        }
        for (n, id, message_id, conversation, seq, payload) in rows {
            after = n;
            let fence = fences::strongest(&fences, &conversation, host);
            match fence.map(|f| f.kind) {
                Some(FenceKind::Block) | Some(FenceKind::Hold) => {
                    let f = fence.map(Fence::describe).unwrap_or_default();
                    let to = if fence.map(|f| f.kind) == Some(FenceKind::Block) { Failed } else { Held };
                    let reason = format!("{} by {f}", if to == Failed { "blocked" } else { "held" });
                    let change = Change {
                        delivery_id: &id,
                        from: Queued,
                        to,
                        expect_holder: None,
                        new_holder: None,
                        reason: Some(&reason),
                    };
                    transition::apply(conn, change, &hub, now_ms)?;
                }
                // Never read (see `claim_scan`); were it read, staying queued is the rule's answer.
                Some(FenceKind::Pause) => {}
                None => {
                    let token = new_token();
                    let holder = Holder { instance_id, claim_token: &token };
                    let change = Change {
                        delivery_id: &id,
                        from: Queued,
                        to: Claimed,
                        expect_holder: None,
                        new_holder: Some(holder),
                        reason: None,
                    };
                    transition::apply(conn, change, &node, now_ms)?;
                    out.push(ClaimedDelivery {
                        delivery_id: id,
                        message_id,
                        conversation,
                        seq,
                        payload,
                        claim_token: token,
                        state: Claimed,
                    });
                    if out.len() >= max as usize {
                        break 'scan;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A list of conversation names as the JSON array the claim's `json_each` reads.
fn conversation_list(names: &[String]) -> StoreResult<String> {
    serde_json::to_string(names).map_err(|e| StoreError::Internal(format!("encoding conversation names: {e}")))
}

/// What `instance_id` holds on `host`: claimed, mirrored, or delivered without an outcome.
pub fn holdings(conn: &Connection, host: &str, instance_id: &str) -> StoreResult<Vec<ClaimedDelivery>> {
    let rows = conn
        .prepare_cached(
            "SELECT d.id, d.message_id, d.conversation, d.seq, m.payload, d.claim_token, d.state
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.instance_id = :i AND d.host = :h
               AND (d.state IN ('claimed', 'mirrored')
                    OR (d.state = 'delivered' AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id)))
             ORDER BY d.n",
        )?
        .query_map(named_params! {":i": instance_id, ":h": host}, |r| {
            let delivery_id: String = r.get(0)?;
            let message_id: String = r.get(1)?;
            Ok(ClaimedDelivery {
                payload: json_column(r, 4, "messages", &message_id)?,
                state: state_column(r, 6, "deliveries", &delivery_id)?,
                delivery_id,
                message_id,
                conversation: r.get(2)?,
                seq: r.get(3)?,
                claim_token: r.get(5)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// A delivery's host, state and holder, for the holder checks.
struct HeldRow {
    host: String,
    state: DeliveryState,
    instance_id: Option<String>,
    claim_token: Option<String>,
}

fn load(conn: &Connection, delivery_id: &str, host: &str) -> StoreResult<HeldRow> {
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
    conn: &Connection,
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
    conn: &Connection,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let row = load(conn, delivery_id, host)?;
    check_holder(&row, delivery_id, holder)?;
    holder_step(conn, host, delivery_id, holder, row.state, Mirrored, Delivered, &[Delivered], now_ms)
}

#[allow(clippy::too_many_arguments)]
fn holder_step(
    conn: &Connection,
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
    conn: &Connection,
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
    use crate::store::accept::testing::accept_one;
    use crate::store::fences::{FenceScope, NewFence, lift as fence_lift};
    use crate::store::testing;
    use FenceKind::*;

    #[test]
    fn a_revoked_certificate_is_handed_nothing() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        let role = baton_shared::ids::Role::Node;
        crate::store::hosts::record_certificate(&db.conn, "aa01", role, "host-a", i64::MAX, 1).unwrap();
        let who = Claimant { host: "host-a", serial: Some("aa01"), instance_id: "i" };
        crate::store::hosts::revoke(&db.conn, "aa01", "op", "lost", 2).unwrap();
        assert!(matches!(claim_as(&db.conn, who, 10, 3), Err(StoreError::CertificateRevoked(_))));
        let unknown = Claimant { serial: Some("bb02"), ..who };
        assert!(matches!(claim_as(&db.conn, unknown, 10, 3), Err(StoreError::CertificateRevoked(_))));
        let state: String = db.conn.query_row("SELECT state FROM deliveries", [], |r| r.get(0)).unwrap();
        assert_eq!(state, "queued", "nothing was handed out or failed");
    }

    fn fence_set(
        conn: &Connection,
        kind: FenceKind,
        scope: FenceScope,
        target: Option<&str>,
        reason: &str,
        now_ms: i64,
    ) -> StoreResult<i64> {
        fences::set(conn, NewFence { kind, scope, target, operator: "op", reason }, now_ms)
    }

    fn state_of_msg(conn: &Connection, msg: &str) -> (String, Option<String>) {
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
        use FenceScope::*;
        for (kind, covered) in [(Pause, "queued"), (Hold, "held"), (Block, "failed")] {
            check(kind, Conversation, Some("c1"), "c1", covered);
            check(kind, Conversation, Some("c2"), "c1", "claimed");
            check(kind, Host, Some("host-a"), "c1", covered);
            check(kind, Host, Some("host-b"), "c1", "claimed");
            check(kind, All, None, "c1", covered);
        }
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

    #[test]
    fn paused_conversation_does_not_block_others_and_order_is_oldest_first() {
        let db = testing::db();
        let a1 = accept_one(&db.conn, "a", "k1", &["host-a"]);
        let _b1 = accept_one(&db.conn, "b", "k2", &["host-a"]);
        let a2 = accept_one(&db.conn, "a", "k3", &["host-a"]);
        fence_set(&db.conn, Pause, FenceScope::Conversation, Some("b"), "r", 1).unwrap();
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
}
