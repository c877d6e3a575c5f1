//! What the real binaries export for alerting, scraped after real traffic: the hub's
//! histograms with their buckets, requests counted by route template and status code, the
//! record gauges and their per-host cap (`metrics_hosts_max`); `baton-node`'s own `/metrics`
//! when `metrics_listen` is set and no listener otherwise; the node's one log line when the hub
//! answers again after an outage; and `docs/alerts/` (the alerting rules and the Grafana
//! dashboard): checked by `promtool` and holding only metric names the binaries export.
//!
//! Without `promtool` (Debian's `prometheus` package) the promtool test says so and passes,
//! unless `BATON_REQUIRE_PROMTOOL` is set (CI sets it), when it fails.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};
use crate::status_page::{get_as, operator_addr};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Set (to anything) to make a missing `promtool` a failure instead of a skip.
const REQUIRE_VAR: &str = "BATON_REQUIRE_PROMTOOL";
/// The hub refreshes its record gauges every 10 s.
const GAUGE_WAIT: Duration = Duration::from_secs(60);

/// One sample of a Prometheus text exposition: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of `text` (comments skipped). Label values are read as quoted strings, so a
/// route template's braces stay inside its value.
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = line[..name_end].to_string();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices();
            let (mut key, mut value, mut in_value, mut escaped) = (String::new(), String::new(), false, false);
            let mut end = inner.len();
            while let Some((i, c)) = chars.next() {
                match (in_value, c) {
                    (false, '}') => {
                        end = i + 1;
                        break;
                    }
                    (false, '=') => {
                        chars.next(); // the opening quote
                        in_value = true;
                    }
                    (false, ',') => {}
                    (false, c) => key.push(c),
                    (true, '\\') if !escaped => escaped = true,
                    (true, '"') if !escaped => {
                        labels.insert(std::mem::take(&mut key), std::mem::take(&mut value));
                        in_value = false;
                    }
                    (true, c) => {
                        escaped = false;
                        value.push(c);
                    }
                }
            }
            rest = &inner[end..];
        }
        let value = rest.trim().split(' ').next().unwrap_or("");
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("{line}: {v:?} is not a value")),
        };
        out.push(Sample { name, labels, value });
    }
    out
}

/// The value of the sample named `name` whose labels include every pair of `labels`.
fn value(all: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    all.iter()
        .find(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.value)
}

/// GET `path` on a plain-HTTP listener at `addr`: status and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let text = get_as(addr, host, path).unwrap_or_else(|| panic!("GET http://{addr}{path}: no answer"));
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// Scrapes `http://addr/metrics` until `ready` holds of its samples (up to `limit`); returns
/// the text.
#[track_caller]
fn scrape_until(addr: &str, limit: Duration, what: &str, ready: impl Fn(&[Sample]) -> bool) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let (status, text) = get(addr, "/metrics");
        assert_eq!(status, 200, "{text}");
        if ready(&samples(&text)) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "{what} never showed on http://{addr}/metrics:\n{text}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The node's metrics listener address, once it has written `DATA_DIR/metrics.addr`.
fn node_metrics_addr(data_dir: &Path) -> String {
    let file = data_dir.join("metrics.addr");
    wait_for("DATA_DIR/metrics.addr", NODE_WAIT, || {
        std::fs::read_to_string(&file).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    })
}

