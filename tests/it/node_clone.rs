//! A second node with the same certificate and another data directory (a clone, or a
//! re-provisioned machine) while the first instance still holds work: it takes nothing and
//! acts on nothing; the first instance resumes after its restart.

use crate::harness::Hub;
use crate::node_harness::wait_for;
use std::time::Duration;

/// Counts the clone's refused claims in its log.
fn refusals(log: &str) -> usize {
    log.matches("instance_conflict").count()
}

/// The first instance dies after the handoff: delivered without an outcome, still held by it.
#[test]
fn a_clone_takes_nothing_while_the_first_holds_a_delivered_turn() {
    check("node.handoff.after_response", "delivered");
}

/// The first instance dies after mirroring locally: the hub has it claimed by that instance.
#[test]
fn a_clone_takes_nothing_while_the_first_holds_a_claim() {
    check("node.mirror.after_commit", "claimed");
}

/// The first instance crashes at `point`, leaving its delivery in `held_state`; a clone runs
/// meanwhile; then the first restarts.
fn check(point: &str, held_state: &str) {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut first = hub.node_process("host-a").crash_point(point).start();
    let held = hub.send_one("conv", "k1", "host-a");
    first.wait_crash(point);
    let record = hub.show(&held);
    assert_eq!(record["delivery"]["state"], held_state);
    let first_instance = record["delivery"]["instance_id"].as_str().expect("instance").to_string();

    let mut clone = hub.node_process("host-a").named("host-a-clone").set("backoff_max", "\"200ms\"").start();
    clone.wait_log("instance_conflict");
    // New work for the host while the clone runs: the clone must not get it either.
    let queued = hub.send_one("conv", "k2", "host-a");
    let seen = refusals(&clone.log());
    wait_for("the clone to be refused again after the new message", Duration::from_secs(20), || {
        (refusals(&clone.log()) >= seen + 2).then_some(())
    });
    let log = clone.log();
    assert!(log.contains("409"), "the refusal is a 409: {log}");

    // The hub's record is exactly as the first instance left it.
    assert_eq!(hub.show(&held), record, "the clone changed nothing about the held delivery");
    let q = hub.delivery(&queued);
    assert_eq!((q["state"].as_str(), q["instance_id"].as_str()), (Some("queued"), None), "{q:#}");
    assert!(hub.exec_log().lines().is_empty(), "nothing ran: {:#?}", hub.exec_log().lines());

    let st = clone.term();
    assert_eq!(st.code(), Some(0), "the clone stops cleanly: {st}");
    let cs = clone.status();
    assert_ne!(cs["instance_id"], first_instance.as_str(), "another data directory is another instance");
    assert!(cs["open"].as_array().is_some_and(Vec::is_empty), "the clone holds nothing: {cs}");
    assert!(cs["counts"].as_object().is_some_and(|c| c.is_empty()), "the clone never stored a delivery: {cs}");

    first.restart();
    for id in [&held, &queued] {
        hub.wait_outcome(id);
    }
    let status = first.wait_idle();
    assert_eq!(status["instance_id"], first_instance.as_str());
    for id in [&held, &queued] {
        hub.assert_one_attempt(id, "succeeded");
        assert_eq!(hub.delivery(id)["instance_id"], first_instance.as_str());
        assert_eq!(hub.exec_log().runs_of(id), 1, "{id} ran once");
    }
    assert!(hub.exec_log().lines().iter().all(|r| r.host == "host-a"), "only the first instance ran anything");
    hub.verify_ok();
}
