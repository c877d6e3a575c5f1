//! The binaries under test, and how a command is run: with a scrubbed environment, to
//! completion under a deadline.
//!
//! `CARGO_BIN_EXE_<name>` is set only for the package that owns a binary, so the suites find
//! `baton-hub` and `baton-node` another way (ripgrep's `tests/util.rs` fallback): a path named
//! in the environment, else the target directory next to the running executable
//! (`target/debug/deps/it-*` and `target/release/baton-bench` both give `target/<profile>/`).
//! A stale binary tests old code, so `Binaries::build` builds them there first, once per
//! process, as the test command (`cargo test --workspace --all-features`) builds them: every
//! binary of the workspace, crash points compiled in, with the workspace's features resolved as
//! for its test targets. Under the test command everything is then already built and the build
//! is a check; a build of some packages alone (`-p`) would resolve the dependencies' features
//! otherwise and compile much of the tree a second and third time.

use anyhow::{Context, anyhow, bail};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Names the `baton-hub` binary to use instead of the one next to the running executable.
pub const HUB_BIN_VAR: &str = "BATON_HUB_BIN";
/// Names the `baton-node` binary to use instead of the one next to the running executable.
pub const NODE_BIN_VAR: &str = "BATON_NODE_BIN";
/// `1` skips the build in `Binaries::build` (the binaries are taken as they are).
pub const NO_BUILD_VAR: &str = "BATON_TESTS_NO_BUILD";
/// The log filter every child gets in `BATON_LOG` (the tests wait for `info` lines).
pub const CHILD_LOG_FILTER: &str = "info";
/// How often a running command is checked for its exit.
pub(crate) const EXIT_POLL: Duration = Duration::from_millis(10);

/// The two binaries the suites drive.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `baton-hub`.
    pub hub: PathBuf,
    /// `baton-node`.
    pub node: PathBuf,
}

impl Binaries {
    /// The binaries named by `BATON_HUB_BIN` / `BATON_NODE_BIN`, else the ones next to the
    /// running executable. Fails when one is not a file.
    pub fn locate() -> anyhow::Result<Binaries> {
        Binaries::at(None, None)
    }

    /// `hub` and `node` where given, else as `locate` finds them.
    pub fn at(hub: Option<PathBuf>, node: Option<PathBuf>) -> anyhow::Result<Binaries> {
        let dir = profile_dir()?;
        let pick = |given: Option<PathBuf>, var: &str, name: &str| -> anyhow::Result<PathBuf> {
            let path = given.or_else(|| std::env::var_os(var).map(PathBuf::from)).unwrap_or_else(|| dir.join(name));
            if !path.is_file() {
                bail!("{name} not found at {}; build it (cargo build -p {name}) or name it with {var}", path.display());
            }
            Ok(path)
        };
        Ok(Binaries { hub: pick(hub, HUB_BIN_VAR, "baton-hub")?, node: pick(node, NODE_BIN_VAR, "baton-node")? })
    }

    /// Builds both binaries next to the running executable (same profile, `--all-features`)
    /// once per process, then `locate`s them. The build is skipped when both are named in the
    /// environment or `BATON_TESTS_NO_BUILD=1`.
    pub fn build() -> anyhow::Result<Binaries> {
        let named = std::env::var_os(HUB_BIN_VAR).is_some() && std::env::var_os(NODE_BIN_VAR).is_some();
        let skip = named || std::env::var_os(NO_BUILD_VAR).is_some_and(|v| v == "1");
        if !skip {
            built_once()?;
        }
        Binaries::locate()
    }

    /// A scrubbed `baton-hub` command (see `command`).
    pub fn hub_command(&self) -> Command {
        command(&self.hub)
    }

    /// A scrubbed `baton-node` command (see `command`).
    pub fn node_command(&self) -> Command {
        command(&self.node)
    }
}

/// `target/<profile>`: the directory of the running executable, above `deps/` for a test.
fn profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let mut dir = exe.parent().ok_or_else(|| anyhow!("{} has no directory", exe.display()))?.to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Names the `baton` binary (the producer command line) to use instead of the one next to the
/// running executable.
pub const PRODUCER_CLI_BIN_VAR: &str = "BATON_CLI_BIN";

/// The producer command line `baton` (package `baton-client`): built next to the running
/// executable once per process, like `Binaries::build` builds the hub and the node (skipped
/// when it is named by `BATON_CLI_BIN` or `BATON_TESTS_NO_BUILD=1`), then located.
pub fn producer_cli() -> anyhow::Result<PathBuf> {
    if std::env::var_os(PRODUCER_CLI_BIN_VAR).is_none() && std::env::var_os(NO_BUILD_VAR).is_none_or(|v| v != "1") {
        built_once()?;
    }
    locate_producer_cli()
}

