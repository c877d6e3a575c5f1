//! What `baton-node config check` proves about a configuration before a node runs with it, and
//! what `baton-node run` refuses to start without.
//!
//! Offline, from the files alone: the three certificate files read and hold PEM (`files`); the
//! harness program can be run as the node runs it (`harness`); the private key belongs to the
//! certificate (`key`); the certificate names a node (`identity`); it chains to `ca_file` and is
//! inside its validity window, with a warning when it ends soon (`ca`). With `--online`, one
//! authenticated read that changes nothing proves the hub answers and takes this certificate as
//! a node's (`hub`).
//!
//! Each check ends `ok`, `warn` or `fail` with a sentence naming the key, the file, what is wrong
//! and how to fix it. `run` applies the checks a node could never work without (`files`,
//! `harness`, `key`, `identity`) and stops on the first failure with the same sentence
//! (`ConfigError::Check`, exit status 2), so a producer certificate or a mismatched key never
//! reaches the hub's refusals. Validity is left to the hub at run time: a certificate renewed
//! in place is picked up on SIGHUP.
//!
//! Time is passed in (`now_ms`), so expiry is tested without waiting.
//!
//! Layout: `offline` (the checks from the files alone), `online` (the one read that proves the
//! hub takes the certificate).

mod offline;
mod online;

pub use online::online;

use crate::config::{ConfigError, NodeConfig};
use offline::{Files, chain, harness, identity, key_matches};
use std::time::Duration;

/// A certificate that ends sooner than this after the check is a warning: time to renew it.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// The instance id the online check reads holdings for. It never claims anything, so the hub
/// answers with an empty list and binds nothing to it.
const CHECK_INSTANCE_ID: &str = "config-check";

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Proved.
    Ok,
    /// Works now, but needs attention soon (a certificate close to its end).
    Warn,
    /// Will not work as configured.
    Fail,
}

impl Status {
    /// The word in `--json` (`ok`, `warn`, `fail`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }

    /// The word in the human listing (`ok`, `warn`, `FAIL`).
    fn shown(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Which check: `files`, `harness`, `key`, `identity`, `ca` or `hub`.
    pub name: &'static str,
    /// How it ended.
    pub status: Status,
    /// The configuration key it concerns most (`cert_file`, `command`…), for the one-line error.
    pub field: &'static str,
    /// What was proved, or what is wrong and how to fix it; names the key and the file.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, status: Status, field: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status, field, detail: detail.into() }
    }
}

/// Every check of one `config check` run, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The checks in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether no check failed (warnings pass).
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The first failure as the error `config check` exits 2 with, naming how many more there
    /// are; `None` when nothing failed.
    pub fn error(&self) -> Option<ConfigError> {
        self.error_listed("above")
    }

    /// The first failure, naming how many more there are and where they are `listed`.
    fn error_listed(&self, listed: &str) -> Option<ConfigError> {
        let mut failed = self.checks.iter().filter(|c| c.status == Status::Fail);
        let first = failed.next()?;
        let more = failed.count();
        let detail = match more {
            0 => first.detail.clone(),
            n => format!("{} (and {n} more failed check{} {listed})", first.detail, if n == 1 { "" } else { "s" }),
        };
        Some(ConfigError::Check { field: first.field, detail })
    }

    /// One line per check (`ok`/`warn`/`FAIL`, its name, its detail with control characters
    /// escaped), then a verdict line.
    pub fn human(&self, config: &NodeConfig) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{:<5} {:<9} {}\n", c.status.shown(), c.name, escaped(&c.detail)));
        }
        let failed = self.checks.iter().filter(|c| c.status == Status::Fail).count();
        if failed == 0 {
            out.push_str(&format!(
                "configuration is valid ({} {}, data dir {})\n",
                if config.hub_url.urls().len() == 1 { "hub" } else { "hubs" },
                escaped(&config.hub_url.urls().join(", ")),
                escaped(&config.data_dir.display().to_string())
            ));
        } else {
            out.push_str(&format!("configuration is not valid: {failed} of {} checks failed\n", self.checks.len()));
        }
        out
    }

    /// `{"checks": [{"name", "status", "detail"}], "ok"}`.
    pub fn json(&self) -> serde_json::Value {
        let checks: Vec<serde_json::Value> = self
            .checks
            .iter()
            .map(|c| serde_json::json!({"name": c.name, "status": c.status.as_str(), "detail": c.detail}))
            .collect();
        serde_json::json!({"checks": checks, "ok": self.ok()})
    }
}

/// Control characters (a terminal escape in a file name or a server's message) shown escaped.
fn escaped(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// The offline checks at `now_ms` (unix milliseconds): `files`, `harness`, `key`, `identity`,
/// `ca`.
pub fn offline(config: &NodeConfig, now_ms: i64) -> Report {
    let files = Files::read(config);
    let checks = vec![
        files.check(),
        harness(config),
        key_matches(config, &files),
        identity(config, &files),
        chain(config, &files, now_ms),
    ];
    Report { checks }
}

/// What `run` refuses to start without: the `files`, `harness`, `key` and `identity` checks,
/// the first failure as its error (the same sentence `config check` prints).
pub fn before_run(config: &NodeConfig) -> Result<(), ConfigError> {
    let files = Files::read(config);
    let checks = [files.check(), harness(config), key_matches(config, &files), identity(config, &files)];
    // `run` prints no list of checks, so the rest are pointed at where they are listed.
    match (Report { checks: checks.to_vec() }).error_listed("listed by `baton-node config check`") {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
