//! The producer's replay feed, `GET /v1/messages?conversation=C&after=CURSOR&limit=N` and
//! `baton list`: its own messages of a conversation, oldest first, in bounded pages whose
//! cursors walk them once each; another producer's messages never in it; a cursor of another
//! listing, or a mangled one, refused as `bad_cursor`; one whose messages after it were
//! purged, `cursor_expired`; the read by key and the listing never mixed in one query. Rerun on
//! PostgreSQL: the listing reads the record in `seq` order from a cursor. One hub serves every
//! check.

use crate::harness::{Api, Hub};
use crate::producer_cli::{baton, config_file, json, run, status, text};
use serde_json::{Value, json};

/// Every page of `producer`'s listing of `conversation`, `limit` at a time, from the start:
/// the (seq, idempotency key) of each message in order, and the last page's cursor.
async fn walk(api: &Api, conversation: &str, limit: u32) -> (Vec<(i64, String)>, String) {
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/messages?conversation={conversation}&limit={limit}");
        if let Some(a) = &after {
            path.push_str(&format!("&after={a}"));
        }
        let r = api.get(&path).await;
        let page = r.ok(200).clone();
        assert_eq!(page["conversation"], conversation, "{page:#}");
        let messages = page["messages"].as_array().expect("messages");
        assert!(messages.len() <= limit as usize, "{page:#}");
        for m in messages {
            seen.push((m["seq"].as_i64().expect("seq"), m["idempotency_key"].as_str().expect("key").to_string()));
        }
        after = Some(page["next_cursor"].as_str().expect("next_cursor").to_string());
        if page["more"] == json!(false) {
            return (seen, after.unwrap_or_default());
        }
    }
    panic!("the listing of {conversation} did not end");
}