/// `baton` as it is, unbuilt: the one `BATON_CLI_BIN` names, else the one next to the running
/// executable. Fails when it is not a file.
pub fn locate_producer_cli() -> anyhow::Result<PathBuf> {
    match std::env::var_os(PRODUCER_CLI_BIN_VAR) {
        Some(named) => existing(PathBuf::from(named), "baton", PRODUCER_CLI_BIN_VAR),
        None => existing(profile_dir()?.join("baton"), "baton", PRODUCER_CLI_BIN_VAR),
    }
}

/// Builds the binaries of `packages` next to the running executable (same target directory and
/// profile) with their default features, cargo's progress going to this process's terminal.
/// For a program started by `cargo run -p P` whose package depends on the libraries of the
/// packages it builds here, `P` among them: the feature resolution is then the one of the
/// `cargo run` that built it, so every library is fresh and only the binaries are linked.
pub fn build_bins_shown(packages: &[&str]) -> anyhow::Result<()> {
    let profile_dir = profile_dir()?;
    let target = profile_dir.parent().ok_or_else(|| anyhow!("no target directory above {}", profile_dir.display()))?;
    let profile = profile_dir.file_name().and_then(OsStr::to_str).unwrap_or("debug");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--bins", "--target-dir"]).arg(target).current_dir(env!("CARGO_MANIFEST_DIR"));
    for p in packages {
        cmd.args(["-p", p]);
    }
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build -p {} exited {status}", packages.join(" -p "));
    }
    Ok(())
}

/// `path`, when it is a file; else an error saying how to build or name it.
fn existing(path: PathBuf, name: &str, var: &str) -> anyhow::Result<PathBuf> {
    if !path.is_file() {
        bail!("{name} not found at {}; build it or name it with {var}", path.display());
    }
    Ok(path)
}

/// Set by cargo-nextest in every test process of one run, the same in all of them.
const NEXTEST_RUN_ID_VAR: &str = "NEXTEST_RUN_ID";

/// `cargo_build`, once per process (the hub, the node and `baton` come from the one build).
/// Under cargo-nextest, which runs every test in a process of its own, once per run instead:
/// the first process of the run whose build succeeds leaves a marker named by the run's id in
/// the target directory, and the others find it and take the binaries as they are (a build
/// that finds nothing to do still costs every process a pass over the workspace, one process
/// at a time under cargo's lock).
fn built_once() -> anyhow::Result<()> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let marker = nextest_run_marker();
            if marker.as_ref().is_some_and(|m| m.is_file()) {
                return Ok(());
            }
            cargo_build().map_err(|e| format!("{e:#}"))?;
            if let Some(marker) = marker {
                // Only a shortcut for the run's later processes: without it they build again.
                let _ = marker.parent().map(std::fs::create_dir_all);
                let _ = std::fs::write(&marker, b"");
            }
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The file saying this cargo-nextest run already built the binaries:
/// `target/<profile>/baton-built/<run id>`, or `None` outside nextest.
fn nextest_run_marker() -> Option<PathBuf> {
    let run = std::env::var(NEXTEST_RUN_ID_VAR).ok().filter(|r| !r.is_empty() && !r.contains(['/', '.']))?;
    Some(profile_dir().ok()?.join("baton-built").join(run))
}

/// A directory the test processes of this cargo-nextest run share (made on first use), beside
/// the run's build marker: `target/<profile>/baton-built/<run id>.shared`; `None` outside
/// nextest, where every process starts from nothing. Other runs' directories are removed when
/// this run's is made.
pub fn run_shared_dir() -> Option<PathBuf> {
    let marker = nextest_run_marker()?;
    let dir = marker.with_extension("shared");
    if !dir.is_dir() {
        if let Some(parent) = dir.parent()
            && let Ok(entries) = std::fs::read_dir(parent)
        {
            for e in entries.flatten() {
                let p = e.path();
                if p != dir && p.extension().is_some_and(|x| x == "shared") {
                    let _ = std::fs::remove_dir_all(&p);
                }
            }
        }
        std::fs::create_dir_all(&dir).ok()?;
    }
    Some(dir)
}