/// A hub with two hosts (per-host series capped at one), a real node on host-a running one
/// turn, producer requests answered 201, 200 and 404: the turn histograms come with buckets,
/// requests are counted by route template and status code, and the record gauges show.
#[test]
fn the_hub_exports_histograms_requests_by_route_and_the_record_gauges() {
    let hub = Hub::builder().nodes(&["host-a", "host-b"]).config("metrics_hosts_max = 1\n").start();
    let _node = hub.node_process("host-a").start();
    let prod = hub.client("prod");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sent = rt.block_on(prod.submit_new("c", "k1", &["host-a"]));
    hub.wait_outcome(sent.to("host-a"));
    rt.block_on(prod.get(&format!("/v1/messages/{}", sent.message_id))).ok(200);
    rt.block_on(prod.get("/v1/no/such/endpoint")).err(404, "not_found");
    rt.block_on(prod.get("/healthz")).ok(200);
    let addr = operator_addr(&hub);

    // A scrape is counted once it is answered, so the operator listener's own series shows
    // from the second scrape on: wait for it too. The record gauges are read every few
    // seconds, so a reading taken while the message still waited shows until the next one:
    // wait for one taken after the claim (host-a's backlog empty again).
    let text = scrape_until(
        &addr,
        GAUGE_WAIT,
        "the turn's report, host-a's contact, its backlog empty again and an earlier scrape",
        |s| {
            value(s, "baton_hub_accept_to_outcome_seconds_count", &[("outcome", "succeeded")]) == Some(1.0)
                && value(s, "baton_hub_host_last_contact_age_seconds", &[("host", "host-a")]).is_some()
                && value(s, "baton_hub_host_backlog", &[("host", "host-a")]) == Some(0.0)
                && value(s, "baton_hub_http_requests_total", &[("listener", "operator"), ("route", "/metrics")])
                    .is_some()
        },
    );
    let s = samples(&text);
    for name in [
        "baton_hub_turn_duration_seconds",
        "baton_hub_accept_to_outcome_seconds",
        "baton_hub_http_request_duration_seconds",
    ] {
        assert!(text.contains(&format!("# TYPE {name} histogram\n")), "{name} is a histogram:\n{text}");
    }
    for name in ["baton_hub_turn_duration_seconds", "baton_hub_accept_to_outcome_seconds"] {
        let buckets: Vec<&Sample> = s.iter().filter(|x| x.name == format!("{name}_bucket")).collect();
        assert!(buckets.len() > 5, "{name} has buckets:\n{text}");
        assert_eq!(value(&s, &format!("{name}_bucket"), &[("outcome", "succeeded"), ("le", "+Inf")]), Some(1.0));
        assert_eq!(value(&s, &format!("{name}_count"), &[("outcome", "succeeded")]), Some(1.0), "{text}");
        assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value), "cumulative buckets: {buckets:?}");
    }
    let requests = |route: &str, code: &str| {
        value(&s, "baton_hub_http_requests_total", &[("listener", "api"), ("route", route), ("code", code)])
    };
    assert_eq!(requests("/v1/messages", "201"), Some(1.0), "{text}");
    assert_eq!(requests("/v1/messages/{message_id}", "200"), Some(1.0), "the template, not the path:\n{text}");
    assert!(requests("unmatched", "404").is_some_and(|n| n >= 1.0), "{text}");
    assert!(requests("/healthz", "200").is_some_and(|n| n >= 1.0), "{text}");
    assert!(
        value(&s, "baton_hub_http_requests_total", &[("listener", "operator"), ("route", "/metrics"), ("code", "200")])
            .is_some(),
        "{text}"
    );
    assert!(value(&s, "baton_hub_http_request_duration_seconds_bucket", &[("route", "/v1/messages")]).is_some());
    for x in s.iter().filter(|x| x.name.starts_with("baton_hub_http_request")) {
        let route = &x.labels["route"];
        assert!(route == "unmatched" || route.starts_with('/'), "{x:?}");
        assert!(!route.contains(&sent.message_id) && !route.contains("no/such"), "a raw path as a label: {x:?}");
    }

    // The record gauges, host-b left out by metrics_hosts_max = 1.
    assert_eq!(value(&s, "baton_hub_hosts_silent", &[]), Some(0.0), "{text}");
    assert_eq!(value(&s, "baton_hub_host_silent", &[("host", "host-a")]), Some(0.0), "{text}");
    assert_eq!(value(&s, "baton_hub_host_backlog", &[("host", "host-a")]), Some(0.0), "{text}");
    assert_eq!(value(&s, "baton_hub_host_backlog", &[("host", "host-b")]), None, "capped:\n{text}");
    assert_eq!(value(&s, "baton_hub_metrics_hosts_omitted", &[]), Some(1.0), "{text}");
    assert!(hub.serve_logs().contains("more hosts than metrics_hosts_max"), "{}", hub.serve_logs());
    for role in ["node", "producer", "server", "ca"] {
        let left = value(&s, "baton_hub_certificate_expires_in_seconds", &[("role", role)]);
        assert!(left.is_some_and(|l| l > 86_400.0), "{role}: {left:?}\n{text}");
    }
    assert_eq!(value(&s, "baton_hub_turns_running", &[]), Some(0.0), "{text}");
    assert_eq!(value(&s, "baton_hub_turn_oldest_running_age_seconds", &[]), Some(0.0), "{text}");
    assert_eq!(value(&s, "baton_hub_held_oldest_age_seconds", &[]), Some(0.0), "{text}");
    let read = value(&s, "baton_hub_gauges_read_seconds", &[]);
    assert!(read.is_some_and(|r| (0.0..60.0).contains(&r)), "the last gauge read's time: {read:?}\n{text}");
    for scope in ["conversation", "host", "all"] {
        assert_eq!(value(&s, "baton_hub_fences_active_by_scope", &[("scope", scope)]), Some(0.0), "{text}");
    }

    // A held delivery and a host fence show within a gauge refresh.
    let fence = hub.fence("hold", &["--host", "host-a"], "maintenance");
    rt.block_on(prod.submit_new("c", "k2", &["host-a"]));
    scrape_until(&addr, GAUGE_WAIT, "the held delivery and the host fence", |s| {
        value(s, "baton_hub_fences_active_by_scope", &[("scope", "host")]) == Some(1.0)
            && value(s, "baton_hub_deliveries", &[("state", "held")]) == Some(1.0)
            && value(s, "baton_hub_held_oldest_age_seconds", &[]).is_some_and(|a| a > 0.0)
    });
    hub.lift(fence);
}

