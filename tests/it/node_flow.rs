//! The node's normal flow with real processes: fan-out to two hosts, exactly-once execution
//! and reporting, per-conversation order; `baton-node status` without the hub; and the
//! configuration refusals of `baton-node run`.

use crate::harness::{EVENT_WAIT, Hub, bins, output_within};
use crate::node_harness::{NODE_WAIT, node_status, wait_for};
use std::collections::HashMap;
use std::fs;

/// Two hosts, three conversations, 50 messages (some to both hosts, some to one): every
/// delivery is claimed and delivered once, runs once on its own host, is reported once with
/// `succeeded`, and each host runs each conversation's turns in `seq` order.
#[test]
fn two_hosts_three_conversations_fifty_messages_run_once_each_in_order() {
    let hub = Hub::with_nodes(&["host-a", "host-b"]);
    // Small claim batches and two parallel conversations: many claims, real interleaving. Turns
    // take 0-40 ms, varying with seq, so turns run at once within a conversation would overlap
    // or finish out of order in the log.
    let turn = "sleep 0.0$(( ($BATON_SEQ * 7) % 5 ))";
    let node = |host: &str, batch: &str| hub.node_process(host).then(turn).trace_ends().set("claim_batch_max", batch);
    let _a = node("host-a", "3").set("parallel_conversations", "2").start();
    let _b = node("host-b", "5").start();

    let producer = hub.client("prod");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // delivery id → (host, conversation, seq)
    let mut expected: HashMap<String, (String, String, i64)> = HashMap::new();
    for i in 0..50 {
        let conversation = format!("conv-{}", i % 3);
        let to: &[&str] = match i % 4 {
            0 | 2 => &["host-a", "host-b"],
            1 => &["host-a"],
            _ => &["host-b"],
        };
        let m = rt.block_on(producer.submit_new(&conversation, &format!("k{i}"), to));
        assert_eq!(m.deliveries.len(), to.len(), "one delivery per recipient");
        for (host, id) in m.deliveries {
            expected.insert(id, (host, conversation.clone(), m.seq));
        }
    }
    assert_eq!(expected.len(), 75);

    let all = wait_for("every delivery to have an outcome", NODE_WAIT, || {
        let list = hub.deliveries();
        list.iter().all(|d| !d["outcome"].is_null()).then_some(list)
    });
    assert_eq!(all.len(), expected.len(), "no delivery more or less than accepted");
    for d in &all {
        let id = d["delivery_id"].as_str().expect("delivery_id");
        let (host, conversation, seq) = expected.get(id).unwrap_or_else(|| panic!("unexpected delivery {d}"));
        let same = d["host"] == host.as_str() && d["conversation"] == conversation.as_str() && d["seq"] == *seq;
        assert!(same, "{d} is not ({host}, {conversation}, {seq})");
        assert_eq!(d["state"], "delivered", "{d}");
        hub.assert_one_attempt(id, "succeeded");
        assert_eq!(hub.entered(id, "claimed"), 1, "claimed once: {id}");
        assert_eq!(hub.entered(id, "delivered"), 1, "delivered once: {id}");
    }
    assert_eq!(hub.status_json()["attempts"], 75, "reported once each, counted once");

    let ran = hub.exec_log().lines();
    assert_eq!(ran.len(), 75, "one turn per delivery: {ran:#?}");
    for r in &ran {
        let (host, conversation, seq) = expected.get(&r.delivery_id).expect("the log names a known delivery");
        assert_eq!((&r.host, &r.conversation, r.seq), (host, conversation, *seq), "ran where and as sent");
    }
    hub.exec_log().assert_one_at_a_time_in_order();
    assert_eq!(hub.exec_log().events().len(), 150, "every turn ended");
    let mut ids: Vec<&str> = ran.iter().map(|r| r.delivery_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 75, "no delivery ran twice");
    hub.verify_ok();
}

/// `baton-node status` reads the local store only: it answers with the hub gone, while the
/// node runs and after it stopped, and shows the finished turn.
#[test]
fn status_works_with_the_hub_down() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").start();
    let id = hub.send_one("c", "k1", "host-a");
    let shown = hub.wait_outcome(&id);
    let instance = shown["delivery"]["instance_id"].as_str().expect("instance_id").to_string();
    node.wait_idle();
    hub.kill9();

    for _ in 0..2 {
        let s = node.status();
        assert_eq!(s["instance_id"], instance.as_str(), "{s}");
        assert_eq!(s["counts"]["done"], 1, "{s}");
        assert_eq!((s["open"].as_array().map(Vec::len), s["running"].as_array().map(Vec::len)), (Some(0), Some(0)));
        let text = node.status_output(false);
        assert!(text.status.success(), "status (text) exited {}", text.status);
        let shown = String::from_utf8_lossy(&text.stdout);
        assert!(shown.contains(&instance));
        // The session's registration reads as a UTC time, not a count of milliseconds.
        let started = s["session"]["started_at_ms"].as_i64().expect("started_at_ms");
        let session = shown.lines().find(|l| l.starts_with("last session:")).expect("a session line");
        let at = session.split("registered ").nth(1).and_then(|r| r.split([';', ',', ')']).next());
        let at_ms = at.and_then(|t| baton_shared::duration::parse_time_ms("registered", t).ok());
        assert_eq!(at_ms, Some(started - started % 1000), "{session}");
        assert!(!session.contains(&started.to_string()), "{session}");
        if node.is_running() {
            let st = node.term();
            assert_eq!(st.code(), Some(0), "SIGTERM with the hub down is still a clean exit: {st}");
        }
    }
}

