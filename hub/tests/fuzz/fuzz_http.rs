//! Property-based fuzzing of every request parser of the HTTP API, driven through the real axum
//! router in-process (tower `oneshot`), so the extractors (JSON bodies, query strings, path
//! ids, the `baton-session` header, identity) are exercised together with the handlers.
//!
//! What must hold for any request: no panic, no 5xx, and every non-2xx answer is exactly
//! `{code, message}` with a stable code whose status is the one sent and a message that names
//! no internal type. For accepted messages: the payload reads back byte for byte, a replay is a
//! duplicate, and a payload differing only in one number is a conflict, never a duplicate.
//!
//! Long run: `BATON_FUZZ_CASES=1000000 cargo test --release -p baton-hub --all-features --test fuzz -- fuzz_http::`.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use baton_hub::config::Limits;
use baton_hub::http::app;
use baton_hub::runtime::{AppState, Shared, TurnState, Work, certs::CertCache};
use baton_hub::store::upkeep::canonical::canonical;
use baton_hub::store::{self, Store, registry::hosts};
use baton_hub::tls::PeerIdentityExt;
use baton_shared::error::ErrorCode;
use baton_shared::ids::Role;
use baton_shared::pki::PeerIdentity;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// See `shared/tests/suite/fuzz_ids.rs`: `default` cases unless `BATON_FUZZ_CASES` says otherwise.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("BATON_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/fuzz_http.txt"))),
        ..ProptestConfig::default()
    }
}

const NODE_SERIAL: &str = "0a01";
const PRODUCER_SERIAL: &str = "0b02";
const HOST: &str = "host-a";
const PRODUCER: &str = "prod-a";

/// One hub for the whole run: a store with an enrolled node (`host-a`, and `host-b` as a second
/// recipient) and producer, the router over it, and the runtime that drives it.
struct Fixture {
    rt: tokio::runtime::Runtime,
    app: Router,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("hub.db");
        let conn = store::open_write(&path, baton_shared::sqlite::Synchronous::Normal).expect("store");
        store::in_write_txn(&conn, |c| {
            let far = i64::from(i32::MAX);
            for (role, name, serial) in [
                (Role::Node, HOST, NODE_SERIAL),
                (Role::Node, "host-b", "0c03"),
                (Role::Producer, PRODUCER, PRODUCER_SERIAL),
            ] {
                hosts::enroll(c, hosts::Issued { role, name, serial, not_after_unix: far }, "fuzz", "enrolled", 0)?;
            }
            Ok(())
        })
        .expect("enroll");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let limits = Limits { long_poll_wait_max: Duration::from_millis(20), ..Limits::default() };
        let state: AppState = rt.block_on(async {
            Arc::new(Shared {
                store: Store::sqlite(
                    conn,
                    &path,
                    baton_shared::sqlite::CHECKPOINT_INTERVAL,
                    baton_shared::clock::system(),
                )
                .expect("store"),
                work: Work::default(),
                outcomes: watch::channel(0).0,
                limits,
                shutdown: CancellationToken::new(),
                ready: AtomicBool::new(true),
                store_bytes: Default::default(),
                metrics: None,
                clock: baton_shared::clock::system(),
                turns: TurnState::default(),
                certs: CertCache::new(watch::channel(0).1),
                peers: None,
                feed_horizon: Default::default(),
                telemetry: baton_telemetry::Telemetry::off(),
                tls: None,
            })
        });
        Fixture { rt, app: app(state), _dir: dir }
    })
}

/// Who the request comes from, as the TLS layer would have put it on the request.
#[derive(Debug, Clone, Copy)]
enum Who {
    Node,
    Producer,
    UnknownSerial,
    BadCertificate,
    NoCertificate,
}

fn identity(who: Who) -> Option<PeerIdentityExt> {
    let id = |role, name: &str, serial: &str| Ok(PeerIdentity { role, name: name.into(), serial: serial.into() });
    let r = match who {
        Who::Node => id(Role::Node, HOST, NODE_SERIAL),
        Who::Producer => id(Role::Producer, PRODUCER, PRODUCER_SERIAL),
        Who::UnknownSerial => id(Role::Producer, PRODUCER, "ffff"),
        Who::BadCertificate => Err("the certificate carries 0 Baton identity URIs".to_string()),
        Who::NoCertificate => return None,
    };
    Some(PeerIdentityExt(Arc::new(r)))
}

