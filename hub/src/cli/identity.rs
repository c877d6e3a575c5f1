//! The hub's identities: `init` (the data directory, the CA, the server certificate, the
//! database), `enroll` and `renew` (a node's or producer's certificate), `revoke`.

use super::args::{Confirm, Enroll, EnrollArgs};
use super::confirm::{self, Decision};
use super::files::{replace_files, write_new};
use super::{CliError, CliResult, Context, Record, output};
use crate::config::{DATABASE_URL, process_env};
use crate::store::By;
use crate::store::Store;
use crate::store::registry::hosts::Enrollment as Recorded;
use crate::store::registry::producers::QuotaChange;
use crate::wake;
use baton_shared::files::read_text_bounded;
use baton_shared::ids::{Role, check_name};
use baton_shared::limits::PEM_FILE_BYTES_MAX;
use baton_shared::pki::{self, LeafKind};
use std::path::Path;
use std::time::Duration;

/// The longest certificate validity `enroll` and `renew` issue, in days.
const CERT_DAYS_MAX: u32 = 3650;
/// A renewed node's or producer's validity when `--days` is not given (`enroll`'s default).
const CERT_DAYS_DEFAULT: u32 = 365;

/// `init`: creates the data directory, the CA (new, or `ca_from` an existing hub's), the server
/// certificate, the configuration template and the record: the SQLite file, or, when a
/// `database_url` is configured, the PostgreSQL database migrated (no SQLite file) with the URL
/// written into `hub.toml` (0600: it may hold a password). Refuses a directory that is already
/// initialised, and a PostgreSQL record already in use when the CA is not taken from a hub of
/// it. A refusal creates nothing.
pub(super) fn init(ctx: &Context, hostnames: &[String], ca_from: Option<&Path>) -> CliResult {
    let dir = &ctx.dir;
    if dir.ca_cert().exists() || dir.db().exists() {
        return Err(CliError::usage(format!(
            "{} is already initialised; refusing to overwrite it",
            dir.root().display()
        )));
    }
    let config = ctx.config(None)?;
    let shared_ca = ca_from.map(read_ca_from).transpose()?;
    if let Some(url) = &config.database_url {
        check_joining(ctx, url, shared_ca.is_some())?;
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir.root())?;
    }
    // A directory that existed already may be looser than 0700: tighten it before any file.
    dir.tighten().map_err(|e| CliError::failure(format!("{}: {e}", dir.root().display())))?;
    let (ca_cert, ca_key) = match shared_ca {
        Some(pair) => pair,
        None => {
            let ca = pki::create_ca("Baton hub CA").map_err(|e| CliError::failure(e.to_string()))?;
            (ca.cert_pem, ca.key_pem)
        }
    };
    let names = server_names(hostnames);
    let server =
        pki::issue(&ca_cert, &ca_key, &LeafKind::Server { hostnames: names.clone(), lifetime: pki::SERVER_VALIDITY })
            .map_err(|e| CliError::usage(e.to_string()))?;
    write_new(&dir.ca_key(), &ca_key, true)?;
    write_new(&dir.ca_cert(), &ca_cert, false)?;
    write_new(&dir.server_key(), &server.key_pem, true)?;
    write_new(&dir.server_cert(), &server.cert_pem, false)?;
    // The URL as the highest layer that gave it was written (the file's own needs no copy).
    let url_text = ctx.database_url.clone().or_else(|| process_env(DATABASE_URL.name.env)).filter(|u| !u.is_empty());
    if !dir.config().exists() {
        let private = url_text.is_some();
        write_new(&dir.config(), &crate::config::template_with(url_text.as_deref()), private)?;
    }
    let record = match &config.database_url {
        Some(url) => format!("the record in PostgreSQL at {}", url.shown()),
        None => {
            drop(Store::open_write(&dir.db(), baton_shared::sqlite::Synchronous::Full, ctx.clock.clone())?);
            // SQLite creates the database (and later its -wal and -shm, with the same mode)
            // under the umask; make it the owner's alone.
            dir.tighten().map_err(|e| CliError::failure(format!("{}: {e}", dir.root().display())))?;
            format!("the record in {}", dir.db().display())
        }
    };
    let ca = match ca_from {
        Some(src) => format!("the CA taken from {}", src.display()),
        None => "a new CA".to_string(),
    };
    output::line(format!("initialised {} (server names: {}; {ca}; {record})", dir.root().display(), names.join(", ")))
}

