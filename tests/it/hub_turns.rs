//! Turn control through the real `baton-hub`, with a raw HTTPS client playing the node: node
//! sessions and the 409 `session_superseded` on every node route, hub-confirmed starts, cancel
//! (operator and producer) reaching a waiting claim, retries the harness asks for (across a
//! hub restart), and the operator's retry and redrive.

use crate::harness::{Hub, OPERATOR, random_id};
use serde_json::{Value, json};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A node client that sends `baton-session` when it has one.
#[derive(Clone)]
struct SessionNode {
    http: reqwest::Client,
    base: String,
    instance: String,
    session: Option<u64>,
}

/// One answer: status and JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    #[track_caller]
    fn ok(&self) -> &Value {
        assert_eq!(self.status, 200, "{:?}", self.body);
        &self.body
    }

    #[track_caller]
    fn err(&self, status: u16, code: &str) {
        assert_eq!((self.status, self.body["code"].as_str()), (status, Some(code)), "{:?}", self.body);
    }
}

/// A delivery as a claim hands it out.
#[derive(Debug, Clone)]
struct Turn {
    id: String,
    token: String,
    attempt: u64,
}

impl Turn {
    fn list(body: &Value) -> Vec<Turn> {
        body["deliveries"]
            .as_array()
            .unwrap_or_else(|| panic!("no deliveries in {body}"))
            .iter()
            .map(|d| Turn {
                id: d["delivery_id"].as_str().unwrap().to_string(),
                token: d["claim_token"].as_str().unwrap().to_string(),
                attempt: d["attempt"].as_u64().unwrap(),
            })
            .collect()
    }
}

impl SessionNode {
    fn new(hub: &Hub, host: &str, instance: &str) -> SessionNode {
        let id = hub.identity(host);
        let builder = baton_testkit::identity::client_builder(hub.ca_pem().as_bytes(), Some(&id.pem().unwrap()))
            .unwrap_or_else(|e| panic!("{e:#}"));
        SessionNode {
            http: builder.timeout(Duration::from_secs(60)).build().unwrap(),
            base: hub.url(),
            instance: instance.into(),
            session: None,
        }
    }

