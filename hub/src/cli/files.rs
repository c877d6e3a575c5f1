//! Files the operator CLI writes: a new file never over an existing one, and replacements that
//! keep the file they replace aside under a time stamp.

use super::{CliError, CliResult};
use std::io::Write;
use std::path::Path;

/// Writes a new file (never over an existing one) and syncs it; keys get mode 0600.
pub(super) fn write_new(path: &Path, contents: &str, private: bool) -> CliResult {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| CliError::failure(format!("{}: {e}", path.display())))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// Replaces each `(path, contents, private)` by writing `path.new`, syncing it, keeping the
/// current file aside as `path.replaced-STAMP` (a hard link, same inode and mode) and renaming
/// the new one over it; then syncs the directory. Returns the paths kept aside.
pub(super) fn replace_files(
    files: &[(std::path::PathBuf, &str, bool)],
    stamp: &str,
) -> Result<Vec<std::path::PathBuf>, CliError> {
    let fail = |what: &str, p: &Path, e: std::io::Error| CliError::failure(format!("{what} {}: {e}", p.display()));
    let mut staged = Vec::new();
    for (path, contents, private) in files {
        let new = suffixed(path, ".new");
        match std::fs::remove_file(&new) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail("removing", &new, e)),
            _ => {}
        }
        write_new(&new, contents, *private)?;
        staged.push((path, new));
    }
    let mut kept = Vec::new();
    for (path, new) in staged {
        if path.exists() {
            let aside = free_name(&suffixed(path, &format!(".replaced-{stamp}")));
            std::fs::hard_link(path, &aside).map_err(|e| fail("keeping aside", path, e))?;
            kept.push(aside);
        }
        std::fs::rename(&new, path).map_err(|e| fail("replacing", path, e))?;
    }
    if let Some(parent) = files.first().and_then(|(p, _, _)| p.parent()) {
        std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| fail("syncing", parent, e))?;
    }
    Ok(kept)
}

fn suffixed(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    std::path::PathBuf::from(s)
}

/// `base`, or `base.2`, `base.3`, … when taken (two replacements within one second).
fn free_name(base: &Path) -> std::path::PathBuf {
    let mut candidate = base.to_path_buf();
    let mut n = 1;
    while candidate.exists() {
        n += 1;
        candidate = suffixed(base, &format!(".{n}"));
    }
    candidate
}

/// The UTC time in the names of files kept aside (`hub.crt.replaced-20260501T120000Z`), as
/// `restore` names a replaced database.
pub(super) fn aside_stamp(now_ms: i64) -> String {
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from_unix_timestamp(now_ms / 1000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| now_ms.to_string())
}
