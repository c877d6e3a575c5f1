//! The fleet as operators see it: every host with its bound instance, its current node session
//! (from `node_sessions`), what it holds in flight, its standing and certificates, its recent
//! events; and the two things `status` flags: hosts gone silent and certificates about to
//! expire. Read-only: every function here runs on a read connection.

use crate::store::Store;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::engine::{Db, DbResult, Row};
use crate::store::{StoreResult, parse_column, parse_column_opt};
use baton_shared::ids::Role;

impl Store {
    /// Every host.
    pub async fn hosts(&self) -> StoreResult<Vec<HostRow>> {
        self.conns.read(hosts).await
    }

    /// One host in detail (`None`: never enrolled).
    pub async fn host(&self, name: String) -> StoreResult<Option<HostDetail>> {
        self.conns.read(move |c| host(c, &name)).await
    }

    /// Hosts whose open node session has been silent longer than `silence_ms` at `now_ms`.
    pub async fn silent_hosts(&self, now_ms: i64, silence_ms: i64) -> StoreResult<Vec<SilentHost>> {
        self.conns.read(move |c| silent_hosts(c, now_ms, silence_ms)).await
    }

    /// Certificates not revoked that expire before `until_unix`.
    pub async fn expiring_certificates(&self, until_unix: i64) -> StoreResult<Vec<CertRow>> {
        self.conns.read(move |c| expiring_certificates(c, until_unix)).await
    }

    /// Every certificate.
    pub async fn certificates(&self) -> StoreResult<Vec<CertRow>> {
        self.conns.read(|c| certificates(c, None)).await
    }
}

/// Most recent events `hosts show` lists, of each kind (operator and delivery events).
pub const HOST_EVENTS_SHOWN_MAX: u32 = 20;

/// How a node session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The node said goodbye (`POST /v1/sessions/end`).
    Clean,
    /// A newer session of the same host took over while this one was open.
    Superseded,
}

impl SessionEnd {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionEnd::Clean => "clean",
            SessionEnd::Superseded => "superseded",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<SessionEnd> {
        [SessionEnd::Clean, SessionEnd::Superseded].into_iter().find(|e| e.as_str() == s)
    }
}

/// One node session: a `baton-node` process's registration with the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// Its number (per host, increasing).
    pub session: i64,
    /// The node instance that registered it.
    pub instance_id: String,
    /// The node's version, as it said.
    pub node_version: Option<String>,
    /// When it began (unix ms).
    pub started_at_ms: i64,
    /// The last request the hub accepted in it (unix ms).
    pub last_contact_at_ms: i64,
    /// When it ended (unix ms), if it did.
    pub ended_at_ms: Option<i64>,
    /// How it ended.
    pub ended_how: Option<SessionEnd>,
    /// The session it took over (one that had not ended when it began).
    pub took_over: Option<i64>,
}

/// Where a host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// Enrolled, not retired, with at least one unrevoked certificate.
    Active,
    /// Every certificate it has is revoked (it cannot connect).
    Revoked,
    /// Retired: it takes no more work.
    Retired,
}

impl HostState {
    /// The name shown and sent in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Active => "active",
            HostState::Revoked => "revoked",
            HostState::Retired => "retired",
        }
    }
}

/// What a host's node holds in flight: claimed, mirrored, and delivered without an outcome of
/// its current run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Claimed, not yet mirrored.
    pub claimed: i64,
    /// Mirrored, not yet acked.
    pub mirrored: i64,
    /// Delivered, its current run's outcome not reported yet (running or waiting on the node).
    pub delivered: i64,
}

/// One host as `hosts list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    /// The host name.
    pub name: String,
    /// Active, revoked or retired.
    pub state: HostState,
    /// When it was enrolled (unix ms).
    pub enrolled_at_ms: i64,
    /// When it was retired (unix ms), by whom and why.
    pub retired: Option<(i64, String, String)>,
    /// The node instance bound to it, and since when (unix ms).
    pub instance: Option<(String, i64)>,
    /// Its newest node session, if a node ever registered one.
    pub session: Option<SessionRow>,
    /// What it holds in flight.
    pub holdings: Holdings,
    /// Deliveries waiting for it (queued or held).
    pub waiting: i64,
    /// Unrevoked certificates.
    pub certificates_active: i64,
    /// The pools it is a member of, by name (filled by `hosts` and `host`; empty otherwise).
    pub pools: Vec<String>,
}

