//! `baton send --spool` and `baton spool`, end to end against the real `baton-hub`: messages
//! sent while the hub is down wait in the producer's spool and are accepted once each, in the
//! order they were spooled, when it is back at the same address; a `baton` SIGKILLed while
//! flushing loses and duplicates nothing; a message the hub refuses is kept, failed, and holds
//! back only its own conversation; `spool status` says what waits.

use crate::harness::{EVENT_WAIT, Hub};
use crate::node_harness::wait_for;
use crate::producer_cli::{baton, baton_bin, config_file, json, run, status, text};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the hub stays down while producers spool.
const OUTAGE: Duration = Duration::from_secs(60);

/// `baton --config FILE ARGS…`, run to its end.
fn producer(config: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--config".to_string(), config.display().to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    run(baton(all))
}

/// `baton send --spool DIR` of `{"n": key}` to host-a.
fn spool_send(config: &Path, spool: &Path, conversation: &str, key: &str) -> std::process::Output {
    let payload = format!("{{\"n\": {key:?}}}");
    let dir = spool.display().to_string();
    producer(
        config,
        &[
            "send",
            "--spool",
            &dir,
            "--conversation",
            conversation,
            "--to",
            "host-a",
            "--key",
            key,
            "--payload",
            &payload,
        ],
    )
}

/// `baton spool status --spool DIR --json`.
fn spool_status(spool: &Path) -> Value {
    let out = run(baton(["spool", "status", "--spool", &spool.display().to_string(), "--json"]));
    status(&out, 0);
    json(&out)
}

/// The message the hub holds under `key` (the producer `prod`'s).
async fn by_key(hub: &Hub, key: &str) -> Value {
    let r = hub.client("prod").get(&format!("/v1/messages?idempotency_key={key}")).await;
    r.ok(200).clone()
}

/// Asserts that the conversation holds exactly `keys`, accepted in that order.
async fn accepted_in_order(hub: &Hub, conversation: &str, keys: &[String]) {
    let mut seqs = Vec::new();
    for k in keys {
        let m = by_key(hub, k).await;
        assert_eq!(m["conversation"], conversation, "{m}");
        seqs.push(m["seq"].as_i64().expect("seq"));
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{conversation}: accepted out of spool order: {keys:?} {seqs:?}");
    let c = hub.client("prod").get(&format!("/v1/conversations/{conversation}")).await;
    assert_eq!(c.ok(200)["last_seq"], keys.len() as i64, "{conversation}: no message twice, none extra");
}

/// The hub stopped for a minute: every `send --spool` meanwhile answers "spooled" (exit 10);
/// a flush started during the outage keeps trying and, once the hub is back at the same
/// address, delivers them all, once each, in spool order per conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_spooled_through_a_hub_outage_are_accepted_once_in_order() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let config = config_file(&hub, true);
    let spool = hub.scratch("spool");

    // With the hub up, a spooled send is delivered before `baton` returns.
    let out = spool_send(&config, &spool, "c1", "k-0");
    status(&out, 0);
    assert!(
        text(&out.stdout).contains("spooled k-0") && text(&out.stdout).contains("accepted"),
        "{}",
        text(&out.stdout)
    );

    hub.kill9();
    let down = Instant::now();
    let mut c1 = vec!["k-0".to_string()];
    let mut c2 = Vec::new();
    for i in 1..=8 {
        let (conversation, keys) = if i % 3 == 0 { ("c2", &mut c2) } else { ("c1", &mut c1) };
        let key = format!("k-{i}");
        let out = spool_send(&config, &spool, conversation, &key);
        status(&out, 10);
        assert!(text(&out.stdout).contains(&format!("spooled {key}")), "{}", text(&out.stdout));
        keys.push(key);
    }
    // Sent again unchanged, a spooled message is not spooled twice.
    status(&spool_send(&config, &spool, "c2", "k-3"), 10);
    let st = spool_status(&spool);
    assert_eq!(st["waiting"], 8, "{st}");
    assert!(st["oldest_age_ms"].as_i64().is_some() && st["failed"] == serde_json::json!([]), "{st}");
    assert!(st["last_error"]["error"].as_str().is_some_and(|e| e.contains("unreachable")), "{st}");
    let human = run(baton(["spool", "status", "--spool", &spool.display().to_string()]));
    status(&human, 0);
    assert!(text(&human.stdout).contains("waiting 8"), "{}", text(&human.stdout));

    // A flush that waits longer than the outage, started while the hub is down.
    let mut flush = baton_testkit::proc::Proc::new(&hub.scratch("flush"), "flush");
    let mut cmd = baton_testkit::bins::command(&baton_bin());
    cmd.args(["--config", &config.display().to_string(), "spool", "flush", "--spool", &spool.display().to_string()]);
    cmd.args(["--wait", "10m", "--json"]);
    flush.spawn(cmd).expect("spawn baton spool flush");
    // The outage itself is what this test is about: its length is the scenario, not a wait.
    std::thread::sleep(OUTAGE.saturating_sub(down.elapsed()));
    assert!(flush.running(), "the flush keeps trying while the hub is down: {}", flush.stderr());
    hub.serve(None);
    let ended = flush.wait_exit(EVENT_WAIT * 4).expect("wait for the flush").expect("the flush ends once delivered");
    assert_eq!(ended.code(), Some(0), "stdout: {}\nstderr: {}", flush.stdout(), flush.stderr());

    accepted_in_order(&hub, "c1", &c1).await;
    accepted_in_order(&hub, "c2", &c2).await;
    let st = spool_status(&spool);
    assert_eq!((st["waiting"].as_i64(), st["bytes"].as_i64()), (Some(0), Some(0)), "{st}");
}

