//! `audit [--since T] [--actor A] [--limit N] [--after CURSOR] [--json]`: what operators and the hub did,
//! newest first, from the operator event log and the delivery transitions they made.

use super::{CliError, CliResult, Context, output};
use crate::store::registry::audit::AuditCursor;
use baton_shared::{duration, exit};

/// What `audit` was asked for, as typed.
pub(super) struct Query<'a> {
    /// `--since`: a time, or a duration ago.
    pub(super) since: Option<&'a str>,
    /// `--actor`.
    pub(super) actor: Option<&'a str>,
    /// `--limit`.
    pub(super) limit: u32,
    /// `--after`: the cursor a previous page printed.
    pub(super) after: Option<&'a str>,
}

/// Runs `audit`. Exit 1 when nothing matches; when more matched than `--limit`, prints the next
/// page's cursor on stderr.
pub(super) fn run(ctx: &Context, q: Query<'_>, json: bool) -> CliResult {
    let since_ms = match q.since {
        None => None,
        Some(t) => Some(match duration::parse("--since", t) {
            Ok(ago) => ctx.now_ms().saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)),
            Err(_) => duration::parse_time_ms("--since", t).map_err(CliError::usage)?,
        }),
    };
    let after = q.after.map(AuditCursor::parse).transpose().map_err(CliError::usage)?;
    let record = ctx.open_read()?;
    let (entries, more) = record.run(record.audit(since_ms, q.actor.map(str::to_string), after, q.limit))?;
    output::audit(&entries, json)?;
    if let (true, Some(last)) = (more, entries.last()) {
        output::more_remain(&format!("more remain; next page: --after {}", AuditCursor::after(last)))?;
    }
    if entries.is_empty() {
        return Err(CliError::new(exit::NOTHING, "nothing matches"));
    }
    Ok(())
}