/// The answer: status and body.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

fn send(who: Who, method: &str, uri: &str, headers: &[(&str, String)], body: Vec<u8>) -> Option<Answer> {
    let mut builder = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, v.as_str());
    }
    // A URI or header the HTTP layer itself could not carry never reaches the router.
    let mut req = builder.body(Body::from(body)).ok()?;
    if let Some(ext) = identity(who) {
        req.extensions_mut().insert(ext);
    }
    let f = fixture();
    let answer = f.rt.block_on(async {
        let resp = f.app.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 64 << 20).await.expect("body");
        Answer { status, body: body.to_vec() }
    });
    Some(answer)
}

/// Rust type names an error message must never carry.
const INTERNAL_NAMES: &[&str] = &[
    "SubmitRequest",
    "ClaimRequest",
    "SessionRequest",
    "SessionEndRequest",
    "StartRequest",
    "StartItem",
    "CancelRequest",
    "HolderRequest",
    "RejectRequest",
    "ReportRequest",
    "Batch",
    "HolderItem",
    "RejectItem",
    "ReadQuery",
    "HoldingsQuery",
    "Payload",
    "Outcome",
    "RawValue",
    "serde",
    "axum",
    "baton_",
    "::",
];

/// Holds any answer to the API's promises: never 5xx, and an error is `{code, message}` with a
/// stable code matching the status and no internal names.
fn answer_is_sound(what: &str, a: &Answer) -> Result<(), TestCaseError> {
    let text = String::from_utf8_lossy(&a.body);
    prop_assert!(a.status.as_u16() < 500, "{what}: {} {text}", a.status);
    if a.status.is_success() {
        return Ok(());
    }
    let v: Value = serde_json::from_slice(&a.body)
        .map_err(|e| TestCaseError::fail(format!("{what}: {} body is not JSON ({e}): {text}", a.status)))?;
    let obj = v.as_object().ok_or_else(|| TestCaseError::fail(format!("{what}: not an object: {text}")))?;
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    prop_assert_eq!(keys, vec!["code", "message"], "{}: {}", what, text);
    let code = obj["code"].as_str().and_then(ErrorCode::parse);
    let code = code.ok_or_else(|| TestCaseError::fail(format!("{what}: unknown code: {text}")))?;
    prop_assert_eq!(code.status(), a.status.as_u16(), "{}: {}", what, text);
    let message = obj["message"].as_str().unwrap_or_default();
    prop_assert!(!message.is_empty(), "{what}: empty message");
    for name in INTERNAL_NAMES {
        prop_assert!(!message.contains(name), "{what}: the message names {name:?}: {message}");
    }
    Ok(())
}

static KEYS: AtomicU64 = AtomicU64::new(0);

/// A fresh idempotency key.
fn fresh_key(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), KEYS.fetch_add(1, Ordering::Relaxed))
}

/// JSON text of any shape, as it may arrive: numbers beyond 64 bits and long decimals, escapes,
/// astral characters, whitespace inside, duplicate keys, nesting a few levels deep.
fn json_text() -> impl Strategy<Value = String> {
    let number = "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,30})?([eE][+-]?[0-9]{1,3})?";
    let string = prop::collection::vec(
        prop_oneof![
            "[a-z0-9 ]{1,3}".prop_map(|s| s),
            Just("\\n".to_string()),
            Just("\\u00e9".to_string()),
            Just("\\ud83d\\ude00".to_string()),
            Just("\\u0000".to_string()),
            Just("\\uffff".to_string()),
            Just("\\ud800".to_string()),
            Just("\\\"".to_string()),
            Just("\\/".to_string()),
            Just("é😀\u{ffff}".to_string()),
        ],
        0..4,
    )
    .prop_map(|parts| format!("\"{}\"", parts.concat()));
    let leaf = prop_oneof![
        number.prop_map(|s| s),
        string.clone(),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("null".to_string()),
    ];
    leaf.prop_recursive(5, 32, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(" , "))),
            prop::collection::vec((string.clone(), inner), 0..4).prop_map(|members| {
                let members: Vec<String> = members.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("{{ {} }}", members.join(",\n"))
            }),
        ]
    })
}

