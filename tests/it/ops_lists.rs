//! Lists that scale: `deliveries list` filters by outcome and time, orders either way, pages
//! with a cursor printed when more remain, and every command taking a delivery id takes a
//! unique prefix of one (an ambiguous one is refused listing the matches).

use crate::harness::Hub;
use serde_json::Value;

fn page(hub: &Hub, args: &[&str]) -> (Vec<String>, Option<String>) {
    let mut all = vec!["deliveries", "list", "--json"];
    all.extend_from_slice(args);
    let out = hub.cli(&all);
    assert!(out.status.success(), "{all:?}: {out:?}");
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids = rows.as_array().unwrap().iter().map(|d| d["delivery_id"].as_str().unwrap().to_string()).collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cursor = stderr.split("--after ").nth(1).map(|c| c.trim().to_string());
    // The cursor is in the JSON too: the last row's is the next page's.
    if let Some(c) = &cursor {
        let last = rows.as_array().unwrap().last().unwrap();
        assert_eq!(last["cursor"].to_string(), *c, "{all:?}: {last}");
    }
    (ids, cursor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_list_pages_filters_and_orders() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let mut sent = Vec::new();
    for i in 0..5 {
        sent.push(
            prod.submit_new(&format!("c{}", i % 2), &format!("k{i}"), &["host-a"]).await.to("host-a").to_string(),
        );
    }
    for (order, expected) in [("--oldest", sent.clone()), ("--newest", sent.iter().rev().cloned().collect())] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut args = vec![order, "--limit", "2"];
            if let Some(a) = &after {
                args.extend_from_slice(&["--after", a]);
            }
            let (ids, cursor) = page(&hub, &args);
            pages += 1;
            seen.extend(ids);
            match cursor {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        assert_eq!((seen, pages), (expected, 3), "{order}");
    }
    // A page that holds everything prints no cursor.
    assert_eq!(page(&hub, &["--limit", "5"]).1, None);

    let node = hub.node("host-a", "inst-1");
    let got = node.claim(2, 0).await;
    for c in &got {
        node.mirror_and_ack(c).await;
    }
    node.report(&got[0], "r1", "succeeded", 0).await.ok(201);
    node.report(&got[1], "r2", "failed", 3).await.ok(201);
    assert_eq!(page(&hub, &["--outcome", "failed"]).0, [got[1].delivery_id.clone()]);
    assert_eq!(page(&hub, &["--outcome", "succeeded"]).0, [got[0].delivery_id.clone()]);
    let out = hub.cli(["deliveries", "list", "--state", "unknown"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "unknown is a state too: {stderr}");
    let out = hub.cli(["deliveries", "list", "--state", "succeeded"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("--outcome succeeded"), "{stderr}");
    assert_eq!(page(&hub, &["--since", "1h"]).0.len(), 5);
    assert!(page(&hub, &["--until", "2001-01-01 00:00:00"]).0.is_empty());
    assert_eq!(hub.cli(["deliveries", "list", "--since", "someday"]).status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_taken_by_unique_prefix_and_an_ambiguous_one_lists_the_matches() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let a = prod.submit_new("c", "k1", &["host-a"]).await.to("host-a").to_string();
    let b = prod.submit_new("c", "k2", &["host-a"]).await.to("host-a").to_string();
    let unique = &a[..a.len() - 1];
    let shown = hub.cli_json(["deliveries", "show", unique, "--json"]);
    assert_eq!(shown["delivery"]["delivery_id"], a.as_str());

    let common = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count().max(1);
    let ambiguous = &a[..common];
    for args in [
        vec!["deliveries", "show", ambiguous],
        vec!["deliveries", "cancel", ambiguous, "--reason", "r"],
        vec!["held", "release", ambiguous],
    ] {
        let out = hub.cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&a) && stderr.contains(&b), "the matches are listed: {stderr}");
    }
    assert_eq!(hub.cli(["deliveries", "show", "zzzz"]).status.code(), Some(1));

    // A table shows each id as its shortest unique prefix (at least 8 characters), which every
    // command taking an id accepts; --wide shows it whole.
    let table = |wide: bool| {
        let mut args = vec!["deliveries", "list", "--oldest"];
        if wide {
            args.push("--wide");
        }
        let out = hub.cli(&args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let short = table(false);
    assert_eq!(short.len(), 2, "{short:?}");
    for (s, full) in short.iter().zip([&a, &b]) {
        assert!(s.len() >= 8 && s.len() < full.len() && full.starts_with(s.as_str()), "{s} of {full}");
        assert!(s.len() > common, "{s} is unique: longer than the {common} characters the two share");
        let shown = hub.cli_json(["deliveries", "show", s, "--json"]);
        assert_eq!(shown["delivery"]["delivery_id"], full.as_str());
    }
    assert_eq!(table(true), [a.clone(), b.clone()]);

    hub.cli_ok(["deliveries", "cancel", unique, "--reason", "by prefix"]);
    assert_eq!(hub.state(&a), "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_list_pages_with_a_cursor() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    hub.fence("hold", &["--conversation", "h"], "look");
    let mut sent = Vec::new();
    for i in 0..3 {
        sent.push(prod.submit_new("h", &format!("k{i}"), &["host-a"]).await.to("host-a").to_string());
    }
    assert!(hub.node("host-a", "inst-1").claim(10, 0).await.is_empty());
    let held = |args: &[&str]| {
        let mut all = vec!["held", "list", "--json", "--limit", "2"];
        all.extend_from_slice(args);
        let out = hub.cli(&all);
        assert!(out.status.success(), "{out:?}");
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
        let ids: Vec<String> =
            rows.as_array().unwrap().iter().map(|d| d["delivery_id"].as_str().unwrap().to_string()).collect();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (ids, stderr.split("--after ").nth(1).map(|c| c.trim().to_string()))
    };
    let (first, cursor) = held(&[]);
    let cursor = cursor.expect("a cursor when more remain");
    let (rest, none) = held(&["--after", &cursor]);
    assert_eq!(none, None);
    assert_eq!([first, rest].concat(), sent);
}

/// One vocabulary for "failed": a turn whose harness failed (state `delivered`) and a delivery
/// a block refused (state `failed`) both have outcome `failed`. The list shows it, `--outcome
/// failed` lists exactly those two, and `redrive --outcome failed` selects the same two.
#[test]
fn outcome_failed_is_one_set_in_the_list_its_filter_and_redrive() {
    use crate::node_harness::{NODE_WAIT, wait_for};
    let hub = Hub::with_nodes(&["host-a"]);
    let _node = hub.node_process("host-a").then(r#"[ "$BATON_CONVERSATION" != bad ] || exit 3"#).start();
    let ran = hub.send_one("bad", "k1", "host-a");
    hub.wait_outcome(&ran);
    hub.cli_ok(["fence", "block", "--conversation", "blocked", "--force", "--reason", "not wanted"]);
    let blocked = hub.send_one("blocked", "k2", "host-a");
    wait_for("the block to refuse it", NODE_WAIT, || (hub.state(&blocked) == "failed").then_some(()));
    let fine = hub.send_one("good", "k3", "host-a");
    hub.wait_outcome(&fine);

    let mut expected = vec![ran.clone(), blocked.clone()];
    expected.sort();
    let listed = hub.cli_json(["deliveries", "list", "--outcome", "failed", "--json"]);
    let mut ids: Vec<String> =
        listed.as_array().unwrap().iter().map(|d| d["delivery_id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, expected, "{listed}");
    let states: Vec<(&str, &str)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["state"].as_str().unwrap(), d["outcome"].as_str().unwrap_or("-")))
        .collect();
    assert!(states.contains(&("delivered", "failed")) && states.contains(&("failed", "failed")), "{listed}");
    let all = hub.deliveries();
    let good = all.iter().find(|d| d["delivery_id"] == fine.as_str()).unwrap();
    assert_eq!(good["outcome"], "succeeded", "{good}");

    let would = hub.cli_json(["redrive", "--outcome", "failed", "--dry-run", "--reason", "look", "--json"]);
    let mut redriven: Vec<String> =
        would["deliveries"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect();
    redriven.sort();
    assert_eq!(redriven, expected, "{would}");

    // --since takes a duration ago, RFC 3339, or unix milliseconds; a bad one names the forms.
    let selected = |since: &str| {
        let out = hub.cli(["redrive", "--outcome", "failed", "--since", since, "--dry-run", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let mut ids: Vec<String> = v["deliveries"]
            .as_array()
            .map(|a| a.iter().map(|d| d.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        ids.sort();
        (out.status.code(), ids)
    };
    assert_eq!(selected("1h"), (Some(0), expected.clone()));
    assert_eq!(selected("2001-01-01T00:00:00Z"), (Some(0), expected.clone()));
    assert_eq!(selected("978307200000"), (Some(0), expected.clone()));
    assert_eq!(selected("2999-01-01T00:00:00Z"), (Some(1), vec![]), "nothing ended after then");
    let out = hub.cli(["redrive", "--outcome", "failed", "--since", "someday", "--dry-run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--since") && stderr.contains("duration ago"), "{stderr}");

    // A repeat by request id of a redrive given a duration is the same request, though "1h"
    // names a later moment the second time.
    let run = ["redrive", "--outcome", "failed", "--since", "1h", "--request-id", "r-1", "--reason", "again", "--json"];
    let first = hub.cli_json(run);
    assert_eq!(first["repeat"], false, "{first}");
    let again = hub.cli_json(run);
    assert_eq!((again["repeat"].clone(), again["redriven"].clone()), (Value::Bool(true), Value::from(2)), "{again}");
    let out = hub.cli(["redrive", "--outcome", "failed", "--since", "2h", "--request-id", "r-1", "--reason", "again"]);
    assert_eq!(out.status.code(), Some(2), "another duration is another selection: {out:?}");
}
