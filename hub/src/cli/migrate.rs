//! `migrate --to TARGET`: moves this hub's whole record to another backend — from its SQLite
//! file to a PostgreSQL database, or from its PostgreSQL database to a new SQLite file — while
//! no hub serves this data directory (`store::upkeep::transfer::move_record`: one transaction into an
//! empty record, then both compared row by row and both verified). The source is left as it
//! was: pointing `database_url` at the target (or removing it) is the operator's step, printed
//! at the end.

use super::{CliError, CliResult, Context};
use crate::lock::{DirLock, LockError};
use crate::store::upkeep::transfer::{self, Place};

/// Runs `migrate --to target`.
pub(super) fn migrate(ctx: &Context, target: &str) -> CliResult {
    let config = ctx.config(None)?;
    let _lock = DirLock::acquire(&ctx.dir).map_err(|e| match e {
        LockError::Held { .. } => CliError::failure(format!(
            "refusing to move the record while a hub serves {}: {e}; stop it first",
            ctx.dir.root().display()
        )),
        other => CliError::from(other),
    })?;
    let to_postgres = target.starts_with("postgres://") || target.starts_with("postgresql://");
    let (from, to) = match (&config.database_url, to_postgres) {
        (None, true) => {
            let url = crate::store::engine::postgres::PgUrl::parse(target)
                .map_err(|e| CliError::usage(format!("--to: {e}")))?;
            (Place::Sqlite(ctx.dir.db(), config.synchronous), Place::Postgres(Box::new(url)))
        }
        (Some(url), false) => {
            let path = std::path::PathBuf::from(target);
            if path.exists() {
                return Err(CliError::usage(format!("{}: exists; --to names a new SQLite file", path.display())));
            }
            (Place::Postgres(Box::new(url.clone())), Place::Sqlite(path, config.synchronous))
        }
        (None, false) => {
            return Err(CliError::usage(
                "the record is in an SQLite file: --to names a PostgreSQL database (postgres://...) to move it to",
            ));
        }
        (Some(_), true) => {
            return Err(CliError::usage(
                "the record is already in PostgreSQL: --to names an SQLite file to move it to",
            ));
        }
    };
    let copied = transfer::move_record(&from, &to)
        .map_err(|e| CliError::failure(format!("moving the record to {}: {e}", to.shown())))?;
    for (table, rows) in &copied.tables {
        super::output::line(format!("{table}: {rows} rows"))?;
    }
    let next = match &to {
        Place::Postgres(_) => "set database_url in hub.toml (mode 0600) to the URL given to --to".to_string(),
        Place::Sqlite(..) => {
            format!("remove database_url from hub.toml and put the file at {}", ctx.dir.db().display())
        }
    };
    super::output::line(format!(
        "moved {} rows from {} to {}; both verify and hold the same record. To serve from it: {next}, then \
         start the hub. The source is unchanged.",
        copied.rows(),
        from.shown(),
        to.shown()
    ))
}
