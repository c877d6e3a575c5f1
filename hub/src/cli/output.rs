//! Everything the CLI writes to stdout: aligned tables for people, JSON for scripts, and the
//! one-line answers of changing commands. The JSON field names are a public contract (scripts
//! and the tests read them); store rows do not derive `Serialize`, so each shape is built here,
//! explicitly.
//!
//! Why one file over 700 lines: every byte a command writes to stdout, with one escaping rule
//! (`esc`) and one table layout, read in one place. Where it splits when it grows: a folder
//! with `esc` and the table layout at its top and one file per thing shown (identities,
//! deliveries, the fleet and its pools, fences and audit), each taking only those two.

use super::views::StoreSize;
use super::{CliError, CliResult};
use crate::attention::Attention;
use crate::lock::Holder;
use crate::store::lifecycle::progress::LastProgress;
use crate::store::registry::audit::{AuditCursor, AuditEntry};
use crate::store::registry::fences::FenceRow;
use crate::store::registry::members::{ConversationMembers, IntervalRow};
use crate::store::registry::producers::ProducerRow;
use crate::store::upkeep::verify::Problem;
use crate::store::views::explain::{self, Behind, Explanation, FenceHold, Liveness};
use crate::store::views::fleet::{CertRow, HostDetail, HostEvent, HostRow, HostState, SessionRow};
use crate::store::views::listing::Listed;
use crate::store::views::overview::RunningTurn;
use crate::store::views::pool_standing::{Binding, MemberStanding, PoolStanding};
use crate::store::views::read::{DeliveryDetail, DeliveryRow, StatusView};
use baton_shared::duration::human_ms;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::io::Write;

/// Whether a character must not reach a terminal raw: C0 and C1 controls (ESC, CSI, OSC and
/// the rest), DEL, and the bidirectional overrides and isolates that reorder what is shown.
fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// Stored text (a reason, a result, a name derived from a payload or sent by a node) made safe
/// for a terminal: every control character, escape sequence introducer (so CSI and OSC 52
/// sequences), DEL and bidirectional override is shown escaped (`\x1b`, `\n`, `\u{202e}`),
/// so nothing stored can move the cursor, fake a table row, clear the screen or write the
/// clipboard. The one function every human-readable output of stored text goes through;
/// `--json` output is never escaped (serde writes it exactly).
pub(super) fn esc(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) { push_escaped(&mut out, c) } else { out.push(c) }
    }
    Cow::Owned(out)
}

/// `esc` for a block printed over several lines (a harness result): line breaks stay line
/// breaks, each line after the first is indented by `indent`, everything else is escaped.
fn esc_block(s: &str, indent: &str) -> String {
    s.trim_end()
        .split('\n')
        .map(|l| esc(l.strip_suffix('\r').unwrap_or(l)).into_owned())
        .collect::<Vec<_>>()
        .join(&format!("\n{indent}"))
}

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

/// Prints one line.
pub(super) fn line(text: impl std::fmt::Display) -> CliResult {
    writeln!(out(), "{text}")?;
    Ok(())
}

/// Prints a JSON value, pretty.
pub(super) fn json(v: &Value) -> CliResult {
    let text = serde_json::to_string_pretty(v).map_err(|e| CliError::failure(e.to_string()))?;
    line(text)
}

/// Prints rows as an aligned table with a header. Every cell goes through `esc`, so a stored
/// text can neither break a row nor reach the terminal raw.
fn table(header: &[&str], rows: &[Vec<String>]) -> CliResult {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| esc(c).into_owned()).collect()).collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let render = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths.get(i).copied().unwrap_or(0)));
            }
        }
        s.trim_end().to_string()
    };
    let mut o = out();
    writeln!(o, "{}", render(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>()))?;
    for row in rows {
        writeln!(o, "{}", render(row))?;
    }
    Ok(())
}

/// A stored timestamp (unix ms) as UTC date and time; one out of range shows as its number.
pub(super) fn fmt_ms(ms: i64) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

fn fence_json(r: &FenceRow) -> Value {
    json!({
        "id": r.id,
        "kind": r.kind.as_str(),
        "scope": r.scope.as_str(),
        "target": r.target,
        "set_by": r.set_by,
        "set_at_ms": r.set_at_ms,
        "reason": r.reason,
        "lifted_at_ms": r.lifted_at_ms,
        "lifted_by": r.lifted_by,
        "expires_at_ms": r.expires_at_ms,
    })
}

/// `fence list`.
pub(super) fn fences(rows: &[FenceRow], now_ms: i64, as_json: bool) -> CliResult {
    if as_json {
        return json(&Value::Array(rows.iter().map(fence_json).collect()));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let until = match (r.lifted_at_ms, r.expires_at_ms) {
                (None, Some(at)) => format!("{} (in {})", fmt_ms(at), human_secs(at.saturating_sub(now_ms))),
                (Some(_), Some(at)) => fmt_ms(at),
                (_, None) => "-".into(),
            };
            vec![
                r.id.to_string(),
                r.kind.as_str().to_string(),
                r.scope.as_str().to_string(),
                r.target.clone().unwrap_or_else(|| "*".into()),
                r.set_by.clone(),
                fmt_ms(r.set_at_ms),
                until,
                match (r.lifted_at_ms, &r.lifted_by) {
                    (Some(at), Some(by)) => format!("{} by {by}", fmt_ms(at)),
                    (Some(at), None) => fmt_ms(at),
                    (None, _) => "active".into(),
                },
                r.reason.clone(),
            ]
        })
        .collect();
    table(&["ID", "KIND", "SCOPE", "TARGET", "SET BY", "SET AT", "UNTIL", "LIFTED", "REASON"], &rows)
}

fn interval_json(i: &IntervalRow) -> Value {
    json!({
        "join_seq": i.join_seq,
        "joined_at_ms": i.joined_at_ms,
        "joined_by": i.joined_by,
        "join_reason": i.join_reason,
        "leave_seq": i.leave_seq,
        "left_at_ms": i.left_at_ms,
        "left_by": i.left_by,
        "leave_reason": i.leave_reason,
        "family": i.family,
    })
}

