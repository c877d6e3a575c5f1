//! `baton-demo`, the README's quick start, run to its end from the binaries this suite built
//! (run directly, the demo builds nothing and takes the programs beside it), so it cannot rot:
//! it shows what README promises and ends cleanly, its temporary directory removed. And the
//! quick start's one build: the demo's own build of the programs resolves features as the
//! `cargo run` that built the demo, so it compiles no library a second time.

use baton_testkit::Binaries;
use baton_testkit::bins;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The whole demo: three processes, about twenty turns, one retry backoff.
const DEMO_WAIT: Duration = Duration::from_secs(300);

/// The demo exits 0 after showing a pause, a failed turn (and `baton wait` exit 7 for it), a
/// turn retried after exit 75 sent and waited for with the `baton` CLI, the status page's
/// address, what `baton-hub status` flags with its exit status explained, and a clean
/// shutdown; its directory is gone afterwards.
#[test]
fn the_demo_runs_to_a_clean_end() {
    let bins = Binaries::build().unwrap();
    let demo = bins.hub.with_file_name("baton-demo");
    let out = bins::run(bins::command(&demo), DEMO_WAIT).unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = format!("{said}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the demo exited {}:\n{log}", out.status);
    for shown in [
        "== [",
        "status page: http://127.0.0.1:",
        "paused by pause fence",
        "failed  exit 3",
        "$ baton --config baton.toml wait --idempotency-key gamma-1",
        "  (exit 7)",
        "$ baton --config baton.toml send --conversation delta",
        "--max-attempts 3",
        // Shown as a shell reads it: an argument with spaces is quoted.
        r#"--payload '{"task": "delta: flaky tool"}'"#,
        "retry 1 of 2 after exit 75",
        "run 2 (retry)",
        "$ baton --config baton.toml get --idempotency-key delta-1",
        "$ baton-hub status",
        "hub stopped (exit status: 0)",
        "13 of 14 deliveries succeeded",
    ] {
        assert!(said.contains(shown), "the demo did not show {shown:?}:\n{log}");
    }
    assert!(said.contains("(exit 0: nothing needs attention") || said.contains("(exit 1: "), "{log}");
    assert!(!said.contains("linking baton-hub"), "run directly, the demo builds nothing:\n{log}");
    let dir = said.lines().find_map(|l| l.strip_prefix("working in ")).expect("the demo names its directory");
    assert!(!Path::new(dir).exists(), "the demo left {dir}");
}

/// Every package and the features cargo resolves for it when it builds `packages` (normal and
/// build dependencies, as `cargo run` and `cargo build --bins` do).
fn resolved_features(packages: &[&str]) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent");
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(["tree", "--offline", "-e", "features,normal,build", "--prefix", "none", "-f", "{p} {f}"])
        .current_dir(root);
    for p in packages {
        cmd.args(["-p", p]);
    }
    let out = bins::run(cmd, DEMO_WAIT).unwrap();
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.replace(" (*)", "").replace(" (command-line)", "").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// README's quick start builds once: `cargo run --release -p baton-demo` resolves every
/// dependency's features exactly as the demo's own build of the programs (its `PROGRAMS`) does,
/// so that build compiles no library again and only links the binaries.
#[test]
fn the_demos_build_of_the_programs_compiles_no_library_again() {
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("demo/src/main.rs")).unwrap();
    let list = source
        .lines()
        .find_map(|l| l.strip_prefix("const PROGRAMS: "))
        .and_then(|l| l.split_once("= [").map(|(_, rest)| rest.trim_end_matches("];").to_string()))
        .expect("the demo's PROGRAMS");
    let programs: Vec<&str> = list.split(',').map(|p| p.trim().trim_matches('"')).filter(|p| !p.is_empty()).collect();
    assert!(programs.contains(&"baton-demo") && programs.contains(&"baton-hub"), "{programs:?}");
    let by_run = resolved_features(&["baton-demo"]);
    let by_build = resolved_features(&programs);
    let differ: Vec<&String> = by_run.symmetric_difference(&by_build).collect();
    assert!(
        differ.is_empty(),
        "`cargo run -p baton-demo` and the demo's `cargo build -p {}` resolve features otherwise: {differ:?}",
        programs.join(" -p ")
    );
}
