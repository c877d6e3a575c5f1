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
    let early = hub.cli(["ca", "retire-old"]);
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

    // Retired: the old CA's node is refused, the new one goes on.
    let out = hub.cli_ok(["ca", "retire-old"]);
    assert!(out.contains("retired 1 old CA"), "{out}");
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
    let nothing = hub.cli(["ca", "retire-old"]);
    assert_eq!(nothing.status.code(), Some(1), "nothing left to retire: {nothing:?}");
    drop((old_node, new_node));
}
