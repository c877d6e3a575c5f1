//! Looking at the record without changing it: `status`, `backup`, `verify`, `config check`.

use super::{CliError, CliResult, Context, output};
use crate::lock;
use crate::store::{backup, read, verify};
use baton_shared::exit;
use std::path::Path;

/// `status`: the record's counts, and whether a hub serves this data directory (from its
/// lock: side-effect free, it wakes no waiting long-poll).
pub(super) fn status(ctx: &Context, json: bool) -> CliResult {
    let hub = lock::probe(&ctx.dir)?;
    let s = read::status(&ctx.open_read()?)?;
    output::status(&s, hub.as_ref(), json)
}

/// `backup --out FILE`: a consistent copy, checked, while the hub may run.
pub(super) fn backup(ctx: &Context, path: &Path) -> CliResult {
    if path.exists() {
        return Err(CliError::usage(format!("{} exists; refusing to overwrite it", path.display())));
    }
    backup::copy_to(&ctx.open_read()?, path)?;
    output::line(format!("backup written to {} (integrity ok)", path.display()))
}

/// `verify`: every invariant, including a full integrity check of the file; exit 4 when any
/// problem is found.
pub(super) fn verify(ctx: &Context, json: bool) -> CliResult {
    let problems = verify::check(&ctx.open_read()?)?;
    output::problems(&problems, json)?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::new(exit::FAILURE, format!("{} problem(s) found", problems.len())))
    }
}

/// `config check`: validates the configuration `serve` would start with (but its flags).
pub(super) fn config_check(ctx: &Context, file: Option<&Path>) -> CliResult {
    ctx.config(file)?;
    output::line("configuration is valid")
}
