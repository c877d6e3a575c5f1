//! What needs an operator's attention, computed once for `baton-hub status` (which exits 1 when
//! anything does) and the status page's "Needs attention" block, so the two never disagree.
//!
//! From the record (`from_record`): every active fence on a host or on everything, every
//! conversation the breaker holds (`store::lifecycle::approval`), held
//! deliveries, deliveries that ended `unknown` since a window, a record over
//! `limits.store_bytes_max`, silent hosts, hosts with work waiting and no node serving them, and
//! node or producer certificates that expire soon.
//! From the data directory (`from_files`): a CA rotation not finished and the hub's own server
//! certificate expiring. Whether a hub serves the directory is the CLI's own question (the page
//! is served by one).

use crate::datadir::DataDir;
use crate::store::lifecycle::approval;
use crate::store::registry::fences::FenceScope;
use crate::store::views::fleet::HostState;
use crate::store::{Store, StoreResult};
use baton_shared::duration::{human, human_ms};
use baton_shared::pki;
use baton_shared::states::DeliveryState;
use std::time::Duration;

/// How far ahead certificates that expire are flagged (nodes, producers and the hub's own
/// server certificate): long enough to renew at leisure.
pub const CERT_EXPIRY_WARN: Duration = Duration::from_secs(30 * 24 * 3600);
/// How far back an `unknown` outcome needs attention when nothing says otherwise (`status
/// --since`'s default, and the status page's window).
pub const UNKNOWN_WINDOW_DEFAULT: Duration = Duration::from_secs(24 * 3600);

/// One thing that needs an operator's attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attention {
    /// `hub_not_running`, `fence_active` (a host's or everything's), `breaker_tripped` (a
    /// conversation the breaker holds), `held`, `unknown_outcomes`, `store_full`, `host_silent`,
    /// `host_no_node`, `ca_rotation_unfinished` or `certificate_expiring`.
    pub kind: &'static str,
    /// What it is about: the data directory, a host, a certificate's name.
    pub subject: String,
    /// What is wrong, in a sentence.
    pub detail: String,
}

/// The bounds the record is held against.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// `unknown` outcomes at or after this moment (unix ms) are flagged.
    pub unknown_since_ms: i64,
    /// `host_silence_warn`.
    pub host_silence_warn: Duration,
    /// `limits.store_bytes_max`.
    pub store_bytes_max: u64,
}