/// A certificate as the record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRow {
    /// Serial, lowercase hex.
    pub serial: String,
    /// Node or producer.
    pub role: Role,
    /// The host or producer name.
    pub name: String,
    /// When it was issued (unix ms).
    pub issued_at_ms: i64,
    /// When it expires (unix seconds).
    pub not_after_unix: i64,
    /// When it was revoked (unix ms), by whom and why.
    pub revoked: Option<(i64, String, String)>,
}

/// One event in a host's recent history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEvent {
    /// When (unix ms).
    pub at_ms: i64,
    /// `operator` (an operator or hub action) or `delivery` (a transition of one of its
    /// deliveries).
    pub kind: &'static str,
    /// What happened: the operator action, or `FROM -> TO`.
    pub action: String,
    /// What it was about: the host, a certificate serial, a delivery id.
    pub subject: String,
    /// Who did it.
    pub actor: String,
    /// Why.
    pub reason: Option<String>,
}

/// One host with its certificates and recent events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDetail {
    /// The host.
    pub host: HostRow,
    /// Every certificate of its name (node role), newest first.
    pub certificates: Vec<CertRow>,
    /// Its recent events, newest first.
    pub events: Vec<HostEvent>,
}

fn session_row(r: &Row<'_>, first: usize, host: &str) -> DbResult<Option<SessionRow>> {
    let Some(session) = r.get::<_, Option<i64>>(first)? else { return Ok(None) };
    let row = format!("{host} session {session}");
    Ok(Some(SessionRow {
        session,
        instance_id: r.get(first + 1)?,
        node_version: r.get(first + 2)?,
        started_at_ms: r.get(first + 3)?,
        last_contact_at_ms: r.get(first + 4)?,
        ended_at_ms: r.get(first + 5)?,
        ended_how: parse_column_opt(r, first + 6, "node_sessions", &row, "ended_how", SessionEnd::parse)?,
        took_over: r.get(first + 7)?,
    }))
}

/// The hosts' columns and their newest session, in the order `host_row` reads them.
const HOST_SELECT: &str = "SELECT h.name, h.enrolled_at, h.retired_at, h.retired_by, h.retired_reason,
        h.instance_id, h.instance_since,
        (SELECT count(*) FROM certificates c WHERE c.role = 'node' AND c.name = h.name AND c.revoked_at IS NULL),
        (SELECT count(*) FROM certificates c WHERE c.role = 'node' AND c.name = h.name),
        coalesce((SELECT waiting FROM host_backlog b WHERE b.host = h.name), 0),
        s.session, s.instance_id, s.node_version, s.started_at, s.last_contact_at, s.ended_at, s.ended_how, s.took_over
    FROM hosts h
    LEFT JOIN node_sessions s ON s.host = h.name
        AND s.session = (SELECT max(session) FROM node_sessions m WHERE m.host = h.name)";

fn host_row(r: &Row<'_>) -> DbResult<HostRow> {
    let name: String = r.get(0)?;
    let retired_at: Option<i64> = r.get(2)?;
    let active_certs: i64 = r.get(7)?;
    let all_certs: i64 = r.get(8)?;
    let state = match (retired_at, active_certs, all_certs) {
        (Some(_), _, _) => HostState::Retired,
        (None, 0, n) if n > 0 => HostState::Revoked,
        _ => HostState::Active,
    };
    let retired = match retired_at {
        Some(at) => Some((
            at,
            r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            r.get::<_, Option<String>>(4)?.unwrap_or_default(),
        )),
        None => None,
    };
    let instance = match r.get::<_, Option<String>>(5)? {
        Some(i) => Some((i, r.get::<_, Option<i64>>(6)?.unwrap_or_default())),
        None => None,
    };
    Ok(HostRow {
        session: session_row(r, 10, &name)?,
        name,
        state,
        enrolled_at_ms: r.get(1)?,
        retired,
        instance,
        holdings: Holdings::default(),
        waiting: r.get(9)?,
        certificates_active: active_certs,
        pools: Vec::new(),
    })
}