/// The names `init`'s server certificate carries: the loopback ones and every `--hostname`.
fn server_names(hostnames: &[String]) -> Vec<String> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for h in hostnames {
        if !names.contains(h) {
            names.push(h.clone());
        }
    }
    names
}

/// Connects to the PostgreSQL record at `url` and migrates it, as `serve` will; refuses (exit
/// 2) a record already in use when the CA is a new one (`shared_ca` false). The record stores
/// no CA, so which one issued its certificates cannot be checked; but a record in use (hosts
/// enrolled, certificates issued, messages sent) was made under some hub's CA, which a new one
/// would not verify.
fn check_joining(ctx: &Context, url: &crate::store::engine::postgres::PgUrl, shared_ca: bool) -> CliResult {
    let record = Record::postgres(url, ctx.clock.clone())?;
    let seen = record.run(record.in_use())?;
    if seen.any() && !shared_ca {
        return Err(CliError::usage(format!(
            "the database at {} already holds a record ({} host(s) enrolled, {} certificate(s) issued, {} \
             message(s)) made under the CA of the hubs that serve it, which a new CA would not verify: join with \
             `baton-hub init --ca-from DIR`, DIR being the data directory of a hub that serves it",
            url.shown(),
            seen.hosts,
            seen.certificates,
            seen.messages
        )));
    }
    Ok(())
}

/// The CA of the hub whose data directory is `src` (`ca.crt`, every CA it trusts, and
/// `ca.key`, the issuing one's key), checked to belong together, for a hub that joins the
/// record it serves.
fn read_ca_from(src: &Path) -> Result<(String, String), CliError> {
    let other = crate::datadir::DataDir::new(src);
    let read = |p: &Path| {
        read_text_bounded(p, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
            .map_err(|e| CliError::usage(format!("--ca-from {}: cannot read {}: {e}", src.display(), p.display())))
    };
    let (cert, key) = (read(&other.ca_cert())?, read(&other.ca_key())?);
    pki::issuing_cert(&cert, &key).map_err(|e| {
        CliError::usage(format!(
            "--ca-from {}: {} is not the key of a CA in {}: {e}",
            src.display(),
            other.ca_key().display(),
            other.ca_cert().display()
        ))
    })?;
    Ok((cert, key))
}

/// `enroll node|producer NAME --out DIR`.
pub(super) fn enroll_cmd(ctx: &Context, e: &Enroll) -> CliResult {
    match e {
        Enroll::Node(a) => enroll(ctx, Role::Node, a, None, QuotaChange::default()),
        Enroll::Producer(p) => {
            let scope = p.conversations.as_deref();
            if let Some(patterns) = scope {
                super::conversations::check_patterns(patterns)?;
            }
            let quota = super::conversations::quota_change(&p.quota)?;
            enroll(ctx, Role::Producer, &p.common, scope, quota)
        }
    }
}

/// What `renew NAME` is asked for besides the name (see `args::Command::Renew`).
#[derive(Debug, Clone, Copy)]
pub(super) struct RenewOptions<'a> {
    /// Where to write the files.
    pub(super) out: &'a Path,
    /// Validity in days.
    pub(super) days: Option<u32>,
    /// Revoke the name's other unrevoked certificates in the same transaction.
    pub(super) revoke_old: bool,
    /// Renew a name whose every certificate was revoked.
    pub(super) force: bool,
    /// Why, for the audit log (`None`: what was done, "renewed").
    pub(super) reason: Option<&'a str>,
}