fn conversation_members_json(c: &ConversationMembers) -> Value {
    let members: Vec<Value> = c
        .members
        .iter()
        .map(|m| {
            json!({
                "host": m.host,
                "current": m.current,
                "intervals": m.intervals.iter().map(interval_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mentions: Vec<Value> = c
        .mentions
        .iter()
        .map(|g| {
            json!({
                "host": g.host,
                "grant_seq": g.grant_seq,
                "granted_at_ms": g.granted_at_ms,
                "granted_by": g.granted_by,
                "grant_reason": g.grant_reason,
                "revoke_seq": g.revoke_seq,
                "revoked_at_ms": g.revoked_at_ms,
                "revoked_by": g.revoked_by,
                "revoke_reason": g.revoke_reason,
            })
        })
        .collect();
    let pools: Vec<Value> = c
        .pools
        .iter()
        .map(|p| {
            json!({
                "pool": p.pool,
                "current": p.current,
                "intervals": p.intervals.iter().map(interval_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"conversation": c.conversation, "last_seq": c.last_seq, "members": members, "pools": pools,
           "mentions": mentions})
}

/// `members list`: one table row per interval and per mention authorization (its JOINED column
/// says `may be mentioned`; a member pool's HOST column says `pool NAME`), or JSON
/// (`[{"conversation", "last_seq", "members": [{"host", "current", "intervals": [...]}], "pools":
/// [{"pool", "current", "intervals": [...]}], "mentions": [{"host", "grant_seq", ...}]}]`).
pub(super) fn members(rows: &[ConversationMembers], as_json: bool) -> CliResult {
    if as_json {
        return json(&Value::Array(rows.iter().map(conversation_members_json).collect()));
    }
    let mut table_rows: Vec<Vec<String>> = Vec::new();
    for c in rows {
        for m in &c.members {
            for i in &m.intervals {
                let left = match (i.leave_seq, i.left_at_ms) {
                    (Some(seq), Some(at)) => format!("after {seq}, {}", fmt_ms(at)),
                    (Some(seq), None) => format!("after {seq}"),
                    _ => "member".into(),
                };
                table_rows.push(vec![
                    c.conversation.clone(),
                    m.host.clone(),
                    match &i.family {
                        Some(p) => format!("after {}, {} (via {p})", i.join_seq, fmt_ms(i.joined_at_ms)),
                        None => format!("after {}, {}", i.join_seq, fmt_ms(i.joined_at_ms)),
                    },
                    format!("{}: {}", i.joined_by, i.join_reason),
                    left,
                    match (&i.left_by, &i.leave_reason) {
                        (Some(by), Some(why)) => format!("{by}: {why}"),
                        _ => "-".into(),
                    },
                ]);
            }
        }
        let pools = c.pools.iter().flat_map(|p| p.intervals.iter().map(move |i| (format!("pool {}", p.pool), i)));
        for (who, i) in pools {
            table_rows.push(vec![
                c.conversation.clone(),
                who,
                format!("after {}, {}", i.join_seq, fmt_ms(i.joined_at_ms)),
                format!("{}: {}", i.joined_by, i.join_reason),
                match (i.leave_seq, i.left_at_ms) {
                    (Some(seq), Some(at)) => format!("after {seq}, {}", fmt_ms(at)),
                    (Some(seq), None) => format!("after {seq}"),
                    _ => "member".into(),
                },
                match (&i.left_by, &i.leave_reason) {
                    (Some(by), Some(why)) => format!("{by}: {why}"),
                    _ => "-".into(),
                },
            ]);
        }
        for g in &c.mentions {
            table_rows.push(vec![
                c.conversation.clone(),
                g.host.clone(),
                format!("may be mentioned after {}, {}", g.grant_seq, fmt_ms(g.granted_at_ms)),
                format!("{}: {}", g.granted_by, g.grant_reason),
                match (g.revoke_seq, g.revoked_at_ms) {
                    (Some(seq), Some(at)) => format!("after {seq}, {}", fmt_ms(at)),
                    (Some(seq), None) => format!("after {seq}"),
                    _ => "allowed".into(),
                },
                match (&g.revoked_by, &g.revoke_reason) {
                    (Some(by), Some(why)) => format!("{by}: {why}"),
                    _ => "-".into(),
                },
            ]);
        }
    }
    table(&["CONVERSATION", "HOST", "JOINED", "JOINED BY", "LEFT", "LEFT BY"], &table_rows)
}

/// A pool member's standing as JSON: its host's standing, whether it may take the pool's work
/// and why not (`fenced` names the fence), and the pool work it holds.
fn member_json(m: &MemberStanding) -> Value {
    json!({
        "host": m.liveness.host,
        "state": m.liveness.state.map(|s| s.as_str()),
        "active": m.active(),
        "busy": m.busy(),
        "in_flight": m.in_flight,
        "bound_conversations": m.bound_conversations,
        "fenced": m.fenced(),
        "fence": m.fence.as_ref().map(|f| json!({"id": f.id, "kind": f.kind.as_str(), "reason": f.reason})),
        "silent": m.silent(),
        "connected": m.connected(),
        "session": m.liveness.session,
        "last_contact_at_ms": m.liveness.last_contact_at_ms,
    })
}

/// `pools list|show`: a table, or JSON (`[{"name", "created_at_ms", "members": [{"host",
/// "state", "active", "busy", "in_flight", "bound_conversations", "fenced", "fence", "silent",
/// "connected", "session", "last_contact_at_ms"}], "members_may_claim", "queued",
/// "oldest_queued_at_ms", "oldest_queued_age_ms", "in_flight", "bound_conversations"}]`). The
/// oldest queued delivery's age is counted from `now_ms`.
pub(super) fn pools(rows: &[PoolStanding], now_ms: i64, as_json: bool) -> CliResult {
    let age = |at: Option<i64>| at.map(|at| now_ms.saturating_sub(at).max(0));
    if as_json {
        let typed: Vec<Value> = rows
            .iter()
            .map(|p| {
                let s = &p.summary;
                json!({
                    "name": s.name,
                    "created_at_ms": s.created_at_ms,
                    "members": p.members.iter().map(member_json).collect::<Vec<_>>(),
                    "members_may_claim": p.may_claim(),
                    "queued": s.queued,
                    "oldest_queued_at_ms": s.oldest_queued_at_ms,
                    "oldest_queued_age_ms": age(s.oldest_queued_at_ms),
                    "in_flight": s.in_flight,
                    "bound_conversations": s.bound_conversations,
                })
            })
            .collect();
        return json(&Value::Array(typed));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            let s = &p.summary;
            let members: Vec<String> =
                p.members.iter().map(|m| format!("{} ({})", esc(&m.liveness.host), m.words())).collect();
            vec![
                esc(&s.name).into_owned(),
                if members.is_empty() { "-".into() } else { members.join(" ") },
                s.queued.to_string(),
                age(s.oldest_queued_at_ms).map(|ms| format!("{} s", ms / 1000)).unwrap_or_else(|| "-".into()),
                s.in_flight.to_string(),
                s.bound_conversations.to_string(),
            ]
        })
        .collect();
    table(&["POOL", "MEMBERS", "QUEUED", "OLDEST QUEUED", "IN FLIGHT", "BOUND CONVERSATIONS"], &rows)
}

/// `producers list`: a table, or JSON (`[{"name", "conversations", "default_scope",
/// "active_certificates", "revoked_certificates"}]`).
pub(super) fn producers(rows: &[ProducerRow], as_json: bool) -> CliResult {
    if as_json {
        let typed: Vec<Value> = rows
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "conversations": p.conversations,
                    "default_scope": p.default_scope,
                    "active_certificates": p.active_certificates,
                    "revoked_certificates": p.revoked_certificates,
                    "max_unsettled": p.quota.unsettled_max,
                    "max_unsettled_bytes": p.quota.unsettled_bytes_max,
                    "unsettled": p.unsettled,
                    "unsettled_bytes": p.unsettled_bytes,
                    "may_approve": p.may_approve,
                })
            })
            .collect();
        return json(&Value::Array(typed));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.active_certificates.to_string(),
                p.revoked_certificates.to_string(),
                format!("{}{}", p.conversations.join(" "), if p.default_scope { " (default)" } else { "" }),
                format!("{} msgs, {} bytes", p.unsettled, p.unsettled_bytes),
                quota(&p.quota),
            ]
        })
        .collect();
    table(&["PRODUCER", "CERTS", "REVOKED", "MAY POST INTO", "UNSETTLED", "QUOTA"], &rows)
}

/// A producer's quota in one phrase: `unlimited` (the default), or its limits.
pub(super) fn quota(q: &crate::store::registry::producers::Quota) -> String {
    let shown = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |v| v.to_string());
    if q.unsettled_max.is_none() && q.unsettled_bytes_max.is_none() {
        return "unlimited".into();
    }
    format!("max_unsettled {} max_unsettled_bytes {}", shown(q.unsettled_max), shown(q.unsettled_bytes_max))
}