/// A value a field may be replaced with: any JSON, the edges of every integer type a field
/// has, long and hostile strings, and ids that are almost right.
fn field_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => json_text(),
        2 => prop::sample::select(vec![
            "0", "-1", "1", "255", "256", "257", "4294967295", "4294967296", "9223372036854775807",
            "9223372036854775808", "18446744073709551615", "18446744073709551616", "-9223372036854775809",
            "1.5", "1e3", "-0", "1e400", "0.0", "\"\"", "\" \"", "\"operator\"", "\"host-a\"", "\"Host-A\"",
            "\"host-a/../x\"", "\"%2e%2e%2f\"", "\"a\\u0000b\"", "\"\\u0000\"", "\"\\ud800\"", "\"\\uffff0\\u0000\"", "\"succeeded\"", "\"retry\"", "[]", "{}", "null",
            "\"0190b5a4-7a3e-7000-8000-000000000000\"", "\"not-a-uuid\"",
        ]).prop_map(str::to_string),
        1 => (prop::sample::select(vec!['a', 'é', '😀', '-', '\\', '\u{0}', '\u{ffff}']), 60usize..1200)
            .prop_map(|(c, n)| serde_json::to_string(&c.to_string().repeat(n)).unwrap_or_default()),
    ]
}

/// A change to a request body's template.
#[derive(Debug, Clone)]
enum Edit {
    /// Replace the value at a node (chosen among all nodes) with JSON text.
    Replace(prop::sample::Index, String),
    /// Remove an object member.
    Remove(prop::sample::Index),
    /// Add a member no request type knows.
    Unknown(String),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), field_value()).prop_map(|(i, v)| Edit::Replace(i, v)),
        2 => any::<prop::sample::Index>().prop_map(Edit::Remove),
        1 => "[a-z_]{1,12}".prop_map(Edit::Unknown),
    ]
}

/// Paths (object keys and array indexes) to every node of `v`, the root first.
fn paths(v: &Value, here: Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(here.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let mut p = here.clone();
                p.push(k.clone());
                paths(child, p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let mut p = here.clone();
                p.push(i.to_string());
                paths(child, p, out);
            }
        }
        _ => {}
    }
}

