//! Python, for the suites that run the Python client package (`shared/python`) and the Python
//! examples against the real binaries: the interpreter, the skip-or-require rule, and commands
//! that import the package from the source tree.
//!
//! The interpreter is the one `BATON_PYTHON` names (CI's virtualenv, which `.ci/run` fills with
//! the package's dependencies and test tools), else `python3` on `PATH`. When it is missing, or
//! cannot import a module the caller needs, the caller's test says `SKIPPED:` and passes,
//! unless `BATON_REQUIRE_PYTHON` is set (CI sets it), when it fails.

use crate::bins;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Names the Python interpreter to use (an absolute path); else `python3` on `PATH`.
pub const PYTHON_VAR: &str = "BATON_PYTHON";
/// Set (to anything) to make a missing interpreter or module a failure instead of a skip.
pub const REQUIRE_VAR: &str = "BATON_REQUIRE_PYTHON";
/// How long checking that the interpreter imports the needed modules may take.
const PROBE_LIMIT: Duration = Duration::from_secs(60);

/// A Python interpreter that imports what its caller asked for.
#[derive(Debug, Clone)]
pub struct Python {
    /// The interpreter, as an absolute path (a node runs its harness without a shell or `PATH`
    /// lookup of its own).
    pub exe: PathBuf,
}

/// The Python client package's directory in the source tree (`shared/python`).
pub fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/python")
}

/// The directory to put on `PYTHONPATH` for `import baton_client` from the source tree.
pub fn package_src() -> PathBuf {
    package_dir().join("src")
}

impl Python {
    /// A scrubbed command (`bins::command`) running this interpreter with the package's source
    /// first on `PYTHONPATH` (so the tree's code is what runs, whatever is installed) and no
    /// bytecode written into the tree.
    pub fn command(&self) -> Command {
        let mut cmd = bins::command(&self.exe);
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// The environment `command` adds, for processes started another way (a node's harness).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("PYTHONPATH", package_src().display().to_string()), ("PYTHONDONTWRITEBYTECODE", "1".to_string())]
    }
}

/// The interpreter, when it imports every one of `modules` (`"httpx"`, `"mypy"`); else `None`
/// after saying `SKIPPED:` on stderr, or a panic when `BATON_REQUIRE_PYTHON` is set.
pub fn find_or_skip(modules: &[&str]) -> Option<Python> {
    let missing = |why: String| -> Option<Python> {
        assert!(std::env::var_os(REQUIRE_VAR).is_none(), "{REQUIRE_VAR} is set but {why}");
        eprintln!(
            "SKIPPED: {why}; run .ci/run's Python step (or set {PYTHON_VAR}), or set {REQUIRE_VAR} to make this a failure"
        );
        None
    };
    let exe = match std::env::var_os(PYTHON_VAR) {
        Some(named) => PathBuf::from(named),
        None => match on_path("python3") {
            Some(p) => p,
            None => return missing("python3 is not on PATH".into()),
        },
    };
    let py = Python { exe };
    let mut probe = py.command();
    probe.args(["-c", &format!("import {}", modules.join(", "))]);
    match bins::run(probe, PROBE_LIMIT) {
        Ok(out) if out.status.success() => Some(py),
        Ok(out) => missing(format!(
            "{} cannot import {}: {}",
            py.exe.display(),
            modules.join(", "),
            String::from_utf8_lossy(&out.stderr).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim()
        )),
        Err(e) => missing(format!("{} does not run: {e:#}", py.exe.display())),
    }
}

/// `name` on `PATH`, as an absolute path, when it runs.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
}