/// Where a delivery goes, in a cell: its host, `pool P` while it waits in pool P, or
/// `H (pool P)` once member H took it.
fn recipient(r: &DeliveryRow) -> String {
    match (&r.host, &r.pool) {
        (Some(h), None) => esc(h).into_owned(),
        (Some(h), Some(p)) => format!("{} (pool {})", esc(h), esc(p)),
        (None, Some(p)) => format!("pool {}", esc(p)),
        (None, None) => "-".into(),
    }
}

fn delivery_json(r: &DeliveryRow) -> Value {
    json!({
        "delivery_id": r.delivery_id,
        "message_id": r.message_id,
        "host": r.host,
        "pool": r.pool,
        "conversation": r.conversation,
        "seq": r.seq,
        "state": r.state.as_str(),
        "instance_id": r.instance_id,
        "reason": r.reason,
        "updated_at_ms": r.updated_at_ms,
        "outcome": r.outcome.map(|o| o.as_str()),
    })
}

/// Listed deliveries: each row that is not final with its one-line reason; in JSON each with
/// its `cursor` (the `--after` of the page after it), in a table with its short id.
pub(super) fn deliveries(rows: &[Listed], as_json: bool) -> CliResult {
    if as_json {
        let rows = rows
            .iter()
            .map(|l| {
                let mut v = delivery_json(&l.row);
                v["stored_reason"] = json!(l.row.reason);
                v["reason_code"] = json!(l.why.as_ref().map(|w| w.code));
                if let Some(w) = &l.why {
                    v["reason"] = json!(w.text);
                }
                v["cursor"] = json!(l.cursor);
                v
            })
            .collect();
        return json(&Value::Array(rows));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|l| {
            let r = &l.row;
            vec![
                l.short_id.clone().unwrap_or_else(|| r.delivery_id.clone()),
                recipient(r),
                r.conversation.clone(),
                r.seq.to_string(),
                r.state.to_string(),
                r.outcome.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
                fmt_ms(r.updated_at_ms),
                l.why.as_ref().map(|w| w.text.clone()).or_else(|| r.reason.clone()).unwrap_or_default(),
            ]
        })
        .collect();
    table(&["DELIVERY", "HOST", "CONVERSATION", "SEQ", "STATE", "OUTCOME", "UPDATED", "REASON"], &rows)
}

fn fence_hold_json(f: &FenceHold) -> Value {
    json!({
        "id": f.id,
        "kind": f.kind.as_str(),
        "scope": f.scope.as_str(),
        "target": f.target,
        "set_by": f.set_by,
        "set_at_ms": f.set_at_ms,
        "reason": f.reason,
        "expires_at_ms": f.expires_at_ms,
    })
}

fn behind_json(b: &Behind) -> Value {
    match b {
        Behind::Delivery { delivery_id, seq, state, host, pool, has_outcome } => json!({
            "kind": "delivery",
            "delivery_id": delivery_id,
            "message_id": Value::Null,
            "seq": seq,
            "state": state.as_str(),
            "host": host,
            "pool": pool,
            "has_outcome": has_outcome,
        }),
        Behind::FanOut { message_id, seq } => json!({
            "kind": "fan_out",
            "delivery_id": Value::Null,
            "message_id": message_id,
            "seq": seq,
            "state": Value::Null,
            "host": Value::Null,
            "pool": Value::Null,
            "has_outcome": false,
        }),
    }
}