fn node_at<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, step| match v {
        Value::Object(m) => m.get_mut(step),
        Value::Array(items) => step.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

/// Applies `edits` to `template` and writes it as text: replacements are spliced in as raw text,
/// so they can hold numbers no `serde_json::Value` can.
fn apply(template: &Value, edits: &[Edit]) -> String {
    let mut v = template.clone();
    let mut holes = Vec::new();
    for e in edits {
        let mut all = Vec::new();
        paths(&v, Vec::new(), &mut all);
        match e {
            Edit::Replace(at, raw) => {
                let path = all[at.index(all.len())].clone();
                let hole = format!("@@hole{}@@", holes.len());
                if let Some(n) = node_at(&mut v, &path) {
                    *n = Value::String(hole.clone());
                    holes.push((hole, raw.clone()));
                }
            }
            Edit::Remove(at) => {
                let members: Vec<&Vec<String>> = all.iter().filter(|p| !p.is_empty()).collect();
                if members.is_empty() {
                    continue;
                }
                let path = members[at.index(members.len())].clone();
                let (last, parent) = path.split_last().expect("not the root");
                if let Some(Value::Object(m)) = node_at(&mut v, parent) {
                    m.remove(last);
                }
            }
            Edit::Unknown(name) => {
                if let Value::Object(m) = &mut v {
                    m.insert(name.clone(), json!(1));
                }
            }
        }
    }
    let mut text = v.to_string();
    for (hole, raw) in holes {
        text = text.replace(&format!("\"{hole}\""), &raw);
    }
    text
}

/// One route, with a body that is valid for it (before edits).
fn route_template(i: usize, uuid: &str) -> (&'static str, String, Value) {
    let submit = json!({
        "conversation": "conv-a", "idempotency_key": fresh_key("t"), "payload": {"n": 1},
        "to": [HOST], "max_attempts": 1, "retry_backoff_ms": 0,
    });
    let report = json!({
        "delivery_id": uuid, "instance_id": "inst-1", "claim_token": "tok", "report_id": "r-1",
        "outcome": "succeeded", "exit_code": 0, "duration_ms": 1, "result": "x", "reason": null,
        "attempt": 1, "signal": null,
    });
    let holder = json!({"instance_id": "inst-1", "claim_token": "tok"});
    let routes = [
        ("POST", "/v1/messages".to_string(), submit.clone()),
        ("GET", "/v1/messages".to_string(), Value::Null),
        ("GET", format!("/v1/messages/{uuid}"), Value::Null),
        ("POST", format!("/v1/messages/{uuid}/cancel"), json!({"reason": "r"})),
        ("GET", "/v1/conversations/conv-a".to_string(), Value::Null),
        ("POST", "/v1/sessions".to_string(), json!({"instance_id": "inst-1", "node_version": "1"})),
        ("POST", "/v1/sessions/end".to_string(), json!({"instance_id": "inst-1", "session": 1})),
        ("POST", "/v1/claims".to_string(), json!({"instance_id": "inst-1", "max": 1, "wait_ms": 0})),
        (
            "POST",
            "/v1/starts".to_string(),
            json!({"instance_id": "inst-1", "starts": [{"delivery_id": uuid, "claim_token": "tok", "attempt": 1}]}),
        ),
        ("GET", "/v1/holdings".to_string(), Value::Null),
        ("POST", format!("/v1/deliveries/{uuid}/mirrored"), holder.clone()),
        ("POST", format!("/v1/deliveries/{uuid}/ack"), holder.clone()),
        (
            "POST",
            format!("/v1/deliveries/{uuid}/reject"),
            json!({"instance_id": "inst-1", "claim_token": "tok", "reason": "r"}),
        ),
        ("POST", "/delivery-report".to_string(), report.clone()),
        ("POST", "/v1/batch/messages".to_string(), json!({"messages": [submit]})),
        (
            "POST",
            "/v1/batch/mirrored".to_string(),
            json!({"instance_id": "inst-1", "deliveries": [{"delivery_id": uuid, "claim_token": "tok"}]}),
        ),
        (
            "POST",
            "/v1/batch/ack".to_string(),
            json!({"instance_id": "inst-1", "deliveries": [{"delivery_id": uuid, "claim_token": "tok"}]}),
        ),
        (
            "POST",
            "/v1/batch/handoff".to_string(),
            json!({"instance_id": "inst-1", "deliveries": [{"delivery_id": uuid, "claim_token": "tok"}]}),
        ),
        (
            "POST",
            "/v1/batch/reject".to_string(),
            json!({"instance_id": "inst-1", "deliveries": [{"delivery_id": uuid, "claim_token": "tok", "reason": "r"}]}),
        ),
        ("POST", "/v1/batch/reports".to_string(), json!({"reports": [report]})),
        ("GET", format!("/v1/messages/{uuid}/events"), Value::Null),
        ("GET", "/v1/conversations/conv-a/events".to_string(), Value::Null),
        (
            "POST",
            "/v1/running".to_string(),
            json!({"instance_id": "inst-1", "turns": [{"delivery_id": uuid, "claim_token": "tok", "attempt": 1,
                   "events": [{"seq": 1, "progress": {"step": 1}}], "dropped": 0}]}),
        ),
        ("GET", "/healthz".to_string(), Value::Null),
        ("GET", "/readyz".to_string(), Value::Null),
        ("GET", "/metrics".to_string(), Value::Null),
        ("GET", "/no/such/endpoint".to_string(), Value::Null),
    ];
    let n = routes.len();
    routes.into_iter().nth(i % n).expect("in range")
}

/// A path segment: a valid id, or something hostile, percent-encoded where it must be.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("0190b5a4-7a3e-7000-8000-000000000000".to_string()),
        1 => "[0-9a-fA-F-]{0,40}",
        1 => prop::sample::select(vec!["..", "%2e%2e%2f", "%00", "%ff%fe", "a%20b", "x;y", "%", "%zz", "é"]).prop_map(str::to_string),
        1 => (any::<String>()).prop_map(|s| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>()),
    ]
}

/// A query string: the real parameters with edge values, unknown ones, and broken encodings.
fn query() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        4 => prop::sample::select(vec!["idempotency_key", "wait_ms", "instance_id", "after", "limit"]).prop_map(str::to_string),
        1 => "[a-z_]{1,10}",
        1 => Just(String::new()),
    ];
    let value = prop_oneof![
        prop::sample::select(vec![
            "0",
            "-1",
            "30000",
            "18446744073709551615",
            "18446744073709551616",
            "1.5",
            "",
            "inst-1",
            "t-1",
            "k%20k",
            "%zz",
            "%00",
            "a%2Fb",
            "%2e%2e%2f",
            "true",
        ])
        .prop_map(str::to_string),
        "[A-Za-z0-9._:-]{0,140}",
    ];
    prop::collection::vec((name, value, any::<bool>()), 0..4).prop_map(|pairs| {
        let parts: Vec<String> = pairs.into_iter().map(|(n, v, eq)| if eq { format!("{n}={v}") } else { n }).collect();
        parts.join("&")
    })
}

