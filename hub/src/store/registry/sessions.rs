//! Node sessions: each `baton-node` process start registers one, a fencing epoch per host.
//!
//! Invariant: only the host's newest session may act. Every node request that names its session
//! (the `baton-session` header) is checked against `node_sessions` inside the transaction that
//! acts on it, so a request from a superseded session (a copy of the data directory, or a process
//! that outlived its restart) changes nothing. A request without the header is accepted only for
//! a host that has never registered a session (a node that predates sessions, a raw client); once
//! a host has registered one, a request without the header is refused (400 naming the header), so
//! leaving it out is no way around this fence.
//!
//! Invariant (start lease): a session's `start_lease_until` (the hub's clock) is when its right
//! to start, on its own, the turns it acked runs out. It is granted for the session's own
//! `start_lease_ms` at registration and renewed by every accepted `POST /v1/starts` of the
//! session; a superseded session can renew nothing (its requests are refused), and a clean end
//! clears it. `turns::start` does not grant a newer session the start of a run an older session
//! acked (`deliveries.acked_session`) while that older session's lease has not run out.
//!
//! Invariant: a session that begins while the host's previous one has not ended is a takeover:
//! the previous row is ended `superseded`, the new row names it in `took_over`, and an operator
//! event records it.

use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::dialect;
use crate::store::engine::params;
use crate::store::registry::hosts::{self, Standing};
use crate::store::registry::instances::{RebindLimit, bind_instance};
use crate::store::{StoreError, StoreResult};
use std::time::Duration;

/// The node a holder's request comes from: its host and its node session.
#[derive(Debug, Clone)]
pub struct NodeAt {
    /// The host, from the certificate.
    pub host: String,
    /// The request's node session (`None` for a node that predates sessions).
    pub session: Option<u64>,
}

impl Store {
    /// Records the node sessions' last contact: `(host, session, at_ms)`.
    pub async fn record_contacts(&self, contacts: Vec<(String, u64, i64)>) -> StoreResult<()> {
        self.conns.write(move |c| record_contacts(c, &contacts)).await
    }

    // ---- Nodes ----

    /// Registers a fresh node session of `host` for `instance_id`.
    pub async fn open_session(
        &self,
        host: String,
        instance_id: String,
        node_version: Option<String>,
        rebind: RebindLimit,
        start_lease: Duration,
    ) -> StoreResult<Opened> {
        let clock = self.clock.clone();
        let lease_ms = u64::try_from(start_lease.as_millis()).unwrap_or(u64::MAX);
        self.conns
            .write(move |c| open(c, &host, &instance_id, node_version.as_deref(), rebind, lease_ms, clock.now_ms()))
            .await
    }

    /// Ends the node session `session` of `instance_id` cleanly (the request's own session,
    /// `node.session`, checked first).
    pub async fn end_session(&self, node: NodeAt, instance_id: String, session: u64) -> StoreResult<()> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                check(c, &node.host, node.session)?;
                end(c, &node.host, &instance_id, session, clock.now_ms())
            })
            .await
    }
}

/// What registering a session did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The new session number.
    pub session: u64,
    /// The session it replaced without that one having ended cleanly, when there was one.
    pub took_over: Option<u64>,
    /// The start lease granted to the new session, in milliseconds.
    pub start_lease_ms: u64,
}

