//! The hub's open files: at start, the soft open-file limit (`RLIMIT_NOFILE`) is raised to the
//! hard one where the system allows it, and `serve` refuses to start when
//! `limits.connections_max` and the files the hub keeps for itself (`FILES_RESERVED`) cannot
//! fit under it, instead of running into "Too many open files" with clients waiting.

use crate::config::OPERATOR_CONNECTIONS_MAX;
use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};

/// Files the hub keeps open besides its mTLS connections: the record (each SQLite connection
/// holds the file, its log and its shared memory; or the PostgreSQL connections), its
/// listeners, the wake socket, the operator listener's `OPERATOR_CONNECTIONS_MAX` connections,
/// and a margin for the accept that finds the connection limit reached.
pub const FILES_RESERVED: u64 = OPERATOR_CONNECTIONS_MAX as u64 + 192;

/// The soft limit asked for when the hard limit is unlimited (Linux refuses an unlimited soft
/// limit for open files; its usual `fs.nr_open`).
const UNLIMITED_TARGET: u64 = 1 << 20;

/// What the start-up check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// The soft limit the hub runs with.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
    /// The soft limit before the hub raised it, when it did.
    pub raised_from: Option<u64>,
}

/// Why `serve` does not start.
#[derive(Debug, thiserror::Error)]
pub enum FileLimitError {
    /// `connections_max` and the hub's own files do not fit.
    #[error(
        "limits.connections_max = {connections_max} does not fit in this process's open-file limit of {soft} \
         (RLIMIT_NOFILE; hard limit {hard}): the hub also keeps up to {FILES_RESERVED} files of its own. Raise \
         the limit to at least {needed} (`ulimit -n`, systemd's LimitNOFILE=) or lower limits.connections_max{fits}"
    )]
    TooLow {
        /// The configured bound.
        connections_max: u32,
        /// The soft limit, raised as far as allowed.
        soft: u64,
        /// The hard limit.
        hard: u64,
        /// What would fit it.
        needed: u64,
        /// `" to at most N"`, when some number of connections fits.
        fits: String,
    },
    /// The limit could not be read.
    #[error("cannot read the open-file limit (RLIMIT_NOFILE): {0}")]
    Read(std::io::Error),
}

/// Raises the soft open-file limit to the hard one (where allowed; a failure is logged and the
/// current limit checked), then checks that `connections_max` fits (see `FILES_RESERVED`).
pub fn raise_and_check(connections_max: u32) -> Result<FileLimit, FileLimitError> {
    let (soft, hard) = read().map_err(FileLimitError::Read)?;
    let target = if hard == RLIM_INFINITY { UNLIMITED_TARGET.max(soft) } else { hard };
    let mut limit = FileLimit { soft, hard, raised_from: None };
    if soft < target {
        match set(target, hard) {
            Ok(()) => limit = FileLimit { soft: target, hard, raised_from: Some(soft) },
            Err(e) => tracing::warn!(soft, hard, error = %e, "could not raise the open-file limit to the hard limit"),
        }
    }
    check(connections_max, limit)?;
    Ok(limit)
}

/// Whether `connections_max` fits under `limit`.
fn check(connections_max: u32, limit: FileLimit) -> Result<(), FileLimitError> {
    let needed = u64::from(connections_max) + FILES_RESERVED;
    if needed <= limit.soft {
        return Ok(());
    }
    let fits = match limit.soft.checked_sub(FILES_RESERVED) {
        Some(n) if n > 0 => format!(" to at most {n}"),
        _ => String::new(),
    };
    Err(FileLimitError::TooLow { connections_max, soft: limit.soft, hard: limit.hard, needed, fits })
}

fn read() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    Ok((soft, hard))
}

fn set(soft: u64, hard: u64) -> std::io::Result<()> {
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound plus the reserve must fit the soft limit; the refusal names the key, the limit,
    /// what would fit and how to raise it.
    #[test]
    fn connections_max_must_fit_under_the_soft_limit() {
        let limit = |soft| FileLimit { soft, hard: soft, raised_from: None };
        assert!(check(1024, limit(1024 + FILES_RESERVED)).is_ok());
        let e = check(1024, limit(1024)).unwrap_err().to_string();
        for words in
            ["limits.connections_max = 1024", "open-file limit of 1024", "at least 1280", "at most 768", "ulimit -n"]
        {
            assert!(e.contains(words), "{words}: {e}");
        }
        let e = check(10, limit(100)).unwrap_err().to_string();
        assert!(!e.contains("at most"), "nothing fits: {e}");
    }
}
