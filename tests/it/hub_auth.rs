//! Identity and transport (SPEC §7): client certificates are required and checked against the
//! hub's CA and record; roles are enforced; revocation takes effect at once and across restarts.
//! Each refusal test also makes one request that must succeed, so a hub that refused everything
//! would fail it.

use crate::harness::{Api, Claimed, Hub, random_id, submit_body};
use baton_shared::ids::Role;
use baton_shared::pki::{self, LeafKind};
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Issues a client certificate for `role`/`name` from the given CA; returns cert+key PEM.
fn issue(ca_cert: &str, ca_key: &str, role: Role, name: &str) -> Vec<u8> {
    let leaf = pki::issue(
        ca_cert,
        ca_key,
        &LeafKind::Client { role, name: name.into(), lifetime: Duration::from_secs(24 * 3600) },
    )
    .expect("issue");
    format!("{}\n{}", leaf.cert_pem, leaf.key_pem).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_client_certificate_gets_no_answer() {
    let hub = Hub::start();
    hub.client("prod").get("/healthz").await.ok(200);
    let anon = hub.anonymous_client();
    let r = anon.try_get("/healthz").await;
    assert!(r.is_err(), "a client without a certificate got an HTTP answer: {:?}", r.map(|r| r.status));
    let r = anon.try_post("/v1/messages", &submit_body("c", "k", json!(1), &["host-a"])).await;
    assert!(r.is_err(), "a submit without a certificate got an answer: {:?}", r.map(|r| (r.status, r.text)));
    assert!(hub.deliveries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_a_foreign_ca_is_refused() {
    let hub = Hub::start();
    let foreign = pki::create_ca("not the hub").expect("ca");
    // Same role and name as an enrolled producer: only the issuer differs.
    let pem = issue(&foreign.cert_pem, &foreign.key_pem, Role::Producer, "prod");
    let r = hub.client_with_pem(&pem).try_post("/v1/messages", &submit_body("c", "k", json!(1), &["host-a"])).await;
    assert!(r.is_err(), "a foreign certificate got an HTTP answer: {:?}", r.map(|r| (r.status, r.text)));
    let pem = issue(&foreign.cert_pem, &foreign.key_pem, Role::Node, "host-a");
    let r = hub.client_with_pem(&pem).try_get("/v1/holdings?instance_id=i").await;
    assert!(r.is_err(), "a foreign node certificate got an HTTP answer");
    assert!(hub.deliveries().is_empty());
    hub.client("prod").submit_new("c", "k", &["host-a"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_gets_no_http_answer() {
    let hub = Hub::start();
    // Through an HTTP client ...
    let plain = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let r = plain.get(format!("http://{}/healthz", hub.addr())).send().await;
    assert!(r.is_err(), "plain HTTP got an answer: {:?}", r.map(|r| r.status()));
    // ... and byte for byte: whatever comes back is not an HTTP response.
    let mut tcp = tokio::net::TcpStream::connect(hub.addr()).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), tcp.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the hub neither answered nor closed the plaintext connection");
    assert!(!buf.starts_with(b"HTTP/"), "plaintext got an HTTP answer: {:?}", String::from_utf8_lossy(&buf));
    hub.client("prod").get("/healthz").await.ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_is_refused_on_the_other_roles_endpoints() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.client("host-a");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    let id = random_id();
    let holder = json!({"instance_id": "i", "claim_token": "t"});

    // A producer on node endpoints.
    for (method, path, body) in [
        ("POST", "/v1/claims".to_string(), json!({"instance_id": "i", "max": 1, "wait_ms": 0})),
        ("GET", "/v1/holdings?instance_id=i".to_string(), json!(null)),
        ("POST", format!("/v1/deliveries/{id}/mirrored"), holder.clone()),
        ("POST", format!("/v1/deliveries/{id}/ack"), holder.clone()),
        ("POST", format!("/v1/deliveries/{id}/reject"), json!({"instance_id": "i", "claim_token": "t", "reason": "r"})),
        (
            "POST",
            "/delivery-report".to_string(),
            json!({"delivery_id": id, "instance_id": "i", "claim_token": "t", "report_id": "r", "outcome": "succeeded"}),
        ),
    ] {
        let r = if method == "GET" { prod.get(&path).await } else { prod.post(&path, &body).await };
        let msg = r.err(403, "wrong_role");
        assert!(msg.contains("producer"), "{path}: {msg}");
    }
    // A node on producer endpoints.
    for (method, path) in [
        ("POST", "/v1/messages".to_string()),
        ("GET", format!("/v1/messages/{}", s.message_id)),
        ("GET", "/v1/messages?idempotency_key=k".to_string()),
    ] {
        let r = if method == "GET" {
            node.get(&path).await
        } else {
            node.post(&path, &submit_body("c", "k2", json!(1), &["host-a"])).await
        };
        let msg = r.err(403, "wrong_role");
        assert!(msg.contains("node"), "{path}: {msg}");
    }
    // Health endpoints take any verified certificate.
    prod.get("/healthz").await.ok(200);
    node.get("/readyz").await.ok(200);
    assert_eq!(hub.deliveries().len(), 1, "the node's submit added nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_takes_effect_at_once_and_after_a_restart() {
    let mut hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    prod.submit_new("c", "k1", &["host-a"]).await;
    assert_eq!(node.claim(1, 0).await.len(), 1);

    let out = hub.cli_ok(["revoke", "prod", "--reason", "laptop stolen", "--yes"]);
    assert!(out.contains("revoked 1"), "{out}");
    hub.cli_ok(["revoke", "host-a", "--reason", "host compromised", "--yes"]);
    // No restart. The hub closes the revoked certificates' open connections (`hub_edges`), so
    // the next requests come on new connections, which are refused.
    let (prod, node) = (hub.client("prod"), hub.node("host-a", "inst-1"));
    prod.submit("c", "k2", json!(1), &["host-a"]).await.err(401, "certificate_revoked");
    node.claim_raw(1, 0).await.err(401, "certificate_revoked");
    node.api.get("/v1/holdings?instance_id=inst-1").await.err(401, "certificate_revoked");
    // Others are unaffected.
    hub.client("prod-two").submit_new("c", "k3", &["host-b"]).await;

    hub.kill9();
    hub.serve(None);
    // The first request after the restart is refused.
    hub.client("prod").get("/v1/messages?idempotency_key=k1").await.err(401, "certificate_revoked");
    hub.node("host-a", "inst-1").claim_raw(1, 0).await.err(401, "certificate_revoked");
    hub.client("prod-two").get("/v1/messages?idempotency_key=k3").await.ok(200);
    assert_eq!(hub.deliveries().len(), 2, "the revoked producer's submit added nothing");

    // A revoked name is renewed only on purpose (`--force`, `ops_identity`); the renewed
    // certificate works again; revoking an unknown name is not found (exit 1).
    let renewed = hub.scratch("renewed");
    let renew = [std::ffi::OsStr::new("renew"), "prod".as_ref(), "--out".as_ref(), renewed.as_os_str()];
    assert_eq!(hub.cli(renew).status.code(), Some(2), "prod was revoked");
    hub.cli_ok(renew.into_iter().chain([std::ffi::OsStr::new("--force")]));
    let pem = [
        std::fs::read(renewed.join("prod.crt")).unwrap(),
        b"\n".to_vec(),
        std::fs::read(renewed.join("prod.key")).unwrap(),
    ]
    .concat();
    hub.client_with_pem(&pem).get("/v1/messages?idempotency_key=k1").await.ok(200);
    assert_eq!(hub.cli(["revoke", "nobody", "--reason", "typo", "--yes"]).status.code(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_signed_certificate_that_was_never_recorded_is_unknown() {
    let hub = Hub::start();
    // Signed with the hub's own CA key, but not through `enroll`, so not in the record.
    for (role, name) in [(Role::Producer, "prod"), (Role::Producer, "ghost"), (Role::Node, "host-a")] {
        let pem = issue(&hub.ca_pem(), &hub.ca_key_pem(), role, name);
        let api: Api = hub.client_with_pem(&pem);
        let r = match role {
            Role::Producer => api.post("/v1/messages", &submit_body("c", "k", json!(1), &["host-a"])).await,
            Role::Node => api.post("/v1/claims", &json!({"instance_id": "i", "max": 1, "wait_ms": 0})).await,
        };
        r.err(401, "unknown_certificate");
    }
    assert!(hub.deliveries().is_empty());
    hub.client("prod").submit_new("c", "k", &["host-a"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waiting_when_its_certificate_is_revoked_is_handed_nothing() {
    // SPEC §6: before a claim releases a delivery the hub re-checks that the host is still
    // authorized, its certificate not revoked. A long-poll that began before the revocation
    // must not hand out work that arrives after it.
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    assert!(node.claim(1, 0).await.is_empty(), "the certificate works before the revocation");
    let n = node.clone();
    let poll = tokio::spawn(async move { n.claim_raw(10, crate::harness::LONG_WAIT_MS).await });
    tokio::time::sleep(crate::harness::SETTLE).await;
    hub.cli_ok(["revoke", "host-a", "--reason", "compromised", "--yes"]);
    let s = hub.client("prod").submit_new("c", "after-revoke", &["host-a"]).await;
    let r = poll.await.expect("claim task");
    let handed = if r.status == 200 { Claimed::list(&r.body).len() } else { 0 };
    assert_eq!(handed, 0, "a revoked certificate was handed work: {}", r.text);
    assert_ne!(hub.state(s.to("host-a")), "claimed", "the delivery was claimed for a revoked certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_completes_a_handshake_is_dropped() {
    let hub = Hub::builder().config("[limits]\nhandshake_timeout = \"1s\"\n").start();
    let mut tcp = tokio::net::TcpStream::connect(hub.addr()).await.expect("connect");
    let mut buf = Vec::new();
    // The hub closes it after limits.handshake_timeout; we wait far longer before giving up.
    let read = tokio::time::timeout(crate::harness::EVENT_WAIT, tcp.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "a silent connection was kept open past the handshake timeout");
    assert!(buf.is_empty() || !buf.starts_with(b"HTTP/"));
    hub.client("prod").get("/healthz").await.ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused_even_when_recorded() {
    if crate::harness::skipped_on_postgres("an_expired_certificate_is_refused_even_when_recorded") {
        return;
    }
    let hub = Hub::start();
    // `enroll` issues at least a day, so issue a short-lived one directly and record it the way
    // `enroll` does; only its expiry can then refuse it.
    let leaf = pki::issue(
        &hub.ca_pem(),
        &hub.ca_key_pem(),
        &LeafKind::Client { role: Role::Producer, name: "prod".into(), lifetime: Duration::from_secs(0) },
    )
    .expect("issue");
    let db = rusqlite::Connection::open(hub.data_dir().join("hub.db")).expect("open hub.db");
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute(
        "INSERT INTO certificates (serial, role, name, issued_at, not_after) VALUES (?1, 'producer', 'prod', 0, ?2)",
        rusqlite::params![leaf.serial, leaf.not_after_unix],
    )
    .expect("record the certificate");
    drop(db);
    // Wait for the clock to pass its not_after (certificate times have one-second resolution).
    let expired = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(leaf.not_after_unix).unwrap() + 1);
    while std::time::SystemTime::now() <= expired {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pem = format!("{}\n{}", leaf.cert_pem, leaf.key_pem).into_bytes();
    let r = hub.client_with_pem(&pem).try_post("/v1/messages", &submit_body("c", "k", json!(1), &["host-a"])).await;
    assert!(
        r.as_ref().is_err() || r.as_ref().is_ok_and(|r| r.status == 401),
        "an expired certificate was served: {:?}",
        r.map(|r| (r.status, r.text))
    );
    assert!(hub.deliveries().is_empty());
    hub.client("prod").submit_new("c", "k", &["host-a"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_server_certificate_is_not_a_client_identity() {
    let hub = Hub::start();
    let pem = [
        std::fs::read(hub.data_dir().join("hub.crt")).unwrap(),
        b"\n".to_vec(),
        std::fs::read(hub.data_dir().join("hub.key")).unwrap(),
    ]
    .concat();
    let r = hub.client_with_pem(&pem).try_get("/healthz").await;
    assert!(
        r.as_ref().is_err() || r.as_ref().is_ok_and(|r| r.status == 401),
        "the server certificate was accepted as a client: {:?}",
        r.map(|r| (r.status, r.text))
    );
}
