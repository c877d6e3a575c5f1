//! `baton-demo`, the README's quick start, run to its end from the binaries this suite built
//! (run directly, the demo builds nothing and takes the programs beside it), so it cannot rot:
//! it shows what README promises and ends cleanly, its temporary directory removed.

use baton_testkit::Binaries;
use baton_testkit::bins;
use std::path::Path;
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