/// What `host` holds in flight.
fn holdings(conn: &dyn Db, host: &str) -> StoreResult<Holdings> {
    let mut h = Holdings::default();
    let mut stmt = conn.prepare_cached(
        "SELECT d.state, count(*) FROM deliveries d
         WHERE d.host = $1 AND d.state IN ('claimed', 'mirrored', 'delivered')
           AND (d.state <> 'delivered'
                OR NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))
         GROUP BY d.state",
    )?;
    let rows = stmt.query_map(params![host], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    for row in rows {
        match row? {
            (s, n) if s == "claimed" => h.claimed = n,
            (s, n) if s == "mirrored" => h.mirrored = n,
            (_, n) => h.delivered = n,
        }
    }
    Ok(h)
}

/// Every host, by name.
pub fn hosts(conn: &dyn Db) -> StoreResult<Vec<HostRow>> {
    let mut rows: Vec<HostRow> = conn
        .prepare_cached(&format!("{HOST_SELECT} ORDER BY h.name"))?
        .query_map([], host_row)?
        .collect::<Result<_, _>>()?;
    for row in &mut rows {
        row.holdings = holdings(conn, &row.name)?;
        row.pools = pools_of(conn, &row.name)?;
    }
    Ok(rows)
}

/// One host's row without its holdings (left at zero) or certificates: what `explain` needs
/// of its liveness, in one indexed read. `None` when it was never enrolled.
pub fn host_standing(conn: &dyn Db, name: &str) -> StoreResult<Option<HostRow>> {
    Ok(conn.prepare_cached(&format!("{HOST_SELECT} WHERE h.name = $1"))?.query_row([name], host_row).optional()?)
}

/// One host with its certificates and recent events; `None` when it was never enrolled.
pub fn host(conn: &dyn Db, name: &str) -> StoreResult<Option<HostDetail>> {
    let Some(mut host) = host_standing(conn, name)? else {
        return Ok(None);
    };
    host.holdings = holdings(conn, name)?;
    host.pools = pools_of(conn, name)?;
    let certificates = certificates(conn, Some((Role::Node, name)))?;
    let mut events: Vec<HostEvent> = conn
        .prepare_cached(
            "SELECT at, action, subject, operator, reason FROM operator_events
             WHERE subject = $1 OR subject IN (SELECT serial FROM certificates WHERE role = 'node' AND name = $1)
                OR subject IN (SELECT instance_id FROM node_sessions WHERE host = $1)
             ORDER BY id DESC LIMIT $2",
        )?
        .query_map(params![name, HOST_EVENTS_SHOWN_MAX], |r| host_event(r, "operator"))?
        .collect::<Result<_, _>>()?;
    let transitions: Vec<HostEvent> = conn
        .prepare_cached(
            "SELECT e.at, coalesce(e.from_state, '(new)') || ' -> ' || e.to_state, e.delivery_id,
                    e.actor_kind || ' ' || e.actor, e.reason
             FROM delivery_events e JOIN deliveries d ON d.id = e.delivery_id
             WHERE d.host = $1 ORDER BY e.id DESC LIMIT $2",
        )?
        .query_map(params![name, HOST_EVENTS_SHOWN_MAX], |r| host_event(r, "delivery"))?
        .collect::<Result<_, _>>()?;
    events.extend(transitions);
    events.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
    Ok(Some(HostDetail { host, certificates, events }))
}

/// A row in the events' column order (at, action, subject, actor, reason) as a `HostEvent`.
fn host_event(r: &Row<'_>, kind: &'static str) -> DbResult<HostEvent> {
    Ok(HostEvent { at_ms: r.get(0)?, kind, action: r.get(1)?, subject: r.get(2)?, actor: r.get(3)?, reason: r.get(4)? })
}