/// `metrics_listen` set: the node serves `/metrics` (its counters after a turn, the store's
/// gauges, 404 elsewhere). Not set: no listener, no address file.
#[test]
fn the_node_serves_metrics_when_configured_and_not_otherwise() {
    let hub = Hub::with_nodes(&["host-a", "host-b"]);
    let with = hub.node_process("host-a").set("metrics_listen", "\"127.0.0.1:0\"").start();
    let without = hub.node_process("host-b").start();
    let id = hub.send_one("c", "k1", "host-a");
    hub.wait_outcome(&id);
    let addr = node_metrics_addr(with.data_dir());
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let text = scrape_until(&addr, NODE_WAIT, "the confirmed report", |s| {
        value(s, "baton_node_reports_total", &[("result", "confirmed")]) == Some(1.0)
    });
    let s = samples(&text);
    let version = format!("{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
    assert!(text.contains(&format!("baton_node_build_info{version} 1\n")), "{text}");
    for (name, expected) in [
        ("baton_node_hub_reachable", 1.0),
        ("baton_node_deliveries_claimed_total", 1.0),
        ("baton_node_queue_ahead", 0.0),
        ("baton_node_turns_running", 0.0),
        ("baton_node_outbox_depth", 0.0),
        ("baton_node_outbox_oldest_age_seconds", 0.0),
        ("baton_node_outbox_dead", 0.0),
        ("baton_node_hub_requests_unanswered_total", 0.0),
    ] {
        assert_eq!(value(&s, name, &[]), Some(expected), "{name}:\n{text}");
    }
    assert!(value(&s, "baton_node_claim_requests_total", &[]).is_some_and(|n| n >= 1.0), "{text}");
    assert!(value(&s, "baton_node_hub_requests_total", &[]).is_some_and(|n| n >= 3.0), "{text}");
    assert!(value(&s, "baton_node_hub_last_contact_age_seconds", &[]).is_some_and(|a| a < 60.0), "{text}");
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).unwrap();
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP:\n{text}");
    }
    assert_eq!(get(&addr, "/elsewhere").0, 404);
    assert!(with.log().contains(&format!("serving metrics on http://{addr}/metrics")), "{}", with.log());

    without.wait_log("registered session");
    assert!(!without.data_dir().join("metrics.addr").exists(), "no listener unless configured");
    assert!(!without.log().contains("serving metrics"), "{}", without.log());
}

