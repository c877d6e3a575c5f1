//! The node's batched handoff with real processes: a claim batch reaches the hub as one
//! handoff request (or one `mirrored` and one `ack`, with `handoff = "separate"`) and reports leave the outbox in batch requests, counted
//! from the node's own request log (`baton_node::requests` at debug level: one line per request,
//! with its route and item count), never timed.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};

/// The log filter that makes the node write one line per hub request.
const REQUEST_LOG: &str = "info,baton_node::requests=debug";

/// The requests of `route` in `log`, each with its item count.
fn requests(log: &str, route: &str) -> Vec<u64> {
    let quoted = format!("route=\"{route}\" ");
    let plain = format!("route={route} ");
    log.lines()
        .filter(|l| l.contains("hub request") && (l.contains(&quoted) || l.contains(&plain)))
        .map(|l| {
            let items = l.split("items=").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next());
            items.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no item count in {l:?}"))
        })
        .collect()
}

/// 60 deliveries queued for one host before its node starts (with `handoff` as given, or the
/// default): every turn runs and is reported once, with no single handoff or report request;
/// returns the node's log.
fn flow_of_sixty(handoff: Option<&str>) -> String {
    let hub = Hub::with_nodes(&["host-a"]);
    let producer = hub.client("prod");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for i in 0..MESSAGES {
        let m = rt.block_on(producer.submit_new(&format!("conv-{}", i % 4), &format!("k{i}"), &["host-a"]));
        assert_eq!(m.deliveries.len(), 1);
    }
    wait_for("every delivery fanned out", NODE_WAIT, || (hub.deliveries().len() == MESSAGES).then_some(()));
    let mut node = hub.node_process("host-a").set("claim_batch_max", "32").env("BATON_LOG", REQUEST_LOG);
    if let Some(handoff) = handoff {
        node = node.set("handoff", &format!("\"{handoff}\""));
    }
    let node = node.start();
    let all = wait_for("every delivery to have an outcome", NODE_WAIT, || {
        let list = hub.deliveries();
        list.iter().all(|d| !d["outcome"].is_null()).then_some(list)
    });
    assert_eq!(all.len(), MESSAGES);
    for d in &all {
        hub.assert_one_attempt(d["delivery_id"].as_str().expect("delivery_id"), "succeeded");
    }
    let log = node.logs();
    for single in ["mirrored", "ack", "report"] {
        assert_eq!(requests(&log, single), Vec::<u64>::new(), "no single {single} request to a hub with batches");
    }
    let reports = requests(&log, "batch/reports");
    assert!(reports.iter().sum::<u64>() >= MESSAGES as u64, "every report sent: {reports:?}");
    log
}

/// How many deliveries `flow_of_sixty` queues.
const MESSAGES: usize = 60;

/// By default a claim batch is handed off in one request (`mirrored` and `ack` together), and
/// the hub gets far fewer handoff and report requests than the three per delivery single
/// requests would take.
#[test]
fn many_deliveries_flow_with_few_requests() {
    let log = flow_of_sixty(None);
    for apart in ["batch/mirrored", "batch/ack"] {
        assert_eq!(requests(&log, apart), Vec::<u64>::new(), "no {apart} request: the handoff is one");
    }
    let handoffs = requests(&log, "batch/handoff");
    assert_eq!(handoffs.iter().sum::<u64>(), MESSAGES as u64, "each delivery handed off once: {handoffs:?}");
    assert!(handoffs.len() <= 4, "one request per claim batch: {handoffs:?}");
    let requests_made = handoffs.len() + requests(&log, "batch/reports").len();
    assert!(
        requests_made < MESSAGES,
        "{requests_made} handoff and report requests for {MESSAGES} deliveries (single requests take {})",
        3 * MESSAGES
    );
}

/// With `handoff = "separate"` a claim batch is one `mirrored` and one `ack` request.
#[test]
fn a_separate_handoff_flows_as_one_mirrored_and_one_ack_per_claim_batch() {
    let log = flow_of_sixty(Some("separate"));
    assert_eq!(requests(&log, "batch/handoff"), Vec::<u64>::new(), "no combined handoff");
    let mirrored = requests(&log, "batch/mirrored");
    let acked = requests(&log, "batch/ack");
    assert_eq!(mirrored.iter().sum::<u64>(), MESSAGES as u64, "each delivery mirrored once: {mirrored:?}");
    assert_eq!(acked.iter().sum::<u64>(), MESSAGES as u64, "each delivery acked once: {acked:?}");
    assert!(
        mirrored.len() <= 4 && acked.len() == mirrored.len(),
        "one request per claim batch: {mirrored:?} {acked:?}"
    );
}

/// A front that stands for a hub from before batches: it serves TLS with the hub's own server
/// certificate, answers 404 to every `/v1/batch/...` route, and passes every other request on
/// to the real hub with the node's certificate. It counts what it refused and what it passed.
mod old_hub {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    /// Most bytes of one request head the front reads.
    const HEAD_BYTES_MAX: usize = 64 * 1024;