fn cert_row(r: &Row<'_>) -> DbResult<CertRow> {
    let serial: String = r.get(0)?;
    let revoked = match r.get::<_, Option<i64>>(5)? {
        Some(at) => Some((
            at,
            r.get::<_, Option<String>>(6)?.unwrap_or_default(),
            r.get::<_, Option<String>>(7)?.unwrap_or_default(),
        )),
        None => None,
    };
    Ok(CertRow {
        role: parse_column(r, 1, "certificates", &serial, "role", Role::parse)?,
        name: r.get(2)?,
        issued_at_ms: r.get(3)?,
        not_after_unix: r.get(4)?,
        revoked,
        serial,
    })
}

/// Every certificate (or those of one role and name), by name, then newest first.
pub fn certificates(conn: &dyn Db, of: Option<(Role, &str)>) -> StoreResult<Vec<CertRow>> {
    let (role, name) = match of {
        Some((role, name)) => (Some(role.as_str()), Some(name)),
        None => (None, None),
    };
    Ok(conn
        .prepare_cached(
            "SELECT serial, role, name, issued_at, not_after, revoked_at, revoked_by, revoked_reason FROM certificates
             WHERE (CAST($1 AS TEXT) IS NULL OR role = $1) AND (CAST($2 AS TEXT) IS NULL OR name = $2)
             ORDER BY name, role, issued_at DESC, serial",
        )?
        .query_map(params![role, name], cert_row)?
        .collect::<Result<_, _>>()?)
}

/// A host whose open node session has not been heard from for longer than the warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilentHost {
    /// The host.
    pub host: String,
    /// Its open session.
    pub session: i64,
    /// Its last contact (unix ms).
    pub last_contact_at_ms: i64,
}

/// The hosts (not retired) whose newest session is open and was last heard from before
/// `now_ms - silence_ms`. A host that never registered a session, or whose node said goodbye,
/// is not silent: nothing is expected from it.
pub fn silent_hosts(conn: &dyn Db, now_ms: i64, silence_ms: i64) -> StoreResult<Vec<SilentHost>> {
    Ok(conn
        .prepare_cached(
            "SELECT s.host, s.session, s.last_contact_at FROM node_sessions s JOIN hosts h ON h.name = s.host
             WHERE h.retired_at IS NULL AND s.ended_at IS NULL AND s.last_contact_at < $1
               AND s.session = (SELECT max(session) FROM node_sessions m WHERE m.host = s.host)
             ORDER BY s.host",
        )?
        .query_map(params![now_ms.saturating_sub(silence_ms)], |r| {
            Ok(SilentHost { host: r.get(0)?, session: r.get(1)?, last_contact_at_ms: r.get(2)? })
        })?
        .collect::<Result<_, _>>()?)
}