async fn post(api: &Api, conversation: &str, key: &str) -> String {
    let body = json!({"conversation": conversation, "idempotency_key": key, "payload": {"key": key}, "to": ["host-a"]});
    let r = api.post("/v1/messages", &body).await;
    r.ok(201)["message_id"].as_str().expect("message_id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_pages_through_its_own_messages_from_a_cursor() {
    let hub = Hub::builder().nodes(&["host-a"]).producers(&["prod", "prod-two"]).start();
    let (mine, theirs) = (hub.client("prod"), hub.client("prod-two"));
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(post(&mine, "talk", &format!("mine-{i}")).await);
        if i % 2 == 0 {
            post(&theirs, "talk", &format!("theirs-{i}")).await;
        }
    }
    post(&mine, "elsewhere", "mine-elsewhere").await;

    // Its own five, in order, in pages of two; the other producer's never, and the reverse.
    let (seen, end) = walk(&mine, "talk", 2).await;
    let keys: Vec<&str> = seen.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(keys, ["mine-0", "mine-1", "mine-2", "mine-3", "mine-4"]);
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "seq order: {seen:?}");
    let (seen, _) = walk(&theirs, "talk", 100).await;
    let keys: Vec<&str> = seen.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(keys, ["theirs-0", "theirs-2", "theirs-4"], "a producer sees none of another's messages");

    // Nothing new at the end: an empty page, the same cursor; a new message comes after it.
    let r = mine.get(&format!("/v1/messages?conversation=talk&after={end}")).await;
    let page = r.ok(200);
    assert_eq!(
        (page["messages"].as_array().map(Vec::len), &page["next_cursor"], &page["more"]),
        (Some(0), &json!(end), &json!(false))
    );
    post(&mine, "talk", "mine-5").await;
    let r = mine.get(&format!("/v1/messages?conversation=talk&after={end}")).await;
    let page = r.ok(200).clone();
    assert_eq!(page["messages"][0]["idempotency_key"], "mine-5", "{page:#}");
    assert_eq!(page["messages"][0]["payload"], json!({"key": "mine-5"}));
    assert_eq!(page["messages"][0]["deliveries"][0]["host"], "host-a");
    let traceparent = page["messages"][0]["traceparent"].as_str().unwrap_or_default().to_string();
    assert!(traceparent.starts_with("00-"), "the message's trace: {page:#}");

    // A cursor is this listing's only: another producer's, another conversation's, a mangled
    // one are refused as bad_cursor, naming `after`.
    let (_, their_end) = walk(&theirs, "talk", 100).await;
    let (_, elsewhere_end) = walk(&mine, "elsewhere", 100).await;
    for bad in [their_end.as_str(), elsewhere_end.as_str(), "12.abcdef", "nonsense"] {
        let r = mine.get(&format!("/v1/messages?conversation=talk&after={bad}")).await;
        let message = r.err(400, "bad_cursor");
        assert!(message.starts_with("after:"), "{message}");
    }
    // The two forms of the query never mix; a listing names its conversation.
    let r = mine.get("/v1/messages?idempotency_key=mine-0&conversation=talk").await;
    let message = r.err(400, "invalid_field");
    assert!(message.contains("idempotency_key") && message.contains("conversation"), "{message}");
    let r = mine.get("/v1/messages?wait_ms=10&limit=2").await;
    let message = r.err(400, "invalid_field");
    assert!(message.contains("wait_ms") && message.contains("limit"), "{message}");
    let r = mine.get("/v1/messages?limit=2").await;
    assert!(r.err(400, "invalid_field").starts_with("conversation:"));
    let r = mine.get("/v1/messages?conversation=talk&limit=0").await;
    assert!(r.err(400, "invalid_field").starts_with("limit:"));
    let r = mine.get("/v1/messages?idempotency_key=mine-0").await;
    assert_eq!(r.ok(200)["message_id"], json!(ids[0]), "the read by key is as before");

    // The first two messages cancelled and purged: a cursor before them is expired, one after
    // them is not, and a listing from the start begins at what is kept.
    let (first_page, first_cursor) = {
        let r = mine.get("/v1/messages?conversation=talk&limit=1").await;
        let p = r.ok(200).clone();
        (
            p["messages"][0]["message_id"].as_str().expect("id").to_string(),
            p["next_cursor"].as_str().expect("cursor").to_string(),
        )
    };
    assert_eq!(first_page, ids[0]);
    let r = mine.get(&format!("/v1/messages?conversation=talk&after={first_cursor}&limit=1")).await;
    let second_cursor = r.ok(200)["next_cursor"].as_str().expect("cursor").to_string();
    for id in &ids[..2] {
        mine.post(&format!("/v1/messages/{id}/cancel"), &json!({"reason": "replay test"})).await.ok(200);
        hub.cli_ok(["purge", "--message", id, "--reason", "replay test", "--yes"]);
    }
    let r = mine.get(&format!("/v1/messages?conversation=talk&after={first_cursor}")).await;
    let message = r.err(410, "cursor_expired");
    assert!(message.starts_with("after:") && message.contains("talk"), "{message}");
    let r = mine.get(&format!("/v1/messages?conversation=talk&after={second_cursor}&limit=1")).await;
    assert_eq!(r.ok(200)["messages"][0]["idempotency_key"], "mine-2");
    let (seen, _) = walk(&mine, "talk", 100).await;
    assert_eq!(seen.first().map(|(_, k)| k.as_str()), Some("mine-2"));

    // `baton list`: the page as text and as the API's JSON, and its exit statuses.
    let config = config_file(&hub, false);
    let cli = |args: &[&str]| {
        let mut all = vec!["--config".to_string(), config.display().to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        run(baton(all))
    };
    let out = cli(&["list", "--conversation", "talk", "--limit", "2"]);
    status(&out, 0);
    let shown = text(&out.stdout);
    assert!(shown.contains("key mine-2") && shown.contains("key mine-3") && !shown.contains("mine-4"), "{shown}");
    let next = shown.lines().last().and_then(|l| l.strip_prefix("next ")).and_then(|l| l.split(' ').next());
    let next = next.unwrap_or_else(|| panic!("no next cursor: {shown}")).to_string();
    let out = cli(&["--json", "list", "--conversation", "talk", "--after", &next]);
    status(&out, 0);
    let page: Value = json(&out);
    let keys: Vec<&str> =
        page["messages"].as_array().unwrap().iter().map(|m| m["idempotency_key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["mine-4", "mine-5"], "{page:#}");
    assert_eq!(page["more"], false);
    let out = cli(&["list", "--conversation", "talk", "--after", &first_cursor]);
    status(&out, 2);
    assert!(text(&out.stderr).contains("cursor"), "{}", text(&out.stderr));
}