/// `status` on a directory that never held a node store fails instead of creating one.
#[test]
fn status_of_a_missing_store_fails_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = node_status(dir.path(), true);
    assert!(!out.status.success());
    assert!(!dir.path().join("node.db").exists());
}

/// Runs `baton-node run --config F` with `extra` appended to an otherwise valid config.
fn run_with_config(extra: &str, hub_url: &str) -> (std::process::Output, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    for f in ["ca.crt", "h.crt", "h.key"] {
        fs::write(dir.path().join(f), "-----BEGIN CERTIFICATE-----\n").expect("write");
    }
    let text = format!(
        "hub_url = \"{hub_url}\"\nca_file = \"{d}/ca.crt\"\ncert_file = \"{d}/h.crt\"\nkey_file = \"{d}/h.key\"\n\
         data_dir = \"{data}\"\ncommand = [\"true\"]\n{extra}",
        d = dir.path().display(),
        data = data.display()
    );
    let config = dir.path().join("node.toml");
    fs::write(&config, text).expect("write config");
    let mut cmd = bins().node_command();
    cmd.arg("run").arg("--config").arg(&config);
    let out = output_within(cmd, EVENT_WAIT);
    (out, data.exists())
}

/// An unknown key and a plain-http hub URL are refused at start: exit 2, the key named,
/// nothing created.
#[test]
fn bad_config_is_refused_with_exit_2_naming_the_key() {
    for (extra, url, names) in [
        ("colour = \"blue\"\n", "https://127.0.0.1:9", "colour"),
        ("", "http://127.0.0.1:9", "hub_url"),
        ("exec_timeout = \"0s\"\n", "https://127.0.0.1:9", "exec_timeout"),
    ] {
        let (out, created) = run_with_config(extra, url);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?} {url}: exited {}: {stderr}", out.status);
        assert!(stderr.contains(names), "{extra:?} {url}: stderr does not name {names}: {stderr}");
        assert!(!created, "{extra:?} {url}: the data directory was created before validation");
    }
}

/// A second `baton-node run` on a data directory in use is refused (exit 4, saying why); the
/// running node is unaffected and keeps working.
#[test]
fn a_second_process_on_the_same_data_directory_is_refused() {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").start();
    node.wait_log("holdings resync");
    let out = output_within(node.second_run_command(), EVENT_WAIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(i32::from(baton_shared::exit::FAILURE)), "exited {}: {stderr}", out.status);
    assert!(stderr.contains("another baton-node is running"), "{stderr}");
    assert!(node.is_running());
    let id = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&id);
    hub.assert_one_attempt(&id, "succeeded");
}

/// The log filter of this test: everything Baton and its libraries log at debug level.
const DEBUG_LOGS: &str = "debug";

