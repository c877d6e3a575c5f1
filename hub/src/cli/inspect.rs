//! Looking at the record without changing it: `status`, `backup`, `verify`, `config check`.

use super::views::StoreSize;
use super::{CliError, CliResult, Context, output};
use crate::attention::{self, Attention};
use crate::lock;
use baton_shared::duration;
use baton_shared::exit;
use std::path::Path;

/// `status`: the record's counts, whether a hub serves this data directory (from its lock:
/// side-effect free, it wakes no waiting long-poll), and what needs attention (`attention`,
/// as the status page shows it). Exit 1 when the hub is not running or anything needs
/// attention.
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
    let mut items = Vec::new();
    if hub.is_none() {
        items.push(Attention {
            kind: "hub_not_running",
            subject: ctx.dir.root().display().to_string(),
            detail: "no hub serves this data directory".into(),
        });
    }
    let watch = attention::Watch {
        unknown_since_ms: since_ms,
        host_silence_warn: config.host_silence_warn,
        store_bytes_max: config.limits.store_bytes_max,
    };
    items.extend(record.run(attention::from_record(&record, now_ms, watch))?);
    items.extend(attention::from_files(&ctx.dir, now_ms).map_err(CliError::failure)?);
    let store = StoreSize {
        bytes: u64::try_from(record.run(record.store_bytes())?).unwrap_or(0),
        bytes_max: config.limits.store_bytes_max,
    };
    output::status(&s, hub.as_ref(), store, &items, json)?;
    match items.as_slice() {
        [] => Ok(()),
        [only] if only.kind == "hub_not_running" => Err(CliError::new(exit::NOTHING, "the hub is not running")),
        items => Err(CliError::new(exit::NOTHING, format!("{} item(s) need attention", items.len()))),
    }
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
