//! What the status page shows, read over plain HTTP from the real hub (the browser test in
//! `status_page` checks rendering; this module checks the numbers, and is rerun on
//! PostgreSQL): "Needs attention" is exactly what `baton-hub status` flags, the rates count the
//! record's last hour, running turns are listed with their age, a paused backlog is marked
//! paused, a search finds deliveries by id prefix, message, conversation or host, and failure
//! reasons are shown as `status_page_reasons` says while harness results never are.

use crate::harness::Hub;
use crate::node_harness::wait_for;
use crate::status_page::{get_as, operator_addr};
use std::collections::BTreeSet;
use std::time::Duration;

/// Generous: a node picking up a turn on a loaded machine.
const RUN_WAIT: Duration = Duration::from_secs(60);

/// The page at `path` (with its headers), answered 200.
pub fn page(addr: &str, path: &str) -> String {
    let text = get_as(addr, addr, path).unwrap_or_else(|| panic!("no answer for {path}"));
    assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text}");
    text
}

/// The values of attribute `attr` in `html`, in order.
fn attrs(html: &str, attr: &str) -> Vec<String> {
    let needle = format!("{attr}=\"");
    html.match_indices(&needle)
        .map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .collect()
}

/// The whole number in the element whose attribute `attr` is `value`.
fn number_at(html: &str, attr: &str, value: &str) -> i64 {
    let needle = format!("{attr}=\"{value}\">");
    let at = html.find(&needle).unwrap_or_else(|| panic!("no {needle} in the page:\n{html}")) + needle.len();
    let digits: String = html[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|e| panic!("{e}: {needle} is not followed by a number:\n{html}"))
}

#[test]
fn the_page_flags_what_status_flags_and_counts_the_last_hour_running_turns_and_searches() {
    let hub = Hub::with_nodes(&["host-a", "host-b", "host-c"]);
    // host-a fails every turn; host-b is paused with three waiting; host-c runs a long turn.
    let _fails = hub.node_process("host-a").then("echo result-TOPSECRET; exit 3").start();
    let _runs = hub.node_process("host-c").then("sleep 300").start();
    hub.fence("pause", &["--host", "host-b"], "disk swap");
    for k in ["k1", "k2", "k3"] {
        hub.send_one("waits", k, "host-b");
    }
    let failed = hub.send_one("work", "k4", "host-a");
    assert_eq!(hub.wait_outcome(&failed)["delivery"]["outcome"], "failed");
    let running = hub.send_one("long", "k5", "host-c");
    let addr = operator_addr(&hub);
    let html = wait_for("the long turn on the page", RUN_WAIT, || {
        let html = page(&addr, "/");
        html.contains(&format!("data-running=\"{running}\"")).then_some(html)
    });

    // Needs attention: the kinds `status` flags, no more and no fewer.
    let status = hub.status_json();
    let flagged: BTreeSet<String> =
        status["attention"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap().to_string()).collect();
    assert!(flagged.contains("fence_active"), "{status}");
    let shown: BTreeSet<String> = attrs(&html, "data-kind").into_iter().collect();
    assert_eq!(shown, flagged, "the page and status agree:\n{html}");
    assert!(html.contains("disk swap"), "the fence's reason is named:\n{html}");

    // The paused backlog is marked paused; the failure is coloured and explained.
    assert_eq!(number_at(&html, "data-host-backlog", "host-b"), 3);
    let b_row = &html[html.find("<tr data-host=\"host-b\"").unwrap()..];
    assert!(b_row[..b_row.find("</tr>").unwrap()].contains("data-fenced=\"paused\""), "{html}");
    assert!(html.contains("class=\"num failed\" data-outcome=\"failed\">1<"), "{html}");
    assert!(html.contains("exited with status 3"), "the run's reason is shown on loopback:\n{html}");
    assert!(!html.contains("result-TOPSECRET"), "a harness result is never shown:\n{html}");

    // The last hour: five messages and deliveries accepted, one failed run.
    assert_eq!(number_at(&html, "data-rate", "messages"), 5, "{html}");
    assert_eq!(number_at(&html, "data-rate", "deliveries"), 5, "{html}");
    assert_eq!(number_at(&html, "data-rate", "failed"), 1, "{html}");

    // The running turn, with its age.
    assert_eq!(attrs(&html, "data-running"), [running.as_str()], "{html}");
    let secs = attrs(&html, "data-running-secs");
    assert!(secs.len() == 1 && secs[0].parse::<u64>().is_ok(), "its age in seconds: {secs:?}\n{html}");

    // Search: by conversation, host, message, id prefix; nothing for what nothing holds.
    let found = |q: &str| {
        let html = page(&addr, &format!("/status?q={q}"));
        assert!(!html.contains("http-equiv=\"refresh\""), "a search does not reload itself:\n{html}");
        attrs(&html, "data-found")
    };
    assert_eq!(found("waits").len(), 3);
    assert_eq!(found("host-a"), [failed.as_str()]);
    // A prefix long enough to reach past the time-ordered head names the delivery alone.
    assert_eq!(found(&failed[..failed.len() - 4]), [failed.as_str()]);
    let message = hub.delivery(&running)["message_id"].as_str().unwrap().to_string();
    assert_eq!(found(&message), [running.as_str()]);
    assert!(found("no-such-thing").is_empty());
    let too_long = get_as(&addr, &addr, &format!("/status?q={}", "x".repeat(201))).unwrap();
    assert!(too_long.starts_with("HTTP/1.1 400") && too_long.contains("at most 200"), "{too_long}");
}

/// With `status_page_reasons = "hidden"`, neither a cancel's reason nor a run's is on the page,
/// which says where to read them.
#[test]
fn reasons_are_hidden_when_configured() {
    let hub = Hub::builder().nodes(&["host-a"]).config("status_page_reasons = \"hidden\"\n").start();
    let cancelled = hub.send_one("work", "k1", "host-a");
    hub.cli_ok(["deliveries", "cancel", &cancelled, "--reason", "reason-TOPSECRET"]);
    let addr = operator_addr(&hub);
    for path in ["/".to_string(), format!("/status/deliveries/{cancelled}")] {
        let html = page(&addr, &path);
        assert!(html.contains(&cancelled), "{path} lists the delivery:\n{html}");
        assert!(!html.contains("TOPSECRET"), "{path} shows a reason:\n{html}");
        assert!(html.contains("status_page_reasons") && html.contains("deliveries show"), "{path}:\n{html}");
    }
    // By default, on loopback, the same reason is shown.
    let shown = Hub::with_nodes(&["host-a"]);
    let cancelled = shown.send_one("work", "k1", "host-a");
    shown.cli_ok(["deliveries", "cancel", &cancelled, "--reason", "reason-TOPSECRET"]);
    let addr = operator_addr(&shown);
    assert!(page(&addr, "/").contains("reason-TOPSECRET"));
    assert!(page(&addr, &format!("/status/deliveries/{cancelled}")).contains("reason-TOPSECRET"));
}