    /// What the front saw.
    #[derive(Default)]
    pub struct Seen {
        /// Batch requests answered 404.
        pub refused: AtomicUsize,
        /// Paths passed on to the hub, in order.
        pub passed: Mutex<Vec<String>>,
    }

    /// Starts the front on `rt`; returns its address.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        hub_data: &Path,
        hub_url: String,
        client: reqwest::Client,
        seen: Arc<Seen>,
    ) -> std::net::SocketAddr {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(hub_data.join("hub.crt"))
            .expect("hub.crt")
            .collect::<Result<_, _>>()
            .expect("hub.crt");
        let key = PrivateKeyDer::from_pem_file(hub_data.join("hub.key")).expect("hub.key");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
        let addr = listener.local_addr().expect("addr");
        rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, client, seen, hub_url) =
                    (acceptor.clone(), client.clone(), Arc::clone(&seen), hub_url.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(tls, &client, &seen, &hub_url).await;
                    }
                });
            }
        });
        addr
    }

    /// Serves one connection's requests (HTTP/1.1, bodies with `content-length`) until it closes.
    async fn serve<S: AsyncReadExt + AsyncWriteExt + Unpin>(
        mut conn: S,
        client: &reqwest::Client,
        seen: &Seen,
        hub_url: &str,
    ) {
        let mut buf = Vec::new();
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 8192];
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                if buf.len() > HEAD_BYTES_MAX {
                    return;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let mut lines = head.split("\r\n");
            let mut first = lines.next().unwrap_or_default().split(' ');
            let (method, path) =
                (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            let length: usize =
                headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
            while buf.len() < head_end + length {
                let mut chunk = [0u8; 8192];
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = buf[head_end..head_end + length].to_vec();
            buf.drain(..head_end + length);
            let (status, answer) = if path.starts_with("/v1/batch/") {
                seen.refused.fetch_add(1, Ordering::SeqCst);
                (404, br#"{"code":"not_found","message":"no such route"}"#.to_vec())
            } else {
                seen.passed.lock().unwrap().push(path.clone());
                let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
                let mut req = client.request(method, format!("{hub_url}{path}")).body(body);
                for (k, v) in headers.iter().filter(|(k, _)| k == "content-type" || k.starts_with("baton-")) {
                    req = req.header(k, v);
                }
                match req.send().await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        (status, resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
                    }
                    Err(_) => return,
                }
            };
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                answer.len()
            );
            if conn.write_all(head.as_bytes()).await.is_err() || conn.write_all(&answer).await.is_err() {
                return;
            }
        }
    }
}

/// A node against a hub that predates batches (a 404 to every batch route): it learns that from
/// the first batch request, sends one request per delivery from then on, and every turn still
/// runs once and is reported once.
#[test]
fn a_node_works_with_a_hub_without_batch_routes() {
    use std::sync::atomic::Ordering;
    const MESSAGES: usize = 12;
    let hub = Hub::with_nodes(&["host-a"]);
    let id = hub.identity("host-a");
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&id.ca_pem().expect("ca")).expect("ca")])
        .identity(reqwest::Identity::from_pem(&id.pem().expect("identity")).expect("identity"))
        .build()
        .expect("client");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let seen = std::sync::Arc::new(old_hub::Seen::default());
    let front = old_hub::start(&rt, hub.data_dir(), hub.url(), client, std::sync::Arc::clone(&seen));
    let producer = hub.client("prod");
    for i in 0..MESSAGES {
        rt.block_on(producer.submit_new(&format!("conv-{}", i % 3), &format!("k{i}"), &["host-a"]));
    }
    let _node = hub
        .node_process("host-a")
        // The environment layer overrides the config file's `hub_url`.
        .env("BATON_NODE_HUB_URL", &format!("https://{front}"))
        .env("BATON_LOG", REQUEST_LOG)
        .start();
    let all = wait_for("every delivery to have an outcome", NODE_WAIT, || {
        let list = hub.deliveries();
        (list.len() == MESSAGES && list.iter().all(|d| !d["outcome"].is_null())).then_some(list)
    });
    for d in &all {
        let id = d["delivery_id"].as_str().expect("delivery_id");
        hub.assert_one_attempt(id, "succeeded");
        assert_eq!(hub.exec_log().runs_of(id), 1, "ran once: {id}");
    }
    // One 404 per route is enough to learn it: the combined handoff's, then the first batch's.
    assert_eq!(seen.refused.load(Ordering::SeqCst), 2, "one 404 per route is enough to learn it");
    let passed = seen.passed.lock().unwrap().clone();
    let count = |suffix: &str| passed.iter().filter(|p| p.ends_with(suffix)).count();
    assert_eq!(count("/mirrored"), MESSAGES, "{passed:?}");
    assert_eq!(count("/ack"), MESSAGES, "{passed:?}");
    assert!(count("/delivery-report") >= MESSAGES, "{passed:?}");
}
