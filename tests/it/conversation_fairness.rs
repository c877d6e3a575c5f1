//! Fairness across conversations on one host (SPEC §2): a conversation with a deep backlog must
//! not starve the others. Conversation A has 5,000 queued turns and B has 20, all waiting before
//! the host's node starts (`parallel_conversations = 4`, a harness that does nothing but log);
//! every turn of B must run while most of A's backlog has not.

use crate::harness::{Api, Hub};
use crate::node_harness::wait_for;
use std::time::Duration;

/// The heavy conversation's backlog.
const HEAVY_TURNS: usize = 5_000;
/// The light conversation's turns.
const LIGHT_TURNS: usize = 20;
/// Concurrent producer connections filling the heavy backlog.
const SUBMITTERS: usize = 16;
/// The one host.
const HOST: &str = "host-a";
/// How long all of B may take to run once the node starts, on a loaded 2-core machine.
const LIGHT_RAN_WAIT: Duration = Duration::from_secs(300);

#[test]
fn a_deep_backlog_does_not_starve_a_light_conversation_on_the_same_host() {
    // The per-host backlog limit must admit the whole heavy backlog.
    let hub =
        Hub::builder().nodes(&[HOST]).producers(&["prod"]).config("[limits]\nqueued_per_host_max = 100000\n").start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let submitters: Vec<Api> = (0..SUBMITTERS).map(|_| hub.client("prod")).collect();
    let light = hub.client("prod");
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (s, api) in submitters.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                for m in (s..HEAVY_TURNS).step_by(SUBMITTERS) {
                    api.submit_new("heavy", &format!("a-{m}"), &[HOST]).await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("submitter task");
        }
        // B's turns come after all of A's, the worst case for a first-come order.
        for m in 0..LIGHT_TURNS {
            light.submit_new("light", &format!("b-{m}"), &[HOST]).await;
        }
    });

    let _node = hub.node_process(HOST).set("parallel_conversations", "4").start();
    let ran = wait_for("every turn of the light conversation to run", LIGHT_RAN_WAIT, || {
        let ran = hub.exec_log().lines();
        (ran.iter().filter(|r| r.conversation == "light").count() >= LIGHT_TURNS).then_some(ran)
    });
    let heavy_ran = ran.iter().filter(|r| r.conversation == "heavy").count();
    eprintln!("the light conversation finished after {heavy_ran} of {HEAVY_TURNS} heavy turns");
    assert!(
        heavy_ran * 2 < HEAVY_TURNS,
        "the light conversation waited for {heavy_ran} of {HEAVY_TURNS} heavy turns (more than half)"
    );
    let light: Vec<i64> = ran.iter().filter(|r| r.conversation == "light").map(|r| r.seq).collect();
    assert!(light.windows(2).all(|w| w[0] < w[1]), "light turns out of order: {light:?}");
}