/// Registers a new session of `host` for `instance_id` (`POST /v1/sessions`). The instance rule
/// of the claim applies: another instance while the bound one holds work is `InstanceConflict`.
pub fn open(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    node_version: Option<&str>,
    rebind: RebindLimit,
    start_lease_ms: u64,
    now_ms: i64,
) -> StoreResult<Opened> {
    match hosts::standing(conn, host)? {
        Standing::NotEnrolled => return Err(StoreError::NotYours(format!("host {host} is not enrolled"))),
        Standing::Retired => return Err(StoreError::NotYours(format!("host {host} is retired"))),
        Standing::Active => {}
    }
    let lease = i64::try_from(start_lease_ms.max(1)).unwrap_or(i64::MAX);
    bind_instance(conn, host, instance_id, rebind, now_ms)?;
    let last: Option<(i64, Option<i64>)> = conn
        .prepare_cached("SELECT session, ended_at FROM node_sessions WHERE host = $1 ORDER BY session DESC LIMIT 1")?
        .query_row([host], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let session = last.map_or(1, |(s, _)| s + 1);
    let took_over = match last {
        Some((previous, None)) => {
            conn.prepare_cached(
                "UPDATE node_sessions SET ended_at = $3, ended_how = 'superseded' WHERE host = $1 AND session = $2",
            )?
            .execute(params![host, previous, now_ms])?;
            crate::store::registry::audit::record_operator_event(
                conn,
                "session_takeover",
                host,
                "hub",
                Some(&format!(
                    "session {session} (instance {instance_id}) took over from session {previous}, which had not ended"
                )),
                now_ms,
            )?;
            Some(previous)
        }
        _ => None,
    };
    conn.prepare_cached(
        "INSERT INTO node_sessions (host, session, instance_id, node_version, started_at, took_over, last_contact_at,
                                    start_lease_ms, start_lease_until)
         VALUES ($1, $2, $3, $4, $5, $6, $5, $7, $8)",
    )?
    .execute(params![
        host,
        session,
        instance_id,
        node_version,
        now_ms,
        took_over,
        lease,
        now_ms.saturating_add(lease)
    ])?;
    Ok(Opened { session: session as u64, took_over: took_over.map(|t| t as u64), start_lease_ms: lease as u64 })
}

/// Ends a session cleanly (`POST /v1/sessions/end`). Repeating it changes nothing; ending a
/// superseded session is refused (`SessionSuperseded`).
pub fn end(conn: &dyn Db, host: &str, instance_id: &str, session: u64, now_ms: i64) -> StoreResult<()> {
    check(conn, host, Some(session))?;
    let row: Option<(String, Option<i64>)> = conn
        .prepare_cached("SELECT instance_id, ended_at FROM node_sessions WHERE host = $1 AND session = $2")?
        .query_row(params![host, session as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((owner, ended_at)) = row else {
        return Err(StoreError::NotFound(format!("host {host} has no session {session}")));
    };
    if owner != instance_id {
        return Err(StoreError::NotYours(format!("session {session} belongs to instance {owner}")));
    }
    if ended_at.is_none() {
        conn.prepare_cached(
            "UPDATE node_sessions SET ended_at = $3, ended_how = 'clean', last_contact_at = $3, start_lease_until = NULL
             WHERE host = $1 AND session = $2",
        )?
        .execute(params![host, session as i64, now_ms])?;
    }
    Ok(())
}

/// Refuses a request whose session is not the host's newest (`SessionSuperseded`). `None` (no
/// header) is accepted only while the host has never registered a session (a node that predates
/// sessions, a raw client); after that it is refused (`Invalid`, 400 naming the header), so a process of a superseded
/// session cannot act by leaving the header out. A session the hub has no record of (a hub
/// restored from an older backup) is refused as superseded, so the node registers anew.
pub fn check(conn: &dyn Db, host: &str, session: Option<u64>) -> StoreResult<()> {
    let newest: Option<i64> = conn
        .prepare_cached("SELECT max(session) FROM node_sessions WHERE host = $1")?
        .query_row([host], |r| r.get(0))?;
    let Some(session) = session else {
        return match newest {
            None => Ok(()),
            Some(n) => Err(StoreError::Invalid(format!(
                "baton-session: required: host {host} has registered node sessions (the newest is {n}), so a \
                 request that acts on its deliveries must name its session"
            ))),
        };
    };
    match newest {
        Some(n) if n == session as i64 => Ok(()),
        Some(n) if n > session as i64 => Err(StoreError::SessionSuperseded(format!(
            "session {session} of host {host} was superseded: session {n} replaced it (another process took over \
             this node instance)"
        ))),
        _ => Err(StoreError::SessionSuperseded(format!(
            "host {host} has no session {session} in the hub's record; register a new session"
        ))),
    }
}

/// Renews the start lease of `session` of `host` for the session's own length from `now_ms`
/// (the caller checked that it is the host's newest session).
pub fn renew_lease(conn: &dyn Db, host: &str, session: u64, now_ms: i64) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE node_sessions SET start_lease_until = $3 + start_lease_ms
         WHERE host = $1 AND session = $2 AND start_lease_ms IS NOT NULL AND ended_at IS NULL",
    )?
    .execute(params![host, session as i64, now_ms])?;
    Ok(())
}