    /// The same client naming another session (or none).
    fn with_session(&self, session: Option<u64>) -> SessionNode {
        SessionNode { session, ..self.clone() }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let req = match self.session {
            Some(s) => req.header("baton-session", s.to_string()),
            None => req,
        };
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        let body = serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null);
        Answer { status, body }
    }

    async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(self.http.post(format!("{}{path}", self.base)).json(&body)).await
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(self.http.get(format!("{}{path}", self.base))).await
    }

    /// Registers a new session and uses it from now on; returns the answer.
    async fn open_session(&mut self) -> Value {
        let a = self.post("/v1/sessions", json!({"instance_id": self.instance, "node_version": "test"})).await;
        let body = a.ok().clone();
        self.session = Some(body["session"].as_u64().unwrap());
        body
    }

    async fn claim(&self, wait_ms: u64) -> Answer {
        self.post("/v1/claims", json!({"instance_id": self.instance, "max": 10, "wait_ms": wait_ms})).await
    }

    async fn holdings(&self) -> Answer {
        self.get(&format!("/v1/holdings?instance_id={}", self.instance)).await
    }

    fn holder(&self, t: &Turn) -> Value {
        json!({"instance_id": self.instance, "claim_token": t.token})
    }

    async fn step(&self, t: &Turn, step: &str) -> Answer {
        self.post(&format!("/v1/deliveries/{}/{step}", t.id), self.holder(t)).await
    }

    async fn deliver(&self, t: &Turn) {
        self.step(t, "mirrored").await.ok();
        self.step(t, "ack").await.ok();
    }

    async fn starts(&self, turns: &[&Turn]) -> Answer {
        let items: Vec<Value> =
            turns.iter().map(|t| json!({"delivery_id": t.id, "claim_token": t.token, "attempt": t.attempt})).collect();
        self.post("/v1/starts", json!({"instance_id": self.instance, "starts": items})).await
    }

    async fn report(&self, t: &Turn, report_id: &str, outcome: &str, exit_code: Option<i32>) -> Answer {
        self.post(
            "/delivery-report",
            json!({
                "delivery_id": t.id, "instance_id": self.instance, "claim_token": t.token, "report_id": report_id,
                "outcome": outcome, "exit_code": exit_code, "attempt": t.attempt,
            }),
        )
        .await
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Submits one message to host-a as `prod`, with an optional retry policy; returns the delivery.
async fn submit(hub: &Hub, conversation: &str, key: &str, retry: Option<(u32, u64)>) -> (String, String) {
    let mut body = json!({"conversation": conversation, "idempotency_key": key, "payload": {}, "to": ["host-a"]});
    if let Some((max, backoff)) = retry {
        body["max_attempts"] = json!(max);
        body["retry_backoff_ms"] = json!(backoff);
    }
    let r = hub.client("prod").post("/v1/messages", &body).await;
    let b = r.ok(201);
    (b["message_id"].as_str().unwrap().to_string(), b["deliveries"][0]["delivery_id"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_session_is_refused_on_every_node_route() {
    if crate::harness::skipped_on_postgres("an_older_session_is_refused_on_every_node_route") {
        return;
    }
    let hub = Hub::start();
    let mut node = SessionNode::new(&hub, "host-a", "inst-1");
    let first = node.open_session().await;
    assert_eq!((first["session"].as_u64(), first["took_over"].as_u64()), (Some(1), None));
    let (_, id) = submit(&hub, "c", "k1", None).await;
    let turns = Turn::list(node.claim(0).await.ok());
    assert_eq!(turns.len(), 1);
    let t = turns[0].clone();
    node.deliver(&t).await;
    let old = node.clone();
    // The same instance starts again (a crash, or a copy of its data directory).
    let second = node.open_session().await;
    assert_eq!((second["session"].as_u64(), second["took_over"].as_u64()), (Some(2), Some(1)));
    assert!(hub.serve_logs().contains("took over"), "the takeover is logged: {}", hub.serve_logs());

    old.claim(0).await.err(409, "session_superseded");
    old.holdings().await.err(409, "session_superseded");
    old.step(&t, "mirrored").await.err(409, "session_superseded");
    old.step(&t, "ack").await.err(409, "session_superseded");
    let reject = json!({"instance_id": "inst-1", "claim_token": t.token, "reason": "x"});
    old.post(&format!("/v1/deliveries/{id}/reject"), reject).await.err(409, "session_superseded");
    old.starts(&[&t]).await.err(409, "session_superseded");
    old.report(&t, "r-old", "succeeded", Some(0)).await.err(409, "session_superseded");
    old.post("/v1/sessions/end", json!({"instance_id": "inst-1", "session": 1})).await.err(409, "session_superseded");
    assert!(hub.show(&id)["attempts"].as_array().unwrap().is_empty(), "the old session changed nothing");

    // The newest session is accepted. Leaving the header out is no way around the fence: once
    // the host has sessions, a request without one is refused, naming the header, and changes
    // nothing.
    node.holdings().await.ok();
    let bare = node.with_session(None);
    for r in [
        bare.holdings().await,
        bare.claim(0).await,
        bare.step(&t, "ack").await,
        bare.report(&t, "r-bare", "succeeded", Some(0)).await,
    ] {
        r.err(400, "invalid_field");
        assert!(r.body["message"].as_str().is_some_and(|m| m.contains("baton-session")), "names the header: {r:?}");
    }
    assert!(hub.show(&id)["attempts"].as_array().unwrap().is_empty(), "the request without a session changed nothing");
    node.report(&t, "r-new", "succeeded", Some(0)).await;
    assert_eq!(hub.show(&id)["attempts"].as_array().unwrap().len(), 1);
    // A session number that is not a number is refused.
    let garbage = node.http.get(format!("{}/v1/holdings?instance_id=inst-1", node.base)).header("baton-session", "two");
    node.with_session(None).send(garbage).await.err(400, "invalid_field");
    // Accepted requests are recorded as the session's last contact (written every few seconds).
    let db = hub.data_dir().join("hub.db");
    let contact = || -> Option<(i64, i64)> {
        let c = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
        c.query_row(
            "SELECT started_at, last_contact_at FROM node_sessions WHERE host = 'host-a' AND session = 2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .ok()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        node.holdings().await.ok();
        if contact().is_some_and(|(started, last)| last > started) {
            break;
        }
        assert!(Instant::now() < deadline, "last_contact_at never moved: {:?}", contact());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A clean end, then a new session: no takeover.
    node.post("/v1/sessions/end", json!({"instance_id": "inst-1", "session": 2})).await.ok();
    node.post("/v1/sessions/end", json!({"instance_id": "inst-1", "session": 2})).await.ok();
    let third = node.open_session().await;
    assert_eq!((third["session"].as_u64(), third["took_over"].as_u64()), (Some(3), None));
    // Another instance while this one holds work is refused, as at the claim.
    submit(&hub, "c", "k2", None).await;
    assert_eq!(Turn::list(node.claim(0).await.ok()).len(), 1);
    let copy = SessionNode::new(&hub, "host-a", "inst-2");
    copy.post("/v1/sessions", json!({"instance_id": "inst-2"})).await.err(409, "instance_conflict");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_are_recorded_once_and_refused_to_another_session() {
    // A short start lease, so the later session sees it run out.
    let hub = Hub::builder().config("start_lease = \"1s\"\n").start();
    let mut node = SessionNode::new(&hub, "host-a", "inst-1");
    node.open_session().await;
    submit(&hub, "c", "k1", None).await;
    submit(&hub, "c", "k2", None).await;
    let turns = Turn::list(node.claim(0).await.ok());
    node.deliver(&turns[0]).await;
    node.step(&turns[1], "mirrored").await.ok();
    let mut unknown = turns[0].clone();
    unknown.id = random_id();
    let a = node.starts(&[&turns[0], &turns[1], &unknown]).await;
    let r = a.ok()["results"].as_array().unwrap().clone();
    assert_eq!(r[0]["start"], true);
    assert_eq!((r[1]["start"].as_bool(), r[1]["code"].as_str()), (Some(false), Some("stale_claim")));
    assert_eq!(r[2]["code"], "not_found");
    assert_eq!(node.starts(&[&turns[0]]).await.ok()["results"][0]["start"], true, "idempotent for the session");
    // Without a session a start is refused outright.
    node.with_session(None).starts(&[&turns[0]]).await.err(400, "invalid_field");
    // A later session of the same instance did not start this run. While the first session's
    // start lease (renewed by its accepted start) lasts, the first process may still be starting
    // it on its own (had the grant's answer been lost on its way), so the later one waits; once
    // the lease ran out, the run is the first session's for good.
    node.open_session().await;
    let pending = node.starts(&[&turns[0]]).await.ok()["results"][0].clone();
    assert_eq!(pending["code"], "start_lease_pending", "{pending}");
    let wait_ms = pending["retry_after_ms"].as_u64().unwrap_or_else(|| panic!("no retry_after_ms: {pending}"));
    assert!((1..=1_000).contains(&wait_ms), "{pending}");
    tokio::time::sleep(std::time::Duration::from_millis(wait_ms + 50)).await;
    let again = node.starts(&[&turns[0]]).await;
    assert_eq!(again.ok()["results"][0]["code"], "started_elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_waiting_claim_and_is_idempotent() {
    let hub = Hub::start();
    let mut node = SessionNode::new(&hub, "host-a", "inst-1");
    node.open_session().await;
    let (message_id, id) = submit(&hub, "c", "k1", None).await;
    let t = Turn::list(node.claim(0).await.ok()).remove(0);
    node.deliver(&t).await;
    assert_eq!(node.starts(&[&t]).await.ok()["results"][0]["start"], true);

    // A claim waits; the operator's cancel wakes it with the notice.
    let waiting = node.clone();
    let began = Instant::now();
    let claim = tokio::spawn(async move { waiting.claim(25_000).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = hub.cli_ok(["deliveries", "cancel", &id, "--reason", "stop it"]);
    assert!(out.contains(&id) && out.contains("requested"), "{out}");
    let answer = claim.await.unwrap();
    assert!(began.elapsed() < Duration::from_secs(20), "the waiting claim returned with the cancel");
    let body = answer.ok();
    assert_eq!(body["cancels"], json!([{"delivery_id": id, "attempt": 1, "reason": "stop it"}]));
    assert!(body["deliveries"].as_array().unwrap().is_empty());
    let held = node.holdings().await;
    assert_eq!(held.ok()["deliveries"][0]["cancel_requested"], true);
    // Repeating the cancel changes nothing and answers the same.
    let events = hub.events(&id).len();
    let again = hub.cli_ok(["deliveries", "cancel", &id, "--reason", "stop it", "--json"]);
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["deliveries"][0]["effect"], "requested");
    assert_eq!(hub.events(&id).len(), events);
    // The node reports the run cancelled: final.
    node.report(&t, "r-cancel", "cancelled", None).await;
    let shown = hub.show(&id);
    assert_eq!(shown["attempts"][0]["outcome"], "cancelled", "{shown}");
    let fin = hub.cli(["deliveries", "cancel", &id, "--reason", "late", "--json"]);
    assert_eq!(fin.status.code(), Some(1), "a cancel that changes nothing exits 1");
    assert_eq!(serde_json::from_slice::<Value>(&fin.stdout).unwrap()["deliveries"][0]["effect"], "final");

    // The producer route: its own message only.
    let prod = hub.client("prod");
    let (other_msg, other) = submit(&hub, "c", "k2", None).await;
    let r = hub.client("prod-two").post(&format!("/v1/messages/{other_msg}/cancel"), &json!({"reason": "mine?"})).await;
    r.err(403, "forbidden");
    let r = prod.post(&format!("/v1/messages/{}/cancel", random_id()), &json!({"reason": "x"})).await;
    r.err(404, "not_found");
    let r = prod.post(&format!("/v1/messages/{other_msg}/cancel"), &json!({"reason": "not needed"})).await;
    assert_eq!(r.ok(200)["deliveries"][0]["effect"], "cancelled");
    assert_eq!(hub.state_reason(&other), ("failed".to_string(), Some("cancelled: not needed".to_string())));
    let r2 = prod.post(&format!("/v1/messages/{other_msg}/cancel"), &json!({"reason": "not needed"})).await;
    assert_eq!(r2.ok(200), r.ok(200), "a repeat answers the same");
    let r = prod.post(&format!("/v1/messages/{message_id}/cancel"), &json!({"reason": "x"})).await;
    assert_eq!(r.ok(200)["deliveries"][0]["effect"], "final");
    // Many at once, with a dry run first.
    submit(&hub, "d", "k3", None).await;
    submit(&hub, "d", "k4", None).await;
    let dry = hub.cli_ok(["deliveries", "cancel", "--conversation", "d", "--dry-run", "--reason", "r", "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&dry).unwrap()["deliveries"].as_array().unwrap().len(), 2);
    assert!(hub.deliveries().iter().filter(|d| d["conversation"] == "d").all(|d| d["state"] == "queued"));
    hub.cli_ok(["deliveries", "cancel", "--conversation", "d", "--reason", "r"]);
    assert!(hub.deliveries().iter().filter(|d| d["conversation"] == "d").all(|d| d["state"] == "failed"));
    let none = hub.cli(["deliveries", "cancel", "--conversation", "d", "--reason", "r"]);
    assert_eq!(none.status.code(), Some(1), "nothing left to cancel");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_its_time_and_survives_a_hub_kill() {
    let mut hub = Hub::start();
    let mut node = SessionNode::new(&hub, "host-a", "inst-1");
    node.open_session().await;
    let (_, id) = submit(&hub, "c", "k1", Some((3, 3000))).await;
    let (_, later) = submit(&hub, "c", "k2", None).await;
    // The retryable turn is handed out alone: the later one waits for its outcome.
    let t = Turn::list(node.claim(0).await.ok());
    assert_eq!(t.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [id.as_str()]);
    node.deliver(&t[0]).await;
    let before = now_ms();
    let r = node.report(&t[0], "r1", "failed", Some(75)).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let retry_at = r.body["retry_at_ms"].as_i64().expect("retry_at_ms");
    assert!(retry_at >= before + 2400, "3 s backoff, jittered by at most a fifth: {retry_at} vs {before}");
    assert_eq!(r.body["attempt"]["retryable"], true);
    assert_eq!(hub.state(&id), "queued");
    assert!(Turn::list(node.claim(0).await.ok()).is_empty(), "neither the retry nor the later turn yet");

    hub.kill9();
    hub.serve(None);
    node.open_session().await;
    // A waiting claim is answered when the retry is due, not at the end of its wait.
    let began = Instant::now();
    let got = Turn::list(node.claim(25_000).await.ok());
    assert!(now_ms() >= retry_at, "handed out before its not-before time");
    assert!(began.elapsed() < Duration::from_secs(20), "the waiting claim woke for the retry");
    assert_eq!(got.iter().map(|t| (t.id.as_str(), t.attempt)).collect::<Vec<_>>(), [(id.as_str(), 2)]);
    node.deliver(&got[0]).await;
    let r = node.report(&got[0], "r2", "succeeded", Some(0)).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r.body["retry_at_ms"].is_null());
    let next = Turn::list(node.claim(0).await.ok());
    assert_eq!(next.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), [later.as_str()]);
    let shown = hub.show(&id);
    let runs: Vec<(u64, bool, Value, Value)> = shown["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["retryable"].as_bool().unwrap(),
                a["rerun"].clone(),
                a["caused_by"].clone(),
            )
        })
        .collect();
    assert_eq!(runs, [(1, true, Value::Null, json!("producer:prod")), (2, false, json!("retry"), json!("hub"))]);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_runs_are_final_and_bounds_are_checked() {
    let hub = Hub::start();
    let mut node = SessionNode::new(&hub, "host-a", "inst-1");
    node.open_session().await;
    let prod = hub.client("prod");
    for (field, value) in
        [("max_attempts", json!(0)), ("max_attempts", json!(11)), ("retry_backoff_ms", json!(301_000))]
    {
        let mut body = json!({"conversation": "c", "idempotency_key": "kb", "payload": {}, "to": ["host-a"]});
        body[field] = value;
        let e = prod.post("/v1/messages", &body).await.err(400, "invalid_field");
        assert!(e.contains(field), "{e}");
    }
    let (_, id) = submit(&hub, "c", "k1", Some((1, 10))).await;
    let t = Turn::list(node.claim(0).await.ok()).remove(0);
    node.deliver(&t).await;
    let r = node.report(&t, "r1", "failed", Some(75)).await;
    assert!(r.body["retry_at_ms"].is_null() && r.body["attempt"]["retryable"] == false, "{:?}", r.body);
    assert_eq!(hub.state(&id), "delivered");
    // An outcome `cancelled` without a cancel is refused.
    let (_, id2) = submit(&hub, "c", "k2", None).await;
    let t2 = Turn::list(node.claim(0).await.ok()).remove(0);
    assert_eq!(t2.id, id2);
    node.deliver(&t2).await;
    node.report(&t2, "r2", "cancelled", None).await.err(400, "invalid_field");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_retry_and_redrive_in_batches_once_per_request() {
    let hub = Hub::builder().config("[limits]\nredrive_batch_max = 1\n").start();
    let mut node = SessionNode::new(&hub, "host-a", "inst-1");
    node.open_session().await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(submit(&hub, &format!("c{i}"), &format!("k{i}"), None).await.1);
    }
    for t in Turn::list(node.claim(0).await.ok()) {
        node.deliver(&t).await;
        node.report(&t, &format!("r-{}", t.id), "failed", Some(1)).await;
    }
    // One by id.
    let out = hub.cli_ok(["deliveries", "retry", &ids[0], "--reason", "try once more"]);
    assert!(out.contains("run 2"), "{out}");
    let shown = hub.show(&ids[0]);
    assert_eq!(shown["delivery"]["state"], "queued");
    assert_eq!(hub.cli(["deliveries", "retry", &ids[0], "--reason", "again"]).status.code(), Some(2), "not final");
    // Many: a dry run changes nothing.
    let dry = hub.cli_ok(["redrive", "--outcome", "failed", "--dry-run", "--reason", "r", "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&dry).unwrap()["deliveries"].as_array().unwrap().len(), 3);
    assert_eq!(hub.state(&ids[1]), "delivered");
    let args = [
        "redrive",
        "--outcome",
        "failed",
        "--limit",
        "2",
        "--request-id",
        "req-1",
        "--reason",
        "outage over",
        "--json",
    ];
    let first: Value = serde_json::from_str(&hub.cli_ok(args)).unwrap();
    assert_eq!(first["deliveries"].as_array().unwrap().len(), 2, "{first}");
    let events = hub.events(&ids[3]).len();
    let repeat: Value = serde_json::from_str(&hub.cli_ok(args)).unwrap();
    assert_eq!((repeat["repeat"].as_bool(), repeat["redriven"].as_i64()), (Some(true), Some(2)), "{repeat}");
    assert_eq!(hub.events(&ids[3]).len(), events, "a repeated request changes nothing");
    // The same request id with other filters is an idempotency conflict (2): nothing changes,
    // and nothing says the other selection was re-run.
    for other in
        [&["--limit", "3"][..], &["--limit", "2", "--host", "host-a"], &["--limit", "2", "--conversation", "c1"]]
    {
        let mut args = vec!["redrive", "--outcome", "failed", "--request-id", "req-1", "--reason", "outage over"];
        args.extend_from_slice(other);
        let out = hub.cli(&args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{other:?}: {said}{}", String::from_utf8_lossy(&out.stdout));
        assert!(said.contains("idempotency conflict") && said.contains("req-1") && said.contains("filters"), "{said}");
        assert_eq!(hub.events(&ids[3]).len(), events, "a conflicting request changes nothing");
    }
    let queued = ids.iter().filter(|id| hub.state(id) == "queued").count();
    assert_eq!(queued, 3);
    // The redriven runs are handed out with their run and marked as redrives.
    let got = node.claim(0).await;
    let body = got.ok();
    for d in body["deliveries"].as_array().unwrap() {
        assert_eq!((d["attempt"].as_u64(), d["rerun"].as_str()), (Some(2), Some("redrive")), "{d}");
    }
    let shown = hub.show(&ids[0]);
    let last = shown["events"].as_array().unwrap().last().unwrap().clone();
    assert!(last.to_string().contains("claimed"), "{last}");
    let redriven = hub.cli_ok(["deliveries", "show", &ids[0]]);
    assert!(redriven.contains("run 1") && redriven.contains("failed"), "{redriven}");
    assert!(redriven.contains(&format!("operator:{OPERATOR}")) || hub.show(&ids[0]).to_string().contains(OPERATOR));
    hub.verify_ok();
}

/// `deliveries cancel` takes the reason the API takes (1..=1024 characters, not only
/// whitespace): an empty, blank or longer one is refused (2) before anything changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reason_is_held_to_the_api_rule() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let s = prod.submit_new("c", "k1", &["host-a"]).await;
    let id = s.to("host-a").to_string();
    let long = "x".repeat(baton_shared::limits::REASON_CHARS_MAX + 1);
    for reason in ["", "   ", long.as_str()] {
        let out = hub.cli(["deliveries", "cancel", &id, "--reason", reason]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{reason:?}: {said}");
        assert!(said.contains("--reason") && said.contains("1..=1024"), "{said}");
        assert_eq!(hub.state(&id), "queued", "a refused cancel changes nothing");
    }
    let ok = "y".repeat(baton_shared::limits::REASON_CHARS_MAX);
    hub.cli_ok(["deliveries", "cancel", &id, "--reason", &ok]);
    assert_eq!(hub.state(&id), "failed");
}

/// `deliveries cancel --host H` cancels every delivery to that host that has not ended, and
/// nothing of another host: a queued one and a claimed one fail as cancelled, a delivered one
/// without an outcome gets the cancel asked for (its node stops it); a dry run changes nothing,
/// and a repeat has nothing left to do (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_by_host_reaches_every_unfinished_delivery_of_that_host_only() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let delivered = prod.submit_new("c1", "k1", &["host-b"]).await;
    let claimed = prod.submit_new("c2", "k2", &["host-b"]).await;
    let queued = prod.submit_new("c3", "k3", &["host-b", "host-a"]).await;
    let node = hub.node("host-b", "inst-b");
    let got = node.claim(2, 0).await;
    assert_eq!(got.len(), 2);
    node.mirror_and_ack(&got[0]).await;
    assert_eq!(got[0].delivery_id, delivered.to("host-b"));

    let dry = hub.cli_ok(["deliveries", "cancel", "--host", "host-b", "--dry-run", "--reason", "drain", "--json"]);
    let dry: Value = serde_json::from_str(&dry).unwrap();
    let ids = |v: &Value| -> Vec<String> {
        let mut ids: Vec<String> = v["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["delivery_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let mut want =
        vec![delivered.to("host-b").to_string(), claimed.to("host-b").to_string(), queued.to("host-b").to_string()];
    want.sort();
    assert_eq!(ids(&dry), want, "every unfinished delivery of host-b, none of host-a");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(hub.state(queued.to("host-b")), "queued", "a dry run changes nothing");
    assert_eq!(hub.state(claimed.to("host-b")), "claimed");

    let done = hub.cli_ok(["deliveries", "cancel", "--host", "host-b", "--reason", "drain", "--json"]);
    let done: Value = serde_json::from_str(&done).unwrap();
    assert_eq!(ids(&done), want);
    for d in done["deliveries"].as_array().unwrap() {
        let want = if d["delivery_id"] == delivered.to("host-b") { "requested" } else { "cancelled" };
        assert_eq!(d["effect"], want, "{d}");
    }
    assert_eq!(hub.state_reason(queued.to("host-b")), ("failed".to_string(), Some("cancelled: drain".to_string())));
    assert_eq!(hub.state_reason(claimed.to("host-b")).0, "failed");
    assert_eq!(hub.state(delivered.to("host-b")), "delivered", "its node is asked to stop it");
    assert_eq!(node.holdings().await.iter().filter(|c| c.delivery_id == delivered.to("host-b")).count(), 1);
    assert_eq!(hub.state(queued.to("host-a")), "queued", "another host's delivery is untouched");

    let again = hub.cli(["deliveries", "cancel", "--host", "host-b", "--reason", "drain"]);
    assert_eq!(again.status.code(), Some(1), "nothing left to cancel: {again:?}");
    hub.verify_ok();
}