/// A moment as UTC date and time, for the sentences (as the CLI prints times).
fn utc(ms: i64) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// What the record says needs attention at `now_ms`, in this order: fences, held deliveries,
/// `unknown` outcomes, a full record, silent hosts, hosts no node serves, expiring certificates.
pub async fn from_record(store: &Store, now_ms: i64, w: Watch) -> StoreResult<Vec<Attention>> {
    let mut out = Vec::new();
    // A fence on a host or on everything stops work fleet-wide: one on a conversation is a
    // conversation's business. One past its time is the hub's to lift, not the operator's.
    for f in store.fences(false).await? {
        if f.expires_at_ms.is_some_and(|at| at <= now_ms) {
            continue;
        }
        // A conversation the breaker held is a runaway the operator should look at.
        if f.scope == FenceScope::Conversation && approval::is_breaker(&f) {
            out.push(Attention {
                kind: "breaker_tripped",
                subject: format!("conversation {}", f.target.as_deref().unwrap_or_default()),
                detail: format!(
                    "fence {} (hold) set by the hub {} ago: {}; `fence lift {}` once it is looked into",
                    f.id,
                    human_ms(now_ms.saturating_sub(f.set_at_ms)),
                    f.reason,
                    f.id
                ),
            });
            continue;
        }
        if f.scope == FenceScope::Conversation {
            continue;
        }
        let subject = match &f.target {
            Some(t) => format!("{} {t}", f.scope.as_str()),
            None => "everything".to_string(),
        };
        let until = f.expires_at_ms.map(|at| format!(", until {}", utc(at))).unwrap_or_default();
        out.push(Attention {
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
    let status = store.status().await?;
    let held = status.deliveries.iter().find(|(st, _)| *st == DeliveryState::Held).map_or(0, |(_, n)| *n);
    if held > 0 {
        out.push(Attention {
            kind: "held",
            subject: "held queue".into(),
            detail: format!("{held} delivery(ies) held, waiting for an operator's release (held list)"),
        });
    }
    let unknown = store.unknown_since(w.unknown_since_ms).await?;
    if unknown > 0 {
        out.push(Attention {
            kind: "unknown_outcomes",
            subject: format!("since {}", utc(w.unknown_since_ms)),
            detail: format!(
                "{unknown} delivery(ies) ended unknown: a turn may or may not have run (deliveries list --outcome unknown)"
            ),
        });
    }
    let bytes = u64::try_from(store.store_bytes().await?).unwrap_or(0);
    if bytes > w.store_bytes_max {
        out.push(Attention {
            kind: "store_full",
            subject: "store".into(),
            detail: format!(
                "{bytes} bytes, over limits.store_bytes_max = {}: submissions get 507 store_full until retention or a \
                 purge frees room; claims, reports and reads go on",
                w.store_bytes_max
            ),
        });
    }
    let silence_ms = i64::try_from(w.host_silence_warn.as_millis()).unwrap_or(i64::MAX);
    for h in store.silent_hosts(now_ms, silence_ms).await? {
        out.push(Attention {
            kind: "host_silent",
            subject: h.host,
            detail: format!(
                "session {} silent for {} (host_silence_warn {})",
                h.session,
                human_ms(now_ms.saturating_sub(h.last_contact_at_ms)),
                human(w.host_silence_warn)
            ),
        });
    }
    // Work waiting for a host no node serves: one never started since the host was enrolled,
    // or one whose session ended (a clean stop included), for longer than `host_silence_warn`,
    // so a node's restart is not flagged. An open session that went quiet is `host_silent`.
    for h in store.hosts().await? {
        if h.state != HostState::Active || h.waiting == 0 {
            continue;
        }
        let (since, what) = match &h.session {
            None => (h.enrolled_at_ms, "no node has registered since it was enrolled".to_string()),
            Some(s) => match s.ended_at_ms {
                Some(ended) => (
                    ended,
                    format!(
                        "its node's session {} ended ({})",
                        s.session,
                        s.ended_how.map_or("ended", |how| how.as_str())
                    ),
                ),
                None => continue,
            },
        };
        let ago = now_ms.saturating_sub(since);
        if ago <= silence_ms {
            continue;
        }
        out.push(Attention {
            kind: "host_no_node",
            subject: h.name.clone(),
            detail: format!(
                "{} delivery(ies) waiting for it and no node serving it: {what} {} ago (host_silence_warn {}); \
                 start baton-node there, or retire the host",
                h.waiting,
                human_ms(ago),
                human(w.host_silence_warn)
            ),
        });
    }
    let now_unix = now_ms / 1000;
    let until_unix = now_unix.saturating_add(i64::try_from(CERT_EXPIRY_WARN.as_secs()).unwrap_or(i64::MAX));
    for c in store.expiring_certificates(until_unix).await? {
        out.push(expiring(&format!("{} {}", c.role, c.name), &c.serial, c.not_after_unix, now_unix));
    }
    Ok(out)
}

/// What the data directory says needs attention at `now_ms`: a CA rotation not finished
/// (`ca.crt` trusts more than the issuing CA, from `ca rotate` until `ca retire-old`) and the
/// hub's server certificate expiring. An unreadable file is an error naming it, and so is one
/// over `PEM_FILE_BYTES_MAX` (read within that bound, as every PEM file the hub reads).
pub fn from_files(dir: &DataDir, now_ms: i64) -> Result<Vec<Attention>, String> {
    let read = |p: &std::path::Path| {
        baton_shared::files::read_text_bounded(p, baton_shared::limits::PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut out = Vec::new();
    let bundle = read(&dir.ca_cert())?;
    let cas = pki::pem_certs(&bundle).map_err(|e| format!("{}: {e}", dir.ca_cert().display()))?.len();
    let old_cas = cas.saturating_sub(1);
    if old_cas > 0 {
        out.push(Attention {
            kind: "ca_rotation_unfinished",
            subject: dir.ca_cert().display().to_string(),
            detail: format!(
                "{old_cas} older CA(s) still trusted beside the issuing one: renew what they issued, then ca retire-old"
            ),
        });
    }
    let server = dir.server_cert();
    let (serial, not_after) = pki::cert_facts(&read(&server)?).map_err(|e| format!("{}: {e}", server.display()))?;
    let now_unix = now_ms / 1000;
    if not_after < now_unix.saturating_add(i64::try_from(CERT_EXPIRY_WARN.as_secs()).unwrap_or(i64::MAX)) {
        out.push(expiring("hub server certificate", &serial, not_after, now_unix));
    }
    Ok(out)
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
