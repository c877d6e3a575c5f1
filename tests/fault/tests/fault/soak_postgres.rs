//! The short fixed-seed soak of two hubs sharing one PostgreSQL record: 25 s of kills, pauses,
//! partitions, fences and copies of a cut-off node's directory against both hubs (either, or
//! both at once) and 3 nodes that dial both, with producers submitting through either hub; then
//! heal, drain, and zero checker violations over the PostgreSQL record and every node database;
//! then the same with turn control (retries, slow turns, cancels) on a fresh database. Skipped
//! without PostgreSQL unless `BATON_REQUIRE_POSTGRES=1`.
//!
//! A test binary of its own, so it never runs beside the SQLite soaks of `soak.rs` (test
//! binaries run one after another): three soaks at once on a 2-core machine slow the
//! turn-control soak's drain past its limit.

use baton_fault::soak::{self, SoakConfig};
use baton_testkit::Binaries;

/// Seconds of faults: enough for each hub to be killed several times on a loaded 2-core
/// machine, short enough that the whole test stays well under two minutes.
const TWO_HUB_SECONDS: u64 = 25;
/// Seconds of faults of the turn-control soak, run after the first (never beside it: two
/// soaks at once on two cores slow each other's drains past their limit).
const TWO_HUB_TURN_CONTROL_SECONDS: u64 = 20;

/// Two hubs on one PostgreSQL record: nodes dial both through a proxy each, producers submit
/// through either, the nemesis kills, pauses and cuts off either hub (both at once included);
/// the checker then reads the PostgreSQL record and every node database and finds nothing.
/// Then the same with turn control.
#[test]
fn a_short_two_hub_postgres_soak_has_no_violations() {
    let Some(pg) = baton_testkit::pg::cluster_or_skip("a_short_two_hub_postgres_soak", false) else { return };
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cfg = SoakConfig {
        seconds: TWO_HUB_SECONDS,
        seed: 3,
        pause_ms_max: 3000,
        turn_control: false,
        database_url: Some(pg.url()),
        copies: true,
    };
    let f = two_hub_soak(&rt, &bins, cfg, "");
    // A node's directory was copied while it was cut off: I17 had a copy to judge.
    assert!(f.copies > 0, "{f:?}");
    assert!(f.accepted > 0 && f.kills > 0, "{f:?}");
    assert!(f.hub_moves > 0, "{f:?}");
    // At times neither hub ran: the nodes and producers waited for one to come back.
    assert!(f.all_hubs_down > 0, "{f:?}");
    assert!(f.ordered_executions > 2 * soak::HOSTS.len() as u64, "{f:?}");
    // Pool work claimed through both hubs at once: I18 had claims and order to judge.
    assert!(f.pool_claims > 0 && f.pool_ordered_executions > 0, "{f:?}");

    // Turn control on two hubs: a retry's run, a start or a cancel made through one hub holds
    // through the other, and I16 and I17 have runs and cancels to judge.
    let cfg = SoakConfig {
        seconds: TWO_HUB_TURN_CONTROL_SECONDS,
        seed: 1,
        pause_ms_max: 3000,
        turn_control: true,
        database_url: Some(pg.create_database("soak_turns").unwrap()),
        copies: false,
    };
    let f = two_hub_soak(&rt, &bins, cfg, "turn control");
    assert!(f.reruns > 0 && f.cancels > 0, "{f:?}");
    drop(rt);
    drop(pg);
}

/// Runs one soak of two hubs and holds it to what every such run must show: it drained, the
/// checker found nothing, both hubs were killed and both accepted work. Its figures, for the
/// caller's own checks.
fn two_hub_soak(rt: &tokio::runtime::Runtime, bins: &Binaries, cfg: SoakConfig, label: &str) -> soak::Figures {
    let started = std::time::Instant::now();
    let r = rt.block_on(soak::run(bins, cfg, &mut |l| eprintln!("nemesis {label}: {l}"))).unwrap();
    eprintln!("{label} {:?} in {:?}", r.figures, started.elapsed());
    let f = r.figures;
    assert!(r.drained, "{label}: the drain did not finish");
    assert!(r.report.violations.is_empty(), "{label}: {}", r.report.render());
    assert_eq!(f.hub_kills.len(), 2, "{f:?}");
    assert!(f.hub_kills.iter().all(|&k| k > 0), "both hubs were killed: {f:?}");
    assert!(f.accepted_via.iter().all(|&a| a > 0), "both hubs accepted work: {f:?}");
    f
}
