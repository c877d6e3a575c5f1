//! `requeue_silent_after`, end to end: a node dies holding a mirrored delivery (aborted right
//! after the hub confirmed `mirrored`, before its ack); once its session has been silent that
//! long, the hub returns the delivery to the queue (by `hub`), another instance of the host takes
//! and runs it, and the old node, back on its data directory, never runs it (its ack is refused:
//! the execution gate).

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};

const POINT: &str = "node.mirrored.after_response";

#[test]
fn a_silent_instances_mirrored_delivery_goes_back_to_the_queue_and_runs_once_elsewhere() {
    let hub = Hub::builder()
        .nodes(&["host-a"])
        .producers(&["prod"])
        .config("requeue_silent_after = \"14s\"\n[limits]\nlong_poll_wait_max = \"1s\"\n")
        .start();
    // Only a node that sends `mirrored` and `ack` apart leaves a delivery `mirrored` at the hub.
    let mut old = hub
        .node_process("host-a")
        .set("claim_wait", "\"1s\"")
        .set("handoff", "\"separate\"")
        .crash_point(POINT)
        .start();
    let id = hub.send_one("conv", "k1", "host-a");
    old.wait_crash(POINT);
    let held = hub.delivery(&id);
    assert_eq!(held["state"], "mirrored", "{held:#}");
    let old_instance = held["instance_id"].as_str().expect("held by the old instance").to_string();

    // The hub requeues it on its own, as `hub`.
    wait_for("the silent instance's delivery to be requeued", NODE_WAIT, || {
        (hub.delivery(&id)["state"] == "queued").then_some(())
    });
    let events = hub.events(&id);
    let last = events.last().expect("events");
    assert_eq!(
        (last.0.as_deref(), last.1.as_str(), last.2.as_str()),
        (Some("mirrored"), "queued", "hub"),
        "{events:?}"
    );
    let audit = hub.cli_json(["audit", "--json"]);
    let requeues: Vec<_> = audit.as_array().unwrap().iter().filter(|e| e["action"] == "requeue_silent").collect();
    assert_eq!(requeues.len(), 1, "{audit:#}");
    assert_eq!((requeues[0]["actor"].as_str(), requeues[0]["subject"].as_str()), (Some("hub"), Some("host-a")));

    // Another instance of the host takes it and runs it.
    let _other = hub.node_process("host-a").named("host-a-clone").set("claim_wait", "\"1s\"").start();
    hub.wait_outcome(&id);
    let done = hub.delivery(&id);
    assert_ne!(done["instance_id"], old_instance.as_str(), "another instance ran it");
    assert_eq!(hub.exec_log().runs_of(&id), 1);

    // The old node comes back with its mirrored copy: it never runs it.
    old.restart();
    old.wait_idle();
    assert_eq!(hub.exec_log().runs_of(&id), 1, "run once:\n{:#?}", hub.exec_log().lines());
    hub.assert_one_attempt(&id, "succeeded");
    hub.verify_ok();
}
