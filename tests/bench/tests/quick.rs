//! The reduced benchmark runs end to end, so the benchmark cannot rot. This checks that it runs
//! and reports every figure the JSON promises; it never judges the numbers.

use std::path::PathBuf;
use std::process::Command;

/// The figures `--json` must always carry (step results may be `null` only when skipped).
const KEYS: [&str; 12] = [
    "sqlite_commits_per_s",
    "sqlite_rows_per_s_batch64",
    "accepted_per_s",
    "e2e_deliveries_per_s",
    "accept_to_claim_p50_ms",
    "accept_to_claim_p99_ms",
    "accept_to_report_p99_ms",
    "claim_ms_backlog_10k",
    "claim_ms_backlog_100k",
    "claim_ms_backlog_1m",
    "hub_peak_rss_bytes",
    "hub_cpu_s_per_1k_deliveries",
];

/// Builds the hub and node binaries into this test's target directory (the same features the
/// end-to-end suite uses, so neither build undoes the other) and returns that directory.
fn binaries() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>").to_path_buf();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    if std::env::var_os("BATON_TESTS_NO_BUILD").is_none_or(|v| v != "1") {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "baton-hub", "-p", "baton-node", "--all-features", "--target-dir"])
            .arg(&target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo build");
        assert!(out.status.success(), "cargo build failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    profile_dir
}

#[test]
fn the_quick_benchmark_runs_and_reports_every_figure() {
    let bins = binaries();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_baton-bench"))
        .arg("--quick")
        .arg("--json")
        .arg(&json)
        .arg("--dir")
        .arg(dir.path())
        .env("BATON_HUB_BIN", bins.join("baton-hub"))
        .env("BATON_NODE_BIN", bins.join("baton-node"))
        .output()
        .expect("run baton-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "baton-bench --quick failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("read json")).expect("json");
    for key in KEYS {
        // --quick times backlogs of 1k and 10k only; every other figure is measured.
        if key == "claim_ms_backlog_100k" || key == "claim_ms_backlog_1m" {
            assert!(figures.get(key).is_some(), "{key} missing from the JSON");
            continue;
        }
        let v = figures[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number: {}", figures[key]));
        assert!(v.is_finite() && v > 0.0, "{key} = {v}");
        assert!(stdout.contains(key), "{key} missing from the printed table");
    }
}