/// The hub killed under a node, then started again: the node counts the unanswered requests,
/// shows the hub unreachable, and when it answers again logs once how long it was gone and
/// how many requests failed meanwhile.
#[test]
fn the_node_logs_the_hub_reachable_again_once_with_the_failed_requests() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let node = hub.node_process("host-a").set("metrics_listen", "\"127.0.0.1:0\"").start();
    let addr = node_metrics_addr(node.data_dir());
    node.wait_log("registered session");
    hub.kill9();
    let down = scrape_until(&addr, NODE_WAIT, "unanswered requests", |s| {
        value(s, "baton_node_hub_requests_unanswered_total", &[]).is_some_and(|n| n >= 2.0)
            && value(s, "baton_node_hub_reachable", &[]) == Some(0.0)
    });
    let failed_before = value(&samples(&down), "baton_node_hub_requests_unanswered_total", &[]).unwrap();
    assert!(!node.log().contains("hub reachable again"), "{}", node.log());
    hub.serve(None);
    node.wait_log("hub reachable again after");
    let log = node.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("hub reachable again after")).collect();
    assert_eq!(lines.len(), 1, "logged once:\n{log}");
    assert!(lines[0].contains("INFO"), "at info: {}", lines[0]);
    let after = lines[0].split("hub reachable again after ").nth(1).unwrap();
    let (secs, rest) = after.split_once("s, ").unwrap_or_else(|| panic!("{}", lines[0]));
    let secs: f64 = secs.parse().unwrap_or_else(|_| panic!("{}", lines[0]));
    let failed: f64 = rest.split(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{}", lines[0]));
    assert!(rest.contains("request(s) failed meanwhile"), "{}", lines[0]);
    assert!(secs > 0.0, "{}", lines[0]);
    assert!(failed >= failed_before, "{failed} failed requests logged, {failed_before} counted before:\n{}", lines[0]);
    let up =
        scrape_until(&addr, NODE_WAIT, "the hub reachable", |s| value(s, "baton_node_hub_reachable", &[]) == Some(1.0));
    let counted = value(&samples(&up), "baton_node_hub_requests_unanswered_total", &[]).unwrap();
    assert_eq!(counted, failed, "the log and the counter saw the same requests");
}

/// The repository's `docs/alerts/`.
fn alerts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/alerts")
}

/// `promtool`, or `None` (with the skip printed) when it is not installed and not required.
fn promtool_or_skip(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os(REQUIRE_VAR).is_none(),
            "{test}: promtool is not installed (apt-get install prometheus) and {REQUIRE_VAR} is set"
        );
        println!(
            "SKIPPED: {test}: promtool is not installed (Debian package prometheus); set {REQUIRE_VAR}=1 to fail instead"
        );
    }
    found
}

