//! One hub per data directory. `serve` holds an exclusive lock (`flock`) on `DIR/hub.lock` for
//! its whole life, with its pid and listen address written in the file. A second `serve` on the
//! same directory is refused before it touches the store, the wake socket or `hub.addr`, and the
//! refusal names the running hub. `status` learns whether a hub runs by testing the lock, which
//! wakes nobody.
//!
//! The operating system drops the lock when the process ends, however it ends, so a crashed hub
//! never leaves a stale lock behind. The file itself stays; its contents describe the last hub
//! that held it and mean nothing while it is not locked.
//!
//! Invariant: while a hub serves a data directory, it holds that directory's lock.

use crate::datadir::DataDir;
use std::fs::{File, OpenOptions, TryLockError};
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How many times `acquire` tries the lock before refusing. `status` holds the lock (shared)
/// for the few microseconds of its test; a hub starting at that instant tries again.
pub const LOCK_ATTEMPTS_MAX: u32 = 10;
/// The pause between two attempts.
pub const LOCK_RETRY_PACE: Duration = Duration::from_millis(20);
/// Most bytes of the lock file read back (it holds two short lines).
const LOCK_FILE_BYTES_MAX: u64 = 4096;

/// The hub that holds a data directory's lock, as its lock file describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    /// Its process id, when the file names one.
    pub pid: Option<u32>,
    /// The address it listens on, once it has bound one.
    pub listen: Option<SocketAddr>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => f.write_str("pid unknown")?,
        }
        match self.listen {
            Some(addr) => write!(f, ", listening on {addr}"),
            None => f.write_str(", not listening yet"),
        }
    }
}

impl Holder {
    fn parse(text: &str) -> Holder {
        let mut h = Holder::default();
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("pid", v)) => h.pid = v.trim().parse().ok(),
                Some(("listen", v)) => h.listen = v.trim().parse().ok(),
                _ => {}
            }
        }
        h
    }

    fn render(&self) -> String {
        let mut s = String::new();
        if let Some(pid) = self.pid {
            s.push_str(&format!("pid {pid}\n"));
        }
        if let Some(addr) = self.listen {
            s.push_str(&format!("listen {addr}\n"));
        }
        s
    }
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another hub serves this data directory.
    #[error(
        "another hub already serves {dir} ({holder}); refusing to start a second one (stop it first, \
         or give this one its own data directory)"
    )]
    Held {
        /// The data directory.
        dir: String,
        /// The running hub, as its lock file describes it.
        holder: Holder,
    },
    /// The lock file could not be opened, locked, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The lock file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// The exclusive lock on a data directory, held until dropped.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
    holder: Holder,
}

impl DirLock {
    /// Takes the lock of `dir` for this process, or refuses, naming the hub that holds it.
    pub fn acquire(dir: &DataDir) -> Result<DirLock, LockError> {
        let path = dir.lock_file();
        let io = |source| LockError::Io { path: path.display().to_string(), source };
        // Never truncate on open: the file may be the running hub's, which a refused second hub
        // must leave as it is.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let mut attempt = 1;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if attempt < LOCK_ATTEMPTS_MAX => {
                    attempt += 1;
                    std::thread::sleep(LOCK_RETRY_PACE);
                }
                Err(TryLockError::WouldBlock) => {
                    let holder = read_holder(&file).map_err(io)?;
                    return Err(LockError::Held { dir: dir.root().display().to_string(), holder });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        let holder = Holder { pid: Some(std::process::id()), listen: None };
        let mut lock = DirLock { file, path: path.clone(), holder };
        lock.write().map_err(io)?;
        Ok(lock)
    }

    /// Records the address this hub listens on, for `status` and for a refused second hub.
    pub fn record_listen(&mut self, addr: SocketAddr) -> Result<(), LockError> {
        self.holder.listen = Some(addr);
        self.write().map_err(|source| LockError::Io { path: self.path.display().to_string(), source })
    }

    /// Rewrites the file in place (never empty in between: the new text is written over the old,
    /// then the file is cut to its length), so a reader sees one version or the other.
    fn write(&mut self) -> std::io::Result<()> {
        let text = self.holder.render();
        self.file.write_all_at(text.as_bytes(), 0)?;
        self.file.set_len(text.len() as u64)?;
        self.file.sync_data()
    }
}

fn read_holder(file: &File) -> std::io::Result<Holder> {
    let mut buf = vec![0u8; LOCK_FILE_BYTES_MAX as usize];
    let n = file.read_at(&mut buf, 0)?;
    Ok(Holder::parse(&String::from_utf8_lossy(&buf[..n])))
}

/// The hub serving `dir`, if one runs. Changes nothing and wakes nobody: it tests the lock with
/// a shared lock that it drops at once (or finds the file missing: no hub ever served here).
pub fn probe(dir: &DataDir) -> Result<Option<Holder>, LockError> {
    probe_path(&dir.lock_file())
}

fn probe_path(path: &Path) -> Result<Option<Holder>, LockError> {
    let io = |source| LockError::Io { path: path.display().to_string(), source };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(None),
        Err(TryLockError::WouldBlock) => Ok(Some(read_holder(&file).map_err(io)?)),
        Err(TryLockError::Error(e)) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_probe_sees_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path());
        assert_eq!(probe(&dir).unwrap(), None, "no lock file: no hub");
        let mut first = DirLock::acquire(&dir).unwrap();
        let me = Holder { pid: Some(std::process::id()), listen: None };
        assert_eq!(probe(&dir).unwrap(), Some(me.clone()));
        let addr: SocketAddr = "127.0.0.1:7443".parse().unwrap();
        first.record_listen(addr).unwrap();
        // Another open file description conflicts with this one, as another process would.
        match DirLock::acquire(&dir) {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, Holder { listen: Some(addr), ..me }),
            other => panic!("a second lock was granted: {other:?}"),
        }
        let e = DirLock::acquire(&dir).unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())) && e.contains("127.0.0.1:7443"), "{e}");
        drop(first);
        assert_eq!(probe(&dir).unwrap(), None, "a dropped lock is free");
        let again = DirLock::acquire(&dir).unwrap();
        assert_eq!(again.holder.listen, None, "the new holder does not inherit the old address");
    }

    #[test]
    fn the_lock_file_text_round_trips() {
        let h = Holder { pid: Some(42), listen: Some("[::1]:9".parse().unwrap()) };
        assert_eq!(Holder::parse(&h.render()), h);
        assert_eq!(Holder::parse("garbage"), Holder::default());
    }
}
