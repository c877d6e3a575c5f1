//! Hosts and certificates: enrolling a host or producer, looking a certificate up, revoking.

use crate::store::By;
use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::producers;
use crate::store::views::fleet;
use crate::store::{StoreError, StoreResult, parse_column};
use baton_shared::ids::Role;

/// A certificate just issued, to be recorded (owned; see `Issued`).
#[derive(Debug, Clone)]
pub struct Enrollment {
    /// Node or producer.
    pub role: baton_shared::ids::Role,
    /// The host or producer name.
    pub name: String,
    /// The certificate's serial (lowercase hex).
    pub serial: String,
    /// When it expires (unix seconds).
    pub not_after_unix: i64,
    /// A producer's publish scope, set in the same transaction, when given.
    pub scope: Option<Vec<String>>,
    /// Revoke the name's other unrevoked certificates in the same transaction (a renewal).
    pub revoke_old: bool,
    /// Why, recorded in the audit log with the enrollment (as every changing command's
    /// `--reason` is).
    pub reason: String,
    /// A producer's quota, set in the same transaction when it changes anything (an empty
    /// change leaves the stored quota, or the default, as it is).
    pub quota: producers::QuotaChange,
}

impl Store {
    /// A certificate's standing (`None`: not in the record).
    pub async fn cert_status(&self, serial: String) -> StoreResult<Option<CertStatus>> {
        self.conns.read(move |c| cert_status(c, &serial)).await
    }

    /// The roles `name` is enrolled in.
    pub async fn enrolled_roles(&self, name: String) -> StoreResult<Vec<baton_shared::ids::Role>> {
        self.conns.read(move |c| enrolled_roles(c, &name)).await
    }

    /// Records an issued certificate, in one transaction: refused (`Invalid`) when the name is
    /// enrolled in the other role; with the producer's scope when given; revoking the name's
    /// other certificates when asked. Returns the serials revoked.
    pub async fn enroll(&self, e: Enrollment, operator: String) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let now_ms = clock.now_ms();
                let (role, name) = (e.role, e.name.as_str());
                if let Some(r) = enrolled_roles(c, name)?.into_iter().find(|r| *r != role) {
                    return Err(StoreError::Invalid(format!(
                        "{name} is already enrolled as a {r}; a name has one role only"
                    )));
                }
                let issued = Issued { role, name, serial: &e.serial, not_after_unix: e.not_after_unix };
                enroll(c, issued, &operator, &e.reason, now_ms)?;
                if let Some(patterns) = &e.scope {
                    producers::set_scope(c, name, patterns, &operator, "enrolled", now_ms)?;
                }
                if !e.quota.is_empty() {
                    producers::set_quota(c, name, e.quota, &operator, &e.reason, now_ms)?;
                }
                let mut revoked = Vec::new();
                if e.revoke_old {
                    for old in fleet::certificates(c, Some((role, name)))? {
                        if old.revoked.is_none() && old.serial != e.serial {
                            revoked.extend(revoke(
                                c,
                                &old.serial,
                                &operator,
                                "renewed; old certificate revoked",
                                now_ms,
                            )?);
                        }
                    }
                }
                Ok(revoked)
            })
            .await
    }

    /// Revokes every unrevoked certificate of a name, or one by serial; returns the serials.
    pub async fn revoke(&self, name_or_serial: String, by: By) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        self.conns.write(move |c| revoke(c, &name_or_serial, &by.operator, &by.reason, clock.now_ms())).await
    }
}

/// Adds a host (idempotent); enrolling a node does this.
pub fn add_host(conn: &dyn Db, host: &str, now_ms: i64) -> StoreResult<()> {
    conn.prepare_cached("INSERT INTO hosts (name, enrolled_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")?
        .execute(params![host, now_ms])?;
    Ok(())
}

/// Records an issued certificate.
pub fn record_certificate(
    conn: &dyn Db,
    serial: &str,
    role: Role,
    name: &str,
    not_after_unix: i64,
    now_ms: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO certificates (serial, role, name, issued_at, not_after) VALUES ($1, $2, $3, $4, $5)",
    )?
    .execute(params![serial, role.as_str(), name, now_ms, not_after_unix])?;
    Ok(())
}

/// A certificate just issued, to be recorded.
#[derive(Debug, Clone, Copy)]
pub struct Issued<'a> {
    /// Node or producer.
    pub role: Role,
    /// The host or producer name.
    pub name: &'a str,
    /// The certificate's serial (lowercase hex).
    pub serial: &'a str,
    /// When it expires (unix seconds).
    pub not_after_unix: i64,
}

/// Where a host stands in the record: what every check of "may this host get work" reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Never enrolled.
    NotEnrolled,
    /// Enrolled, then retired.
    Retired,
    /// Enrolled and not retired.
    Active,
}

/// How `host` stands: not enrolled, retired, or active.
pub fn standing(conn: &dyn Db, host: &str) -> StoreResult<Standing> {
    let retired: Option<Option<i64>> = conn
        .prepare_cached("SELECT retired_at FROM hosts WHERE name = $1")?
        .query_row([host], |r| r.get(0))
        .optional()?;
    Ok(match retired {
        None => Standing::NotEnrolled,
        Some(Some(_)) => Standing::Retired,
        Some(None) => Standing::Active,
    })
}