/// The example program `name` of the workspace (`shared/client/examples/NAME.rs`), built with
/// the binaries (`Binaries::build`, skipped as it is) into `examples/` beside them; fails when
/// it is not there.
pub fn example(name: &str) -> anyhow::Result<PathBuf> {
    if std::env::var_os(NO_BUILD_VAR).is_none_or(|v| v != "1") {
        built_once()?;
    }
    existing(profile_dir()?.join("examples").join(name), name, NO_BUILD_VAR)
}

/// Builds the workspace's binaries (and its examples) into the target directory of the running executable, with
/// the same profile, `--all-features`; in a debug build with the test targets too, so that the
/// dependencies' features are resolved exactly as `cargo test --workspace --all-features`
/// resolves them (and what it built is reused, not built again with other features).
fn cargo_build() -> anyhow::Result<()> {
    let profile_dir = profile_dir()?;
    let target = profile_dir.parent().ok_or_else(|| anyhow!("no target directory above {}", profile_dir.display()))?;
    let profile = profile_dir.file_name().and_then(OsStr::to_str).unwrap_or("debug");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--workspace", "--bins", "--examples", "--all-features", "--target-dir"])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile {
        "debug" => {
            cmd.arg("--tests");
        }
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let out = cmd.output().context("running cargo build")?;
    if !out.status.success() {
        bail!("cargo build --workspace --bins failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A command for `program` with a scrubbed environment: only `PATH` survives, `BATON_LOG` is
/// `CHILD_LOG_FILTER`, and stdin is empty. Whatever the test process inherited (a developer's
/// `BATON_NODE_*` or `BATON_HUB_DATA_DIR`) cannot leak into the run.
pub fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.env(baton_shared::logging::FILTER_VAR, CHILD_LOG_FILTER);
    cmd.stdin(Stdio::null());
    cmd
}

/// Runs `cmd` to completion with stdout and stderr captured. A command still running after
/// `limit` is killed and the call fails.
pub fn run(mut cmd: Command, limit: Duration) -> anyhow::Result<Output> {
    // Files, not pipes: a chatty command cannot block on a full pipe while we wait for it.
    let dir = tempfile::tempdir()?;
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    cmd.stdout(std::fs::File::create(&out_path)?).stderr(std::fs::File::create(&err_path)?);
    let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} was still running after {limit:?}; killed it");
        }
        std::thread::sleep(EXIT_POLL);
    };
    Ok(Output { status, stdout: std::fs::read(&out_path)?, stderr: std::fs::read(&err_path)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_captures_both_streams_and_the_status() {
        let mut cmd = command(Path::new("sh"));
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = run(cmd, Duration::from_secs(20)).unwrap();
        assert_eq!((out.status.code(), &out.stdout[..], &out.stderr[..]), (Some(3), &b"out\n"[..], &b"err\n"[..]));
    }

    #[test]
    fn run_kills_a_command_that_outlives_its_deadline() {
        let mut cmd = command(Path::new("sleep"));
        cmd.arg("60");
        let err = run(cmd, Duration::from_millis(100)).unwrap_err().to_string();
        assert!(err.contains("still running after"), "{err}");
    }

    #[test]
    fn commands_run_with_a_scrubbed_environment() {
        let out = run(command(Path::new("env")), Duration::from_secs(20)).unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut names: Vec<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
        names.sort();
        let expected: Vec<&str> =
            if std::env::var_os("PATH").is_some() { vec!["BATON_LOG", "PATH"] } else { vec!["BATON_LOG"] };
        assert_eq!(names, expected, "{text}");
        assert!(text.contains(&format!("BATON_LOG={CHILD_LOG_FILTER}\n")), "{text}");
    }

    #[test]
    fn a_producer_cli_that_does_not_exist_is_reported_with_how_to_name_it() {
        let err = existing(PathBuf::from("/nonexistent/baton"), "baton", PRODUCER_CLI_BIN_VAR).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/baton") && err.contains(PRODUCER_CLI_BIN_VAR), "{err}");
        assert_eq!(
            existing(PathBuf::from("/bin/sh"), "baton", PRODUCER_CLI_BIN_VAR).unwrap(),
            PathBuf::from("/bin/sh")
        );
    }

    #[test]
    fn binaries_that_do_not_exist_are_reported_with_how_to_name_them() {
        let missing = PathBuf::from("/nonexistent/baton-hub");
        let err = Binaries::at(Some(missing), Some(PathBuf::from("/bin/sh"))).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/baton-hub") && err.contains(HUB_BIN_VAR), "{err}");
        let found = Binaries::at(Some(PathBuf::from("/bin/sh")), Some(PathBuf::from("/bin/sh"))).unwrap();
        assert_eq!(found.hub, PathBuf::from("/bin/sh"));
    }
}
