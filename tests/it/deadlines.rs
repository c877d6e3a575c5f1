//! Deadlines and stalls, end to end: `baton send --deadline` and `--stall` reach a real node in
//! the claim; past the deadline, or after the stall without a progress line, the node stops the
//! turn's whole process group (SIGTERM, SIGKILL after `kill_grace`; no process of the group is
//! left) and reports it `failed`, the reason naming the bound, how long it ran and its last
//! progress. A stalled run is retried while `max_attempts` allows; one past its deadline is not.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};
use crate::producer_cli::{baton, config_file, json, run, status};
use serde_json::Value;
use std::path::Path;

/// The processes whose process group is `pgid` (from `/proc/*/stat`), zombies excluded.
fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // After the command's closing parenthesis: state, ppid, pgrp, …
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse::<u32>() == Ok(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Sends one message through `baton send` with `extra` flags; returns its delivery id.
fn send(cfg: &Path, conversation: &str, key: &str, extra: &[&str]) -> String {
    let mut cmd = baton(["--config", &cfg.display().to_string(), "--json", "send", "--conversation", conversation]);
    cmd.args(["--to", "host-a", "--key", key, "--payload", "{}"]).args(extra);
    let out = run(cmd);
    status(&out, 0);
    json(&out)["deliveries"][0]["delivery_id"].as_str().expect("delivery_id").to_string()
}

/// The attempts of `id` once it has `n` and its last is final (not retryable).
fn attempts_when(hub: &Hub, id: &str, n: usize) -> Vec<Value> {
    wait_for(&format!("{n} attempt(s) of {id}, the last final"), NODE_WAIT, || {
        let a = hub.attempts(id);
        (a.len() == n && a.last().is_some_and(|l| l["retryable"] == false)).then_some(a)
    })
}

#[test]
fn deadlines_and_stalls_stop_the_whole_group_and_name_themselves() {
    let hub = Hub::with_nodes(&["host-a"]);
    let groups = hub.scratch("groups").join("pgids");
    // Two progress lines 0.2 s apart, then a child that would sleep for minutes, waited for.
    let harness = format!(
        "echo $$ >> '{groups}'\n\
         echo '{{\"step\":1}}' >&$BATON_PROGRESS_FD; sleep 0.2; echo '{{\"step\":2}}' >&$BATON_PROGRESS_FD\n\
         sleep 300 & wait",
        groups = groups.display()
    );
    let _node = hub.node_process("host-a").then(&harness).set("kill_grace", "\"1s\"").start();
    let config = config_file(&hub, false);
    let late = send(&config, "slow", "k-deadline", &["--deadline", "1500ms", "--max-attempts", "2"]);
    let stuck =
        send(&config, "stuck", "k-stall", &["--stall", "700ms", "--max-attempts", "2", "--retry-backoff", "0s"]);

    let a = attempts_when(&hub, &late, 1);
    let reason = a[0]["reason"].as_str().unwrap_or_default();
    assert_eq!(a[0]["outcome"], "failed", "{a:?}");
    assert!(reason.starts_with("deadline: ran past deadline_ms = 1500 after "), "{reason}");
    assert!(reason.contains("last progress: event #2, "), "{reason}");
    assert_eq!(a[0]["retryable"], false, "a deadline is final even with runs left");

    let a = attempts_when(&hub, &stuck, 2);
    for (i, attempt) in a.iter().enumerate() {
        let reason = attempt["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("stall: no progress for stall_ms = 700 (ran "), "run {}: {reason}", i + 1);
        assert!(reason.contains("last progress: event #2, "), "{reason}");
    }
    assert_eq!((a[0]["retryable"].as_bool(), a[1]["retryable"].as_bool()), (Some(true), Some(false)));

    // Every group the turns ran in is gone: no process of them outlived the stop.
    let pgids: Vec<u32> = std::fs::read_to_string(&groups).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pgids.len(), 3, "three runs: {pgids:?}");
    for pgid in pgids {
        let left = wait_for(&format!("group {pgid} to be gone"), NODE_WAIT, || {
            let left = group_members(pgid);
            left.is_empty().then_some(left)
        });
        assert!(left.is_empty());
    }
    // The bounds are part of the message: the hub refuses them past its limits.
    let mut cmd = baton(["--config", &config.display().to_string(), "send", "--conversation", "c", "--to", "host-a"]);
    cmd.args(["--key", "k-long", "--payload", "{}", "--deadline", "31d"]);
    let out = run(cmd);
    status(&out, 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("limits.deadline_max"));
}