/// Refuses a host that is not enrolled or is retired, naming it after `what` (e.g. `to[0]: `).
pub fn require_active(conn: &dyn Db, host: &str, what: &str) -> StoreResult<()> {
    match standing(conn, host)? {
        Standing::NotEnrolled => Err(StoreError::Invalid(format!("{what}host {host:?} is not enrolled"))),
        Standing::Retired => Err(StoreError::Invalid(format!("{what}host {host:?} is retired"))),
        Standing::Active => Ok(()),
    }
}

/// Records an enrollment: for a node, the host (refused when it is retired), then the
/// certificate and an operator event with the reason.
pub fn enroll(conn: &dyn Db, cert: Issued<'_>, operator: &str, reason: &str, now_ms: i64) -> StoreResult<()> {
    if cert.role == Role::Node {
        if standing(conn, cert.name)? == Standing::Retired {
            return Err(StoreError::Invalid(format!("host {} is retired", cert.name)));
        }
        add_host(conn, cert.name, now_ms)?;
    }
    record_certificate(conn, cert.serial, cert.role, cert.name, cert.not_after_unix, now_ms)?;
    record_operator_event(conn, &format!("enroll_{}", cert.role), cert.name, operator, Some(reason), now_ms)
}

/// The roles `name` was ever enrolled under (renewal needs exactly one).
pub fn enrolled_roles(conn: &dyn Db, name: &str) -> StoreResult<Vec<Role>> {
    let roles = conn
        .prepare_cached("SELECT DISTINCT role FROM certificates WHERE name = $1 ORDER BY role")?
        .query_map([name], |r| parse_column(r, 0, "certificates", &format!("of {name}"), "role", Role::parse))?
        .collect::<Result<_, _>>()?;
    Ok(roles)
}

/// What the store says about a certificate serial: its role, name, and whether it is revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertStatus {
    /// Node or producer.
    pub role: Role,
    /// The host or producer name.
    pub name: String,
    /// Set when revoked.
    pub revoked: bool,
}

/// Looks a certificate up by serial.
pub fn cert_status(conn: &dyn Db, serial: &str) -> StoreResult<Option<CertStatus>> {
    Ok(conn
        .prepare_cached("SELECT role, name, revoked_at IS NOT NULL FROM certificates WHERE serial = $1")?
        .query_row([serial], |r| {
            Ok(CertStatus {
                role: parse_column(r, 0, "certificates", serial, "role", Role::parse)?,
                name: r.get(1)?,
                revoked: r.get(2)?,
            })
        })
        .optional()?)
}

/// Revokes every unrevoked certificate of `name` (any role), or one serial. Returns the serials.
pub fn revoke(
    conn: &dyn Db,
    name_or_serial: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    let serials: Vec<String> = conn
        .prepare_cached("SELECT serial FROM certificates WHERE (name = $1 OR serial = $1) AND revoked_at IS NULL")?
        .query_map([name_or_serial], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if serials.is_empty() {
        return Err(StoreError::NotFound(format!("no unrevoked certificate for {name_or_serial:?}")));
    }
    for s in &serials {
        conn.prepare_cached(
            "UPDATE certificates SET revoked_at = $2, revoked_by = $3, revoked_reason = $4 WHERE serial = $1",
        )?
        .execute(params![s, now_ms, operator, reason])?;
        record_operator_event(conn, "revoke", s, operator, Some(reason), now_ms)?;
    }
    Ok(serials)
}

/// How many hosts are enrolled and not retired.
pub fn active_count(conn: &dyn Db) -> StoreResult<i64> {
    Ok(conn.prepare_cached("SELECT count(*) FROM hosts WHERE retired_at IS NULL")?.query_row([], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    #[test]
    fn enroll_records_the_host_and_refuses_a_retired_one() {
        let db = testing::db();
        let c = &db.conn;
        let node = Issued { role: Role::Node, name: "host-d", serial: "aa01", not_after_unix: 9 };
        enroll(c, node, "op", "enrolled", 1).unwrap();
        enroll(c, Issued { role: Role::Producer, name: "prod", serial: "aa02", ..node }, "op", "enrolled", 1).unwrap();
        assert_eq!(enrolled_roles(c, "host-d").unwrap(), vec![Role::Node]);
        assert_eq!(enrolled_roles(c, "prod").unwrap(), vec![Role::Producer]);
        assert!(enrolled_roles(c, "nobody").unwrap().is_empty());
        let s = cert_status(c, "aa01").unwrap().unwrap();
        assert_eq!((s.role, s.name.as_str(), s.revoked), (Role::Node, "host-d", false));
        assert_eq!(revoke(c, "host-d", "op", "lost", 2).unwrap(), vec!["aa01".to_string()]);
        assert!(cert_status(c, "aa01").unwrap().unwrap().revoked);
        crate::store::lifecycle::operator::retire(c, "host-d", "op", "gone", 3).unwrap();
        let again = Issued { serial: "aa03", ..node };
        assert!(matches!(enroll(c, again, "op", "enrolled", 4), Err(StoreError::Invalid(_))));
    }

    #[test]
    fn a_corrupt_role_is_an_error_naming_the_certificate() {
        let db = testing::db();
        let c = &db.conn;
        enroll(c, Issued { role: Role::Node, name: "host-d", serial: "aa01", not_after_unix: 9 }, "op", "enrolled", 1)
            .unwrap();
        c.execute_batch("PRAGMA ignore_check_constraints = ON; UPDATE certificates SET role = 'admin'").unwrap();
        assert!(
            matches!(cert_status(c, "aa01"), Err(StoreError::Corrupt(t)) if t.contains("aa01") && t.contains("admin"))
        );
        assert!(matches!(enrolled_roles(c, "host-d"), Err(StoreError::Corrupt(_))));
    }
}
