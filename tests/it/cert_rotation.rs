//! Rotating the hub's certificates while it runs: `renew --server` (and SIGHUP) replace the
//! server certificate for new connections while open ones and a real node go on; a reload
//! that fails keeps the certificate served; `status` flags a server certificate near its end.

use crate::harness::{EVENT_WAIT, Hub, raw_connector, raw_dial};
use crate::node_harness::wait_for;
use baton_shared::pki;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A raw TLS connector presenting `name`'s certificate and trusting `ca_file` (HTTP/1 only).
fn connector(hub: &Hub, name: &str, ca_file: &Path) -> TlsConnector {
    raw_connector(hub, name, ca_file, b"http/1.1")
}

/// The serial of the certificate the hub presented on `conn`.
fn peer_serial(conn: &TlsStream<TcpStream>) -> String {
    let certs = conn.get_ref().1.peer_certificates().expect("the hub presented a certificate");
    pki::der_facts(&certs[0]).unwrap().0
}

/// The serial of the server certificate in the data directory.
fn file_serial(hub: &Hub) -> String {
    pki::cert_facts(&std::fs::read_to_string(hub.data_dir().join("hub.crt")).unwrap()).unwrap().0
}

/// Sends one keep-alive HTTP/1.1 request on `conn` and reads its whole answer; returns the
/// status line.
async fn request(conn: &mut TlsStream<TcpStream>, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: hub\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(EVENT_WAIT, async {
        loop {
            let n = conn.read(&mut buf).await.expect("read the answer");
            assert!(n > 0, "the hub closed the connection: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen).into_owned();
            let Some(end) = text.find("\r\n\r\n") else { continue };
            let length: usize = text[..end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
                .expect("a content-length");
            if seen.len() >= end + 4 + length {
                return text.lines().next().unwrap_or_default().to_string();
            }
        }
    })
    .await;
    answer.expect("an answer within EVENT_WAIT")
}

/// `renew --server` under a running hub and node: the certificate and key are replaced (the
/// old ones kept aside, the names the same), a connection opened before goes on with the old
/// certificate, a new one gets the new serial, and the node goes on delivering. A SIGHUP with
/// a broken certificate file keeps the one served and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_certificate_rotates_under_running_connections_and_nodes() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").start();
    let first = hub.send_one("c", "before", "host-a");
    hub.wait_outcome(&first);

    let ca = hub.identity("prod").ca.clone();
    let tls = connector(&hub, "prod", &ca);
    let old = file_serial(&hub);
    let old_pem = std::fs::read_to_string(hub.data_dir().join("hub.crt")).unwrap();
    let mut kept = raw_dial(&hub, &tls).await.unwrap();
    assert_eq!(peer_serial(&kept), old);
    assert!(request(&mut kept, "/v1/messages/none").await.starts_with("HTTP/1.1 "));

    let out = hub.cli_ok(["renew", "--server"]);
    let new = file_serial(&hub);
    assert_ne!(new, old, "a new serial");
    assert!(out.contains(&new) && out.contains("serves it to new connections"), "{out}");
    let new_pem = std::fs::read_to_string(hub.data_dir().join("hub.crt")).unwrap();
    assert_eq!(pki::server_names(&new_pem).unwrap(), pki::server_names(&old_pem).unwrap(), "the same names");
    let aside: Vec<String> = std::fs::read_dir(hub.data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".replaced-"))
        .collect();
    assert_eq!(aside.len(), 2, "hub.crt and hub.key kept aside: {aside:?}");
    let kept_crt = aside.iter().find(|n| n.starts_with("hub.crt.")).expect("the old certificate kept");
    assert_eq!(std::fs::read_to_string(hub.data_dir().join(kept_crt)).unwrap(), old_pem);
    {
        use std::os::unix::fs::PermissionsExt;
        for key in ["hub.key".to_string(), aside.iter().find(|n| n.starts_with("hub.key.")).unwrap().clone()] {
            let mode = std::fs::metadata(hub.data_dir().join(&key)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{key}");
        }
    }
    wait_for("the hub's reload log line", EVENT_WAIT, || {
        let logs = hub.serve_stderr();
        logs.lines().any(|l| l.contains("server certificate replaced") && l.contains(&new)).then_some(())
    });

    assert!(request(&mut kept, "/v1/messages/none").await.starts_with("HTTP/1.1 "), "the open connection goes on");
    assert_eq!(peer_serial(&kept), old);
    // A new connector: the first one would resume its TLS session, which presents no certificate.
    let fresh = raw_dial(&hub, &connector(&hub, "prod", &ca)).await.unwrap();
    assert_eq!(peer_serial(&fresh), new, "a new connection gets the new certificate");
    let second = hub.send_one("c", "after", "host-a");
    hub.wait_outcome(&second);
    assert!(node.is_running(), "the node was not restarted");

    // A broken file and a SIGHUP: refused, logged, and the certificate served stays.
    std::fs::write(hub.data_dir().join("hub.crt"), "not a certificate\n").unwrap();
    hub.kit_mut().proc().signal(baton_testkit::Signal::SIGHUP).unwrap();
    wait_for("the failed reload logged", EVENT_WAIT, || {
        hub.serve_stderr()
            .lines()
            .any(|l| l.contains("server certificate not reloaded") && l.contains("SIGHUP"))
            .then_some(())
    });
    assert_eq!(peer_serial(&raw_dial(&hub, &connector(&hub, "prod", &ca)).await.unwrap()), new);
    assert!(hub.is_running());
    std::fs::write(hub.data_dir().join("hub.crt"), &new_pem).unwrap();
}

/// `status` flags the hub's own certificate when it ends within 30 days; a renewal for the
/// full term clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_flags_a_server_certificate_near_its_end() {
    let hub = Hub::with_nodes(&["host-a"]);
    let flagged = |hub: &Hub| {
        let out = hub.cli(["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let hit = v["attention"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["kind"] == "certificate_expiring" && a["subject"] == "hub server certificate");
        (out.status.code(), hit)
    };
    assert_eq!(flagged(&hub), (Some(0), false));
    hub.cli_ok(["renew", "--server", "--days", "10"]);
    assert_eq!(flagged(&hub), (Some(1), true));
    hub.cli_ok(["renew", "--server"]);
    assert_eq!(flagged(&hub), (Some(0), false));
}

/// A CA rotation with an overlap: after `ca rotate` and the bundle handed to the nodes, a node
/// whose certificate is the old CA's and one whose certificate is the new CA's both deliver
/// (the server certificate renewed under the new CA); `ca retire-old` is refused while the
/// server certificate is the old CA's; once it ran, the old-CA node is refused and the new one
/// keeps delivering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_trusts_both_cas_until_the_old_one_is_retired() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let old_node = hub.node_process("host-a").start();
    let first = hub.send_one("c", "before", "host-a");
    hub.wait_outcome(&first);

    let out = hub.cli_ok(["ca", "rotate"]);
    assert!(out.contains("issues from now on"), "{out}");
    let bundle = hub.ca_pem();
    assert_eq!(pki::pem_certs(&bundle).unwrap().len(), 2, "ca.crt holds the new and the old CA");
    let again = hub.cli(["ca", "rotate"]);
    assert_eq!(again.status.code(), Some(2), "one rotation at a time: {again:?}");
    let early = hub.cli(["ca", "retire-old", "--reason", "rotation done"]);
    assert_eq!(early.status.code(), Some(3), "the server certificate is still the old CA's: {early:?}");
    assert!(String::from_utf8_lossy(&early.stderr).contains("renew --server"), "{early:?}");

    // Distribute the bundle: the old node trusts both CAs from its next connection.
    std::fs::write(&hub.identity("host-a").ca, &bundle).unwrap();
    old_node.signal_only(baton_testkit::Signal::SIGHUP);
    old_node.wait_log("SIGHUP: read ca_file");
    hub.cli_ok(["renew", "--server"]);
    hub.enroll_node("host-b");
    let new_node = hub.node_process("host-b").start();
    let cert = |name: &str| std::fs::read_to_string(&hub.identity(name).cert).unwrap();
    assert_eq!(pki::issuer_of(&cert("host-a"), &bundle).unwrap(), Some(1), "host-a is the old CA's");
    assert_eq!(pki::issuer_of(&cert("host-b"), &bundle).unwrap(), Some(0), "host-b is the new CA's");
    let server = std::fs::read_to_string(hub.data_dir().join("hub.crt")).unwrap();
    assert_eq!(pki::issuer_of(&server, &bundle).unwrap(), Some(0), "the server certificate is the new CA's");

    // `certs list` tells which CA issued each certificate.
    let certs = hub.cli_json(["certs", "list", "--json"]);
    let ca_of = |v: &serde_json::Value, name: &str| {
        v.as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()["ca"].clone()
    };
    let (ca_a, ca_b) = (ca_of(&certs, "host-a"), ca_of(&certs, "host-b"));
    assert_ne!(ca_a["key_id"], ca_b["key_id"], "{certs}");
    assert_eq!((ca_a["trusted"].as_bool(), ca_b["trusted"].as_bool()), (Some(true), Some(true)), "{certs}");

    // The overlap: both deliver.
    let (a, b) = (hub.send_one("c", "overlap-a", "host-a"), hub.send_one("d", "overlap-b", "host-b"));
    hub.wait_outcome(&a);
    hub.wait_outcome(&b);

    // Retired: refused while host-a and prod hold only old-CA certificates; forced, the old
    // CA's node is refused, the new one goes on.
    let refused = hub.cli(["ca", "retire-old", "--reason", "rotation done"]);
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(said.contains("node host-a:") && said.contains("producer prod:"), "{said}");
    assert!(!said.contains("host-b"), "host-b holds a certificate of the issuing CA: {said}");
    let out = hub.cli_ok(["ca", "retire-old", "--reason", "rotation done", "--force", "--yes"]);
    assert!(out.contains("retired 1 old CA"), "{out}");
    assert!(out.contains("cut off: node host-a:") && out.contains("cut off: producer prod:"), "{out}");
    assert_eq!(pki::pem_certs(&hub.ca_pem()).unwrap().len(), 1);
    let refused = hub.client("host-a").try_get("/v1/holdings").await;
    assert!(refused.is_err(), "an old-CA certificate is refused: {:?}", refused.map(|r| r.status));
    let after_a = hub.send_one("c", "after-a", "host-a");
    let after_b = hub.send_one("d", "after-b", "host-b");
    hub.wait_outcome(&after_b);
    assert!(hub.delivery(&after_a)["outcome"].is_null(), "the old-CA node ran nothing after the retirement");
    assert_eq!(hub.exec_log().runs_of(&after_a), 0);
    let certs = hub.cli_json(["certs", "list", "--json"]);
    assert_eq!(ca_of(&certs, "host-a")["trusted"], false, "{certs}");
    assert_eq!(ca_of(&certs, "host-b")["trusted"], true, "{certs}");
    assert!(hub.cli_ok(["certs", "list"]).contains("(retired)"));
    let nothing = hub.cli(["ca", "retire-old", "--reason", "rotation done"]);
    assert_eq!(nothing.status.code(), Some(1), "nothing left to retire: {nothing:?}");
    drop((old_node, new_node));
}

/// Long polls of certificates of the old CA that began before `ca retire-old` (a node's claim,
/// a producer's read of a message) answer 401 when the CA is retired, never the work or the
/// outcome that comes after: as a revocation does, the retirement reaches requests in
/// progress, not only new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_of_an_old_ca_certificate_answer_401_once_it_is_retired() {
    let hub = Hub::start();
    hub.cli_ok(["ca", "rotate"]);
    // The clients trust both CAs, so they reach the hub under its renewed certificate.
    let bundle = hub.ca_pem();
    for name in ["host-a", "prod"] {
        std::fs::write(&hub.identity(name).ca, &bundle).unwrap();
    }
    hub.cli_ok(["renew", "--server"]);
    let prod = hub.client("prod");
    let node = hub.node("host-a", "instance-1");
    // A message for host-b, which nobody claims: the read waits for its outcome.
    let s = prod.submit_new("c", "k", &["host-b"]).await;
    let path = format!("/v1/messages/{}?wait_ms=25000", s.message_id);
    let read = tokio::spawn(async move { prod.get(&path).await });
    let claim = tokio::spawn(async move { node.claim_raw(1, 25000).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!read.is_finished() && !claim.is_finished(), "both are waiting");

    let out = hub.cli_ok(["ca", "retire-old", "--reason", "rotation done", "--force", "--yes"]);
    assert!(out.contains("retired 1 old CA"), "{out}");
    // What would end both waits with data: an outcome for the read, work for the claim.
    hub.cli_ok(["deliveries", "cancel", s.to("host-b"), "--reason", "after the retirement"]);
    let work = hub.send_one("d", "after-retirement", "host-a");

    let claimed = tokio::time::timeout(EVENT_WAIT, claim).await.expect("the claim answers").unwrap();
    let message = claimed.err(401, "unknown_certificate");
    assert!(message.contains("no longer trusts"), "{message}");
    assert!(!claimed.text.contains(&work), "{}", claimed.text);
    let r = tokio::time::timeout(EVENT_WAIT, read).await.expect("the read answers").unwrap();
    let message = r.err(401, "unknown_certificate");
    assert!(message.contains("no longer trusts"), "{message}");
    assert!(!r.text.contains("after the retirement"), "{}", r.text);
    assert_eq!(hub.state(&work), "queued", "nothing was handed to the old CA's certificate");
}

/// `ca retire-old` is refused (exit 2) while a node or producer holds an unexpired, unrevoked
/// certificate of the old CA and none of the issuing one, naming each; `--dry-run` says the
/// same and changes nothing. A name renewed under the new CA, or revoked, no longer counts;
/// `--force` retires anyway, naming who is cut off, in the audit log too.
#[test]
fn retiring_the_old_ca_is_refused_while_it_would_cut_off_nodes_or_producers() {
    let hub = Hub::start();
    hub.cli_ok(["ca", "rotate"]);
    hub.cli_ok(["renew", "--server"]);
    let cas = |hub: &Hub| pki::pem_certs(&hub.ca_pem()).unwrap().len();
    let refusal = |args: &[&str]| {
        let out = hub.cli(args);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}{}", String::from_utf8_lossy(&out.stdout));
        said
    };
    for args in [
        &["ca", "retire-old", "--reason", "rotation done"][..],
        &["ca", "retire-old", "--reason", "rotation done", "--dry-run"],
    ] {
        let said = refusal(args);
        for who in ["node host-a:", "node host-b:", "producer prod:", "producer prod-two:"] {
            assert!(said.contains(who), "{who} not named: {said}");
        }
        assert!(said.contains("4 name(s)") && said.contains("--force"), "{said}");
        assert_eq!(cas(&hub), 2, "nothing retired");
    }

    let renewed = hub.scratch("renewed");
    let dir = renewed.display().to_string();
    hub.cli_ok(["renew", "host-a", "--out", &dir]);
    hub.cli_ok(["renew", "prod-two", "--out", &dir]);
    hub.cli_ok(["revoke", "host-b", "--reason", "decommissioned", "--yes"]);
    let said = refusal(&["ca", "retire-old", "--reason", "rotation done"]);
    assert!(said.contains("1 name(s)") && said.contains("producer prod:"), "{said}");
    for gone in ["host-a", "host-b", "prod-two"] {
        assert!(!said.contains(gone), "{gone} is named: {said}");
    }

    let dry = hub.cli_ok(["ca", "retire-old", "--reason", "rotation done", "--dry-run", "--force"]);
    assert!(dry.contains("would retire 1 old CA") && dry.contains("would be cut off: producer prod:"), "{dry}");
    assert_eq!(cas(&hub), 2, "a dry run changes nothing");
    let said = refusal(&["ca", "retire-old", "--force", "--yes"]);
    assert!(said.contains("--reason"), "a reason is required: {said}");
    // Without --yes, and no terminal to ask: refused (2), saying what it would do.
    let said = refusal(&["ca", "retire-old", "--reason", "rotation done", "--force"]);
    assert!(said.contains("would retire 1 old CA") && said.contains("--yes"), "{said}");
    assert_eq!(cas(&hub), 2, "a refused retirement changes nothing");
    let out = hub.cli_ok(["ca", "retire-old", "--reason", "rotation done", "--force", "--yes"]);
    assert!(out.contains("retired 1 old CA") && out.contains("cut off: producer prod:"), "{out}");
    assert_eq!(cas(&hub), 1);
    let audit = hub.cli_ok(["audit"]);
    assert!(audit.contains("forced, cutting off producer prod"), "{audit}");
    assert!(audit.contains("rotation done"), "the reason is recorded: {audit}");
}
