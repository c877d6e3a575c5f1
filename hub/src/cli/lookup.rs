//! What an operator's words name: a delivery from an id or its unique start, a moment from a
//! time or a duration ago, and the hub's thresholds the views judge liveness and a pool
//! conversation's binding by.

use super::{CliError, Context, Record, output};
use crate::store::views::listing::{self, Resolved};
use crate::store::views::pool_standing::Judging;
use baton_shared::{duration, exit};

/// The hub's `host_silence_warn` (ms), against which liveness is told.
pub(super) fn silence_warn_ms(ctx: &Context) -> Result<i64, CliError> {
    Ok(i64::try_from(ctx.config(None)?.host_silence_warn.as_millis()).unwrap_or(i64::MAX))
}

/// The moment and the hub's thresholds (`host_silence_warn`, `limits.pool_affinity_wait`) the
/// views judge members, hosts and pool conversations by.
pub(super) fn judging(ctx: &Context) -> Result<Judging, CliError> {
    let config = ctx.config(None)?;
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    Ok(Judging {
        now_ms: ctx.now_ms(),
        silence_warn_ms: ms(config.host_silence_warn),
        affinity_wait_ms: ms(config.limits.pool_affinity_wait),
    })
}

/// The delivery an id or a unique prefix names: exit 1 when none, exit 2 listing the matches
/// when several.
pub(super) fn resolve_id(record: &Record, prefix: &str) -> Result<String, CliError> {
    match record.run(record.resolve_delivery(prefix.to_string()))? {
        Resolved::One(id) => Ok(id),
        Resolved::Nothing => Err(CliError::new(exit::NOTHING, format!("no delivery {}", output::esc(prefix)))),
        Resolved::Many(ids) => Err(CliError::usage(format!(
            "{} is the start of several delivery ids: {}{}; give more of it",
            output::esc(prefix),
            ids.join(", "),
            if ids.len() >= listing::PREFIX_MATCHES_SHOWN_MAX { ", …" } else { "" }
        ))),
    }
}

/// A moment from `--since`/`--until`: a time, or a duration meaning that long before now.
pub(super) fn moment_ms(ctx: &Context, flag: &str, text: &str) -> Result<i64, CliError> {
    if let Ok(ago) = duration::parse(flag, text) {
        return Ok(ctx.now_ms().saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)));
    }
    duration::parse_time_ms(flag, text).map_err(|_| {
        CliError::usage(format!(
            "{flag} {}: neither a time (UTC \"2026-05-01 12:00:00\", RFC 3339 \"2026-05-01T12:00:00Z\") nor a \
             duration ago (\"2h\", \"30m\")",
            output::esc(text)
        ))
    })
}
