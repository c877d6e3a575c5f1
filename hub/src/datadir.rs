//! The files in the hub's data directory.

use std::path::{Path, PathBuf};

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
}
