//! The operator listener through the real binary: `/healthz`, `/readyz` and `/metrics` over
//! plain HTTP with no client certificate, every metric with its `# HELP` and `# TYPE`, the
//! listener turned off, and the status page loaded in a real headless browser (Debian's
//! `chromium`), whose numbers (a pool's among them) must match the record and whose screenshot
//! is kept under the target directory (`status-page/`).
//!
//! Without `chromium` the browser test says so and passes, unless `BATON_REQUIRE_BROWSER` is
//! set (CI sets it), when it fails.

use crate::harness::{Hub, output_within};
use crate::node_harness::wait_for;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Set (to anything) to make a missing `chromium` a failure instead of a skip.
const REQUIRE_VAR: &str = "BATON_REQUIRE_BROWSER";
/// Generous: a cold headless browser on a loaded machine.
const BROWSER_WAIT: Duration = Duration::from_secs(120);
/// The hub refreshes its record gauges every 10 s.
const GAUGE_WAIT: Duration = Duration::from_secs(60);
const SCRIPT: &str = "<script>document.title='pwned'</script>";

/// The operator listener's address, once the hub has written it.
pub fn operator_addr(hub: &Hub) -> String {
    let file = hub.data_dir().join("operator.addr");
    wait_for("DIR/operator.addr", Duration::from_secs(30), || {
        std::fs::read_to_string(&file).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    })
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::Client::new().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The metric a sample line belongs to: its name without labels, and without the suffixes a
/// summary or histogram adds.
fn family(sample: &str) -> &str {
    let name = sample.split(['{', ' ']).next().unwrap_or(sample);
    ["_sum", "_count", "_bucket"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_listener_answers_without_a_certificate_and_describes_every_metric() {
    let hub = Hub::with_nodes(&["host-a", "host-b"]);
    let prod = hub.client("prod");
    prod.submit_new("c", "k1", &["host-a"]).await;
    prod.submit_new("c", "k2", &["host-a"]).await;
    let base = format!("http://{}", operator_addr(&hub));
    assert!(base.starts_with("http://127.0.0.1:"), "loopback by default: {base}");

    assert_eq!(get(&format!("{base}/healthz")).await, (200, r#"{"status":"ok"}"#.to_string()));
    assert_eq!(get(&format!("{base}/readyz")).await, (200, r#"{"ready":true}"#.to_string()));

    // The per-host gauges come from the periodic read; wait for the two queued deliveries.
    let deadline = std::time::Instant::now() + GAUGE_WAIT;
    let text = loop {
        let (status, text) = get(&format!("{base}/metrics")).await;
        assert_eq!(status, 200, "{text}");
        if text.contains("baton_hub_host_backlog{host=\"host-a\"} 2") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "host-a's backlog never reached /metrics:\n{text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let version = env!("CARGO_PKG_VERSION");
    assert!(text.contains(&format!("baton_hub_build_info{{version=\"{version}\"}} 1")), "{text}");
    assert!(text.contains("baton_hub_host_backlog{host=\"host-b\"} 0"), "{text}");
    assert!(text.contains("baton_hub_host_oldest_waiting_age_seconds{host=\"host-a\"}"), "{text}");
    assert!(text.contains("baton_hub_deliveries_by_outcome{outcome=\"failed\"} 0"), "{text}");
    assert!(text.contains("baton_hub_fences_active 0"), "{text}");
    assert!(text.contains("baton_hub_messages_accepted_total 2"), "{text}");

    let mut helped = BTreeSet::new();
    let mut typed = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap().to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.insert(rest.split(' ').next().unwrap().to_string());
        }
    }
    assert!(!typed.is_empty(), "{text}");
    for name in &typed {
        assert!(helped.contains(name), "# TYPE {name} has no # HELP:\n{text}");
    }
    for sample in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name = family(sample);
        assert!(helped.contains(name) && typed.contains(name), "{sample}: {name} is not described:\n{text}");
    }

    // The mTLS listener keeps its own endpoints.
    prod.get("/healthz").await.ok(200);
    prod.get("/readyz").await.ok(200);
}

/// Reads until the peer closes (`None`) or answers (`Some(text)`).
async fn answer_or_close(tcp: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut buf = vec![0u8; 4096];
    match tcp.read(&mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
    }
}

/// A blocking GET of `path` on `addr` with `host` as its Host header: the answer's text, or
/// `None` when the listener closed the connection without one.
pub fn get_as(addr: &str, host: &str, path: &str) -> Option<String> {
    let mut tcp = std::net::TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    std::io::Write::write_all(&mut tcp, req.as_bytes()).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut tcp, &mut text).ok()?;
    (!text.is_empty()).then_some(text)
}

/// The listener needs no certificate, so it bounds its clients: a connection that sends no
/// request is closed, and sockets one process holds open cannot keep a health check out (a
/// new connection takes the place of that peer's oldest idle one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_open_sockets_do_not_keep_a_health_check_out() {
    let hub = Hub::with_nodes(&["host-a"]);
    let addr = operator_addr(&hub);
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(60), answer_or_close(&mut silent)).await;
    assert_eq!(closed, Ok(None), "a connection that never sends a request is closed");

    // 80 open and idle from this process: more than one peer may keep, more than the
    // listener keeps at all (`OPERATOR_CONNECTIONS_MAX`, 64).
    let mut open = Vec::new();
    for _ in 0..80 {
        open.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // At once, one try: the health check is answered, not closed at accept.
    let addr2 = addr.clone();
    let healthy = tokio::task::spawn_blocking(move || get_as(&addr2, &addr2, "/healthz")).await.unwrap();
    let healthy = healthy.expect("a health check was closed unanswered while idle sockets were held open");
    assert!(healthy.starts_with("HTTP/1.1 200") && healthy.contains(r#"{"status":"ok"}"#), "{healthy}");
    // The held sockets beyond the peer's bound (8 by default) were closed to make room.
    let mut closed = 0;
    for tcp in &mut open {
        if let Ok(None) = tokio::time::timeout(Duration::from_millis(200), answer_or_close(tcp)).await {
            closed += 1;
        }
    }
    assert!(closed >= 80 - 8, "only {closed} of 80 idle sockets were closed");
}

/// The listener answers only requests whose Host names it (its bound address, localhost on
/// loopback, `operator_hosts`): a page that rebinds its own name to the listener's address
/// gets 421, not the status page.
#[test]
fn the_operator_listener_answers_only_its_own_host_names() {
    let hub = Hub::builder().nodes(&["host-a"]).config("operator_hosts = [\"status.example\"]\n").start();
    let addr = operator_addr(&hub);
    let port = addr.rsplit_once(':').unwrap().1;
    for host in [addr.clone(), format!("localhost:{port}"), "127.0.0.1:8080".into(), "Status.Example:80".into()] {
        let answer = get_as(&addr, &host, "/healthz").expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "Host {host}: {answer}");
    }
    for host in [format!("rebound.example:{port}"), "status.example.evil".to_string(), "10.9.8.7".to_string()] {
        for path in ["/", "/healthz", "/metrics", "/status/deliveries/x"] {
            let answer = get_as(&addr, &host, path).expect("an answer");
            assert!(answer.starts_with("HTTP/1.1 421"), "Host {host} {path}: {answer}");
            assert!(answer.contains("is not this listener") && answer.contains("operator_hosts"), "{answer}");
            assert!(
                !answer.contains("baton_hub") && !answer.contains("<html") && !answer.contains("\"ok\""),
                "{answer}"
            );
        }
    }
}

/// The page needs no certificate: it never shows a harness result (what the work produced), on
/// the overview or a delivery's page, and says where to read it. (Reasons, shown as
/// `status_page_reasons` says, are `status_view`'s.)
#[test]
fn the_status_page_never_shows_a_harness_result() {
    let hub = Hub::with_nodes(&["host-a", "host-b"]);
    let _node = hub.node_process("host-a").then("echo result-TOPSECRET; exit 3").start();
    let failed = hub.send_one("work", "k1", "host-a");
    assert_eq!(hub.wait_outcome(&failed)["delivery"]["outcome"], "failed");
    let shown = hub.cli_json(["deliveries", "show", &failed, "--json"]).to_string();
    assert!(shown.contains("result-TOPSECRET"), "the record holds the result: {shown}");
    let addr = operator_addr(&hub);
    for path in ["/".to_string(), format!("/status/deliveries/{failed}"), format!("/status?q={failed}")] {
        let page = get_as(&addr, &addr, &path).expect("an answer");
        assert!(page.starts_with("HTTP/1.1 200"), "{path}: {page}");
        assert!(!page.contains("TOPSECRET"), "{path} shows a result:\n{page}");
        assert!(page.contains("deliveries show") || path.contains("?q="), "{path} says where it is:\n{page}");
    }
    let page = get_as(&addr, &addr, &format!("/status/deliveries/{failed}")).unwrap();
    assert!(page.contains(">failed</td>"), "the outcome is shown:\n{page}");
    assert!(page.contains("exited with status 3"), "the run's reason is shown on loopback:\n{page}");
}

/// `config check` warns (and still passes) when the listener that needs no certificate is
/// bound beyond loopback; `serve` logs the same.
#[test]
fn config_check_warns_about_an_operator_listener_beyond_loopback() {
    let mut hub = Hub::builder().config("operator_listen = \"0.0.0.0:0\"\n").stopped().start();
    let out = hub.cli(["config", "check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("warning: operator_listen = 0.0.0.0:0 is not a loopback address"), "{err}");
    hub.serve(None);
    wait_for("the warning in the hub's log", Duration::from_secs(30), || {
        hub.serve_logs().contains("is not a loopback address").then_some(())
    });
    hub.write_config("operator_listen = \"127.0.0.1:0\"\n");
    let out = hub.cli(["config", "check"]);
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("warning"), "{out:?}");
}

#[test]
fn the_operator_listener_can_be_turned_off() {
    let hub = Hub::builder().config("operator_listen = \"off\"\n").start();
    hub.cli_ok(["status"]);
    assert!(!hub.data_dir().join("operator.addr").exists(), "no address is written for a listener that is off");
    assert!(hub.serve_logs().contains("operator listener off"), "{}", hub.serve_logs());
}

// ---------------------------------------------------------------------------------------------
// The status page in a real browser

/// Whether `chromium` is here; `false` (after saying why) when the test should skip.
fn browser_present() -> bool {
    if Command::new("chromium").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_VAR).is_none(),
        "{REQUIRE_VAR} is set but chromium is missing (apt-get install chromium)"
    );
    eprintln!("skipped: chromium is not installed (apt-get install chromium; set {REQUIRE_VAR}=1 to require it)");
    false
}

/// Where the screenshots are kept: `TARGET/status-page/`, next to the test binaries.
fn artifact_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // TARGET/debug/deps/it-HASH
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let dir = target.join("status-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs headless chromium on `url` with `args`, in its own profile directory.
fn chromium(hub: &Hub, args: &[&str], url: &str) -> String {
    let profile = hub.scratch(&format!("chromium-{}", uuid::Uuid::new_v4()));
    let mut cmd = Command::new("chromium");
    cmd.args(["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-dev-shm-usage"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url);
    let out = output_within(cmd, BROWSER_WAIT);
    assert!(out.status.success(), "chromium on {url}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The whole number shown in the element whose attribute `attr` is `value`, in a dumped DOM.
fn number_at(dom: &str, attr: &str, value: &str) -> i64 {
    let needle = format!("{attr}=\"{value}\">");
    let at = dom.find(&needle).unwrap_or_else(|| panic!("no {needle} in the page:\n{dom}")) + needle.len();
    let digits: String = dom[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|e| panic!("{e}: {needle} is not followed by a number:\n{dom}"))
}

#[test]
fn the_status_page_in_a_real_browser_matches_the_record() {
    if !browser_present() {
        return;
    }
    let hub = Hub::with_nodes(&["host-a", "host-b"]);
    // host-a's harness fails every turn; host-b has no node and a paused host.
    let _node = hub.node_process("host-a").then("exit 3").start();
    let fence = hub.fence("pause", &["--host", "host-b"], SCRIPT);
    for k in ["k1", "k2", "k3"] {
        hub.send_one("waits", k, "host-b");
    }
    let failed = hub.send_one("work", "k4", "host-a");
    assert_eq!(hub.wait_outcome(&failed)["delivery"]["outcome"], "failed");
    // A pool whose one member, host-b, is fenced: its two deliveries wait in it.
    hub.cli_ok(["pools", "add", "--pool", "gpu", "host-b", "--reason", "one queue"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let prod = hub.client("prod");
    for k in ["p1", "p2"] {
        let body = serde_json::json!({"conversation": "pooled", "idempotency_key": k, "payload": {}, "pools": ["gpu"]});
        rt.block_on(prod.post("/v1/messages", &body)).ok(201);
    }
    let gpu = hub.cli_json(["pools", "show", "gpu", "--json"]);

    let list = hub.cli_json(["deliveries", "list", "--host", "host-b", "--json"]);
    let waiting =
        list.as_array().unwrap().iter().filter(|d| d["state"] == "queued" || d["state"] == "held").count() as i64;
    assert_eq!(waiting, 3);

    let base = format!("http://{}", operator_addr(&hub));
    let dom = chromium(&hub, &["--dump-dom"], &format!("{base}/"));
    assert_eq!(number_at(&dom, "data-host-backlog", "host-b"), waiting, "host-b's backlog is the record's");
    assert_eq!(number_at(&dom, "data-host-backlog", "host-a"), 0);
    assert_eq!(number_at(&dom, "id", "fences-active"), 1);
    assert!(dom.contains(&format!("data-fence=\"{fence}\"")), "the fence is listed:\n{dom}");
    assert_eq!(number_at(&dom, "data-pool-queued", "gpu"), gpu[0]["queued"].as_i64().unwrap(), "the pool's queue");
    assert_eq!(number_at(&dom, "data-pool-queued", "gpu"), 2);
    assert_eq!(number_at(&dom, "data-pool-in-flight", "gpu"), 0);
    assert!(dom.contains("class=\"tag paused\" data-pool-member=\"gpu/host-b\">host-b fenced<"), "{dom}");
    let failed_runs = hub.cli_json(["deliveries", "list", "--outcome", "failed", "--json"]);
    assert_eq!(number_at(&dom, "data-outcome", "failed"), failed_runs.as_array().unwrap().len() as i64);
    assert_eq!(number_at(&dom, "data-outcome", "failed"), 1);
    // Stored text is shown as text: no script ran (the title is ours) and none was added.
    assert!(dom.contains("<title>Status · Baton hub</title>"), "{dom}");
    assert!(!dom.contains("<script"), "stored text added markup:\n{dom}");
    assert!(dom.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;"), "{dom}");
    let link = format!("href=\"/status/deliveries/{failed}\"");
    assert!(dom.contains(&link), "the failed delivery links to its history:\n{dom}");

    // Colour marks the failure, the paused backlog and the attention items, each beside its word.
    assert!(dom.contains("class=\"num failed\" data-outcome=\"failed\">1<"), "{dom}");
    assert!(dom.contains("class=\"tag paused\" data-fenced=\"paused\">paused<"), "{dom}");
    assert!(dom.contains("data-kind=\"fence_active\""), "the pause needs attention:\n{dom}");
    assert!(dom.contains("id=\"rates\""), "the last hour is shown:\n{dom}");

    let detail = chromium(&hub, &["--dump-dom"], &format!("{base}/status/deliveries/{failed}"));
    assert!(detail.contains("id=\"state\" class=\"\">delivered<"), "{detail}");
    assert!(detail.contains("mirrored → delivered"), "its history is shown:\n{detail}");
    assert!(detail.contains("class=\"failed\">failed</td>"), "its failed run is shown:\n{detail}");

    let search = chromium(&hub, &["--dump-dom"], &format!("{base}/status?q=waits"));
    assert_eq!(search.matches("data-found=").count(), 3, "the conversation's three deliveries:\n{search}");

    let shot = artifact_dir().join("status.png");
    let _ = std::fs::remove_file(&shot);
    chromium(&hub, &[&format!("--screenshot={}", shot.display()), "--window-size=1400,1000"], &format!("{base}/"));
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 1000, "a screenshot was saved at {}", shot.display());
    eprintln!("status page screenshot: {}", shot.display());
    let shot = artifact_dir().join("status-search.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &hub,
        &[&format!("--screenshot={}", shot.display()), "--window-size=1400,1000"],
        &format!("{base}/status?q=waits"),
    );
    assert!(std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0) > 1000, "{}", shot.display());
}
