//! Progress of a running turn, end to end: a real harness writes progress events on the channel
//! its node gives it (`BATON_PROGRESS_FD`), the node forwards them with its renewals, the hub
//! keeps them with the run, and the producer follows the message's events feed with `baton
//! watch`, killed and restarted from its last printed cursor, reading every event exactly once
//! and in order. A conversation's feed shows a producer its own messages only, within its
//! publish scope; bad and expired cursors are refused with their codes.

use crate::harness::Hub;
use crate::producer_cli::{baton, baton_bin, config_file, json, run, status, text};
use serde_json::Value;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};

/// How many progress events the harness below writes, in bursts of `BURST` with a pause after
/// each, so the follower is cut off while the turn is still writing.
const EVENTS: u64 = 1000;
const BURST: u64 = 200;

/// A harness that writes `EVENTS` progress events, `{"i":N}`, on its progress channel.
fn emitting_harness() -> String {
    format!(
        "[ \"$BATON_CONVERSATION\" != fail ] || exit 3; i=1; while [ $i -le {EVENTS} ]; do echo \"{{\\\"i\\\":$i}}\" >&$BATON_PROGRESS_FD; \
         if [ $((i % {BURST})) -eq 0 ]; then sleep 0.3; fi; i=$((i+1)); done"
    )
}

/// `baton --json watch ID [--after C]` with stdout piped and stderr appended to `log`.
fn watch(config: &std::path::Path, id: &str, after: Option<&str>, log: &std::path::Path) -> Child {
    let mut cmd = baton(["--config", &config.display().to_string(), "--json", "watch", id, "--timeout", "120s"]);
    if let Some(after) = after {
        cmd.args(["--after", after]);
    }
    let err = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("watch log");
    cmd.stdout(Stdio::piped()).stderr(err);
    cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", baton_bin().display()))
}

/// Reads `child`'s complete lines; once `kill_after` progress events were read in all (counting
/// `seen_before`), kills it with SIGKILL and reads what it had written. Returns the events read
/// and whether it ended on its own (exit 0).
fn follow(mut child: Child, seen_before: usize, kill_after: Option<usize>) -> (Vec<Value>, bool) {
    let stdout = child.stdout.take().expect("stdout");
    let mut events = Vec::new();
    let mut killed = false;
    for line in BufReader::new(stdout).split(b'\n') {
        let Ok(line) = line else { break };
        // A line cut by the kill is not whole JSON: its event comes again after the resume.
        let Ok(v) = serde_json::from_slice::<Value>(&line) else { continue };
        events.push(v);
        let progress = seen_before + events.iter().filter(|e| e["kind"] == "progress").count();
        if !killed && kill_after.is_some_and(|k| progress >= k) {
            let _ = child.kill();
            killed = true;
        }
    }
    let status = child.wait().expect("wait for baton watch");
    if events.is_empty() {
        eprintln!("baton watch printed nothing and ended: {status:?}");
    }
    (events, !killed && status.success())
}

/// The acceptance test of progress: 1,000 events written by a real harness reach a follower
/// that is cut off three times (SIGKILL) and resumes each time from the last cursor it printed:
/// every event once, in order, between the delivery's `delivered` and the run's outcome, which
/// counts them all.
#[test]
fn a_follower_cut_off_three_times_reads_every_progress_event_once_in_order() {
    let hub = Hub::with_nodes(&["host-a"]);
    let _node = hub
        .node_process("host-a")
        .then(&emitting_harness())
        .set("progress_events_per_second_max", "100000")
        .set("progress_flush_interval", "\"50ms\"")
        .start();
    let config = config_file(&hub, false);
    let cfg = config.display().to_string();
    let out = run(baton(
        ["--config", cfg.as_str(), "--json", "send", "--conversation", "c", "--to", "host-a"].into_iter().chain([
            "--key",
            "k1",
            "--payload",
            "{}",
        ]),
    ));
    status(&out, 0);
    let id = json(&out)["message_id"].as_str().expect("message_id").to_string();

    let log = hub.scratch("watch").join("stderr.log");
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut all: Vec<Value> = Vec::new();
    let mut after: Option<String> = None;
    for kill_after in [150, 450, 750] {
        let (events, _) = follow(watch(&config, &id, after.as_deref(), &log), progress_count(&all), Some(kill_after));
        assert!(
            !events.is_empty() || progress_count(&all) >= kill_after,
            "the follower read nothing before its kill: {}",
            said()
        );
        if let Some(last) = events.last() {
            after = Some(last["cursor"].as_str().expect("cursor").to_string());
        }
        all.extend(events);
    }
    let (events, ended) = follow(watch(&config, &id, after.as_deref(), &log), progress_count(&all), None);
    all.extend(events);
    assert!(ended, "the last follower ends when the message settled (exit 0): {}", said());

    let cursors: Vec<u64> = all.iter().map(|e| e["cursor"].as_str().unwrap().parse().unwrap()).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "in order, none twice: {cursors:?}");
    let seqs: Vec<u64> = all.iter().filter(|e| e["kind"] == "progress").map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=EVENTS).collect::<Vec<_>>(), "every event once, in order");
    let bodies: Vec<u64> =
        all.iter().filter(|e| e["kind"] == "progress").map(|e| e["progress"]["i"].as_u64().unwrap()).collect();
    assert_eq!(bodies, seqs, "each event is what the harness wrote");
    let kinds: Vec<String> = all
        .iter()
        .filter(|e| e["kind"] != "progress")
        .map(|e| format!("{}{}", e["kind"].as_str().unwrap(), e["to"].as_str().or(e["outcome"].as_str()).unwrap()))
        .collect();
    assert_eq!(kinds, ["statequeued", "stateclaimed", "statemirrored", "statedelivered", "outcomesucceeded"]);
    let delivered_at = all.iter().position(|e| e["to"] == "delivered").unwrap();
    let outcome_at = all.iter().position(|e| e["kind"] == "outcome").unwrap();
    let first_progress = all.iter().position(|e| e["kind"] == "progress").unwrap();
    assert!(delivered_at < first_progress && outcome_at == all.len() - 1);
    assert_eq!(
        (all[outcome_at]["progress_events"].as_u64(), all[outcome_at]["progress_dropped"].as_u64()),
        (Some(EVENTS), Some(0))
    );

    // A settled message's feed is read whole, once, and `watch` ends with `wait`'s verdict.
    let out =
        run(baton(
            ["--config", cfg.as_str(), "--json", "send", "--conversation", "fail", "--to", "host-a"]
                .into_iter()
                .chain(["--key", "k-fail", "--payload", "{}"]),
        ));
    status(&out, 0);
    let failing = json(&out)["message_id"].as_str().expect("message_id").to_string();
    let out = run(baton(["--config", cfg.as_str(), "wait", &failing, "--timeout", "120s"]));
    status(&out, 7);
    // It ends once the feed is read, not after another long poll (25 s) of a settled message.
    let began = std::time::Instant::now();
    let out = run(baton(["--config", cfg.as_str(), "--json", "watch", &failing]));
    status(&out, 7);
    let took = began.elapsed();
    assert!(took < std::time::Duration::from_secs(15), "watch of a settled message lingered {took:?}");
    let lines: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.last().map(|e| e["outcome"].clone()), Some(Value::from("failed")), "{lines:?}");

    // The text form reads the same feed.
    let out = run(baton(["--config", cfg.as_str(), "watch", &id]));
    status(&out, 0);
    let shown = text(&out.stdout);
    assert!(shown.contains("progress #1000 (run 1) {\"i\":1000}") && shown.contains("run 1 succeeded"), "{shown}");
    hub.verify_ok();
}

