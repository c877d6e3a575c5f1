//! The files in the hub's data directory, and their modes.
//!
//! Invariant: the directory is 0700 and every private file in it (the keys, the database and
//! SQLite's `-wal`/`-shm`, which SQLite creates with the database's mode) is 0600: `init`
//! tightens them whatever the umask or a pre-existing directory's mode, and `serve` refuses a
//! looser one, naming the path and the fix, as ssh does.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The data directory's mode: its owner alone may enter it.
pub const DIR_MODE: u32 = 0o700;
/// A private file's mode: its owner alone may read it.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// The permission bits no one but the owner may hold on the directory or a private file.
const OTHERS_BITS: u32 = 0o077;

/// The environment variable naming the default data directory.
pub const DATA_DIR_ENV: &str = "BATON_HUB_DATA_DIR";
/// The data directory used when neither `--data-dir` nor the environment names one.
pub const DATA_DIR_DEFAULT: &str = "/var/lib/baton-hub";

/// Paths inside one hub data directory.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// The data directory at `root`.
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }
    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The hub database.
    pub fn db(&self) -> PathBuf {
        self.root.join("hub.db")
    }
    /// The CA certificate (PEM), handed to every node and producer.
    pub fn ca_cert(&self) -> PathBuf {
        self.root.join("ca.crt")
    }
    /// The CA private key (PEM, mode 0600). Whoever has it can mint identities.
    pub fn ca_key(&self) -> PathBuf {
        self.root.join("ca.key")
    }
    /// The hub's server certificate.
    pub fn server_cert(&self) -> PathBuf {
        self.root.join("hub.crt")
    }
    /// The hub's server key.
    pub fn server_key(&self) -> PathBuf {
        self.root.join("hub.key")
    }
    /// Where `serve` writes the address it bound.
    pub fn addr_file(&self) -> PathBuf {
        self.root.join("hub.addr")
    }
    /// The local socket CLI changes use to wake the running hub.
    pub fn wake_socket(&self) -> PathBuf {
        self.root.join("hub.sock")
    }
    /// The lock `serve` holds while it runs (one hub per data directory), naming its pid and
    /// listen address.
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("hub.lock")
    }
    /// The optional configuration file.
    pub fn config(&self) -> PathBuf {
        self.root.join("hub.toml")
    }

    /// The files only the hub's user may read: keys, the database and SQLite's side files.
    pub fn private_files(&self) -> Vec<PathBuf> {
        let db = self.db();
        let side = |suffix: &str| {
            let mut name = db.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        vec![self.ca_key(), self.server_key(), db.clone(), side("-wal"), side("-shm")]
    }

    /// Sets the directory to 0700, then every private file present to 0600.
    pub fn tighten(&self) -> std::io::Result<()> {
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(DIR_MODE))?;
        for path in self.private_files() {
            match std::fs::set_permissions(&path, std::fs::Permissions::from_mode(PRIVATE_FILE_MODE)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Refuses a directory or a private file that other users may read or enter, with a message
    /// that names the path and how to fix it.
    pub fn check_private(&self) -> Result<(), String> {
        let loose = |path: &Path, wanted: u32| -> Result<(), String> {
            let mode = match std::fs::metadata(path) {
                Ok(m) => m.permissions().mode() & 0o7777,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(format!("{}: {e}", path.display())),
            };
            if mode & OTHERS_BITS == 0 {
                return Ok(());
            }
            Err(format!(
                "{} is mode {mode:04o}, open to other users; it must be {wanted:04o}: run `chmod {wanted:o} {}`",
                path.display(),
                path.display()
            ))
        };
        loose(&self.root, DIR_MODE)?;
        for path in self.private_files() {
            loose(&path, PRIVATE_FILE_MODE)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// A looser directory or key is refused naming the path and the chmod; `tighten` fixes both.
    #[test]
    fn loose_modes_are_refused_and_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("hub"));
        std::fs::create_dir(dir.root()).unwrap();
        std::fs::set_permissions(dir.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = dir.check_private().unwrap_err();
        assert!(e.contains(&dir.root().display().to_string()) && e.contains("0755") && e.contains("chmod 700"), "{e}");
        std::fs::write(dir.ca_key(), "k").unwrap();
        std::fs::set_permissions(dir.ca_key(), std::fs::Permissions::from_mode(0o644)).unwrap();
        dir.tighten().unwrap();
        assert_eq!((mode(dir.root()), mode(&dir.ca_key())), (0o700, 0o600));
        dir.check_private().unwrap();
        std::fs::set_permissions(dir.ca_key(), std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = dir.check_private().unwrap_err();
        assert!(e.contains("ca.key is mode 0640") && e.contains("chmod 600"), "{e}");
    }
}
