//! R1 with the hub's record in PostgreSQL: every crash point of the hub and a daily share of the
//! node's (all of them in the whole matrix's run), one seed each, on two hubs whose record is a fresh database of one throwaway PostgreSQL cluster. Each run is the same as
//! in `crash_points.rs` (seeded workload, the point firing, restart, the client's retries,
//! quiescence); the checker then reads the PostgreSQL record and every node database, and must
//! find nothing, and the armed point must actually have fired. Skipped without PostgreSQL
//! unless `BATON_REQUIRE_POSTGRES=1`.
//!
//! A test binary of its own, so it never runs beside the SQLite matrix of `crash_points.rs`
//! (test binaries run one after another): two matrices at once on a 2-core machine slow each
//! other's drains past their limit. Within it the hub's and the node's points run side by side,
//! as the SQLite matrix's do. A node keeps its own SQLite database whatever the hub's
//! backend, but what it recovers from a crash (its holdings, a stale claim refused, a report
//! replayed) is the hub's answer, here read from PostgreSQL.

use baton_fault::checker::HubRecord;
use baton_fault::matrix::{
    CRASH_POINTS, CrashPoint, Presence, RecordAt, crash_run_at, known_by, run_each, runs_at_once,
};
use baton_testkit::Binaries;

/// The one seed each point runs with here (the SQLite matrix runs three).
const SEED: u64 = 1;

/// Hubs on the record: two. The nodes' claims, acks and reports split between them, so a hub's
/// point is armed on both hubs and fires at its first hit on either (`matrix::arms`); three
/// runs in a row all fired every point.
const HUBS: usize = 2;

/// The hub's points: the hub's transactions crash on PostgreSQL.
#[test]
fn hub_crash_points_on_postgres_one_seed_each() {
    run_points("hub_crash_points_on_postgres", CrashPoint::on_hub);
}

/// The node's points: what the node recovers (holdings, a stale claim refused, a report
/// replayed) is the hub's answer, read from PostgreSQL. Beside the hub's points (two tests, as
/// in `crash_points.rs`): each run waits on processes far more than it computes.
///
/// The node's side of each run is the node's own SQLite store, and the hub's answers are
/// statements the store's tests run on PostgreSQL, so the test command runs the day's third of
/// the node's points here (by the UTC day: three days in a row cover them all, the points are
/// named in the output); with `BATON_FAULT_SEEDS` set, the whole matrix's command, every one.
#[test]
fn node_crash_points_on_postgres_one_seed_each() {
    let node_points: Vec<&str> = CRASH_POINTS.iter().filter(|p| !p.on_hub()).map(|p| p.name).collect();
    let todays = todays_share(&node_points);
    run_points("node_crash_points_on_postgres", |p| !p.on_hub() && todays.contains(&p.name));
}

/// Runs that share a day's part of a matrix: three.
const DAILY_SHARES: usize = 3;

/// The points of `points` this run takes: all of them with `BATON_FAULT_SEEDS` set (the whole
/// matrix), else every `DAILY_SHARES`th from the UTC day's offset, said on stderr.
fn todays_share<'a>(points: &[&'a str]) -> Vec<&'a str> {
    if std::env::var("BATON_FAULT_SEEDS").is_ok() {
        return points.to_vec();
    }
    let day = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400);
    let offset = (day % DAILY_SHARES as u64) as usize;
    let share: Vec<&str> = points.iter().skip(offset).step_by(DAILY_SHARES).copied().collect();
    eprintln!(
        "node crash points on PostgreSQL: today's share {}/{DAILY_SHARES}, {share:?} (BATON_FAULT_SEEDS=1,2,3 runs them all)",
        offset + 1
    );
    share
}

fn run_points(test: &str, filter: impl Fn(&CrashPoint) -> bool) {
    let Some(pg) = baton_testkit::pg::cluster_or_skip(test, false) else { return };
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let only = std::env::var("BATON_FAULT_POINT").ok();
    let mut runs = Vec::new();
    for (i, p) in CRASH_POINTS.iter().enumerate().filter(|(_, p)| filter(p)) {
        let point = p.name;
        if only.as_deref().is_some_and(|o| o != point) {
            continue;
        }
        if p.presence == Presence::Planned && !known_by(&bins, p).unwrap() {
            eprintln!("{point}: skipped (planned; not in this build yet)");
            continue;
        }
        runs.push((point, pg.create_database(&format!("crash_{i}")).unwrap()));
    }
    // One database per run, so the runs are independent: several at once, reported in order.
    let failures: Vec<String> = run_each(&runs, runs_at_once(), |(point, url)| {
        let started = std::time::Instant::now();
        let run = rt
            .block_on(crash_run_at(&bins, point, SEED, RecordAt::Postgres { url, hubs: HUBS }))
            .unwrap_or_else(|e| panic!("{point} seed {SEED}: {e:#}"));
        assert_eq!(run.record, HubRecord::Postgres(url.clone()), "{point}: the checker read another record");
        eprintln!("{}", run.summary(point, SEED, started.elapsed()));
        run.failure(point, SEED)
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(only.is_some() || !runs.is_empty(), "{test}: no point ran");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    drop(rt);
    drop(pg);
}
