//! The operator listener through the real binary: `/healthz`, `/readyz` and `/metrics` over
//! plain HTTP with no client certificate, every metric with its `# HELP` and `# TYPE`, the
//! listener turned off, and the status page loaded in a real headless browser (Debian's
//! `chromium`), whose numbers must match the record and whose screenshot is kept under the
//! target directory (`status-page/`).
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
fn operator_addr(hub: &Hub) -> String {
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

/// The listener needs no certificate, so it bounds its clients: a connection that sends no
/// request is closed, and connections beyond the limit are closed at accept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_listener_closes_silent_connections_and_bounds_how_many_are_open() {
    use tokio::io::AsyncWriteExt as _;
    let hub = Hub::with_nodes(&["host-a"]);
    let addr = operator_addr(&hub);
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(60), answer_or_close(&mut silent)).await;
    assert_eq!(closed, Ok(None), "a connection that never sends a request is closed");

    // 64 (`OPERATOR_CONNECTIONS_MAX`) open and idle: the next one is closed unanswered.
    let mut open = Vec::new();
    for _ in 0..64 {
        open.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let mut extra = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let refused = tokio::time::timeout(Duration::from_secs(60), answer_or_close(&mut extra)).await;
    assert_eq!(refused, Ok(None), "a connection beyond the limit is closed unanswered");
    drop(open);
    // A blocking client: the wait polls from this thread, which the runtime does not need.
    let healthy = wait_for("the listener answers again", Duration::from_secs(60), || {
        let mut tcp = std::net::TcpStream::connect(&addr).ok()?;
        std::io::Write::write_all(&mut tcp, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut tcp, &mut text).ok()?;
        text.starts_with("HTTP/1.1 200").then_some(text)
    });
    assert!(healthy.contains(r#"{"status":"ok"}"#), "{healthy}");
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
    let failed_runs = hub.cli_json(["deliveries", "list", "--outcome", "failed", "--json"]);
    assert_eq!(number_at(&dom, "data-outcome", "failed"), failed_runs.as_array().unwrap().len() as i64);
    assert_eq!(number_at(&dom, "data-outcome", "failed"), 1);
    // Stored text is shown as text: no script ran (the title is ours) and none was added.
    assert!(dom.contains("<title>Status · Baton hub</title>"), "{dom}");
    assert!(!dom.contains("<script"), "stored text added markup:\n{dom}");
    assert!(dom.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;"), "{dom}");
    let link = format!("href=\"/status/deliveries/{failed}\"");
    assert!(dom.contains(&link), "the failed delivery links to its history:\n{dom}");

    let detail = chromium(&hub, &["--dump-dom"], &format!("{base}/status/deliveries/{failed}"));
    assert!(detail.contains("id=\"state\">delivered<"), "{detail}");
    assert!(detail.contains("mirrored → delivered"), "its history is shown:\n{detail}");
    assert!(detail.contains("<td>failed</td>"), "its failed run is shown:\n{detail}");

    let shot = artifact_dir().join("status.png");
    let _ = std::fs::remove_file(&shot);
    chromium(&hub, &[&format!("--screenshot={}", shot.display()), "--window-size=1400,1000"], &format!("{base}/"));
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 1000, "a screenshot was saved at {}", shot.display());
    eprintln!("status page screenshot: {}", shot.display());
}
