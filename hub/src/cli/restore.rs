//! `restore --from BACKUP`: the hub database replaced with a verified backup, the hub stopped.
//!
//! In order: take the data directory's lock (so no hub serves it, and none starts meanwhile);
//! copy the backup into the directory (`hub.db.restoring`) and verify that copy (the strict
//! open, which migrates an older schema and refuses a newer one; SQLite's full integrity check;
//! every invariant `verify` checks); only then move the current database (with its
//! write-ahead log) aside as `hub.db.replaced-<UTC time>` and rename the verified copy into
//! place. A backup that fails any check replaces nothing. The restore is recorded in the
//! restored record's audit log.

use super::{CliError, CliResult, Context, Record, output};
use crate::lock::{DirLock, LockError};
use crate::store::{Store, upkeep::backup};
use baton_shared::exit;
use std::path::{Path, PathBuf};

/// The side files SQLite keeps next to a database in WAL mode.
const WAL_SUFFIX: &str = "-wal";
const SHM_SUFFIX: &str = "-shm";

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Renames a database and its write-ahead log (when there is one) together, so the moved file
/// still opens with everything it held; the shared-memory index is rebuilt by SQLite, so it is
/// removed rather than moved.
fn move_db(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)?;
    let wal = with_suffix(from, WAL_SUFFIX);
    if wal.exists() {
        std::fs::rename(&wal, with_suffix(to, WAL_SUFFIX))?;
    }
    remove_if_there(&with_suffix(from, SHM_SUFFIX))
}

fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes a staging copy and its side files (a failed or interrupted restore's).
fn remove_staging(staging: &Path) {
    for p in [staging.to_path_buf(), with_suffix(staging, WAL_SUFFIX), with_suffix(staging, SHM_SUFFIX)] {
        // Only files this command made; one that cannot be removed is named by the next run.
        let _ = remove_if_there(&p);
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> CliError {
    CliError::failure(format!("{what} {}: {e}", path.display()))
}

/// Runs `restore`.
pub(super) fn restore(ctx: &Context, from: &Path) -> CliResult {
    ctx.require_sqlite(
        "restore",
        "restore it with PostgreSQL's own tools (pg_restore of a pg_dump, or point-in-time recovery), then run \
         `baton-hub verify`",
    )?;
    let root = ctx.dir.root().display().to_string();
    if !ctx.dir.ca_cert().exists() {
        return Err(CliError::new(
            exit::REFUSED,
            format!("{root} is not an initialised hub data directory (run `baton-hub init` first)"),
        ));
    }
    if !from.is_file() {
        return Err(CliError::usage(format!("{}: no such backup file", from.display())));
    }
    let lock = DirLock::acquire(&ctx.dir).map_err(|e| match e {
        LockError::Held { .. } => {
            CliError::failure(format!("refusing to restore while a hub serves {root}: {e}; stop it first"))
        }
        other => CliError::from(other),
    })?;
    let staging = with_suffix(&ctx.dir.db(), ".restoring");
    remove_staging(&staging);
    let facts = stage(ctx, from, &staging).inspect_err(|_| remove_staging(&staging))?;
    let live = ctx.dir.db();
    let aside = live.exists().then(|| aside_name(&live, ctx.now_ms()));
    if let Some(aside) = &aside {
        move_db(&live, aside).map_err(|e| io_err("moving aside", &live, e))?;
    }
    move_db(&staging, &live).map_err(|e| io_err("moving the verified copy to", &live, e))?;
    std::fs::File::open(ctx.dir.root()).and_then(|d| d.sync_all()).map_err(|e| io_err("syncing", ctx.dir.root(), e))?;
    let note = format!(
        "restored from {}{}",
        from.display(),
        aside.as_ref().map(|a| format!("; replaced database kept as {}", a.display())).unwrap_or_default()
    );
    let record = ctx.open_write()?;
    record.run(record.record_operator_event("restore".into(), root, ctx.operator.clone(), Some(note)))?;
    drop(record);
    drop(lock);
    report(from, &live, aside.as_deref(), &facts)
}

/// Copies the backup to `staging` and verifies the copy; returns what it holds.
fn stage(ctx: &Context, from: &Path, staging: &Path) -> Result<backup::Facts, CliError> {
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut src = std::fs::File::open(from).map_err(|e| io_err("reading", from, e))?;
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(staging)
            .map_err(|e| io_err("creating", staging, e))?;
        std::io::copy(&mut src, &mut dst).map_err(|e| io_err("copying to", staging, e))?;
        dst.sync_all().map_err(|e| io_err("syncing", staging, e))?;
    }
    let refused = |detail: String| {
        CliError::new(
            exit::REFUSED,
            format!("the backup {} failed verification; nothing was replaced: {detail}", from.display()),
        )
    };
    let found_version = Store::file_schema_version(staging).map_err(|e| refused(e.to_string()))?;
    let config = ctx.config(None)?;
    let copy = Store::open_write(staging, config.synchronous, ctx.clock.clone()).map_err(|e| refused(e.to_string()))?;
    let copy = Record::new(copy)?;
    let damage = copy.run(copy.integrity())?;
    if !damage.is_empty() {
        return Err(refused(format!("integrity check: {}", damage.join("; "))));
    }
    let problems = copy.run(copy.verify())?;
    if !problems.is_empty() {
        let shown: Vec<String> =
            problems.iter().take(5).map(|p| format!("{} {}: {}", p.kind.as_str(), p.subject, p.detail)).collect();
        return Err(refused(format!("{} problem(s): {}", problems.len(), output::esc(&shown.join("; ")))));
    }
    let facts = copy.run(copy.backup_facts(found_version))?;
    copy.run(copy.checkpoint())?;
    Ok(facts)
}

/// `DIR/hub.db.replaced-20260501T120000Z` (a number is added when that name is taken).
fn aside_name(live: &Path, now_ms: i64) -> PathBuf {
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let stamp = time::OffsetDateTime::from_unix_timestamp(now_ms / 1000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| now_ms.to_string());
    let base = with_suffix(live, &format!(".replaced-{stamp}"));
    let mut candidate = base.clone();
    let mut n = 1;
    while candidate.exists() || with_suffix(&candidate, WAL_SUFFIX).exists() {
        n += 1;
        candidate = with_suffix(&base, &format!("-{n}"));
    }
    candidate
}

/// What was done, and what it means for producers and nodes.
fn report(from: &Path, live: &Path, aside: Option<&Path>, facts: &backup::Facts) -> CliResult {
    let newest = facts.newest_accepted_at_ms.map(output::fmt_ms).unwrap_or_else(|| "none".into());
    let last = facts.last_change_at_ms.map(output::fmt_ms).unwrap_or_else(|| "none".into());
    output::line(format!(
        "restored {} from {} (verified: integrity ok, no invariant problems; schema version {}, {} message(s), \
         newest accepted {newest} UTC, last change {last} UTC)",
        live.display(),
        from.display(),
        facts.schema_version,
        facts.messages
    ))?;
    match aside {
        Some(a) => output::line(format!("the replaced database is kept as {}", a.display()))?,
        None => output::line("there was no database to replace")?,
    }
    output::line(format!(
        "what this means: the record is now as of the backup (last change {last} UTC).\n\
         - producers: messages accepted after it are forgotten, with their idempotency keys: a producer \
         that retries such a key creates a new message, and reading one by id answers 404.\n\
         - nodes: deliveries handed out, acked or reported after it are back where the backup had them: \
         a queued one may be handed out and run again; calls about deliveries the backup does not know \
         are refused, and a node whose ack is refused drops its copy.\n\
         - certificates enrolled, renewed or revoked after it are not in the record: re-enroll or revoke \
         them again."
    ))
}