/// For each name (and role) still in use, its certificate that lasts longest, when even that
/// one expires before `until_unix`: the names that will lose access unless renewed. Revoked
/// certificates, retired hosts and names with no unrevoked certificate are left out.
pub fn expiring_certificates(conn: &dyn Db, until_unix: i64) -> StoreResult<Vec<CertRow>> {
    Ok(conn
        .prepare_cached(
            "SELECT serial, role, name, issued_at, not_after, revoked_at, revoked_by, revoked_reason
             FROM certificates c
             WHERE revoked_at IS NULL AND not_after < $1
               AND NOT (role = 'node' AND EXISTS (SELECT 1 FROM hosts h WHERE h.name = c.name AND h.retired_at IS NOT NULL))
               AND NOT EXISTS (SELECT 1 FROM certificates l
                               WHERE l.role = c.role AND l.name = c.name AND l.revoked_at IS NULL
                                 AND (l.not_after > c.not_after OR (l.not_after = c.not_after AND l.serial > c.serial)))
             ORDER BY name, role",
        )?
        .query_map(params![until_unix], cert_row)?
        .collect::<Result<_, _>>()?)
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
    pub fn connected(&self) -> bool {
        self.state == Some(HostState::Active) && self.silent_for_ms.is_some() && !self.silent()
    }

    /// The liveness of `host` from its fleet row (`None`: never enrolled), at `now_ms`.
    pub fn from_row(host: &str, row: Option<&HostRow>, now_ms: i64, silence_warn_ms: i64) -> Liveness {
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

/// The pools `host` is a member of, by name (`pool_members`).
pub fn pools_of(conn: &dyn Db, host: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached("SELECT pool FROM pool_members WHERE host = $1 ORDER BY pool")?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::registry::hosts::{Issued, enroll};
    use crate::store::testing;

    fn session(c: &dyn Db, host: &str, n: i64, last_contact: i64, ended: Option<&str>, took_over: Option<i64>) {
        c.execute(
            "INSERT INTO node_sessions (host, session, instance_id, node_version, started_at, ended_at, ended_how, took_over, last_contact_at)
             VALUES ($1, $2, $6, '0.1.0', $3, $7, $4, $5, $3)",
            params![host, n, last_contact, ended, took_over, format!("inst-{n}"), ended.map(|_| last_contact)],
        )
        .unwrap();
    }

    #[test]
    fn hosts_show_their_newest_session_and_silence_needs_an_open_one() {
        let db = testing::db();
        let c = &db.conn;
        for (name, serial) in [("host-a", "a1"), ("host-b", "b1"), ("host-c", "c1")] {
            enroll(c, Issued { role: Role::Node, name, serial, not_after_unix: 10_000 }, "op", "enrolled", 1).unwrap();
        }
        session(c, "host-a", 1, 100, Some("superseded"), None);
        session(c, "host-a", 2, 1_000, None, Some(1));
        session(c, "host-b", 1, 100, Some("clean"), None);
        crate::store::registry::hosts::revoke(c, "host-c", "op", "lost", 5).unwrap();

        let all = hosts(c).unwrap();
        let names: Vec<(&str, HostState)> = all.iter().map(|h| (h.name.as_str(), h.state)).collect();
        assert_eq!(
            names,
            [("host-a", HostState::Active), ("host-b", HostState::Active), ("host-c", HostState::Revoked)]
        );
        let a = all[0].session.as_ref().unwrap();
        assert_eq!((a.session, a.took_over, a.ended_how), (2, Some(1), None));
        assert_eq!(all[1].session.as_ref().unwrap().ended_how, Some(SessionEnd::Clean));
        assert!(all[2].session.is_none());

        // Only host-a's open session can be silent; host-b ended cleanly, host-c never began one.
        assert_eq!(
            silent_hosts(c, 2_000, 500).unwrap().iter().map(|s| s.host.as_str()).collect::<Vec<_>>(),
            ["host-a"]
        );
        assert!(silent_hosts(c, 1_200, 500).unwrap().is_empty());

        let detail = host(c, "host-c").unwrap().unwrap();
        assert_eq!(detail.certificates.len(), 1);
        assert!(detail.certificates[0].revoked.is_some());
        assert!(detail.events.iter().any(|e| e.action == "revoke" && e.subject == "c1"), "{:?}", detail.events);
        assert!(host(c, "nobody").unwrap().is_none());
    }

    #[test]
    fn expiry_looks_at_the_longest_lasting_unrevoked_certificate_of_each_name() {
        let db = testing::db();
        let c = &db.conn;
        let node = |name, serial, not_after_unix| Issued { role: Role::Node, name, serial, not_after_unix };
        enroll(c, node("host-a", "a1", 100), "op", "enrolled", 1).unwrap();
        enroll(c, node("host-a", "a2", 5_000), "op", "enrolled", 1).unwrap();
        enroll(c, node("host-b", "b1", 100), "op", "enrolled", 1).unwrap();
        enroll(c, Issued { role: Role::Producer, ..node("prod", "p1", 200) }, "op", "enrolled", 1).unwrap();
        enroll(c, node("host-r", "r1", 100), "op", "enrolled", 1).unwrap();
        crate::store::lifecycle::operator::retire(c, "host-r", "op", "gone", 2).unwrap();
        let expiring: Vec<(String, String)> =
            expiring_certificates(c, 1_000).unwrap().into_iter().map(|r| (r.name, r.serial)).collect();
        assert_eq!(expiring, [("host-b".to_string(), "b1".to_string()), ("prod".into(), "p1".into())]);
    }
}
