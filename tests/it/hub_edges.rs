//! The hub's edges under abuse, through the real binary: bounded connections (slowloris, one
//! certificate's idle connections, requests per connection, slow bodies), refusals logged once
//! per interval, revoked certificates' connections closed, and a long poll that outlasts every
//! connection timeout; a silent connection closed at the header timeout, 431 in our shape,
//! refused handshakes' reasons logged once per peer, and the open-file limit raised or a
//! `connections_max` that cannot fit refused.

use crate::harness::{Hub, raw_connector, raw_dial};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Short connection bounds, so that the tests see them act; the long-poll bound stays long.
const TIGHT: &str = "[limits]
header_read_timeout = \"1s\"
idle_timeout = \"2s\"
request_body_timeout = \"1s\"
requests_per_connection_max = 3
";

/// Longer than any bound in `TIGHT`; a client that is still served after it was not cut off.
const OUTLAST: Duration = Duration::from_secs(20);

/// A raw TLS connector presenting `name`'s certificate and trusting the hub CA (HTTP/1 only).
fn connector(hub: &Hub, name: &str) -> TlsConnector {
    connector_for(hub, name, b"http/1.1")
}

/// A raw TLS connector presenting `name`'s certificate, trusting the hub CA and offering only
/// the ALPN protocol `alpn`.
fn connector_for(hub: &Hub, name: &str, alpn: &[u8]) -> TlsConnector {
    raw_connector(hub, name, &hub.identity(name).ca, alpn)
}

/// Reads until the hub closes the connection (or `limit` passes: `None`); returns what it sent.
async fn read_to_close(conn: &mut TlsStream<TcpStream>, limit: Duration) -> Option<String> {
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    closed.ok().map(|()| String::from_utf8_lossy(&seen).into_owned())
}

/// A client that finishes the handshake and then trickles its headers is cut off
/// within the header timeout, however long it keeps trickling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_cut_off_within_the_header_timeout() {
    let hub = Hub::builder().config(TIGHT).start();
    let mut conn = raw_dial(&hub, &connector(&hub, "prod")).await.expect("handshake");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: hub\r\n").await.unwrap();
    let started = Instant::now();
    let mut cut = false;
    // One header byte every 200 ms, for at most OUTLAST.
    while started.elapsed() < OUTLAST {
        if conn.write_all(b"x").await.is_err() || conn.flush().await.is_err() {
            cut = true;
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = true;
                break;
            }
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    assert!(cut, "a client trickling its headers was still connected after {OUTLAST:?}");
}

/// The same over HTTP/2: a client that completes the preface and then trickles a HEADERS frame
/// that never ends has no request in progress, so the connection's wait bounds cut it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_slowloris_client_is_cut_off() {
    let hub = Hub::builder().config(TIGHT).start();
    let mut conn = raw_dial(&hub, &connector_for(&hub, "prod", b"h2")).await.expect("handshake");
    assert_eq!(conn.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "the hub must speak HTTP/2 for this test");
    // The preface, an empty SETTINGS frame, then a HEADERS frame on stream 1 that announces
    // 4,096 bytes of header block (END_HEADERS and END_STREAM set) and delivers them one a time.
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    conn.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
    conn.write_all(&[0, 0x10, 0, 0x1, 0x5, 0, 0, 0, 1]).await.unwrap();
    conn.flush().await.unwrap();
    let started = Instant::now();
    let mut cut = false;
    let mut sent = 0;
    while started.elapsed() < OUTLAST && sent < 4096 {
        if conn.write_all(&[0x82]).await.is_err() || conn.flush().await.is_err() {
            cut = true;
            break;
        }
        sent += 1;
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = true;
                break;
            }
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    assert!(cut, "an HTTP/2 client trickling a header block was still connected after {:?}", started.elapsed());
}

/// A body trickled slower than `limits.request_body_timeout` is answered 408 in our shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_answered_408() {
    let hub = Hub::builder().config(TIGHT).start();
    let mut conn = raw_dial(&hub, &connector(&hub, "prod")).await.expect("handshake");
    conn.write_all(
        b"POST /v1/messages HTTP/1.1\r\nhost: hub\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    let answer = tokio::spawn(async move { read_to_close(&mut conn, OUTLAST).await });
    let answer = answer.await.unwrap().expect("the hub kept a slow body's connection open");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"code\":\"request_timeout\"") && answer.contains("limits.request_body_timeout"),
        "{answer}"
    );
}

