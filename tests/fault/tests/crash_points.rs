//! R1: every crash point in `baton-hub` and `baton-node` × 3 seeds, with real processes; each run
//! must end with zero checker violations, and the armed point must actually have fired. A point
//! the table marks planned runs once the binary has it and is skipped (and named) until then.

use baton_fault::matrix::{CRASH_POINTS, CrashPoint, Presence, crash_run, known_by};
use baton_testkit::Binaries;
use std::collections::BTreeSet;
use std::path::Path;

const SEEDS: [u64; 3] = [1, 2, 3];

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
    let mut failures = Vec::new();
    for p in CRASH_POINTS.iter().filter(|p| filter(p)) {
        let point = &p.name;
        if only.as_deref().is_some_and(|o| o != *point) {
            continue;
        }
        if p.presence == Presence::Planned && !known_by(&bins, p).unwrap() {
            eprintln!("{point}: skipped (planned; not in this build yet)");
            continue;
        }
        for seed in SEEDS {
            let started = std::time::Instant::now();
            let run = rt.block_on(crash_run(&bins, point, seed)).unwrap();
            eprintln!("{}", run.summary(point, seed, started.elapsed()));
            failures.extend(run.failure(point, seed));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn hub_crash_points_three_seeds_each() {
    run_points(CrashPoint::on_hub);
}

#[test]
fn node_crash_points_three_seeds_each() {
    run_points(|p| !p.on_hub());
}