/// A large spool flushed by a `baton` that is SIGKILLed halfway: another flush delivers the
/// rest; every message is accepted exactly once (a message the hub took whose removal the
/// kill cut off is a duplicate replay, removed), in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_killed_halfway_loses_and_duplicates_nothing() {
    const MESSAGES: usize = 120;
    let mut hub = Hub::with_nodes(&["host-a"]);
    let config = config_file(&hub, true);
    let spool = hub.scratch("spool");
    hub.kill9();
    let keys: Vec<String> = (0..MESSAGES).map(|i| format!("m-{i:03}")).collect();
    for k in &keys {
        status(&spool_send(&config, &spool, "bulk", k), 10);
    }
    assert_eq!(spool_status(&spool)["waiting"], MESSAGES as i64);
    hub.serve(None);

    let mut flush = baton_testkit::proc::Proc::new(&hub.scratch("flush"), "flush");
    let mut cmd = baton_testkit::bins::command(&baton_bin());
    cmd.args(["--config", &config.display().to_string(), "spool", "flush", "--spool", &spool.display().to_string()]);
    flush.spawn(cmd).expect("spawn baton spool flush");
    let left = wait_for("the flush to deliver some of the spool", EVENT_WAIT * 4, || {
        let waiting = spool_status(&spool)["waiting"].as_i64().unwrap_or(0);
        (waiting < MESSAGES as i64).then_some(waiting)
    });
    flush.kill().expect("SIGKILL the flush");
    assert!(left > 0, "the kill came after the flush ended; nothing was cut off");

    let out = producer(&config, &["spool", "flush", "--spool", &spool.display().to_string()]);
    status(&out, 0);
    accepted_in_order(&hub, "bulk", &keys).await;
    assert_eq!(spool_status(&spool)["waiting"], 0);
}

/// A message the hub refuses for good (400: more runs than the hub's `max_attempts_max`) is kept as failed with the hub's code; the later message of its
/// conversation waits behind it, another conversation's goes on; discarding it lets the
/// conversation go on.
#[test]
fn a_refused_message_is_kept_and_holds_back_only_its_conversation() {
    let hub = Hub::with_nodes(&["host-a"]);
    let config = config_file(&hub, true);
    let spool = hub.scratch("spool");
    let dir = spool.display().to_string();
    let send = |conversation: &str, key: &str, runs: &str| {
        producer(
            &config,
            &[
                "send",
                "--spool",
                &dir,
                "--conversation",
                conversation,
                "--to",
                "host-a",
                "--key",
                key,
                "--payload",
                "{}",
            ]
            .into_iter()
            .chain(["--max-attempts", runs])
            .collect::<Vec<_>>(),
        )
    };
    let refused = send("c1", "bad", "1000000");
    assert!(matches!(refused.status.code(), Some(2 | 9)), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("kept in the spool as failed"), "{}", text(&refused.stderr));
    status(&send("c1", "after", "1"), 10);
    status(&send("c2", "other", "1"), 0);
    let st = spool_status(&spool);
    assert_eq!((st["waiting"].as_i64(), st["blocked"].as_i64()), (Some(1), Some(1)), "{st}");
    let failed = &st["failed"][0];
    assert_eq!(failed["idempotency_key"], "bad", "{st}");
    assert!(failed["code"].as_str().is_some_and(|c| !c.is_empty()) && failed["status"].as_i64().is_some(), "{st}");
    let out = producer(&config, &["spool", "flush", "--spool", &dir]);
    status(&out, 11);

    let position = failed["position"].as_i64().expect("position").to_string();
    status(&run(baton(["spool", "discard", "--spool", &dir, &position])), 0);
    let out = producer(&config, &["spool", "flush", "--spool", &dir]);
    status(&out, 0);
    assert!(text(&out.stdout).contains("accepted: c1 #1"), "{}", text(&out.stdout));
}

/// A damaged spool is refused (exit 3) naming its file, and left as it was.
#[test]
fn a_damaged_spool_is_refused_naming_the_file() {
    let hub = Hub::with_nodes(&["host-a"]);
    let config = config_file(&hub, true);
    let spool = hub.scratch("spool");
    let file = spool.join("spool.db");
    let junk = vec![0x5au8; 8192];
    std::fs::write(&file, &junk).expect("write junk");
    let out = spool_send(&config, &spool, "c", "k");
    status(&out, 3);
    assert!(text(&out.stderr).contains(&file.display().to_string()), "{}", text(&out.stderr));
    let out = run(baton(["spool", "status", "--spool", &spool.display().to_string()]));
    status(&out, 3);
    assert_eq!(std::fs::read(&file).expect("read"), junk, "left as it was");
}