/// A claim token is a bearer secret: whoever shows it with the instance id may mirror, ack and
/// report the delivery. A full delivery with debug logging on hub, node and CLI leaves no
/// token in any log line, nor in any operator view (human or `--json`) of the hub or the node,
/// nor in the producer's view; only the claim answer carries it, to its holder.
#[test]
fn no_claim_token_in_any_log_line_or_operator_view() {
    let mut hub = Hub::builder().nodes(&["host-a"]).producers(&["prod"]).stopped().start();
    hub.kit_mut().set_env(baton_shared::logging::FILTER_VAR, DEBUG_LOGS);
    hub.serve(None);
    let node = hub.node_process("host-a").env(baton_shared::logging::FILTER_VAR, DEBUG_LOGS).start();
    // Standard output, then standard error (the CLI's own log lines).
    let run = |args: &[&str]| {
        let mut cmd = hub.cli_command(args);
        cmd.env(baton_shared::logging::FILTER_VAR, DEBUG_LOGS);
        let out = output_within(cmd, EVENT_WAIT);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let cli = |args: &[&str]| {
        let (stdout, stderr) = run(args);
        format!("{stdout}{stderr}")
    };
    let (sent_out, sent_log) = run(&[
        "send",
        "--conversation",
        "c",
        "--to",
        "host-a",
        "--key",
        "k1",
        "--payload",
        "{\"n\":1}",
        "--producer",
        "prod",
        "--json",
    ]);
    let sent: serde_json::Value = serde_json::from_str(&sent_out).expect("send --json");
    let id = sent["deliveries"][0]["delivery_id"].as_str().expect("delivery id").to_string();
    let message_id = sent["message_id"].as_str().expect("message id").to_string();
    hub.wait_outcome(&id);
    node.wait_idle();

    // The tokens handed out, as the node keeps them (its store is always SQLite).
    let store = rusqlite::Connection::open(node.data_dir().join("node.db")).expect("node store");
    let tokens: Vec<String> = store
        .prepare("SELECT claim_token FROM deliveries")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("claim tokens");
    assert_eq!(tokens.len(), 1, "one delivery, one token");
    assert!(tokens[0].len() >= 16, "a token worth keeping secret: {:?}", tokens[0].len());

    let views = [
        ("send --json", format!("{sent_out}{sent_log}")),
        ("deliveries list", cli(&["deliveries", "list"])),
        ("deliveries list --json", cli(&["deliveries", "list", "--json"])),
        ("deliveries show", cli(&["deliveries", "show", &id])),
        ("deliveries show --json", cli(&["deliveries", "show", &id, "--json"])),
        ("deliveries explain", cli(&["deliveries", "explain", &id])),
        ("status", cli(&["status"])),
        ("status --json", cli(&["status", "--json"])),
        ("hosts list --json", cli(&["hosts", "list", "--json"])),
        ("hosts show --json", cli(&["hosts", "show", "host-a", "--json"])),
        ("audit --json", cli(&["audit", "--json"])),
        ("node status", String::from_utf8_lossy(&node.status_output(false).stdout).into_owned()),
        ("node status --json", String::from_utf8_lossy(&node.status_output(true).stdout).into_owned()),
        ("producer view", {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(hub.client("prod").get(&format!("/v1/messages/{message_id}"))).ok(200).to_string()
        }),
        ("hub log", hub.serve_logs()),
        ("node log", node.logs()),
    ];
    assert!(views.iter().any(|(_, text)| text.contains("DEBUG")), "debug logging is on");
    assert!(views[4].1.contains(&id), "the operator views are read: {}", views[4].1);
    for (name, text) in &views {
        for token in &tokens {
            assert!(!text.contains(token.as_str()), "{name} shows a claim token:\n{text}");
        }
    }
}

/// A node whose store goes over its `store_bytes_max` claims no new work: it reports the turn
/// it ran, then the next delivery stays queued on the hub, the node keeps running and says why
/// in its log and in `status`.
#[test]
fn a_node_over_its_store_bound_claims_nothing_and_says_why() {
    const STORE_BYTES_MAX: i64 = 64 * 1024;
    let hub = Hub::with_nodes(&["host-a"]);
    // Each turn leaves a result of `result_bytes_max` (64 KiB) in the store, twice (the attempt
    // and its report): one turn takes the store over the bound.
    let big_output = "head -c 100000 /dev/zero | tr '\\0' x";
    let mut node =
        hub.node_process("host-a").then(big_output).set("store_bytes_max", &STORE_BYTES_MAX.to_string()).start();
    let first = hub.send_one("c", "k1", "host-a");
    hub.wait_outcome(&first);
    hub.assert_one_attempt(&first, "succeeded");
    node.wait_log("over store_bytes_max");
    let store = rusqlite::Connection::open(node.data_dir().join("node.db")).expect("node store");
    let used: i64 = store
        .query_row(
            "SELECT (p.page_count - f.freelist_count) * s.page_size
             FROM pragma_page_count() p, pragma_freelist_count() f, pragma_page_size() s",
            [],
            |r| r.get(0),
        )
        .expect("store size");
    assert!(used > STORE_BYTES_MAX, "the store ({used} bytes) is over the bound");

    let second = hub.send_one("c", "k2", "host-a");
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert_eq!(hub.state(&second), "queued", "the node claims nothing while its store is over its bound");
    assert!(node.is_running(), "the node keeps running");
    let status = node.status();
    let why = status["claims_paused"].as_str().unwrap_or_else(|| panic!("status says why: {status}"));
    assert!(why.contains("store_bytes_max") && why.contains(&STORE_BYTES_MAX.to_string()), "{why}");
    let text = String::from_utf8_lossy(&node.status_output(false).stdout).into_owned();
    assert!(text.contains("claiming:         paused"), "{text}");
    assert!(node.log().contains("claiming no new work"), "{}", node.log());
}
