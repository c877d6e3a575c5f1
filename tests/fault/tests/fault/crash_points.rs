//! R1: every crash point in `baton-hub` and `baton-node`, with real processes; each run must end
//! with zero checker violations, and the armed point must actually have fired. A point the table
//! marks planned runs once the binary has it and is skipped (and named) until then.
//!
//! Seeds: the test command runs each point once, at the run's seed (`BATON_FAULT_SEEDS` unset:
//! one of `MATRIX_SEEDS`, chosen by the UTC day, so that consecutive days cover them all and a
//! run on the same day repeats it; the seed is printed with every run). The whole matrix, every
//! point × every seed, is `BATON_FAULT_SEEDS=1,2,3` (any comma-separated list of seeds).

use baton_fault::matrix::{CRASH_POINTS, CrashPoint, Presence, crash_run, known_by, run_each, runs_at_once};
use baton_testkit::Binaries;
use std::collections::BTreeSet;
use std::path::Path;

/// The seeds of the whole matrix (R1: every point × 3 seeds).
const MATRIX_SEEDS: [u64; 3] = [1, 2, 3];
/// The environment variable naming the seeds to run (comma-separated), `1,2,3` for the matrix.
const SEEDS_ENV: &str = "BATON_FAULT_SEEDS";

/// The seeds this run uses: those `BATON_FAULT_SEEDS` names, else the day's one of the matrix.
fn seeds() -> Vec<u64> {
    if let Ok(v) = std::env::var(SEEDS_ENV) {
        let seeds: Vec<u64> = v
            .split(',')
            .map(|s| s.trim().parse().unwrap_or_else(|_| panic!("{SEEDS_ENV}: {s:?} is not a seed number")))
            .collect();
        assert!(!seeds.is_empty(), "{SEEDS_ENV} names no seed");
        return seeds;
    }
    let day = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400);
    let seed = MATRIX_SEEDS[(day % MATRIX_SEEDS.len() as u64) as usize];
    eprintln!("crash points at seed {seed} (today's of {MATRIX_SEEDS:?}; {SEEDS_ENV}=1,2,3 runs the whole matrix)");
    vec![seed]
}

fn points_in_source() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = BTreeSet::new();
    let mut stack = vec![root.join("hub/src"), root.join("node/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for part in text.split("crash_point(\"").skip(1) {
                    out.insert(part.split('"').next().unwrap().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn the_matrix_covers_every_crash_point_in_the_source() {
    let in_source = points_in_source();
    let listed: BTreeSet<String> = CRASH_POINTS.iter().map(|p| p.name.to_string()).collect();
    let required: BTreeSet<String> =
        CRASH_POINTS.iter().filter(|p| p.presence == Presence::Required).map(|p| p.name.to_string()).collect();
    let unlisted: Vec<&String> = in_source.difference(&listed).collect();
    assert!(unlisted.is_empty(), "crash points in the source but not in the matrix: {unlisted:?}");
    let missing: Vec<&String> = required.difference(&in_source).collect();
    assert!(missing.is_empty(), "required crash points no longer in the source: {missing:?}");
}

#[test]
fn a_planned_point_is_known_only_to_a_binary_that_has_it() {
    let bins = Binaries::build().unwrap();
    let built = CRASH_POINTS.iter().find(|p| p.name == "node.exec.after_start_marker").unwrap();
    assert!(known_by(&bins, built).unwrap());
    let absent = CrashPoint { name: "node.no.such_point", presence: Presence::Planned };
    assert!(!known_by(&bins, &absent).unwrap());
}

fn run_points(filter: impl Fn(&CrashPoint) -> bool) {
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let only = std::env::var("BATON_FAULT_POINT").ok();
    let seeds = seeds();
    let mut runs = Vec::new();
    for p in CRASH_POINTS.iter().filter(|p| filter(p)) {
        let point = p.name;
        if only.as_deref().is_some_and(|o| o != point) {
            continue;
        }
        if p.presence == Presence::Planned && !known_by(&bins, p).unwrap() {
            eprintln!("{point}: skipped (planned; not in this build yet)");
            continue;
        }
        runs.extend(seeds.iter().map(|&seed| (point, seed)));
    }
    // The runs are independent (own directories, own ports): several at once, reported in order.
    let failures: Vec<String> = run_each(&runs, runs_at_once(), |&(point, seed)| {
        let started = std::time::Instant::now();
        let run = rt.block_on(crash_run(&bins, point, seed)).unwrap_or_else(|e| panic!("{point} seed {seed}: {e:#}"));
        eprintln!("{}", run.summary(point, seed, started.elapsed()));
        run.failure(point, seed)
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn hub_crash_points_at_the_runs_seeds() {
    run_points(CrashPoint::on_hub);
}

#[test]
fn node_crash_points_at_the_runs_seeds() {
    run_points(|p| !p.on_hub());
}
