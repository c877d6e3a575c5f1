//! Commands that tell the truth: counts are rows changed, doing nothing exits 1 "nothing to
//! do", a fence that matches nothing or repeats an active one is refused, a release that a
//! fence would undo is refused unless `--force`, and time-boxed fences are lifted by the hub.
//! Destructive commands (`fence block --all|--host`, `retire`, `revoke`, `redrive` without a
//! filter) say what they would do with counts read from the record, change nothing on
//! `--dry-run`, are refused (2) without `--yes` when no terminal can be asked, and record the
//! reason they are given.

use crate::harness::Hub;
use serde_json::Value;

fn code_and_stderr(out: &std::process::Output) -> (Option<i32>, String) {
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_refuse_typos_and_duplicates_and_releases_a_fence_would_undo() {
    let hub = Hub::start();
    let (code, err) = code_and_stderr(&hub.cli(["fence", "pause", "--host", "hots-a", "--reason", "typo"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("hots-a") && err.contains("never enrolled") && err.contains("--force"), "{err}");
    let (code, err) = code_and_stderr(&hub.cli(["fence", "pause", "--conversation", "nope", "--reason", "typo"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no messages"), "{err}");
    hub.cli_ok(["fence", "pause", "--conversation", "not-yet", "--force", "--reason", "ahead of time"]);

    let prod = hub.client("prod");
    let sent = prod.submit_new("c", "k1", &["host-a"]).await;
    let hold = hub.fence("hold", &["--conversation", "c"], "inspect");
    let (code, err) = code_and_stderr(&hub.cli(["fence", "hold", "--conversation", "c", "--reason", "again"]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("nothing to do") && err.contains(&format!("hold fence {hold}")), "{err}");

    let node = hub.node("host-a", "inst-1");
    assert!(node.claim(5, 0).await.is_empty());
    assert_eq!(hub.state(sent.to("host-a")), "held");
    let (code, err) = code_and_stderr(&hub.cli(["held", "release", sent.to("host-a"), "--reason", "go"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("hold fence {hold}")) && err.contains("--force"), "{err}");
    assert_eq!(hub.state(sent.to("host-a")), "held", "a refused release changes nothing");
    let (code, err) = code_and_stderr(&hub.cli(["held", "release", "--conversation", "c", "--reason", "go"]));
    assert_eq!(code, Some(2), "{err}");
    let out = hub.cli_ok(["held", "release", sent.to("host-a"), "--force", "--reason", "go"]);
    assert!(out.contains("released 1"), "{out}");
    let (code, err) = code_and_stderr(&hub.cli(["held", "release", "--conversation", "c", "--reason", "go"]));
    assert_eq!((code, err.contains("nothing to do")), (Some(1), true), "{err}");

    hub.lift(hold);
    let (code, err) = code_and_stderr(&hub.cli(["fence", "lift", &hold.to_string()]));
    assert_eq!((code, err.contains("nothing to do")), (Some(1), true), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_and_requeue_count_only_what_they_changed() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    prod.submit_new("c", "k1", &["host-a"]).await;
    prod.submit_new("d", "k2", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(2, 0).await;
    assert_eq!(got.len(), 2);
    for c in &got {
        node.mirror_and_ack(c).await;
    }
    node.report(&got[0], "r1", "succeeded", 0).await.ok(201);

    let out = hub.cli_ok(["requeue", "--instance", "inst-1", "--reason", "gone"]);
    assert!(out.contains("0 requeued, 1 delivered without outcome marked unknown"), "{out}");
    let (code, err) = code_and_stderr(&hub.cli(["requeue", "--instance", "inst-1", "--reason", "again"]));
    assert_eq!((code, err.contains("nothing to do")), (Some(1), true), "{err}");
    let out = hub.cli_ok(["retire", "host-a", "--reason", "gone", "--yes"]);
    assert!(out.contains("0 failed, 0 unknown, 0 delivered without outcome marked unknown"), "{out}");
}

fn fences(hub: &Hub, all: bool) -> Vec<Value> {
    let mut args = vec!["fence", "list", "--json"];
    if all {
        args.push("--all");
    }
    hub.cli_json(args).as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_boxed_fence_is_lifted_by_the_hub_at_its_time() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let sent = prod.submit_new("c", "k1", &["host-a"]).await;
    let (code, err) = code_and_stderr(&hub.cli(["fence", "pause", "--all", "--until", "2001-01-01 00:00:00"]));
    assert_eq!(code, Some(2), "a fence ending in the past is refused: {err}");
    let set = hub.cli_json(["fence", "pause", "--conversation", "c", "--for", "3s", "--reason", "brief", "--json"]);
    assert!(set["expires_at_ms"].as_i64().is_some(), "{set}");
    let listed = fences(&hub, false);
    assert_eq!(listed[0]["expires_at_ms"], set["expires_at_ms"]);
    assert!(hub.cli_ok(["fence", "list"]).contains("(in "), "the expiry is shown");
    let node = hub.node("host-a", "inst-1");
    assert!(node.claim(5, 0).await.is_empty(), "paused while the fence lasts");

    // A claim waiting through the fence's end is answered when the hub lifts it, not at the
    // end of its wait.
    let expires_at_ms = set["expires_at_ms"].as_i64().unwrap();
    let got = node.claim(5, crate::harness::LONG_WAIT_MS).await;
    let late_ms = now_ms() - expires_at_ms;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].delivery_id, sent.to("host-a"));
    let wake_max_ms = crate::harness::WAKE_MAX.as_millis() as i64;
    assert!(late_ms < wake_max_ms, "the waiting claim answered {late_ms} ms after the fence's end; it was not woken");
    let lifted = fences(&hub, true);
    assert!(fences(&hub, false).is_empty());
    assert_eq!(lifted[0]["lifted_by"], "hub", "{lifted:?}");
}

/// The audit entries of `action`, newest first.
fn audited(hub: &Hub, action: &str) -> Vec<Value> {
    let all = hub.cli_json(["audit", "--json"]);
    all.as_array().unwrap().iter().filter(|e| e["action"] == action).cloned().collect()
}

/// Runs a destructive command without `--yes` (the tests' stdin is no terminal): refused with
/// exit 2, naming the plan and `--yes`. Returns what it said.
#[track_caller]
fn refused_without_yes(hub: &Hub, args: &[&str]) -> String {
    let (code, err) = code_and_stderr(&hub.cli(args));
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(err.contains("--yes") && err.contains("nothing changed"), "{args:?}: {err}");
    err
}

/// The states of every delivery, oldest first.
fn states(hub: &Hub) -> Vec<String> {
    hub.deliveries().iter().map(|d| d["state"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_everything_or_a_host_says_what_would_fail_and_needs_yes() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    prod.submit_new("c1", "k1", &["host-a"]).await;
    prod.submit_new("c2", "k2", &["host-a"]).await;
    prod.submit_new("c3", "k3", &["host-b"]).await;
    hub.cli_ok(["fence", "pause", "--conversation", "c1", "--reason", "look first"]);
    let queued = vec!["queued".to_string(); 3];

    let (code, err) = code_and_stderr(&hub.cli(["fence", "block", "--all", "--yes"]));
    assert_eq!(code, Some(2), "a block on everything needs a reason: {err}");
    assert!(err.contains("--reason"), "{err}");
    let said = refused_without_yes(&hub, &["fence", "block", "--all", "--reason", "disk full"]);
    assert!(said.contains("3 queued deliveries would fail") && said.contains("1 of them paused"), "{said}");
    let out = hub.cli_ok(["fence", "block", "--all", "--reason", "disk full", "--dry-run"]);
    assert!(out.contains("3 queued deliveries would fail") && out.contains("1 of them paused"), "{out}");
    let plan = hub.cli_json(["fence", "block", "--all", "--reason", "disk full", "--dry-run", "--json"]);
    assert_eq!((plan["queued"].as_i64(), plan["paused"].as_i64()), (Some(3), Some(1)), "{plan}");
    assert_eq!((plan["dry_run"].as_bool(), plan["scope"].as_str()), (Some(true), Some("all")), "{plan}");
    let out = hub.cli_ok(["fence", "block", "--host", "host-a", "--reason", "bad disk", "--dry-run"]);
    assert!(out.contains("2 queued deliveries would fail") && out.contains("1 of them paused"), "{out}");
    refused_without_yes(&hub, &["fence", "block", "--host", "host-a", "--reason", "bad disk"]);
    assert_eq!(fences(&hub, false).len(), 1, "only the pause: nothing was set");
    assert!(audited(&hub, "fence_block").is_empty());
    assert_eq!(states(&hub), queued);

    let set = hub.cli_json(["fence", "block", "--all", "--reason", "disk full", "--yes", "--json"]);
    assert_eq!(set["kind"], "block", "{set}");
    let blocks = audited(&hub, "fence_block");
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["reason"], "disk full", "{}", blocks[0]);
    // A block on one conversation is not asked about, but its dry run says what it would do.
    let out = hub.cli_ok(["fence", "block", "--conversation", "c2", "--reason", "bad input", "--dry-run"]);
    assert!(out.contains("on conversation c2") && out.contains("1 queued deliveries would fail"), "{out}");
    assert_eq!(fences(&hub, false).len(), 2, "a dry run sets nothing");
    hub.cli_ok(["fence", "block", "--conversation", "c2", "--reason", "bad input"]);
    assert_eq!(fences(&hub, false).len(), 3);
    // A time-boxed fence says when the hub will lift it, not that it was lifted.
    let out = hub.cli_ok(["fence", "pause", "--host", "host-b", "--for", "30m", "--reason", "maintenance"]);
    assert!(out.contains("; the hub lifts it at ") && !out.contains("lifted"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retiring_a_host_says_what_it_sweeps_and_leaves_and_needs_yes() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    hub.cli_ok(["members", "add", "--conversation", "team", "host-a", "--reason", "joins"]);
    for (conversation, key) in [("c1", "k1"), ("c2", "k2"), ("c3", "k3")] {
        prod.submit_new(conversation, key, &["host-a"]).await;
    }
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(2, 0).await;
    assert_eq!(got.len(), 2);
    node.mirrored(&got[0]).await.ok(200);
    let before = states(&hub);

    assert_eq!(hub.cli(["retire", "host-a", "--yes"]).status.code(), Some(2), "--reason is required");
    let said = refused_without_yes(&hub, &["retire", "host-a", "--reason", "decommissioned"]);
    let plan = "2 deliveries would fail (1 queued, 0 held, 1 claimed), 1 mirrored would become unknown";
    assert!(said.contains(plan) && said.contains("leave 1 conversation(s): team"), "{said}");
    let out = hub.cli_ok(["retire", "host-a", "--reason", "decommissioned", "--dry-run"]);
    assert!(out.contains(plan) && out.contains("team"), "{out}");
    let host = hub.cli_json(["hosts", "show", "host-a", "--json"]);
    assert!(host["host"]["retired_at_ms"].is_null(), "not retired: {host}");
    assert_eq!(states(&hub), before, "nothing changed");
    assert!(audited(&hub, "retire").is_empty());

    let out = hub.cli_ok(["retire", "host-a", "--reason", "decommissioned", "--yes"]);
    assert!(out.contains("2 failed, 1 unknown"), "{out}");
    let retired = audited(&hub, "retire");
    assert_eq!(retired.len(), 1);
    assert_eq!(retired[0]["reason"], "decommissioned", "{}", retired[0]);
}

#[test]
fn revoking_names_the_certificates_and_needs_yes() {
    let hub = Hub::start();
    let certs = hub.cli_json(["certs", "list", "--name", "host-b", "--json"]);
    let serial = certs[0]["serial"].as_str().unwrap().to_string();
    let revoked = |hub: &Hub| hub.cli_json(["certs", "list", "--name", "host-b", "--json"])[0]["revoked"].clone();

    assert_eq!(hub.cli(["revoke", "host-b", "--yes"]).status.code(), Some(2), "--reason is required");
    let said = refused_without_yes(&hub, &["revoke", "host-b", "--reason", "lost"]);
    assert!(said.contains(&format!("{serial} (node host-b)")), "{said}");
    let out = hub.cli_ok(["revoke", "host-b", "--reason", "lost", "--dry-run"]);
    assert!(out.contains("revoke 1 certificate(s)") && out.contains(&serial), "{out}");
    assert_eq!(revoked(&hub), false, "nothing revoked");
    assert!(audited(&hub, "revoke").is_empty());

    hub.cli_ok(["revoke", "host-b", "--reason", "lost", "--yes"]);
    assert_eq!(revoked(&hub), true);
    let entries = audited(&hub, "revoke");
    assert_eq!((entries.len(), entries[0]["reason"].as_str()), (1, Some("lost")), "{entries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redriving_without_a_filter_says_how_many_and_needs_yes() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let mut ids = Vec::new();
    for (conversation, key) in [("c1", "k1"), ("c2", "k2")] {
        let sent = prod.submit_new(conversation, key, &["host-a"]).await;
        ids.push(sent.to("host-a").to_string());
    }
    for id in &ids {
        hub.cli_ok(["deliveries", "cancel", id, "--reason", "wrong payload"]);
    }
    let cancelled = states(&hub);

    let (code, err) = code_and_stderr(&hub.cli(["redrive", "--outcome", "unknown", "--reason", "fixed"]));
    assert_eq!(code, Some(1), "nothing to re-run is not asked about: {err}");
    let (code, err) = code_and_stderr(&hub.cli(["redrive", "--outcome", "cancelled", "--yes"]));
    assert_eq!(code, Some(2), "a redrive of everything needs a reason: {err}");
    let said = refused_without_yes(&hub, &["redrive", "--outcome", "cancelled", "--reason", "fixed"]);
    assert!(said.contains("2 deliveries that ended cancelled would re-run"), "{said}");
    let out = hub.cli_ok(["redrive", "--outcome", "cancelled", "--reason", "fixed", "--dry-run"]);
    assert!(out.contains("2 deliveries would be re-run"), "{out}");
    assert_eq!(states(&hub), cancelled, "nothing changed");

    let out = hub.cli_ok(["redrive", "--outcome", "cancelled", "--reason", "payload fixed", "--yes"]);
    assert!(out.contains("2 deliveries re-run"), "{out}");
    assert_eq!(states(&hub), vec!["queued".to_string(); 2]);
    let audit = hub.cli_json(["audit", "--json"]);
    let redriven = audit.as_array().unwrap().iter().filter(|e| {
        e["subject"] == ids[0].as_str() && e["reason"].as_str().is_some_and(|r| r.contains("payload fixed"))
    });
    assert_eq!(redriven.count(), 1, "the reason is in the audit log: {audit}");
    // With a filter it runs as before, unasked.
    for id in &ids {
        hub.cli_ok(["deliveries", "cancel", id, "--reason", "again"]);
    }
    let out = hub.cli_ok(["redrive", "--outcome", "cancelled", "--conversation", "c1"]);
    assert!(out.contains("1 deliveries re-run"), "{out}");
}

/// Runs `baton-hub ARGS` with a terminal for its stdin and stderr (under util-linux `script`)
/// and types `answer` there. Returns the exit status and what the terminal showed, or `None`
/// (the test then says it is skipped) where `script` cannot be run.
fn at_a_terminal(hub: &Hub, args: &[&str], answer: &str) -> Option<(Option<i32>, String)> {
    use std::io::Write;
    let inner = hub.cli_command(args);
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let line: Vec<String> = std::iter::once(inner.get_program()).chain(inner.get_args()).map(quote).collect();
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &line.join(" "), "/dev/null"]).env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let Ok(mut child) = cmd.spawn() else {
        eprintln!("SKIPPED: util-linux `script` cannot be run here");
        return None;
    };
    child.stdin.take().expect("piped stdin").write_all(answer.as_bytes()).expect("typing the answer");
    let out = child.wait_with_output().expect("script ends");
    Some((out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// At a terminal a destructive command shows its plan and asks; only "y" or "yes" acts, and
/// anything else changes nothing (exit 1).
#[test]
fn at_a_terminal_a_destructive_command_asks_and_acts_only_on_yes() {
    let hub = Hub::start();
    let Some((code, shown)) = at_a_terminal(&hub, &["retire", "host-b", "--reason", "decommissioned"], "n\n") else {
        return;
    };
    assert!(shown.contains("retire host host-b") && shown.contains("Proceed? [y/N]"), "{shown}");
    assert_eq!(code, Some(1), "declined: {shown}");
    assert!(audited(&hub, "retire").is_empty(), "nothing changed");
    let (code, shown) = at_a_terminal(&hub, &["retire", "host-b", "--reason", "decommissioned"], "y\n").unwrap();
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("retired host-b"), "{shown}");
    assert_eq!(audited(&hub, "retire").len(), 1);
}

/// Milliseconds since the Unix epoch, as the hub stamps its times.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}