/// Runs promtool with `args`; asserts it succeeded; returns its output.
fn promtool(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).current_dir(alerts_dir()).output().expect("run promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every query of the Grafana dashboard, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(alerts_dir().join("grafana-dashboard.json")).expect("read the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                panel["title"].as_str().unwrap_or("").to_string(),
                t["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    assert!(out.len() > 10, "the dashboard has its queries: {out:?}");
    out
}

/// The alerting rules pass `promtool check rules` and their unit tests (`promtool test rules`),
/// and every dashboard query parses (checked as a recording rule by the same promtool).
#[test]
fn the_alerting_rules_and_dashboard_queries_pass_promtool() {
    let Some(bin) = promtool_or_skip("the_alerting_rules_and_dashboard_queries_pass_promtool") else { return };
    let checked = promtool(&bin, &["check", "rules", "baton.rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&bin, &["test", "rules", "baton.rules.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in dashboard_queries().iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(expr).unwrap()
        ));
    }
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, rules).unwrap();
    let out = promtool(&bin, &["check", "rules", file.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The metric names a PromQL expression uses (ours: `baton_…`; `up` is Prometheus's own).
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("baton_") {
        let start = i + at;
        let boundary = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end =
            expr[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(expr.len(), |e| start + e);
        if boundary {
            out.insert(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// The names `METRICS` (the hub's) and `NODE_METRICS` (the node's) describe, read from their
/// tables in the source: the described-metrics lists, for a name only an event makes appear.
fn described_in_source() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = BTreeSet::new();
    for (file, table) in
        [("hub/src/metrics.rs", "pub const METRICS"), ("node/src/metrics.rs", "pub const NODE_METRICS")]
    {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let from = text.find(table).unwrap_or_else(|| panic!("{file} has {table}"));
        let body = &text[from..from + text[from..].find("\n];").unwrap()];
        for entry in body.split("\"baton_").skip(1) {
            let name = entry.split('"').next().unwrap();
            if entry[name.len()..].starts_with("\",") {
                out.insert(format!("baton_{name}"));
            }
        }
    }
    assert!(out.len() > 30, "{out:?}");
    out
}

/// Every metric name the alerting rules and the dashboard's queries use is one a real hub or
/// node exports: scraped from the binaries after a submission and its turn, a producer request
/// refused 404 and a held delivery. A name only an event this test does not cause makes appear is checked
/// against the described-metrics lists instead, and printed as such (none, today).
#[test]
fn every_metric_the_rules_and_the_dashboard_use_is_exported() {
    let hub = Hub::with_nodes(&["host-a"]);
    let node = hub.node_process("host-a").set("metrics_listen", "\"127.0.0.1:0\"").start();
    let prod = hub.client("prod");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let sent = rt.block_on(prod.submit_new("c", "k1", &["host-a"]));
    hub.wait_outcome(sent.to("host-a"));
    rt.block_on(prod.get("/v1/no/such/endpoint")).err(404, "not_found");
    let fence = hub.fence("hold", &["--host", "host-a"], "maintenance");
    hub.send_one("c", "k2", "host-a");
    let hub_text = scrape_until(&operator_addr(&hub), GAUGE_WAIT, "the report, the 404 and the held delivery", |s| {
        value(s, "baton_hub_accept_to_outcome_seconds_count", &[]).is_some()
            && value(s, "baton_hub_http_errors_total", &[("code", "not_found")]).is_some()
            && value(s, "baton_hub_deliveries", &[("state", "held")]) == Some(1.0)
    });
    let node_text = scrape_until(&node_metrics_addr(node.data_dir()), NODE_WAIT, "the confirmed report", |s| {
        value(s, "baton_node_reports_total", &[("result", "confirmed")]) == Some(1.0)
    });
    hub.lift(fence);
    let mut exported = BTreeSet::new();
    for s in samples(&hub_text).into_iter().chain(samples(&node_text)) {
        exported.insert(s.name);
    }
    let described = described_in_source();
    let rules = std::fs::read_to_string(alerts_dir().join("baton.rules.yml")).unwrap();
    let mut used: Vec<(String, String)> =
        names_in(&rules).into_iter().map(|n| ("baton.rules.yml".to_string(), n)).collect();
    for (title, expr) in dashboard_queries() {
        used.extend(names_in(&expr).into_iter().map(|n| (format!("dashboard panel {title:?}"), n)));
    }
    assert!(used.len() > 20, "{used:?}");
    let mut only_described = BTreeSet::new();
    for (where_, name) in &used {
        if exported.contains(name) {
            continue;
        }
        assert!(described.contains(name), "{where_} uses {name}, which neither binary exports nor describes");
        only_described.insert(name.clone());
    }
    println!(
        "{} metric names used by the rules and the dashboard; all scraped from the running binaries except: {:?}",
        used.iter().map(|(_, n)| n).collect::<BTreeSet<_>>().len(),
        only_described
    );
}
