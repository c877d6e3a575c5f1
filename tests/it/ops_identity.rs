//! Identities and audit through the real binary: one role per name, `certs list`, `renew
//! --revoke-old`, and `audit`, which reads every operator and hub action with the operator's
//! name (from `--operator`, `$BATON_OPERATOR`, else `$USER`).

use crate::harness::{Hub, OPERATOR};
use serde_json::Value;

fn certs_of(hub: &Hub, name: &str) -> Vec<Value> {
    hub.cli_json(["certs", "list", "--name", name, "--json"]).as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_has_one_role_and_renew_can_revoke_the_old_certificate() {
    let hub = Hub::start();
    let out_dir = hub.scratch("other");
    let out = hub.cli(["enroll", "producer", "host-a", "--out", out_dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("already enrolled as a node"), "{stderr}");
    assert!(!out_dir.join("host-a.crt").exists(), "a refused enrollment writes nothing");
    assert_eq!(certs_of(&hub, "host-a").len(), 1);

    let all = hub.cli_json(["certs", "list", "--json"]);
    let names: Vec<(&str, &str)> =
        all.as_array().unwrap().iter().map(|c| (c["name"].as_str().unwrap(), c["role"].as_str().unwrap())).collect();
    assert!(names.contains(&("host-a", "node")) && names.contains(&("prod", "producer")), "{names:?}");
    let first = certs_of(&hub, "host-a")[0]["serial"].as_str().unwrap().to_string();

    // A renewal keeps the old certificate valid until it is revoked...
    let renewed = hub.scratch("renew-1");
    hub.cli_ok(["renew", "host-a", "--out", renewed.to_str().unwrap()]);
    let both = certs_of(&hub, "host-a");
    assert_eq!(both.len(), 2);
    assert!(both.iter().all(|c| c["revoked"] == false), "{both:?}");
    // ...or revokes every older one in the same step.
    let again = hub.scratch("renew-2");
    let out = hub.cli_ok(["renew", "host-a", "--out", again.to_str().unwrap(), "--revoke-old"]);
    assert!(out.contains(&first), "names what it revoked: {out}");
    let after = certs_of(&hub, "host-a");
    let live: Vec<&Value> = after.iter().filter(|c| c["revoked"] == false).collect();
    assert_eq!((after.len(), live.len()), (3, 1), "{after:?}");
    assert!(hub.cli_ok(["certs", "list"]).contains("renewed; old certificate revoked"));

    // Enrolling the name again works, and warns that the old certificate stays valid.
    let twice = hub.cli(["enroll", "node", "host-a", "--out", hub.scratch("enroll-again").to_str().unwrap()]);
    let said = String::from_utf8_lossy(&twice.stderr);
    assert!(twice.status.success(), "{said}");
    assert!(said.contains("warning: node host-a is already enrolled") && said.contains("--revoke-old"), "{said}");

    // `renew --reason` is what the audit log records for the renewal.
    let third = hub.scratch("renew-3");
    hub.cli_ok(["renew", "host-a", "--out", third.to_str().unwrap(), "--reason", "yearly key rotation"]);
    let audit = hub.cli_ok(["audit", "--json"]);
    assert!(audit.contains("yearly key rotation"), "{audit}");
}

/// `renew` of a name whose every certificate was revoked is refused (2), naming when, by whom
/// and why it was revoked, and writes nothing; `--force` renews it. A name with a certificate
/// still valid renews as before.
#[test]
fn renewing_a_revoked_name_is_refused_unless_forced() {
    let hub = Hub::start();
    hub.cli_ok(["--operator", "erin", "revoke", "host-a", "--reason", "laptop stolen", "--yes"]);
    let out_dir = hub.scratch("renew-revoked");
    let dir = out_dir.to_str().unwrap();
    let out = hub.cli(["renew", "host-a", "--out", dir]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("was revoked") && said.contains("erin") && said.contains("laptop stolen"), "{said}");
    assert!(said.contains("--force"), "{said}");
    assert!(!out_dir.join("host-a.crt").exists(), "a refused renewal writes nothing");
    assert_eq!(certs_of(&hub, "host-a").len(), 1);

    let out = hub.cli_ok(["renew", "host-a", "--out", dir, "--force"]);
    assert!(out.contains("renewed node host-a"), "{out}");
    let certs = certs_of(&hub, "host-a");
    assert_eq!(certs.iter().filter(|c| c["revoked"] == false).count(), 1, "{certs:?}");
    // host-b was never revoked: renewed as before.
    let other = hub.scratch("renew-b");
    hub.cli_ok(["renew", "host-b", "--out", other.to_str().unwrap()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_reads_operator_and_hub_actions_with_who_and_why() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let sent = prod.submit_new("c", "k1", &["host-a"]).await;
    let fence = hub.fence("hold", &["--conversation", "c"], "look first");
    hub.node("host-a", "inst-1").claim(5, 0).await;
    hub.cli_ok(["--operator", "carol", "held", "release", sent.to("host-a"), "--force", "--reason", "fine"]);
    hub.lift(fence);
    let mut cmd = hub.cli_command(["fence", "pause", "--host", "host-b", "--reason", "by env"]);
    cmd.env("BATON_OPERATOR", "dave");
    assert!(crate::harness::output_within(cmd, crate::harness::EVENT_WAIT).status.success());

    let all = hub.cli_json(["audit", "--json"]);
    let rows = all.as_array().unwrap();
    let find = |action: &str, actor: &str| {
        rows.iter()
            .find(|e| e["action"] == action && e["actor"] == actor)
            .unwrap_or_else(|| panic!("{action} by {actor}: {all}"))
    };
    assert!(
        rows.iter().any(|e| e["action"] == "enroll_node" && e["actor"] == OPERATOR && e["subject"] == "host-a"),
        "enroll records the operator, not `cli`: {all}"
    );
    assert_eq!(find("fence_hold", OPERATOR)["reason"], "look first");
    assert_eq!(find("queued -> held", "hub")["actor_kind"], "hub");
    assert_eq!(find("held -> queued", "carol")["subject"], sent.to("host-a"));
    assert_eq!(find("fence_pause", "dave")["actor_kind"], "operator");
    assert!(rows.windows(2).all(|w| w[0]["at_ms"].as_i64() >= w[1]["at_ms"].as_i64()), "newest first");

    let carol = hub.cli_json(["audit", "--actor", "carol", "--json"]);
    assert_eq!(carol.as_array().unwrap().len(), 1);
    let out = hub.cli(["audit", "--actor", "nobody"]);
    assert_eq!(out.status.code(), Some(1), "nothing matches: exit 1");
    // Paging: each page's cursor leads to the next, and the pages together are the whole log.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["audit", "--since", "1h", "--limit", "2", "--json"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let out = hub.cli(args);
        assert!(out.status.success(), "{out:?}");
        let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        paged.extend(page.as_array().unwrap().iter().cloned());
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        match stderr.split("next page: --after ").nth(1) {
            Some(cursor) => {
                let last = page.as_array().unwrap().last().unwrap();
                assert_eq!(last["cursor"], cursor.trim(), "the JSON carries the next page's cursor: {last}");
                after = Some(cursor.trim().to_string());
            }
            None => break,
        }
    }
    assert_eq!(&paged, rows, "the pages are the whole log, in order, once");
    let out = hub.cli(["audit", "--after", "not-a-cursor"]);
    assert_eq!(out.status.code(), Some(2), "a bad cursor is a usage error: {out:?}");
    assert!(hub.cli(["audit", "--since", "2001-01-01 00:00:00"]).status.success());
}

/// `enroll` and `send` take `--reason` as every other changing command does, and the audit log
/// keeps it with the operator's name: an enrollment and a message sent by hand are operator
/// acts, not anonymous ones. A replayed `send` adds no second audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enroll_and_send_record_their_reason_in_the_audit_log() {
    let hub = Hub::start();
    let dir = hub.scratch("rack-7");
    let dir = dir.to_str().unwrap();
    hub.cli_ok(["--operator", "erin", "enroll", "node", "host-n", "--out", dir, "--reason", "rack 7 commissioned"]);
    hub.cli_ok(["--operator", "erin", "enroll", "producer", "p-new", "--out", dir, "--reason", "team onboarding"]);
    let send = ["--operator", "erin", "send", "--conversation", "c", "--to", "host-n", "--key", "k1"];
    let args = |reason: &'static str| send.iter().copied().chain(["--payload", "{}", "--reason", reason]);
    let sent = hub.cli_json(args("manual replay of ticket 12").chain(["--json"]));
    let message_id = sent["message_id"].as_str().unwrap().to_string();
    hub.cli_json(args("sent twice").chain(["--json"]));

    let all = hub.cli_json(["audit", "--actor", "erin", "--json"]);
    let rows = all.as_array().unwrap();
    let reason_of = |action: &str, subject_has: &str| -> Vec<String> {
        rows.iter()
            .filter(|e| e["action"] == action && e["subject"].as_str().unwrap_or("").contains(subject_has))
            .map(|e| e["reason"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(reason_of("enroll_node", "host-n"), ["rack 7 commissioned"], "{all}");
    assert_eq!(reason_of("enroll_producer", "p-new"), ["team onboarding"], "{all}");
    assert_eq!(reason_of("send", &message_id), ["manual replay of ticket 12"], "one row, for the new message: {all}");
    let human = hub.cli_ok(["audit", "--actor", "erin"]);
    assert!(human.contains("manual replay of ticket 12") && human.contains("rack 7 commissioned"), "{human}");
}