/// Until when (unix ms, the hub's clock) `session` of `host` may still start the turns it acked
/// on its own; `None` when it holds no lease (never granted, or it ended cleanly).
pub fn lease_until(conn: &dyn Db, host: &str, session: u64) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT start_lease_until FROM node_sessions WHERE host = $1 AND session = $2")?
        .query_row(params![host, session as i64], |r| r.get::<_, Option<i64>>(0))
        .optional()?
        .flatten())
}

/// A session's start lease as the hub recorded it (all in the hub's clock, unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Until when the session may still start the turns it acked on its own.
    pub until: i64,
    /// The lease's length, granted at registration.
    pub length_ms: i64,
    /// When the session registered (its first grant).
    pub registered_at: i64,
}

impl Lease {
    /// When the hub last renewed the lease through an accepted `POST /v1/starts` (none when only
    /// the registration granted it).
    pub fn last_renewed(&self) -> Option<i64> {
        Some(self.until.saturating_sub(self.length_ms)).filter(|at| *at > self.registered_at)
    }

    /// Whether the session may have started, on its own, a run whose ack the hub recorded at
    /// `acked_at`: a node starts on its own only a run whose ack it had when it sent a renewal
    /// the hub then recorded, so only a renewal recorded at or after the ack (within a tenth of
    /// the lease, for clocks of several hubs that disagree that much) makes it possible. An ack
    /// time the hub does not know (none) is taken as possible.
    pub fn may_have_started(&self, acked_at: Option<i64>) -> bool {
        let Some(acked_at) = acked_at else { return true };
        self.last_renewed().is_some_and(|r| r.saturating_add(self.length_ms / 10) >= acked_at)
    }
}

/// `session`'s start lease, when it holds one (not when it was never granted one, or it ended
/// cleanly).
pub fn lease(conn: &dyn Db, host: &str, session: u64) -> StoreResult<Option<Lease>> {
    Ok(conn
        .prepare_cached(
            "SELECT start_lease_until, start_lease_ms, started_at FROM node_sessions WHERE host = $1 AND session = $2",
        )?
        .query_row(params![host, session as i64], |r| {
            Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?, r.get::<_, i64>(2)?))
        })
        .optional()?
        .and_then(|(until, length, registered_at)| {
            Some(Lease { until: until?, length_ms: length.unwrap_or(0), registered_at })
        }))
}