/// `renew NAME --out DIR [--revoke-old] [--force]`: a fresh certificate under the role `NAME`
/// was enrolled with; with `revoke_old`, its other unrevoked certificates are revoked in the
/// same transaction (otherwise both stay valid until the old one is revoked or expires). A
/// name whose every certificate was revoked (`revoke NAME`) is refused unless `force`: a
/// renewal would silently undo the revocation.
pub(super) fn renew(ctx: &Context, name: &str, o: RenewOptions<'_>) -> CliResult {
    let RenewOptions { out, days, revoke_old, force, reason: given } = o;
    let days = days.unwrap_or(CERT_DAYS_DEFAULT);
    let record = ctx.open_read()?;
    let roles = record.run(record.enrolled_roles(name.to_string()))?;
    let role = match roles.as_slice() {
        [r] => *r,
        [] => return Err(CliError::new(baton_shared::exit::NOTHING, format!("{name} was never enrolled"))),
        _ => return Err(CliError::usage(format!("{name} is enrolled as both node and producer"))),
    };
    let certs: Vec<_> =
        record.run(record.certificates())?.into_iter().filter(|c| c.role == role && c.name == name).collect();
    drop(record);
    let last_revocation = certs
        .iter()
        .map(|c| c.revoked.as_ref())
        .collect::<Option<Vec<_>>>()
        .and_then(|all| all.into_iter().max_by_key(|(at_ms, _, _)| *at_ms));
    if let (Some((at_ms, by, why)), false) = (last_revocation, force) {
        return Err(CliError::usage(format!(
            "{role} {name} was revoked ({} by {}: {}): every certificate of it is revoked, and a renewal would \
             give it a valid one again; renew anyway with --force",
            output::fmt_ms(*at_ms),
            output::esc(by),
            output::esc(why)
        )));
    }
    let reason = match (given, revoke_old) {
        (Some(why), _) => why,
        (None, true) => "renewed; old certificate revoked",
        (None, false) => "renewed",
    };
    let quota = QuotaChange::default();
    let revoked = enroll_as(
        ctx,
        Enrollment { role, name, out_dir: out, days, scope: None, revoke_old, reason, quota },
        "renewed",
    )?;
    if !revoked.is_empty() {
        output::line(format!("revoked the old certificate(s) of {name}: {}", revoked.join(", ")))?;
        ctx.wake_hub();
    }
    Ok(())
}

/// `renew --server [--days N]`: a new server certificate (new key, new serial) under the
/// current CA, for the names the current one carries, valid `days` (else `SERVER_VALIDITY`).
/// Both files are replaced by rename, the replaced ones kept aside (hard links, so the old key
/// keeps its mode); then a running hub is woken, and reloads them for its next handshakes.
pub(super) fn renew_server(ctx: &Context, days: Option<u32>) -> CliResult {
    let lifetime = match days {
        None => pki::SERVER_VALIDITY,
        Some(d) if d == 0 || d > CERT_DAYS_MAX => {
            return Err(CliError::usage(format!("--days {d} is out of range; allowed 1..={CERT_DAYS_MAX}")));
        }
        Some(d) => Duration::from_secs(u64::from(d) * 24 * 3600),
    };
    let dir = &ctx.dir;
    let current = super::read_pem(&dir.server_cert())?;
    let names =
        pki::server_names(&current).map_err(|e| CliError::failure(format!("{}: {e}", dir.server_cert().display())))?;
    if names.is_empty() {
        return Err(CliError::failure(format!("{} names no host or address", dir.server_cert().display())));
    }
    let (ca_cert, ca_key) = super::ca::issuing_ca(dir)?;
    let server = pki::issue(&ca_cert, &ca_key, &LeafKind::Server { hostnames: names.clone(), lifetime })
        .map_err(|e| CliError::failure(e.to_string()))?;
    let stamp = super::files::aside_stamp(ctx.now_ms());
    let kept = replace_files(
        &[(dir.server_key(), server.key_pem.as_str(), true), (dir.server_cert(), server.cert_pem.as_str(), false)],
        &stamp,
    )?;
    let reloaded = wake::notify(&dir.wake_socket());
    output::line(format!(
        "renewed the hub's server certificate: serial {}, not after {} (names: {}); replaced files kept as {}",
        server.serial,
        output::fmt_ms(server.not_after_unix.saturating_mul(1000)),
        names.join(", "),
        kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    ))?;
    output::line(if reloaded {
        "the running hub serves it to new connections"
    } else {
        "no hub is running here; the next `serve` uses it"
    })
}