fn liveness_json(l: &Liveness) -> Value {
    json!({
        "host": l.host,
        "state": l.state.map(|s| s.as_str()),
        "instance_id": l.instance_id,
        "session": l.session,
        "last_contact_at_ms": l.last_contact_at_ms,
        "session_ended_at_ms": l.session_ended_at_ms,
        "silent_for_ms": l.silent_for_ms,
        "host_silence_warn_ms": l.silence_warn_ms,
        "silent": l.silent(),
    })
}

/// A pool conversation's binding as JSON: `{"kind": "bound"|"preferred"|"free", "host",
/// "in_flight", "turn", "until_ms", "last_host"}` (what a kind lacks is `null`).
fn binding_json(b: &Binding) -> Value {
    match b {
        Binding::Bound { host, in_flight, turn } => json!({
            "kind": "bound",
            "host": host,
            "in_flight": in_flight,
            "turn": turn.as_ref().map(|t| json!({"delivery_id": t.delivery_id, "seq": t.seq, "state": t.state.as_str()})),
            "until_ms": Value::Null,
            "last_host": Value::Null,
        }),
        Binding::Preferred { host, until_ms } => json!({
            "kind": "preferred",
            "host": host,
            "in_flight": 0,
            "turn": Value::Null,
            "until_ms": until_ms,
            "last_host": host,
        }),
        Binding::Free { last_host } => json!({
            "kind": "free",
            "host": Value::Null,
            "in_flight": 0,
            "turn": Value::Null,
            "until_ms": Value::Null,
            "last_host": last_host,
        }),
    }
}

/// A pool conversation's binding in words.
fn binding_words(b: &Binding) -> String {
    match b {
        Binding::Bound { host, in_flight, turn } => {
            let turn = turn
                .as_ref()
                .map(|t| format!(": turn seq {} (delivery {}, {})", t.seq, esc(&t.delivery_id), t.state))
                .unwrap_or_default();
            format!("bound to {} ({in_flight} turn(s) in flight there{turn})", esc(host))
        }
        Binding::Preferred { host, until_ms } => {
            format!("kept for its last host {} until {} (pool_affinity_wait)", esc(host), fmt_ms(*until_ms))
        }
        Binding::Free { last_host } => format!(
            "free: any member may take the next turn{}",
            last_host.as_ref().map(|h| format!(" (last host {})", esc(h))).unwrap_or_default()
        ),
    }
}

/// `deliveries explain`: one screen, or JSON (`{"delivery", "reason", "reason_code", "fence",
/// "behind", "host", "pool", "run", "cancel"}`; absent parts are `null`: `host` for a pool
/// delivery no member has claimed, `pool` for a host's own delivery). `pool` is `{"name",
/// "members": [...as pools show...], "members_may_claim", "conversation": binding}`.
pub(super) fn explanation(e: &Explanation, now_ms: i64, as_json: bool) -> CliResult {
    let run = &e.run;
    if as_json {
        return json(&json!({
            "delivery": delivery_json(&e.delivery),
            "reason": e.reason.text,
            "reason_code": e.reason.code,
            "fence": e.fence.as_ref().map(fence_hold_json),
            "behind": e.behind.as_ref().map(behind_json),
            "host": e.host.as_ref().map(liveness_json),
            "pool": e.pool.as_ref().map(|p| json!({
                "name": p.name,
                "members": p.members.iter().map(member_json).collect::<Vec<_>>(),
                "members_may_claim": p.members.iter().filter(|m| m.may_claim()).count(),
                "conversation": binding_json(&p.binding),
            })),
            "run": {
                "attempt": run.attempt,
                "max_attempts": run.max_attempts,
                "rerun": run.rerun.map(|r| r.as_str()),
                "not_before_ms": run.not_before_ms,
                "started_at_ms": run.started.map(|(at, _)| at),
                "started_session": run.started.map(|(_, s)| s),
                "running_for_ms": run.started.filter(|_| run.outcome.is_none()).map(|(at, _)| (now_ms - at).max(0)),
                "report_outstanding": run.started.is_some() && run.outcome.is_none(),
                "outcome": run.outcome.map(|o| o.as_str()),
                "progress": run.progress.as_ref().map(progress_json),
            },
            "cancel": run.cancel.as_ref().map(|c| json!({"at_ms": c.at_ms, "by": c.by, "reason": c.reason})),
        }));
    }
    let d = &e.delivery;
    let mut o = out();
    writeln!(o, "delivery      {}", esc(&d.delivery_id))?;
    writeln!(o, "message       {} (conversation {}, seq {})", esc(&d.message_id), esc(&d.conversation), d.seq)?;
    writeln!(
        o,
        "state         {}{}",
        d.state,
        d.instance_id.as_ref().map(|i| format!(", held by instance {}", esc(i))).unwrap_or_default()
    )?;
    writeln!(o, "why           {}", esc(&e.reason.text))?;
    match &e.fence {
        Some(f) => writeln!(
            o,
            "fence         {} {} on {}{}, set by {} at {}: {}{}",
            f.kind.as_str(),
            f.id,
            f.scope.as_str(),
            f.target.as_ref().map(|t| format!(" {}", esc(t))).unwrap_or_default(),
            esc(&f.set_by),
            fmt_ms(f.set_at_ms),
            esc(&f.reason),
            f.expires_at_ms.map(|at| format!(" (until {})", fmt_ms(at))).unwrap_or_default()
        )?,
        None => writeln!(o, "fence         none")?,
    }
    match &e.behind {
        Some(Behind::Delivery { delivery_id, seq, state, host, pool, .. }) => {
            let at = match (host, pool) {
                (Some(h), _) => format!("on {}", esc(h)),
                (None, p) => format!("in pool {}", esc(p.as_deref().unwrap_or("?"))),
            };
            writeln!(o, "behind        seq {seq}: delivery {}, {state} {at}", esc(delivery_id))?
        }
        Some(Behind::FanOut { message_id, seq }) => {
            writeln!(o, "behind        seq {seq}: message {}, fan-out pending", esc(message_id))?
        }
        None => writeln!(o, "behind        nothing")?,
    }
    match &e.host {
        Some(h) => writeln!(
            o,
            "host          {} {}{}; {}",
            esc(&h.host),
            h.state.map(|s| s.as_str()).unwrap_or("not enrolled"),
            h.instance_id.as_ref().map(|i| format!(", bound instance {}", esc(i))).unwrap_or_default(),
            esc(&explain::liveness_words(h, now_ms))
        )?,
        None => writeln!(o, "host          none yet: it waits in its pool for a member's claim")?,
    }
    if let Some(p) = &e.pool {
        let may = p.members.iter().filter(|m| m.may_claim()).count();
        writeln!(o, "pool          {}: {} member(s), {may} may take pool work", esc(&p.name), p.members.len())?;
        for m in &p.members {
            let busy = if m.busy() {
                format!(", busy ({} in flight, {} bound conversation(s))", m.in_flight, m.bound_conversations)
            } else {
                String::new()
            };
            let why =
                explain::member_hindrance(m, now_ms).unwrap_or_else(|| explain::liveness_words(&m.liveness, now_ms));
            writeln!(o, "  member      {} {}{busy}; {}", esc(&m.liveness.host), m.words(), esc(&why))?;
        }
        writeln!(o, "conversation  {}", binding_words(&p.binding))?;
    }
    let started = match (run.started, run.outcome) {
        (_, Some(outcome)) => format!("ended {outcome}"),
        (Some((at, session)), None) => format!(
            "started {} by node session {session}, running for {}; report outstanding",
            fmt_ms(at),
            human_secs(now_ms - at)
        ),
        (None, None) => "not started".into(),
    };
    writeln!(
        o,
        "run           {} of {}{}; {started}{}",
        run.attempt,
        run.max_attempts,
        run.rerun.map(|r| format!(" ({})", r.as_str())).unwrap_or_default(),
        run.not_before_ms.map(|at| format!("; retry not before {}", fmt_ms(at))).unwrap_or_default()
    )?;
    if let Some(p) = &run.progress {
        writeln!(o, "progress      {}", progress_words(p, now_ms))?;
    }
    if let Some(c) = &run.cancel {
        writeln!(
            o,
            "cancel        asked by {} at {}{}",
            esc(&c.by),
            fmt_ms(c.at_ms),
            c.reason.as_ref().map(|r| format!(": {}", esc(r))).unwrap_or_default()
        )?;
    }
    Ok(())
}