/// Everything about one request.
#[derive(Debug, Clone)]
struct Fuzzed {
    route: usize,
    method: Option<&'static str>,
    who: Who,
    segment: Option<String>,
    query: Option<String>,
    edits: Vec<Edit>,
    raw_body: Option<Vec<u8>>,
    content_type: Option<&'static str>,
    session: Option<String>,
}

fn fuzzed() -> impl Strategy<Value = Fuzzed> {
    let who = prop::sample::select(vec![
        Who::Node,
        Who::Producer,
        Who::Node,
        Who::Producer,
        Who::UnknownSerial,
        Who::BadCertificate,
        Who::NoCertificate,
    ]);
    let content_type = prop::sample::select(vec![
        Some("application/json"),
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        Some("text/plain"),
        Some("application/jsonx"),
        None,
    ]);
    let session = prop::option::of(prop_oneof![
        "[0-9]{1,22}",
        prop::sample::select(vec!["0", "-1", " 1 ", "1.0", "x", ""]).prop_map(str::to_string),
    ]);
    (
        0usize..64,
        prop::option::weighted(0.1, prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])),
        who,
        prop::option::weighted(0.3, segment()),
        prop::option::weighted(0.6, query()),
        prop::collection::vec(edit(), 0..4),
        prop::option::weighted(
            0.15,
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                json_text().prop_map(String::into_bytes),
                Just(b"{\"instance_id\":\"inst-1\"".to_vec()),
            ],
        ),
        content_type,
        session,
    )
        .prop_map(|(route, method, who, segment, query, edits, raw_body, content_type, session)| Fuzzed {
            route,
            method,
            who,
            segment,
            query,
            edits,
            raw_body,
            content_type,
            session,
        })
}

proptest! {
    #![proptest_config(config(384))]

    /// Any request to any route: no panic, no 5xx, errors in the one shape.
    #[test]
    fn fuzz_every_route_answers_in_shape(f in fuzzed()) {
        let uuid = "0190b5a4-7a3e-7000-8000-000000000000";
        let (method, mut path, template) = route_template(f.route, uuid);
        if let Some(seg) = &f.segment {
            path = path.replace(uuid, seg).replace("conv-a", seg);
        }
        if let Some(q) = &f.query {
            path = format!("{path}?{q}");
        }
        let body = match (&f.raw_body, &template) {
            (Some(raw), _) => raw.clone(),
            (None, Value::Null) => Vec::new(),
            (None, t) => apply(t, &f.edits).into_bytes(),
        };
        let mut headers = Vec::new();
        if let Some(ct) = f.content_type {
            headers.push(("content-type", ct.to_string()));
        }
        if let Some(s) = &f.session {
            headers.push(("baton-session", s.clone()));
        }
        let method = f.method.unwrap_or(method);
        let what = format!("{method} {path} as {:?} with {}", f.who, String::from_utf8_lossy(&body));
        if let Some(answer) = send(f.who, method, &path, &headers, body) {
            if method == "HEAD" {
                // A HEAD answer has no body by HTTP's rules; only its status can be held.
                prop_assert!(answer.status.as_u16() < 500, "{what}: {}", answer.status);
            } else {
                answer_is_sound(&what, &answer)?;
            }
        }
    }

    /// A message with any payload: accepted with its exact text kept (read back byte for byte),
    /// or refused as an invalid payload; its replay is a duplicate; the same key with one
    /// number written differently is a conflict, never a duplicate.
    #[test]
    fn fuzz_payloads_round_trip_and_numbers_never_merge(payload in json_text()) {
        let json = [("content-type", "application/json".to_string())];
        let key = fresh_key("rt");
        let body = |p: &str| format!(r#"{{"conversation":"conv-rt","idempotency_key":"{key}","payload":{p},"to":["{HOST}"]}}"#);
        let first = send(Who::Producer, "POST", "/v1/messages", &json, body(&payload).into_bytes()).expect("request");
        answer_is_sound("submit", &first)?;
        if first.status == StatusCode::BAD_REQUEST {
            // Only a payload without a canonical form (a repeated key, nesting over the bound)
            // is refused, and the refusal says so.
            let e: Value = serde_json::from_slice(&first.body).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&e["code"], "invalid_field");
            prop_assert!(e["message"].as_str().unwrap_or_default().starts_with("payload: "), "{e}");
            return Ok(());
        }
        prop_assert_eq!(first.status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&first.body));
        let accepted: Value = serde_json::from_slice(&first.body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let id = accepted["message_id"].as_str().unwrap_or_default().to_string();

        let read = send(Who::Producer, "GET", &format!("/v1/messages/{id}"), &[], Vec::new()).expect("request");
        prop_assert_eq!(read.status, StatusCode::OK);
        let text = String::from_utf8_lossy(&read.body).into_owned();
        prop_assert!(text.contains(&format!("\"payload\":{payload},")), "payload changed: sent {payload}, read {text}");
        let by_key = send(Who::Producer, "GET", &format!("/v1/messages?idempotency_key={key}"), &[], Vec::new()).expect("request");
        prop_assert_eq!(by_key.body, read.body);

        let again = send(Who::Producer, "POST", "/v1/messages", &json, body(&payload).into_bytes()).expect("request");
        prop_assert_eq!(again.status, StatusCode::OK);
        let replay: Value = serde_json::from_slice(&again.body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&replay["duplicate"], true);
        prop_assert_eq!(&replay["message_id"], &accepted["message_id"]);

        if let Some(changed) = change_one_number(&payload) {
            let other = send(Who::Producer, "POST", "/v1/messages", &json, body(&changed).into_bytes()).expect("request");
            answer_is_sound("changed", &other)?;
            prop_assert_eq!(other.status, StatusCode::CONFLICT, "{} vs {}: {}", payload, changed, String::from_utf8_lossy(&other.body));
        }
    }
}