/// What one enrollment issues and records.
struct Enrollment<'a> {
    role: Role,
    name: &'a str,
    out_dir: &'a Path,
    days: u32,
    /// A producer's publish scope, when given.
    scope: Option<&'a [String]>,
    /// Revoke the name's other unrevoked certificates (a renewal that retires the old one).
    revoke_old: bool,
    /// Why, recorded in the audit log with the enrollment.
    reason: &'a str,
    /// A producer's quota, when given (empty: unchanged).
    quota: QuotaChange,
}

/// Issues a certificate for `name`, records it (with a producer's publish `scope`, when given,
/// in the same transaction), and writes `NAME.crt`, `NAME.key` and `ca.crt` into `out_dir`
/// (refusing to overwrite a certificate or key).
fn enroll(ctx: &Context, role: Role, a: &EnrollArgs, scope: Option<&[String]>, quota: QuotaChange) -> CliResult {
    let e = Enrollment {
        role,
        name: &a.name,
        out_dir: &a.out,
        days: a.days,
        scope,
        revoke_old: false,
        reason: &a.why.reason,
        quota,
    };
    enroll_as(ctx, e, "enrolled").map(drop)
}

/// `enroll` with every option; returns the serials it revoked (`revoke_old`). `done` is the
/// word the answer starts with: "enrolled", or "renewed" for a renewal.
fn enroll_as(ctx: &Context, e: Enrollment<'_>, done: &str) -> Result<Vec<String>, CliError> {
    let Enrollment { role, name, out_dir, days, scope, revoke_old, reason, quota } = e;
    check_name("name", name)?;
    if pki::is_reserved(name) {
        return Err(CliError::usage(format!(
            "{name} is reserved: `baton-hub send` records its messages under it, so no certificate may hold it; \
             enroll under another name"
        )));
    }
    if days == 0 || days > CERT_DAYS_MAX {
        return Err(CliError::usage(format!("--days {days} is out of range; allowed 1..={CERT_DAYS_MAX}")));
    }
    let record = ctx.open_write()?;
    if done == "enrolled" {
        // Enrolling a name again is allowed (a lost key), but the old certificate stays valid
        // beside the new one: say so, and how to end it.
        let now_unix = ctx.now_ms() / 1000;
        let live: Vec<String> = record
            .run(record.certificates())?
            .into_iter()
            .filter(|c| c.role == role && c.name == name && c.revoked.is_none() && c.not_after_unix > now_unix)
            .map(|c| c.serial)
            .collect();
        if !live.is_empty() {
            eprintln!(
                "warning: {role} {name} is already enrolled (certificate {}); the new certificate works beside it until \
                 that one is revoked (revoke SERIAL) or expires; `renew {name} --revoke-old` replaces it in one step",
                live.join(", ")
            );
        }
    }
    let dir = &ctx.dir;
    let (ca_cert, ca_key) = super::ca::issuing_ca(dir)?;
    let lifetime = Duration::from_secs(u64::from(days) * 24 * 3600);
    let leaf = pki::issue(&ca_cert, &ca_key, &LeafKind::Client { role, name: name.into(), lifetime })
        .map_err(|e| CliError::usage(e.to_string()))?;
    std::fs::create_dir_all(out_dir)?;
    let cert_path = out_dir.join(format!("{name}.crt"));
    let key_path = out_dir.join(format!("{name}.key"));
    for p in [&cert_path, &key_path] {
        if p.exists() {
            return Err(CliError::usage(format!("{} exists; refusing to overwrite it", p.display())));
        }
    }
    // Before the record: a serial in the record always has its copy (`certs list`'s CA).
    super::ca::keep_issued(dir, &leaf.serial, &leaf.cert_pem)?;
    let recorded = Recorded {
        role,
        name: name.to_string(),
        serial: leaf.serial.clone(),
        not_after_unix: leaf.not_after_unix,
        scope: scope.map(<[String]>::to_vec),
        revoke_old,
        reason: reason.to_string(),
        quota,
    };
    let revoked = record.run(record.enroll(recorded, ctx.operator.clone()))?;
    write_new(&key_path, &leaf.key_pem, true)?;
    write_new(&cert_path, &leaf.cert_pem, false)?;
    // Every CA the hub trusts (two during a CA rotation): a stale copy is replaced.
    let ca_out = out_dir.join("ca.crt");
    match read_text_bounded(&ca_out, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX") {
        Ok(old) if old == ca_cert => {}
        Ok(_) => {
            drop(replace_files(&[(ca_out.clone(), ca_cert.as_str(), false)], &super::files::aside_stamp(ctx.now_ms()))?)
        }
        Err(_) => write_new(&ca_out, &ca_cert, false)?,
    }
    output::line(format!("{done} {role} {name}: {} (serial {})", cert_path.display(), leaf.serial))?;
    if let Some(patterns) = scope {
        output::line(format!("producer {name} may post into: {}", patterns.join(" ")))?;
    }
    if !quota.is_empty() {
        output::line(format!("producer {name} quota set (see `producers list`)"))?;
    }
    Ok(revoked)
}

