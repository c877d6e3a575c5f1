//! Looking at the record without changing it: `status`, `backup`, `verify`, `config check`.

use super::output::fmt_ms;
use super::{CliError, CliResult, Context, output};
use crate::lock;
use crate::store::fences::FenceScope;
use baton_shared::duration::{self, human, human_ms};
use baton_shared::states::DeliveryState;
use baton_shared::{exit, pki};
use std::path::Path;
use std::time::Duration;

/// How far ahead `status` looks for certificates that expire (nodes, producers and the hub's
/// own server certificate): long enough to renew at leisure.
pub(super) const CERT_EXPIRY_WARN: Duration = Duration::from_secs(30 * 24 * 3600);

/// One thing `status` says needs an operator's attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Attention {
    /// `hub_not_running`, `fence_active` (a host's or everything's), `held`, `unknown_outcomes`,
    /// `ca_rotation_unfinished`, `host_silent` or `certificate_expiring`.
    pub(super) kind: &'static str,
    /// What it is about: the data directory, a host, a certificate's name.
    pub(super) subject: String,
    /// What is wrong, in a sentence.
    pub(super) detail: String,
}

/// The record's size against its bound, as `status` shows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StoreSize {
    /// The bytes the record takes (`store::read::store_bytes`).
    pub(super) bytes: u64,
    /// `limits.store_bytes_max`.
    pub(super) bytes_max: u64,
}

/// `status`: the record's counts, whether a hub serves this data directory (from its lock:
/// side-effect free, it wakes no waiting long-poll), and what needs attention. Exit 1 when the
/// hub is not running or anything needs attention.
pub(super) fn status(ctx: &Context, since: &str, json: bool) -> CliResult {
    let now_ms = ctx.now_ms();
    let since_ms = match duration::parse("--since", since) {
        Ok(ago) => now_ms.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)),
        Err(_) => duration::parse_time_ms("--since", since).map_err(CliError::usage)?,
    };
    let hub = lock::probe(&ctx.dir)?;
    let config = ctx.config(None)?;
    let record = ctx.open_read()?;
    let s = record.run(record.status())?;
    let mut attention = Vec::new();
    if hub.is_none() {
        attention.push(Attention {
            kind: "hub_not_running",
            subject: ctx.dir.root().display().to_string(),
            detail: "no hub serves this data directory".into(),
        });
    }
    // A fence on a host or on everything stops work fleet-wide: one on a conversation is a
    // conversation's business. One past its time is the hub's to lift, not the operator's.
    for f in record.run(record.fences(false))? {
        if f.scope == FenceScope::Conversation || f.expires_at_ms.is_some_and(|at| at <= now_ms) {
            continue;
        }
        let subject = match &f.target {
            Some(t) => format!("{} {t}", f.scope.as_str()),
            None => "everything".to_string(),
        };
        let until = f.expires_at_ms.map(|at| format!(", until {}", fmt_ms(at))).unwrap_or_default();
        attention.push(Attention {
            kind: "fence_active",
            subject,
            detail: format!(
                "fence {} ({}) set by {} {} ago{until}: {}",
                f.id,
                f.kind.as_str(),
                f.set_by,
                human_ms(now_ms.saturating_sub(f.set_at_ms)),
                f.reason
            ),
        });
    }
    let held = s.deliveries.iter().find(|(st, _)| *st == DeliveryState::Held).map_or(0, |(_, n)| *n);
    if held > 0 {
        attention.push(Attention {
            kind: "held",
            subject: "held queue".into(),
            detail: format!("{held} delivery(ies) held, waiting for an operator's release (held list)"),
        });
    }
    let unknown = record.run(record.unknown_since(since_ms))?;
    if unknown > 0 {
        attention.push(Attention {
            kind: "unknown_outcomes",
            subject: format!("since {}", fmt_ms(since_ms)),
            detail: format!(
                "{unknown} delivery(ies) ended unknown: a turn may or may not have run (deliveries list --outcome unknown)"
            ),
        });
    }
    let old_cas = super::ca::old_cas_trusted(&ctx.dir)?;
    if old_cas > 0 {
        attention.push(Attention {
            kind: "ca_rotation_unfinished",
            subject: ctx.dir.ca_cert().display().to_string(),
            detail: format!(
                "{old_cas} older CA(s) still trusted beside the issuing one: renew what they issued, then ca retire-old"
            ),
        });
    }
    let store = StoreSize {
        bytes: u64::try_from(record.run(record.store_bytes())?).unwrap_or(0),
        bytes_max: config.limits.store_bytes_max,
    };
    if store.bytes > store.bytes_max {
        attention.push(Attention {
            kind: "store_full",
            subject: "store".into(),
            detail: format!(
                "{} bytes, over limits.store_bytes_max = {}: submissions get 507 store_full until retention or a \
                 purge frees room; claims, reports and reads go on",
                store.bytes, store.bytes_max
            ),
        });
    }
    let silence_ms = i64::try_from(config.host_silence_warn.as_millis()).unwrap_or(i64::MAX);
    for h in record.run(record.silent_hosts(now_ms, silence_ms))? {
        attention.push(Attention {
            kind: "host_silent",
            subject: h.host,
            detail: format!(
                "session {} silent for {} (host_silence_warn {})",
                h.session,
                human_ms(now_ms.saturating_sub(h.last_contact_at_ms)),
                human(config.host_silence_warn)
            ),
        });
    }
    let now_unix = now_ms / 1000;
    let until_unix = now_unix.saturating_add(CERT_EXPIRY_WARN.as_secs() as i64);
    for c in record.run(record.expiring_certificates(until_unix))? {
        attention.push(expiring(&format!("{} {}", c.role, c.name), &c.serial, c.not_after_unix, now_unix));
    }
    let server_pem = super::read_pem(&ctx.dir.server_cert())?;
    let (serial, not_after) = pki::cert_facts(&server_pem)
        .map_err(|e| CliError::failure(format!("{}: {e}", ctx.dir.server_cert().display())))?;
    if not_after < until_unix {
        attention.push(expiring("hub server certificate", &serial, not_after, now_unix));
    }
    output::status(&s, hub.as_ref(), store, &attention, json)?;
    match attention.as_slice() {
        [] => Ok(()),
        [only] if only.kind == "hub_not_running" => Err(CliError::new(exit::NOTHING, "the hub is not running")),
        items => Err(CliError::new(exit::NOTHING, format!("{} item(s) need attention", items.len()))),
    }
}