/// JSON text with a few characters changed into JSON punctuation, digits or escapes: mostly
/// not JSON any more, and close to what the canonical parser must still get right.
fn damaged_json_text() -> impl Strategy<Value = String> {
    let c = prop::sample::select(vec![
        '{', '}', '[', ']', ',', ':', '"', '\\', ' ', '0', '1', 'e', 'E', '.', '+', '-', 'u', 'd', 'n', 't', '\u{0}',
        'é',
    ]);
    (json_text(), prop::collection::vec((any::<prop::sample::Index>(), c), 1..4)).prop_map(|(text, edits)| {
        let mut chars: Vec<char> = text.chars().collect();
        for (at, c) in edits {
            let i = at.index(chars.len());
            chars[i] = c;
        }
        chars.into_iter().collect()
    })
}

proptest! {
    #![proptest_config(config(1024))]

    /// The canonical form (what the idempotency hash reads) of any text: no panic; a form only
    /// for text that is one JSON value (as `serde_json`, which takes the request, agrees); the
    /// form is its own canonical form; and one number written otherwise changes it.
    #[test]
    fn fuzz_canonical_form_is_sound_and_keeps_numbers_apart(
        text in prop_oneof![2 => json_text(), 2 => damaged_json_text(), 1 => any::<String>()],
    ) {
        let Ok(form) = canonical(&text) else { return Ok(()) };
        prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok(), "canonical took {text:?}, serde_json did not");
        let again = canonical(&form);
        prop_assert_eq!(again.as_ref(), Ok(&form), "not a fixed point: {}", text);
        if let Some(changed) = change_one_number(&text) {
            prop_assert_ne!(canonical(&changed).ok(), Some(form), "{} and {} merged", text, changed);
        }
    }
}

/// The payload with its first number literal written otherwise (`12` → `12.0`, `1.5` →
/// `1.50`, `1e5` → `1e50`): a different text, so different content.
fn change_one_number(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut i = 0;
    let mut in_string = false;
    while i < b.len() {
        match b[i] {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'-' | b'0'..=b'9' if !in_string => {
                let end = (i..b.len())
                    .find(|&j| !matches!(b[j], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                    .unwrap_or(b.len());
                let literal = &text[i..end];
                let changed =
                    if literal.contains(['.', 'e', 'E']) { format!("{literal}0") } else { format!("{literal}.0") };
                return Some(format!("{}{changed}{}", &text[..i], &text[end..]));
            }
            _ => {}
        }
        i += 1;
    }
    None
}