/// `certs list [--name NAME]`: every certificate with its role, serial, issuing CA, expiry and
/// revocation.
pub(super) fn certs(ctx: &Context, name: Option<&str>, json: bool) -> CliResult {
    let record = ctx.open_read()?;
    let mut rows = record.run(record.certificates())?;
    if let Some(n) = name {
        rows.retain(|c| c.name == n);
    }
    let serials: Vec<&str> = rows.iter().map(|c| c.serial.as_str()).collect();
    let issuers = super::ca::issuers(&ctx.dir, &serials)?;
    output::certs(&rows, &issuers, ctx.now_ms(), json)
}

/// `revoke NAME|SERIAL --reason R [--dry-run | --yes]`: names the certificates it revokes
/// (serial, role, holder) and asks first (`confirm`): a revoked name is cut off at its next
/// request, and only `renew --force` gives it a certificate again.
pub(super) fn revoke(ctx: &Context, name: &str, reason: &str, confirm: &Confirm) -> CliResult {
    let record = ctx.open_read()?;
    let certs: Vec<_> = record
        .run(record.certificates())?
        .into_iter()
        .filter(|c| c.revoked.is_none() && (c.name == name || c.serial == name))
        .collect();
    drop(record);
    if certs.is_empty() {
        return Err(CliError::new(
            baton_shared::exit::NOTHING,
            format!("nothing to do: no unrevoked certificate for {}", output::esc(name)),
        ));
    }
    let named: Vec<String> =
        certs.iter().map(|c| format!("{} ({} {})", c.serial, c.role, output::esc(&c.name))).collect();
    let plan = format!(
        "revoke {} certificate(s) of {} (reason: {}): {}; each is refused from its next request on",
        certs.len(),
        output::esc(name),
        output::esc(reason),
        named.join(", ")
    );
    if confirm::decide(confirm, &plan, None)? == Decision::DryRun {
        return Ok(());
    }
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    let serials = record.run(record.revoke(name.to_string(), by))?;
    // A running hub re-checks its open connections and waiting reads at once.
    ctx.wake_hub();
    output::line(format!("revoked {} certificate(s) of {name}: {}", serials.len(), serials.join(", ")))
}