fn expiring(subject: &str, serial: &str, not_after_unix: i64, now_unix: i64) -> Attention {
    let left = not_after_unix.saturating_sub(now_unix);
    let detail = if left <= 0 {
        format!("certificate {serial} expired {} ago", human_ms(left.saturating_neg().saturating_mul(1000)))
    } else {
        format!("certificate {serial} expires in {}", human_ms(left.saturating_mul(1000)))
    };
    Attention { kind: "certificate_expiring", subject: subject.to_string(), detail }
}

/// What `backup` says to use instead on PostgreSQL.
const BACKUP_ON_POSTGRES: &str =
    "back it up with PostgreSQL's own tools (pg_dump, or a base backup with WAL archiving)";

/// `backup --out FILE`: a consistent copy, checked, while the hub may run.
pub(super) fn backup(ctx: &Context, path: &Path) -> CliResult {
    ctx.require_sqlite("backup", BACKUP_ON_POSTGRES)?;
    if path.exists() {
        return Err(CliError::usage(format!("{} exists; refusing to overwrite it", path.display())));
    }
    let record = ctx.open_read()?;
    record.run(record.backup_to(path.to_path_buf()))?;
    output::line(format!("backup written to {} (integrity ok)", path.display()))
}

/// `verify`: every invariant, including a full integrity check of the file; exit 4 when any
/// problem is found.
pub(super) fn verify(ctx: &Context, json: bool) -> CliResult {
    let record = ctx.open_read()?;
    let problems = record.run(record.verify())?;
    output::problems(&problems, json)?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::new(exit::FAILURE, format!("{} problem(s) found", problems.len())))
    }
}

/// `config check`: validates the configuration `serve` would start with (but its flags other
/// than the global ones), and says where the record is (a URL without its password); warns on
/// stderr when the operator listener is bound beyond loopback.
pub(super) fn config_check(ctx: &Context, file: Option<&Path>) -> CliResult {
    let config = ctx.config(file)?;
    if let Some(w) = crate::ops_listener::exposure_warning(&config) {
        eprintln!("warning: {w}");
    }
    let record = match &config.database_url {
        Some(url) => format!("PostgreSQL at {}", url.shown()),
        None => ctx.dir.db().display().to_string(),
    };
    output::line(format!("configuration is valid (record: {record})"))
}