/// The connection that carried `requests_per_connection_max` requests is closed after the last
/// answer, even when more were pipelined behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_carries_at_most_its_requests() {
    let hub = Hub::builder().config(TIGHT).start();
    let mut conn = raw_dial(&hub, &connector(&hub, "prod")).await.expect("handshake");
    conn.write_all(&b"GET /healthz HTTP/1.1\r\nhost: hub\r\n\r\n".repeat(5)).await.unwrap();
    let seen = read_to_close(&mut conn, OUTLAST).await.expect("the connection stayed open");
    assert_eq!(seen.matches("HTTP/1.1 200").count(), 3, "{seen}");
}

/// A long poll outlasts the header and idle timeouts: they count only while the hub waits for
/// the client, never while a request is in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_is_not_cut_by_the_connection_timeouts() {
    let hub = Hub::builder().config(TIGHT).start();
    let prod = hub.client("prod");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    // Five seconds: longer than the header (1 s) and idle (2 s) timeouts.
    let r = prod.get(&format!("/v1/messages/{}?wait_ms=5000", s.message_id)).await;
    assert_eq!(r.ok(200)["message_id"], json!(s.message_id));
}

/// A connection idle past `limits.idle_timeout` is closed by the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed() {
    let hub = Hub::builder().config(TIGHT).start();
    let mut conn = raw_dial(&hub, &connector(&hub, "prod")).await.expect("handshake");
    assert!(read_to_close(&mut conn, OUTLAST).await.is_some(), "an idle connection stayed open for {OUTLAST:?}");
}

/// 1,000 idle connections from one certificate do not stop a second certificate's
/// requests; the connections refused past `limits.connections_per_cert_max` are summed up in
/// the log once per interval, not one line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_certificates_idle_connections_do_not_starve_another() {
    const FLOOD: usize = 1000;
    const PER_CERT: usize = 8;
    let hub = Hub::builder().config(&format!("[limits]\nconnections_per_cert_max = {PER_CERT}\n")).start();
    let tls = connector(&hub, "prod");
    let mut held = Vec::new();
    // Dialled in bounded batches; each handshake itself is bounded by the hub's timeout.
    for _ in 0..FLOOD / 50 {
        let batch: Vec<_> = (0..50).map(|_| raw_dial(&hub, &tls)).collect();
        for c in batch {
            if let Ok(c) = c.await {
                held.push(c);
            }
        }
    }
    let r = hub.client("prod-two").get("/healthz").await;
    r.ok(200);
    let s = hub.client("prod-two").submit_new("c", "while-flooded", &["host-a"]).await;
    hub.client("prod-two").get(&format!("/v1/messages/{}", s.message_id)).await.ok(200);
    // Of the held connections, at most PER_CERT are still served: the rest were closed.
    let mut open = 0;
    for c in &mut held {
        let mut buf = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(10), c.read(&mut buf)).await.is_err() {
            open += 1;
        }
    }
    assert!(open <= PER_CERT, "{open} connections of one certificate are open, over {PER_CERT}");
    let line = "connections refused at their limits";
    let deadline = Instant::now() + Duration::from_secs(40);
    while !hub.serve_logs().contains(line) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = hub.serve_logs();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains(line)).collect();
    assert!(!lines.is_empty(), "no refusal line in the log:\n{logs}");
    let refused: u64 = lines
        .iter()
        .filter_map(|l| l.split("at_connections_per_cert_max=").nth(1))
        .filter_map(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
        .sum();
    assert!(refused >= (FLOOD - PER_CERT) as u64 / 2, "the log counts {refused} refusals: {lines:?}");
    assert!(lines.len() <= 5, "{} refusal lines for one burst; one per interval was promised", lines.len());
    drop(held);
}

/// Revoking a certificate closes its open, idle connections (the CLI wakes the hub).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_certificate_closes_its_open_connections() {
    let hub = Hub::builder().config("[limits]\nidle_timeout = \"1h\"\nheader_read_timeout = \"5m\"\n").start();
    let tls = connector(&hub, "prod");
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(raw_dial(&hub, &tls).await.expect("handshake"));
    }
    hub.cli_ok(["revoke", "prod", "--reason", "stolen", "--yes"]);
    for c in &mut conns {
        assert!(read_to_close(c, OUTLAST).await.is_some(), "a revoked certificate's connection stayed open");
    }
}