/// A run's progress as JSON: the events kept and dropped, and the newest one.
fn progress_json(p: &LastProgress) -> Value {
    json!({
        "events": p.events,
        "dropped": p.dropped,
        "last_seq": p.last.as_ref().map(|(seq, _, _)| seq),
        "last_at_ms": p.last.as_ref().map(|(_, at, _)| at),
        "last": p.last.as_ref().and_then(|(_, _, body)| serde_json::from_str::<Value>(body).ok()),
    })
}

/// A run's progress in words: `12 event(s), 0 dropped; last #12 3s ago: {...}` (the event cut to
/// `PROGRESS_SHOWN_CHARS_MAX` characters, escaped).
fn progress_words(p: &LastProgress, now_ms: i64) -> String {
    let last = match &p.last {
        Some((seq, at, body)) => {
            let shown: String = body.chars().take(PROGRESS_SHOWN_CHARS_MAX).collect();
            let cut = if shown.len() < body.len() { "…" } else { "" };
            format!("; last #{seq} {} ago: {}{cut}", human_secs(now_ms - at), esc(&shown))
        }
        None => String::new(),
    };
    format!("{} event(s), {} dropped{last}", p.events, p.dropped)
}

/// Most characters of a progress event a human view shows.
pub(super) const PROGRESS_SHOWN_CHARS_MAX: usize = 120;

/// `deliveries list --running`: the running turns, longest running first, with their host's
/// liveness and their progress; a table, or JSON (`[{"delivery_id", "host", "conversation",
/// "seq", "attempt", "started_at_ms", "running_for_ms", "node_last_contact_ms", "host_silent",
/// "progress"}]`).
pub(super) fn running(rows: &[RunningTurn], silent: &[String], now_ms: i64, as_json: bool) -> CliResult {
    if as_json {
        let v: Vec<Value> = rows
            .iter()
            .map(|t| {
                json!({
                    "delivery_id": t.delivery_id,
                    "host": t.host,
                    "conversation": t.conversation,
                    "seq": t.seq,
                    "attempt": t.attempt,
                    "started_at_ms": t.started_at_ms,
                    "running_for_ms": (now_ms - t.started_at_ms).max(0),
                    "node_last_contact_ms": t.node_last_contact_ms,
                    "host_silent": silent.contains(&t.host),
                    "progress": t.progress.as_ref().map(progress_json),
                })
            })
            .collect();
        return json(&Value::Array(v));
    }
    let mut o = out();
    writeln!(
        o,
        "{:<36}  {:<16}  {:<16}  {:>6}  {:>3}  {:<12}  {:<16}  PROGRESS",
        "DELIVERY", "HOST", "CONVERSATION", "SEQ", "RUN", "RUNNING FOR", "NODE HEARD"
    )?;
    for t in rows {
        let heard = match t.node_last_contact_ms {
            Some(at) => format!("{} ago", human_secs(now_ms - at)),
            None => "-".into(),
        };
        let heard = if silent.contains(&t.host) { format!("{heard} SILENT") } else { heard };
        let progress = t.progress.as_ref().map_or("-".to_string(), |p| progress_words(p, now_ms));
        writeln!(
            o,
            "{:<36}  {:<16}  {:<16}  {:>6}  {:>3}  {:<12}  {:<16}  {}",
            esc(&t.delivery_id),
            esc(&t.host),
            esc(&t.conversation),
            t.seq,
            t.attempt,
            human_secs(now_ms - t.started_at_ms),
            heard,
            progress
        )?;
    }
    Ok(())
}

/// A listing's note that it stopped at its limit, on stderr (stdout stays the listing alone).
pub(super) fn more_remain(note: &str) -> CliResult {
    writeln!(std::io::stderr().lock(), "{note}")?;
    Ok(())
}