/// Writes the last time each session was heard from (`last_contact_at`), from the hub's
/// in-memory record of accepted node requests; a time never moves backwards.
pub fn record_contacts(conn: &dyn Db, contacts: &[(String, u64, i64)]) -> StoreResult<()> {
    let mut stmt = conn.prepare_cached(dialect::SESSION_CONTACT.of(conn))?;
    for (host, session, at) in contacts {
        stmt.execute(params![host, *session as i64, at])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    fn row(conn: &dyn Db, session: i64) -> (Option<i64>, Option<String>, Option<i64>, i64) {
        conn.query_row(
            "SELECT ended_at, ended_how, took_over, last_contact_at FROM node_sessions WHERE host = 'host-a' AND session = $1",
            [session],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
    }

    /// A renewal after the ack (within a tenth of the lease) makes a start on the session's own
    /// possible; the registration's grant alone, or a renewal well before the ack, does not.
    #[test]
    fn only_a_renewal_at_or_after_the_ack_lets_a_session_start_on_its_own() {
        let lease = |renewed: i64| Lease { until: renewed + 1_000, length_ms: 1_000, registered_at: 100 };
        assert!(!lease(100).may_have_started(Some(150)), "granted at registration only");
        assert_eq!(lease(100).last_renewed(), None);
        assert!(lease(500).may_have_started(Some(450)), "renewed after the ack");
        assert!(lease(500).may_have_started(Some(600)), "the ack within a tenth of the lease after it");
        assert!(!lease(500).may_have_started(Some(601)), "the ack after the last renewal");
        assert!(lease(500).may_have_started(None), "an ack time not known is taken as possible");
    }

    #[test]
    fn a_new_session_supersedes_an_open_one_and_a_clean_end_is_no_takeover() {
        let db = testing::db();
        let c = &db.conn;
        assert_eq!(
            open(c, "host-a", "i", Some("1.0"), RebindLimit::default(), 1000, 1).unwrap(),
            Opened { session: 1, took_over: None, start_lease_ms: 1000 }
        );
        assert_eq!(
            open(c, "host-a", "i", None, RebindLimit::default(), 1000, 2).unwrap(),
            Opened { session: 2, took_over: Some(1), start_lease_ms: 1000 }
        );
        assert_eq!(row(c, 1), (Some(2), Some("superseded".into()), None, 1));
        assert_eq!(row(c, 2).2, Some(1));
        let events: i64 = c
            .query_row("SELECT count(*) FROM operator_events WHERE action = 'session_takeover'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(events, 1);
        assert!(matches!(check(c, "host-a", Some(1)), Err(StoreError::SessionSuperseded(_))));
        assert!(matches!(end(c, "host-a", "i", 1, 3), Err(StoreError::SessionSuperseded(_))));
        check(c, "host-a", Some(2)).unwrap();
        assert!(matches!(check(c, "host-a", None), Err(StoreError::Invalid(_))), "no header is no way around");
        check(c, "host-never", None).unwrap();
        assert!(matches!(check(c, "host-a", Some(9)), Err(StoreError::SessionSuperseded(_))));
        end(c, "host-a", "i", 2, 4).unwrap();
        end(c, "host-a", "i", 2, 5).unwrap();
        assert_eq!(row(c, 2).0, Some(4), "a repeated end changes nothing");
        assert_eq!(
            open(c, "host-a", "i", None, RebindLimit::default(), 1000, 6).unwrap(),
            Opened { session: 3, took_over: None, start_lease_ms: 1000 }
        );
        // Sessions are per host.
        assert_eq!(open(c, "host-b", "j", None, RebindLimit::default(), 1000, 7).unwrap().session, 1);
        record_contacts(c, &[("host-a".into(), 3, 9), ("host-a".into(), 3, 8)]).unwrap();
        assert_eq!(row(c, 3).3, 9);
    }

    #[test]
    fn another_instance_is_refused_while_the_bound_one_holds_work() {
        let db = testing::db();
        let c = &db.conn;
        crate::store::lifecycle::accept::testing::accept_one(c, "conv", "k", &["host-a"]);
        open(c, "host-a", "first", None, RebindLimit::default(), 1000, 1).unwrap();
        assert_eq!(crate::store::lifecycle::claim::claim(c, "host-a", "first", 10, 2).unwrap().len(), 1);
        assert!(matches!(
            open(c, "host-a", "copy", None, RebindLimit::default(), 1000, 3),
            Err(StoreError::InstanceConflict(_))
        ));
        assert_eq!(open(c, "host-a", "first", None, RebindLimit::default(), 1000, 4).unwrap().session, 2);
    }
}
