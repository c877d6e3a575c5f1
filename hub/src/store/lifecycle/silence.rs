//! `requeue_silent_after`: the hub returns to the queue what a silent node instance holds but
//! has not acked (claimed and mirrored deliveries), recorded as done by `hub`. Off unless
//! configured.
//!
//! Why it is safe: the execution gate. A node runs a delivery only after the hub confirmed its
//! ack (delivered), and an ack names the claim token; once a delivery is requeued, its old
//! holder's ack (and mirrored) is refused, so the old holder drops its copy and never runs it,
//! while the requeued delivery is handed out again. Delivered deliveries are never touched:
//! they may be running on the silent node.

use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::params;
use crate::store::lifecycle::transition::{self, Change, Holder};
use crate::store::{Actor, StoreResult, state_column};
use baton_shared::states::DeliveryState;

impl Store {
    /// Node instances whose open session was last heard from before `cutoff_ms` and that hold
    /// claimed or mirrored deliveries.
    pub async fn silent_holders(&self, cutoff_ms: i64) -> StoreResult<Vec<SilentHolder>> {
        self.conns.read(move |c| silent_holders(c, cutoff_ms)).await
    }

    /// Returns to the queue what the silent instance `who` holds, if it is still silent;
    /// returns the deliveries requeued.
    pub async fn requeue_silent(&self, who: SilentHolder, cutoff_ms: i64, now_ms: i64) -> StoreResult<Vec<String>> {
        self.conns.write(move |c| requeue_silent(c, &who, cutoff_ms, now_ms)).await
    }
}

/// A silent node instance that holds claimed or mirrored deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilentHolder {
    /// The host.
    pub host: String,
    /// The node instance the deliveries are held by.
    pub instance_id: String,
    /// Its newest node session (open).
    pub session: i64,
    /// That session's last contact (unix ms).
    pub last_contact_at_ms: i64,
}

/// Hosts (not retired) whose newest node session is open and was last heard from before
/// `cutoff_ms`, with the instance of that session holding claimed or mirrored deliveries.
pub fn silent_holders(conn: &dyn Db, cutoff_ms: i64) -> StoreResult<Vec<SilentHolder>> {
    Ok(conn
        .prepare_cached(
            "SELECT s.host, s.instance_id, s.session, s.last_contact_at FROM node_sessions s
             JOIN hosts h ON h.name = s.host
             WHERE h.retired_at IS NULL AND s.ended_at IS NULL AND s.last_contact_at < $1
               AND s.session = (SELECT max(session) FROM node_sessions m WHERE m.host = s.host)
               AND EXISTS (SELECT 1 FROM deliveries d WHERE d.host = s.host AND d.instance_id = s.instance_id
                             AND d.state IN ('claimed', 'mirrored'))
             ORDER BY s.host",
        )?
        .query_map(params![cutoff_ms], |r| {
            Ok(SilentHolder {
                host: r.get(0)?,
                instance_id: r.get(1)?,
                session: r.get(2)?,
                last_contact_at_ms: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// Requeues the claimed and mirrored deliveries of `who` (inside the caller's write
/// transaction) when its session is still the host's newest, open and silent since before
/// `cutoff_ms`: a node heard from meanwhile keeps its work. Returns the deliveries requeued.
pub fn requeue_silent(conn: &dyn Db, who: &SilentHolder, cutoff_ms: i64, now_ms: i64) -> StoreResult<Vec<String>> {
    let still = silent_holders(conn, cutoff_ms)?
        .into_iter()
        .any(|s| s.host == who.host && s.instance_id == who.instance_id && s.session == who.session);
    if !still {
        return Ok(Vec::new());
    }
    let rows: Vec<(String, DeliveryState, String)> = conn
        .prepare_cached(
            "SELECT id, state, claim_token FROM deliveries
             WHERE host = $1 AND instance_id = $2 AND state IN ('claimed', 'mirrored') ORDER BY n",
        )?
        .query_map([&who.host, &who.instance_id], |r| {
            let id: String = r.get(0)?;
            let state = state_column(r, 1, "deliveries", &id)?;
            Ok((id, state, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let why = format!(
        "requeued by the hub: node session {} of instance {} silent since {} (requeue_silent_after)",
        who.session, who.instance_id, who.last_contact_at_ms
    );
    let mut requeued = Vec::with_capacity(rows.len());
    for (id, state, token) in rows {
        let holder = Holder { instance_id: &who.instance_id, claim_token: &token };
        let change = Change {
            delivery_id: &id,
            from: state,
            to: DeliveryState::Queued,
            expect_holder: Some(holder),
            new_holder: None,
            reason: Some(&why),
        };
        transition::apply(conn, change, &Actor::hub(), now_ms)?;
        requeued.push(id);
    }
    let note = format!("{}; {} delivery(ies) requeued", why, requeued.len());
    crate::store::registry::audit::record_operator_event(
        conn,
        "requeue_silent",
        &who.host,
        "hub",
        Some(&note),
        now_ms,
    )?;
    Ok(requeued)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::testing;

    #[test]
    fn only_claimed_and_mirrored_of_a_silent_open_session_go_back() {
        let db = testing::db();
        let c = &db.conn;
        for k in ["k1", "k2", "k3"] {
            accept_one(c, "c", k, &["host-a"]);
        }
        crate::store::registry::sessions::open(c, "host-a", "i", Some("test"), Default::default(), 15_000, 10).unwrap();
        let got = crate::store::lifecycle::claim::claim(c, "host-a", "i", 3, 10).unwrap();
        let h = |i: usize| Holder { instance_id: "i", claim_token: &got[i].claim_token };
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &got[1].delivery_id, h(1), 10).unwrap();
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &got[2].delivery_id, h(2), 10).unwrap();
        crate::store::lifecycle::handoff::ack(c, "host-a", &got[2].delivery_id, h(2), 10).unwrap();

        assert!(silent_holders(c, 10).unwrap().is_empty(), "heard from at 10: not silent before 10");
        let silent = silent_holders(c, 11).unwrap();
        assert_eq!(silent.len(), 1);
        let requeued = requeue_silent(c, &silent[0], 11, 20).unwrap();
        assert_eq!(requeued, [got[0].delivery_id.clone(), got[1].delivery_id.clone()]);
        let state = |id: &str| transition::state_of(c, id).unwrap().unwrap();
        assert_eq!(state(&got[0].delivery_id), DeliveryState::Queued);
        assert_eq!(state(&got[2].delivery_id), DeliveryState::Delivered, "delivered is never touched");
        // The old holder's ack is refused: it can never run the requeued copy.
        assert!(crate::store::lifecycle::handoff::mirrored(c, "host-a", &got[0].delivery_id, h(0), 21).is_err());
        assert!(silent_holders(c, 11).unwrap().is_empty(), "nothing claimed or mirrored left");
        let by: String = c
            .query_row(
                "SELECT actor_kind FROM delivery_events WHERE delivery_id = $1 ORDER BY id DESC",
                [&got[0].delivery_id],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(by, "hub");
    }
}