/// A producer's long-poll read that began before its certificate was revoked answers
/// 401, not the outcomes written after the revocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waiting_when_its_certificate_is_revoked_answers_401() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    let path = format!("/v1/messages/{}?wait_ms=25000", s.message_id);
    let waiting = tokio::spawn(async move { prod.get(&path).await });
    // The read is waiting once nothing settled; give it a moment to start, then revoke and
    // write an outcome it would otherwise return.
    tokio::time::sleep(Duration::from_millis(500)).await;
    hub.cli_ok(["revoke", "prod", "--reason", "stolen", "--yes"]);
    hub.cli_ok(["deliveries", "cancel", s.to("host-a"), "--reason", "after the revocation"]);
    let r = waiting.await.unwrap();
    r.err(401, "certificate_revoked");
    assert!(!r.text.contains("after the revocation"), "{}", r.text);
}

/// `init` in a pre-existing 0755 directory leaves it 0700 and the keys and database
/// 0600 (SQLite's side files follow the database); a directory loosened afterwards stops
/// `serve`, naming the path and the fix.
#[test]
fn files_are_private_and_a_loose_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let mut hub = Hub::builder().nodes(&[]).producers(&[]).stopped().start();
    let data = hub.data_dir().to_path_buf();
    // The fixture's `init` made the directory; make it a loose, pre-existing one and start over.
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    hub.cli_ok(["init"]);
    assert_eq!(mode(&data), 0o700);
    for f in ["ca.key", "hub.key", "hub.db"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    hub.enroll_producer("prod");
    hub.serve(None);
    let wal = data.join("hub.db-wal");
    assert!(wal.exists(), "a serving hub has its WAL open");
    assert_eq!(mode(&wal), 0o600);
    hub.kill9();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = hub.cli(["serve", "--listen", "127.0.0.1:0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve ran on a 0755 data directory");
    assert!(err.contains(&format!("{} is mode 0755", data.display())) && err.contains("chmod 700"), "{err}");
}

/// axum's own refusals come out as `{code, message}` with a stable code, and no
/// message names a Rust type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_in_our_shape() {
    let hub = Hub::start();
    let tls = connector(&hub, "prod");
    let json = "application/json";
    let cases: &[(&str, &str, &str, &str, u16, &str)] = &[
        ("DELETE", "/v1/messages", "", "", 405, "method_not_allowed"),
        ("PUT", "/healthz", "", "", 405, "method_not_allowed"),
        ("GET", "/nowhere", "", "", 404, "not_found"),
        ("GET", "/v1/messages/%FF%FE", "", "", 400, "invalid_field"),
        ("GET", "/v1/messages?wait_ms=soon&idempotency_key=k", "", "", 400, "invalid_field"),
        ("POST", "/v1/messages", "text/plain", "{}", 400, "invalid_json"),
        ("POST", "/v1/messages", json, "[]", 400, "invalid_json"),
        ("POST", "/v1/messages", json, "\"x\"", 400, "invalid_json"),
    ];
    for (method, path, ctype, body, status, code) in cases {
        let mut conn = raw_dial(&hub, &tls).await.expect("handshake");
        let ctype = if ctype.is_empty() { String::new() } else { format!("content-type: {ctype}\r\n") };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: hub\r\nconnection: close\r\n{ctype}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(req.as_bytes()).await.unwrap();
        let answer = read_to_close(&mut conn, OUTLAST).await.expect("the hub kept the connection open");
        let (head, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{method} {path}: {answer}");
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{method} {path}: {answer}"));
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["code", "message"], "{method} {path}: {text}");
        assert_eq!(v["code"], json!(code), "{method} {path}: {text}");
        let message = v["message"].as_str().unwrap();
        for internal in ["struct ", "enum ", "Request", "Query", "axum", "serde"] {
            assert!(!message.contains(internal), "{method} {path} names {internal:?}: {message}");
        }
    }
}

/// A client that completes the TLS handshake and then sends nothing is closed at
/// `limits.header_read_timeout`, counted from the handshake, not kept to `limits.idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_request_is_closed_at_the_header_timeout() {
    let hub = Hub::builder().config("[limits]\nheader_read_timeout = \"1s\"\nidle_timeout = \"1h\"\n").start();
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let mut conn = raw_dial(&hub, &connector_for(&hub, "prod", alpn)).await.expect("handshake");
        let closed = read_to_close(&mut conn, OUTLAST).await;
        assert!(closed.is_some(), "{alpn:?}: a silent connection was still open after {OUTLAST:?}");
    }
    // A connection that does send its request in time is served.
    let mut conn = raw_dial(&hub, &connector(&hub, "prod")).await.expect("handshake");
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: hub\r\nconnection: close\r\n\r\n").await.unwrap();
    let answer = read_to_close(&mut conn, OUTLAST).await.expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A request head over the hub's bounds (too many header fields, too many bytes) is answered