/// `certs list`: a table, or JSON (`[{"serial", "role", "name", "issued_at_ms",
/// "not_after_unix", "revoked", "revoked_at_ms", "revoked_by", "revoked_reason"}]`).
pub(super) fn certs(rows: &[CertRow], issuers: &[super::views::IssuedBy], now_ms: i64, as_json: bool) -> CliResult {
    if as_json {
        let typed = rows.iter().zip(issuers).map(|(c, by)| {
            let mut v = cert_json(c);
            v["ca"] = by.key_id.as_ref().map_or(Value::Null, |k| json!({"key_id": k, "trusted": by.trusted}));
            v
        });
        return json(&Value::Array(typed.collect()));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .zip(issuers)
        .map(|(c, by)| {
            vec![
                c.name.clone(),
                c.role.as_str().to_string(),
                c.serial.clone(),
                by.to_string(),
                fmt_ms(c.issued_at_ms),
                fmt_not_after(c.not_after_unix, now_ms),
                match &c.revoked {
                    Some((at, by, why)) => format!("{} by {by}: {why}", fmt_ms(*at)),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    table(&["NAME", "ROLE", "SERIAL", "CA", "ISSUED", "NOT AFTER", "REVOKED"], &rows)
}

/// `audit`: a table, or JSON (`[{"at_ms", "source", "id", "action", "subject", "actor_kind",
/// "actor", "reason"}]`), newest first.
pub(super) fn audit(rows: &[AuditEntry], as_json: bool) -> CliResult {
    if as_json {
        let typed: Vec<Value> = rows
            .iter()
            .map(|e| {
                json!({
                    "at_ms": e.at_ms,
                    "source": e.source.as_str(),
                    "id": e.id,
                    "action": e.action,
                    "subject": e.subject,
                    "actor_kind": e.actor_kind.as_str(),
                    "actor": e.actor,
                    "reason": e.reason,
                    "cursor": AuditCursor::after(e).to_string(),
                })
            })
            .collect();
        return json(&Value::Array(typed));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|e| {
            vec![
                fmt_ms(e.at_ms),
                format!("{} {}", e.actor_kind.as_str(), e.actor),
                e.action.clone(),
                e.subject.clone(),
                e.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(&["AT", "ACTOR", "ACTION", "SUBJECT", "REASON"], &rows)
}

/// The cursor of a listing's next page, on stderr so that stdout stays the page alone (a JSON
/// array for scripts).
pub(super) fn next_page(order: &str, cursor: i64) -> CliResult {
    let order = if order.is_empty() { String::new() } else { format!("{order} ") };
    writeln!(std::io::stderr().lock(), "more remain; next page: {order}--after {cursor}")?;
    Ok(())
}

/// `deliveries show`.
pub(super) fn detail(d: &DeliveryDetail, as_json: bool) -> CliResult {
    if as_json {
        let events: Vec<Value> = d
            .events
            .iter()
            .map(|e| {
                json!({
                    "id": e.id,
                    "from_state": e.from_state.map(|s| s.as_str()),
                    "to_state": e.to_state.as_str(),
                    "actor_kind": e.actor_kind.as_str(),
                    "actor": e.actor,
                    "instance_id": e.instance_id,
                    "reason": e.reason,
                    "at_ms": e.at_ms,
                })
            })
            .collect();
        return json(&json!({"delivery": delivery_json(&d.delivery), "events": events, "attempts": d.attempts}));
    }
    let r = &d.delivery;
    let mut o = out();
    writeln!(o, "delivery      {}", esc(&r.delivery_id))?;
    writeln!(o, "message       {}", esc(&r.message_id))?;
    writeln!(o, "host          {}", recipient(r))?;
    writeln!(o, "conversation  {} (seq {})", esc(&r.conversation), r.seq)?;
    writeln!(o, "state         {}", r.state)?;
    if let Some(i) = &r.instance_id {
        writeln!(o, "instance      {}", esc(i))?;
    }
    if let Some(reason) = &r.reason {
        writeln!(o, "reason        {}", esc(reason))?;
    }
    writeln!(o, "events:")?;
    for e in &d.events {
        writeln!(
            o,
            "  {}  {:>9} -> {:<9}  {} {}{}",
            fmt_ms(e.at_ms),
            e.from_state.map(|s| s.to_string()).unwrap_or_else(|| "(new)".into()),
            e.to_state,
            e.actor_kind.as_str(),
            esc(&e.actor),
            e.reason.as_ref().map(|r| format!(": {}", esc(r))).unwrap_or_default()
        )?;
    }
    writeln!(o, "attempts:")?;
    for a in &d.attempts {
        writeln!(
            o,
            "  run {}{}{}  by {}",
            a.attempt,
            a.rerun.map(|r| format!(" ({})", r.as_str())).unwrap_or_default(),
            if a.retryable { "  retryable" } else { "" },
            esc(a.caused_by.as_deref().unwrap_or("-"))
        )?;
        writeln!(
            o,
            "    {}  {}  exit {}  {}{}",
            fmt_ms(a.reported_at_ms),
            a.outcome,
            a.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            a.duration_ms.map(|ms| human_ms(i64::try_from(ms).unwrap_or(i64::MAX))).unwrap_or_else(|| "-".into()),
            a.reason.as_ref().map(|r| format!("  ({})", esc(r))).unwrap_or_default()
        )?;
        if let Some(r) = &a.result {
            writeln!(o, "    result: {}", esc_block(r, "            "))?;
        }
        if let Some(tail) = &a.stderr_tail {
            writeln!(o, "    stderr{}: {}", dropped_note(a.stderr_dropped_bytes), esc_block(tail, "            "))?;
        }
    }
    Ok(())
}

/// What a stderr tail's heading says of the bytes before it: nothing when it is all there was.
fn dropped_note(dropped: Option<u64>) -> String {
    match dropped {
        Some(n) if n > 0 => format!(" (last part; {n} earlier bytes dropped)"),
        _ => String::new(),
    }
}

/// "2026-01-02 03:04:05 (1m 0.003s ago)": a past moment and how long ago it was.
fn fmt_ago(at_ms: i64, now_ms: i64) -> String {
    format!("{} ({} ago)", fmt_ms(at_ms), human_secs(now_ms.saturating_sub(at_ms)))
}

/// A span of milliseconds as a human duration to the whole second (a countdown or an age,
/// where milliseconds are noise); a negative one shows as `0s`.
fn human_secs(ms: i64) -> String {
    human_ms(ms.max(0) / 1000 * 1000)
}

fn session_json(s: &SessionRow) -> Value {
    json!({
        "session": s.session,
        "instance_id": s.instance_id,
        "node_version": s.node_version,
        "started_at_ms": s.started_at_ms,
        "last_contact_at_ms": s.last_contact_at_ms,
        "ended_at_ms": s.ended_at_ms,
        "ended_how": s.ended_how.map(|e| e.as_str()),
        "took_over": s.took_over,
    })
}

fn host_json(h: &HostRow) -> Value {
    json!({
        "host": h.name,
        "state": h.state.as_str(),
        "enrolled_at_ms": h.enrolled_at_ms,
        "retired_at_ms": h.retired.as_ref().map(|r| r.0),
        "retired_by": h.retired.as_ref().map(|r| &r.1),
        "retired_reason": h.retired.as_ref().map(|r| &r.2),
        "instance_id": h.instance.as_ref().map(|i| &i.0),
        "instance_since_ms": h.instance.as_ref().map(|i| i.1),
        "session": h.session.as_ref().map(session_json),
        "holdings": {"claimed": h.holdings.claimed, "mirrored": h.holdings.mirrored, "delivered": h.holdings.delivered},
        "waiting": h.waiting,
        "certificates_active": h.certificates_active,
        "pools": h.pools,
    })
}

/// The session column: "N since T", "N ended clean", or "no session".
fn session_cell(s: Option<&SessionRow>) -> String {
    match s {
        None => "no session".into(),
        Some(s) => match s.ended_how {
            Some(how) => format!("{} (ended {})", s.session, how.as_str()),
            None => format!("{} since {}", s.session, fmt_ms(s.started_at_ms)),
        },
    }
}

/// `hosts list`: a table, or JSON (`[{"host", "state", "instance_id", "session": {…} | null,
/// "holdings": {"claimed", "mirrored", "delivered"}, "waiting", …}]`).
/// Whether `h` is silent: its newest session is open and has sent nothing for longer than
/// `silence_warn_ms`, the host not retired (the rule `status` flags by, `store::views::fleet::silent_hosts`).
fn host_silent(h: &HostRow, now_ms: i64, silence_warn_ms: i64) -> bool {
    h.state != HostState::Retired
        && h.session
            .as_ref()
            .is_some_and(|s| s.ended_at_ms.is_none() && s.last_contact_at_ms < now_ms.saturating_sub(silence_warn_ms))
}

pub(super) fn hosts(rows: &[HostRow], now_ms: i64, silence_warn_ms: i64, as_json: bool) -> CliResult {
    if as_json {
        return json(&Value::Array(
            rows.iter()
                .map(|h| {
                    let mut v = host_json(h);
                    v["silent"] = Value::Bool(host_silent(h, now_ms, silence_warn_ms));
                    v
                })
                .collect(),
        ));
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|h| {
            vec![
                h.name.clone(),
                h.state.as_str().to_string(),
                h.instance.as_ref().map(|i| i.0.clone()).unwrap_or_else(|| "-".into()),
                session_cell(h.session.as_ref()),
                h.session.as_ref().and_then(|s| s.node_version.clone()).unwrap_or_else(|| "-".into()),
                match &h.session {
                    Some(s) if host_silent(h, now_ms, silence_warn_ms) => {
                        format!("{} SILENT", fmt_ago(s.last_contact_at_ms, now_ms))
                    }
                    Some(s) => fmt_ago(s.last_contact_at_ms, now_ms),
                    None => "-".into(),
                },
                format!("{}/{}/{}", h.holdings.claimed, h.holdings.mirrored, h.holdings.delivered),
                h.waiting.to_string(),
                if h.pools.is_empty() { "-".into() } else { h.pools.join(" ") },
            ]
        })
        .collect();
    table(
        &[
            "HOST",
            "STATE",
            "INSTANCE",
            "SESSION",
            "VERSION",
            "LAST CONTACT",
            "CLAIMED/MIRRORED/RUNNING",
            "WAITING",
            "POOLS",
        ],
        &rows,
    )
}

fn cert_json(c: &CertRow) -> Value {
    json!({
        "serial": c.serial,
        "role": c.role.as_str(),
        "name": c.name,
        "issued_at_ms": c.issued_at_ms,
        "not_after_unix": c.not_after_unix,
        "revoked": c.revoked.is_some(),
        "revoked_at_ms": c.revoked.as_ref().map(|r| r.0),
        "revoked_by": c.revoked.as_ref().map(|r| &r.1),
        "revoked_reason": c.revoked.as_ref().map(|r| &r.2),
    })
}

fn event_json(e: &HostEvent) -> Value {
    json!({"at_ms": e.at_ms, "kind": e.kind, "action": e.action, "subject": e.subject, "actor": e.actor, "reason": e.reason})
}

/// A certificate's expiry as a date, and whether it is past `now_ms`.
fn fmt_not_after(not_after_unix: i64, now_ms: i64) -> String {
    let at_ms = not_after_unix.saturating_mul(1000);
    if at_ms <= now_ms { format!("{} (expired)", fmt_ms(at_ms)) } else { fmt_ms(at_ms) }
}

/// `hosts show HOST`: the host, its session, certificates and recent events; or JSON
/// (`{"host": {…as in hosts list}, "certificates": […], "events": […]}`).
pub(super) fn host(d: &HostDetail, now_ms: i64, as_json: bool) -> CliResult {
    if as_json {
        return json(&json!({
            "host": host_json(&d.host),
            "certificates": d.certificates.iter().map(cert_json).collect::<Vec<_>>(),
            "events": d.events.iter().map(event_json).collect::<Vec<_>>(),
        }));
    }
    let h = &d.host;
    let mut o = out();
    writeln!(o, "host          {}", esc(&h.name))?;
    writeln!(o, "state         {}", h.state.as_str())?;
    writeln!(o, "enrolled      {}", fmt_ms(h.enrolled_at_ms))?;
    if let Some((at, by, why)) = &h.retired {
        writeln!(o, "retired       {} by {}: {}", fmt_ms(*at), esc(by), esc(why))?;
    }
    match &h.instance {
        Some((i, since)) => writeln!(o, "instance      {} (bound since {})", esc(i), fmt_ms(*since))?,
        None => writeln!(o, "instance      none bound")?,
    }
    match &h.session {
        None => writeln!(o, "session       no session (its node never registered one)")?,
        Some(s) => {
            writeln!(
                o,
                "session       {} of instance {}, started {}",
                s.session,
                esc(&s.instance_id),
                fmt_ms(s.started_at_ms)
            )?;
            if let Some(prev) = s.took_over {
                writeln!(o, "              took over session {prev}, which had not ended")?;
            }
            if let (Some(at), Some(how)) = (s.ended_at_ms, s.ended_how) {
                writeln!(o, "              ended {} ({})", fmt_ms(at), how.as_str())?;
            }
            writeln!(o, "last contact  {}", fmt_ago(s.last_contact_at_ms, now_ms))?;
            writeln!(o, "node version  {}", s.node_version.as_deref().map(esc).unwrap_or_else(|| "-".into()))?;
        }
    }
    writeln!(
        o,
        "holdings      {} claimed, {} mirrored, {} delivered without an outcome",
        h.holdings.claimed, h.holdings.mirrored, h.holdings.delivered
    )?;
    writeln!(o, "waiting       {} queued or held", h.waiting)?;
    writeln!(o, "certificates:")?;
    for c in &d.certificates {
        let revoked = match &c.revoked {
            Some((at, by, why)) => format!("  revoked {} by {}: {}", fmt_ms(*at), esc(by), esc(why)),
            None => String::new(),
        };
        writeln!(o, "  {}  not after {}{revoked}", esc(&c.serial), fmt_not_after(c.not_after_unix, now_ms))?;
    }
    writeln!(o, "recent events:")?;
    for e in &d.events {
        writeln!(
            o,
            "  {}  {:<8}  {}  {}  {}{}",
            fmt_ms(e.at_ms),
            e.kind,
            esc(&e.action),
            esc(&e.subject),
            esc(&e.actor),
            e.reason.as_deref().map(|r| format!(": {}", esc(r))).unwrap_or_default()
        )?;
    }
    Ok(())
}

/// `status`: the record's counts, whether a hub serves this data directory, and what needs
/// attention (`"attention": [{"kind", "subject", "detail"}]` in JSON).
pub(super) fn status(
    s: &StatusView,
    hub: Option<&Holder>,
    store: StoreSize,
    attention: &[Attention],
    as_json: bool,
) -> CliResult {
    if as_json {
        let deliveries: Vec<Value> = s.deliveries.iter().map(|(st, n)| json!([st.as_str(), n])).collect();
        let attention: Vec<Value> =
            attention.iter().map(|a| json!({"kind": a.kind, "subject": a.subject, "detail": a.detail})).collect();
        return json(&json!({
            "deliveries": deliveries,
            "messages": s.messages,
            "pending_fanout": s.pending_fanout,
            "active_fences": s.active_fences,
            "hosts": s.hosts,
            "attempts": s.attempts,
            "schema_version": s.schema_version,
            "hub_running": hub.is_some(),
            "hub_pid": hub.and_then(|h| h.pid),
            "hub_listen": hub.and_then(|h| h.listen).map(|a| a.to_string()),
            "store_bytes": store.bytes,
            "store_bytes_max": store.bytes_max,
            "store_full": store.bytes > store.bytes_max,
            "attention": attention,
        }));
    }
    let mut o = out();
    match hub {
        Some(h) => writeln!(o, "hub           running ({h})")?,
        None => writeln!(o, "hub           not running")?,
    }
    writeln!(o, "schema        version {}", s.schema_version)?;
    let full = if store.bytes > store.bytes_max { " (FULL: submissions refused)" } else { "" };
    writeln!(o, "store         {} of {} bytes (store_bytes_max){full}", store.bytes, store.bytes_max)?;
    writeln!(o, "hosts         {}", s.hosts)?;
    writeln!(o, "messages      {}", s.messages)?;
    writeln!(o, "fan-out due   {}", s.pending_fanout)?;
    writeln!(o, "fences        {} active", s.active_fences)?;
    writeln!(o, "attempts      {}", s.attempts)?;
    writeln!(o, "deliveries:")?;
    for (state, n) in &s.deliveries {
        writeln!(o, "  {:<10} {n}", state.as_str())?;
    }
    if attention.is_empty() {
        writeln!(o, "attention     none")?;
    } else {
        writeln!(o, "attention:")?;
        for a in attention {
            writeln!(o, "  {:<20} {}: {}", a.kind, esc(&a.subject), esc(&a.detail))?;
        }
    }
    Ok(())
}

/// `verify`: every problem, typed in JSON (`{"problems": [{"kind", "subject", "detail"}]}`).
pub(super) fn problems(problems: &[Problem], as_json: bool) -> CliResult {
    if as_json {
        let typed: Vec<Value> = problems
            .iter()
            .map(|p| json!({"kind": p.kind.as_str(), "subject": p.subject, "detail": p.detail}))
            .collect();
        return json(&json!({ "problems": typed }));
    }
    if problems.is_empty() {
        return line("ok: no invariant violated");
    }
    for p in problems {
        line(esc(&p.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case: what `esc` shows for `raw`.
    fn check(raw: &str, shown: &str) {
        assert_eq!(esc(raw), shown, "{raw:?}");
        assert!(!esc(raw).chars().any(unsafe_char), "{raw:?}");
    }

    #[test]
    fn stored_text_reaches_the_terminal_escaped() {
        check("plain text, ünïcode ok", "plain text, ünïcode ok");
        check("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H");
        check("\x1b]52;c;aGVsbG8=\x07", "\\x1b]52;c;aGVsbG8=\\x07");
        check("row\nfake  row\r\t", "row\\nfake  row\\r\\t");
        check("\u{9b}31m \u{7f}", "\\x9b31m \\x7f");
        check("abc\u{202e}fed", "abc\\u{202e}fed");
        assert!(matches!(esc("clean"), Cow::Borrowed(_)));
        assert_eq!(esc_block("line 1\r\nline \x1b2\n\n", "  "), "line 1\n  line \\x1b2");
    }

    #[test]
    fn timestamps_show_as_utc_and_out_of_range_as_numbers() {
        assert_eq!(fmt_ms(0), "1970-01-01 00:00:00");
        assert_eq!(fmt_ms(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(fmt_ms(i64::MAX), format!("{} ms", i64::MAX));
    }
}
