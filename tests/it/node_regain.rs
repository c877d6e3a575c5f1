//! A restarted hub under 20 real long-polling nodes: every node regains it, and the test prints
//! how long each took from the hub listening again to that node's next answered request (the
//! node logs "hub reachable again after …" at that moment). Figures are printed, never
//! asserted: only that every node regains the hub within a generous deadline.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};
use std::time::{Duration, Instant};

const NODES: usize = 20;

#[test]
fn every_long_polling_node_regains_a_restarted_hub() {
    let hosts: Vec<String> = (0..NODES).map(|i| format!("host-{i:02}")).collect();
    let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let mut hub = Hub::with_nodes(&names);
    let nodes: Vec<_> = names.iter().map(|h| hub.node_process(h).set("claim_wait", "\"30s\"").start()).collect();
    // Every node has claimed once (so each is in its claim long-poll when the hub goes away).
    for (i, host) in names.iter().enumerate() {
        hub.send_one(&format!("before-{i}"), &format!("before-{i}"), host);
    }
    wait_for("every node to run its first turn", NODE_WAIT, || (hub.exec_log().lines().len() == NODES).then_some(()));

    hub.kill9();
    // Long enough an outage that a doubling backoff would have grown past several seconds.
    std::thread::sleep(Duration::from_secs(8));
    hub.serve(None);
    let listening = Instant::now();

    let mut regained: Vec<Option<Duration>> = vec![None; NODES];
    let deadline = listening + NODE_WAIT;
    while regained.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "nodes that did not regain the hub within {NODE_WAIT:?}: {:?}",
            names.iter().zip(&regained).filter(|(_, r)| r.is_none()).map(|(h, _)| *h).collect::<Vec<_>>()
        );
        for (node, slot) in nodes.iter().zip(regained.iter_mut()) {
            if slot.is_none() && node.log().contains("hub reachable again after") {
                *slot = Some(listening.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut times: Vec<Duration> = regained.into_iter().flatten().collect();
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    println!(
        "{NODES} nodes regained the restarted hub: p50 {:.2}s, p99 {:.2}s, max {:.2}s (from the hub listening again)",
        at(0.5).as_secs_f64(),
        at(0.99).as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );

    // And each claims again: a message sent now to every host runs on it.
    for (i, host) in names.iter().enumerate() {
        hub.send_one(&format!("after-{i}"), &format!("after-{i}"), host);
    }
    wait_for("every node to run a turn after the restart", NODE_WAIT, || {
        (hub.exec_log().lines().len() == 2 * NODES).then_some(())
    });
}