/// 431 with the `{code, message}` body every error has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_431_answer_has_the_error_body() {
    let hub = Hub::start();
    let tls = connector(&hub, "prod");
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let large = format!("x-large: {}\r\n", "a".repeat(70 * 1024));
    for (what, headers) in [("150 header fields", many), ("70 KiB of header", large)] {
        let mut conn = raw_dial(&hub, &tls).await.expect("handshake");
        let req = format!("GET /healthz HTTP/1.1\r\nhost: hub\r\n{headers}\r\n");
        let _ = conn.write_all(req.as_bytes()).await;
        let answer = read_to_close(&mut conn, OUTLAST).await.expect("the hub kept the connection open");
        let (head, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(head.starts_with("HTTP/1.1 431"), "{what}: {answer}");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{what}: {head}");
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{what}: {answer}"));
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["code", "message"], "{what}: {text}");
        assert_eq!(v["code"], json!("headers_too_large"), "{what}: {text}");
    }
    // The hub goes on answering.
    hub.client("prod").get("/healthz").await.ok(200);
}

/// A refused handshake's reason reaches the log at warn, once per peer and reason however
/// often the peer retries: a certificate of another CA, and a client that does not trust the
/// hub's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_handshakes_are_logged_with_their_reason_once_per_peer() {
    let hub = Hub::start();
    let other = Hub::builder().producers(&["stranger"]).nodes(&[]).stopped().start();
    let foreign_cert = raw_connector(&other, "stranger", &hub.identity("prod").ca, b"http/1.1");
    let distrusting = raw_connector(&hub, "prod", &other.identity("stranger").ca, b"http/1.1");
    for _ in 0..5 {
        for tls in [&foreign_cert, &distrusting] {
            if let Ok(mut conn) = raw_dial(&hub, tls).await {
                // TLS 1.3: the client's certificate is refused after the client's handshake ends.
                let _ = read_to_close(&mut conn, OUTLAST).await;
            }
        }
    }
    let count = |needle: &str| {
        hub.serve_logs()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("TLS handshake refused") && l.contains(needle))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    // The reason as rustls names it: another CA of the same name fails on its signature.
    let (foreign, distrusted) = ("the client's certificate was refused", "the client refused the hub's certificate");
    while count(foreign) == 0 || count(distrusted) == 0 {
        assert!(Instant::now() < deadline, "both reasons are not in the hub's log:\n{}", hub.serve_logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let logs = hub.serve_logs();
    assert_eq!(count(foreign), 1, "one line for five refusals of a foreign certificate:\n{logs}");
    assert_eq!(count(distrusted), 1, "one line for five clients that distrust the hub:\n{logs}");
    assert!(logs.lines().any(|l| l.contains(foreign) && l.contains("peer=127.0.0.1")), "the peer is named:\n{logs}");
}

/// `baton-hub serve` under `limit` open files (soft; the hard limit `hard`), as `ulimit` sets.
fn serve_under_limit(hub: &Hub, soft: u64, hard: u64, extra: &[&str]) -> std::process::Command {
    let inner = hub.cli_command(["serve", "--listen", "127.0.0.1:0"].iter().chain(extra));
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg(format!("ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\""));
    cmd.arg(inner.get_program()).args(inner.get_args());
    cmd.env_clear();
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    cmd.stdin(std::process::Stdio::null());
    cmd
}

/// The hub raises its soft open-file limit to the hard one at start; when
/// `limits.connections_max` and its own files cannot fit even so, it refuses to start, naming
/// both and the fix, rather than running into "Too many open files" with clients waiting.
#[test]
fn the_open_file_limit_is_raised_or_a_connections_max_that_cannot_fit_is_refused() {
    let hub = Hub::builder().stopped().start();
    // 256 soft and hard: 1024 connections cannot fit.
    let out = crate::harness::output_within(serve_under_limit(&hub, 256, 256, &[]), Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for words in ["limits.connections_max = 1024", "open-file limit of 256", "ulimit -n", "LimitNOFILE"] {
        assert!(err.contains(words), "{words}: {err}");
    }
    // 256 soft under a 4096 hard limit: raised, so the default bound fits.
    let mut child = serve_under_limit(&hub, 256, 4096, &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let limits = format!("/proc/{}/limits", child.id());
    let addr = hub.data_dir().join("hub.addr");
    let soft = crate::node_harness::wait_for("the hub to listen", Duration::from_secs(60), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("serve exited ({status})");
        }
        addr.exists().then_some(())?;
        let text = std::fs::read_to_string(&limits).ok()?;
        let line = text.lines().find(|l| l.starts_with("Max open files"))?.to_string();
        Some(line.split_whitespace().nth(3)?.to_string())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(soft, "4096", "the soft limit was raised to the hard one");
}