fn progress_count(events: &[Value]) -> usize {
    events.iter().filter(|e| e["kind"] == "progress").count()
}

/// A conversation's feed, through the API and `baton follow`: a producer reads its own
/// messages' events only, and only where its publish scope covers the conversation (403 and
/// exit status 9 otherwise); a cursor of no record is `bad_cursor`, one below what a purge
/// removed `cursor_expired`; the message feed is the producer's own (`not_yours`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_feed_shows_a_producer_its_own_messages_within_its_scope() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let other = hub.client("prod-two");
    let mine = prod.submit_new("c", "k1", &["host-a"]).await;
    let theirs = other.submit_new("c", "k2", &["host-a"]).await;
    let feed = prod.get("/v1/conversations/c/events").await;
    let events = feed.ok(200)["events"].as_array().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["message_id"], mine.message_id.as_str());
    other.get(&format!("/v1/messages/{}/events", mine.message_id)).await.err(403, "not_yours");
    let theirs_feed = other.get("/v1/conversations/c/events?limit=10").await;
    assert_eq!(theirs_feed.ok(200)["events"][0]["message_id"], theirs.message_id.as_str());
    prod.get("/v1/conversations/c/events?after=x1").await.err(400, "bad_cursor");
    prod.get("/v1/conversations/c/events?after=9000000000000").await.err(400, "bad_cursor");
    prod.get("/v1/conversations/c/events?limit=0").await.err(400, "invalid_field");

    // Outside the publish scope: refused, whether or not the conversation exists.
    hub.cli_ok(["producers", "scope", "prod-two", "other-*", "--reason", "narrowed"]);
    other.get("/v1/conversations/c/events").await.err(403, "forbidden");
    other.get("/v1/conversations/nowhere/events").await.err(403, "forbidden");
    let config = config_file(&hub, false);
    let cfg = config.display().to_string();
    let out = run(baton(["--config", cfg.as_str(), "--json", "follow", "--conversation", "c", "--once"]));
    status(&out, 0);
    let lines: Vec<Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1);
    let shown: u64 = lines[0]["cursor"].as_str().unwrap().parse().unwrap();
    let said = text(&out.stderr);
    let resume: u64 = said.rsplit("--after ").next().and_then(|n| n.trim().parse().ok()).expect(&said);
    assert!(resume >= shown, "read on past what was shown: {said}");

    // A purge removes the message and its events: a cursor before them has expired.
    hub.cli_ok(["deliveries", "cancel", mine.to("host-a"), "--reason", "stop"]);
    hub.cli_ok(["purge", "--message", &mine.message_id, "--reason", "gone", "--yes"]);
    prod.get("/v1/conversations/c/events?after=0").await.err(410, "cursor_expired");
    prod.get(&format!("/v1/messages/{}/events", mine.message_id)).await.err(404, "not_found");
    let fresh = prod.get("/v1/conversations/c/events").await;
    assert!(fresh.ok(200)["events"].as_array().unwrap().iter().all(|e| e["message_id"] != mine.message_id.as_str()));
}
