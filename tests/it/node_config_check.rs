//! `baton-node config check` through the real binary: what it proves offline (the harness
//! program runs, the key belongs to the certificate, the certificate is a node's, chains to
//! `ca_file` and is valid now) and with `--online` (the hub answers and takes the certificate),
//! each failure named with exit status 2; and `baton-node run` refusing to start on the same
//! failures, so a producer certificate never reaches the hub's refusals.

use crate::harness::{EVENT_WAIT, Hub, bins, output_within};
use baton_shared::exit;
use baton_shared::ids::Role;
use baton_shared::pki::{self, LeafKind};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// The files and command one node configuration names.
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    command: Vec<String>,
}

impl Files {
    /// The enrolled identity `name` of `hub`, running `sh`.
    fn of(hub: &Hub, name: &str) -> Files {
        let id = hub.identity(name);
        Files { ca: id.ca.clone(), cert: id.cert.clone(), key: id.key.clone(), command: vec!["sh".into()] }
    }
}

/// Writes `dir/node.toml` for `files` dialing `hub_url`; returns its path.
fn write_config(dir: &Path, hub_url: &str, files: &Files) -> PathBuf {
    let s = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("json");
    let text = format!(
        "hub_url = {}\nca_file = {}\ncert_file = {}\nkey_file = {}\ndata_dir = {}\ncommand = {}\n",
        serde_json::to_string(hub_url).expect("json"),
        s(&files.ca),
        s(&files.cert),
        s(&files.key),
        s(&dir.join("data")),
        serde_json::to_string(&files.command).expect("json"),
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, text).expect("write node.toml");
    path
}

/// `baton-node ARGS… --config CONFIG`, run to completion.
fn node(args: &[&str], config: &Path) -> Output {
    let mut cmd = bins().node_command();
    cmd.args(args).arg("--config").arg(config);
    output_within(cmd, EVENT_WAIT * 2)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `config check --json` (with `extra` flags): its exit status and its checks by name.
fn check_json(config: &Path, extra: &[&str]) -> (Option<i32>, Value, String) {
    let mut args = vec!["config", "check", "--json"];
    args.extend_from_slice(extra);
    let out = node(&args, config);
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&out.stdout), text(&out.stderr)));
    (out.status.code(), json, text(&out.stderr))
}

/// The check `name` of a `--json` report.
fn named<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name}: {json}"))
}

/// Asserts the check `name` ended `status` with a detail containing every one of `says`.
#[track_caller]
fn assert_check(json: &Value, name: &str, status: &str, says: &[&str]) {
    let c = named(json, name);
    assert_eq!(c["status"], status, "{name}: {json:#}");
    let detail = c["detail"].as_str().expect("detail");
    for s in says {
        assert!(detail.contains(s), "{name}: {detail:?} does not contain {s:?}");
    }
}

const USAGE: Option<i32> = Some(exit::USAGE as i32);

/// A config that fails `config check` offline: exit 2, the failing check and stderr naming it
/// with `says`; and `run` with it refuses to start (exit 2, nothing created) when `run_refuses`.
#[track_caller]
fn refused(dir: &Path, files: &Files, check: &str, says: &[&str], run_refuses: bool) {
    let config = write_config(dir, "https://127.0.0.1:9", files);
    let (code, json, stderr) = check_json(&config, &[]);
    assert_eq!(code, USAGE, "{json:#}\n{stderr}");
    assert_eq!(json["ok"], false);
    assert_check(&json, check, "fail", says);
    assert!(stderr.contains(says[0]), "stderr does not name {:?}: {stderr}", says[0]);
    let human = node(&["config", "check"], &config);
    let shown = text(&human.stdout);
    assert_eq!(human.status.code(), USAGE, "{shown}");
    assert!(shown.lines().any(|l| l.starts_with("FAIL") && l.contains(check)), "{shown}");
    assert!(shown.contains("configuration is not valid"), "{shown}");
    if run_refuses {
        let run = node(&["run"], &config);
        let stderr = text(&run.stderr);
        assert_eq!(run.status.code(), USAGE, "run with a failing {check} check: {stderr}");
        for s in says {
            assert!(stderr.contains(s), "run's refusal does not contain {s:?}: {stderr}");
        }
        assert!(!dir.join("data").exists(), "run created its data directory before refusing");
    }
}

/// Each offline failure is named (key, file, what, how to fix) with exit 2, and `run` refuses
/// the harness, key and role failures before it does anything; a good config passes.
#[test]
fn config_check_names_each_offline_failure() {
    let hub = Hub::builder().nodes(&["host-a", "host-b"]).producers(&["prod"]).stopped().start();
    let scratch = |name: &str| hub.scratch(name);

    // A good config passes, human and JSON.
    let dir = scratch("good");
    let config = write_config(&dir, "https://127.0.0.1:9", &Files::of(&hub, "host-a"));
    let (code, json, stderr) = check_json(&config, &[]);
    assert_eq!(code, Some(0), "{json:#}\n{stderr}");
    assert_eq!(json["ok"], true);
    for name in ["files", "harness", "key", "identity", "ca"] {
        assert_check(&json, name, "ok", &[]);
    }
    assert_check(&json, "identity", "ok", &["host-a"]);
    let human = node(&["config", "check"], &config);
    let shown = text(&human.stdout);
    assert_eq!(human.status.code(), Some(0), "{shown}{}", text(&human.stderr));
    assert!(shown.lines().filter(|l| l.starts_with("ok")).count() == 5, "{shown}");
    assert!(shown.contains("configuration is valid"), "{shown}");

    // A harness that is not there, and one that is not executable.
    let dir = scratch("missing-harness");
    let files = Files { command: vec![dir.join("agent-turn").display().to_string()], ..Files::of(&hub, "host-a") };
    refused(&dir, &files, "harness", &["command", "agent-turn", "does not exist"], true);
    let dir = scratch("plain-file-harness");
    let script = dir.join("agent-turn");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let files = Files { command: vec![script.display().to_string()], ..Files::of(&hub, "host-a") };
    refused(&dir, &files, "harness", &["command", "agent-turn", "not executable", "chmod +x"], true);
    let dir = scratch("unknown-on-path");
    let files = Files { command: vec!["baton-no-such-harness".into()], ..Files::of(&hub, "host-a") };
    refused(&dir, &files, "harness", &["command", "baton-no-such-harness", "not found on PATH"], true);

    // host-a's certificate with host-b's key.
    let dir = scratch("mismatched-key");
    let files = Files { key: hub.identity("host-b").key.clone(), ..Files::of(&hub, "host-a") };
    refused(&dir, &files, "key", &["key_file", "host-b.key", "host-a.crt", "public keys differ"], true);

    // A producer's certificate (and its own key).
    let dir = scratch("producer");
    refused(
        &dir,
        &Files::of(&hub, "prod"),
        "identity",
        &["cert_file", "prod.crt", "producer certificate", "enroll node"],
        true,
    );

    // A node certificate from another CA: same role and name, another issuer.
    let dir = scratch("foreign");
    let foreign = pki::create_ca("not the hub").expect("ca");
    let kind = LeafKind::Client { role: Role::Node, name: "host-a".into(), lifetime: Duration::from_secs(24 * 3600) };
    let leaf = pki::issue(&foreign.cert_pem, &foreign.key_pem, &kind).expect("issue");
    let files = write_leaf(&dir, &hub, &leaf);
    refused(&dir, &files, "ca", &["cert_file", "host-a.crt", "not signed by the CA in ca_file", "ca.crt"], false);

    // An expired certificate of this hub's CA: issued to end now, checked once that has passed
    // (certificate times have one-second resolution).
    let dir = scratch("expired");
    let kind = LeafKind::Client { role: Role::Node, name: "host-a".into(), lifetime: Duration::ZERO };
    let leaf = pki::issue(&hub.ca_pem(), &hub.ca_key_pem(), &kind).expect("issue");
    let files = write_leaf(&dir, &hub, &leaf);
    let ended = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(leaf.not_after_unix).expect("time") + 1);
    baton_testkit::wait::until("the clock to pass not_after", EVENT_WAIT, || {
        Ok((std::time::SystemTime::now() > ended).then_some(()))
    })
    .expect("wait");
    refused(&dir, &files, "ca", &["cert_file", "host-a.crt", "expired on", "baton-hub renew"], false);
}

/// Writes `leaf` as `dir/host-a.crt` and `.key`; the hub's CA stays `ca_file`.
fn write_leaf(dir: &Path, hub: &Hub, leaf: &pki::Issued) -> Files {
    let (cert, key) = (dir.join("host-a.crt"), dir.join("host-a.key"));
    std::fs::write(&cert, &leaf.cert_pem).expect("write cert");
    std::fs::write(&key, &leaf.key_pem).expect("write key");
    Files { cert, key, ..Files::of(hub, "host-a") }
}

/// `--online`: a real hub answers and takes the node's certificate; a closed port is
/// unreachable; the hub refuses a producer's certificate; a `ca_file` that does not hold the
/// hub's CA is a TLS failure. Three different messages, each exit 2.
#[test]
fn config_check_online_tells_a_refusal_an_unreachable_hub_and_a_tls_failure_apart() {
    let hub = Hub::with_nodes(&["host-a"]);

    let dir = hub.scratch("online-good");
    let config = write_config(&dir, &hub.url(), &Files::of(&hub, "host-a"));
    let (code, json, stderr) = check_json(&config, &["--online"]);
    assert_eq!(code, Some(0), "{json:#}\n{stderr}");
    assert_check(&json, "hub", "ok", &[&hub.url(), "accepted this node's certificate"]);
    // Without --online, the hub is not contacted.
    let (_, offline, _) = check_json(&config, &[]);
    assert!(offline["checks"].as_array().expect("checks").iter().all(|c| c["name"] != "hub"), "{offline:#}");

    let dir = hub.scratch("online-closed");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let url = format!("https://{closed}");
    let config = write_config(&dir, &url, &Files::of(&hub, "host-a"));
    let (code, json, stderr) = check_json(&config, &["--online"]);
    assert_eq!(code, USAGE, "{json:#}");
    assert_check(&json, "hub", "fail", &["hub_url", &url, "is unreachable", "cannot connect"]);
    assert!(stderr.contains("is unreachable"), "{stderr}");
    for name in ["files", "harness", "key", "identity", "ca"] {
        assert_check(&json, name, "ok", &[]);
    }

    let dir = hub.scratch("online-producer");
    let config = write_config(&dir, &hub.url(), &Files::of(&hub, "prod"));
    let (code, json, _) = check_json(&config, &["--online"]);
    assert_eq!(code, USAGE, "{json:#}");
    assert_check(&json, "hub", "fail", &["refused this node's certificate", "wrong_role", "enroll node"]);

    let dir = hub.scratch("online-foreign-ca");
    let foreign = pki::create_ca("not the hub").expect("ca");
    let ca = dir.join("other-ca.crt");
    std::fs::write(&ca, &foreign.cert_pem).expect("write ca");
    let config = write_config(&dir, &hub.url(), &Files { ca, ..Files::of(&hub, "host-a") });
    let (code, json, _) = check_json(&config, &["--online"]);
    assert_eq!(code, USAGE, "{json:#}");
    assert_check(
        &json,
        "hub",
        "fail",
        &["TLS with", "server certificate does not verify against ca_file", "other-ca.crt"],
    );
}

/// The workspace root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// README's "Running a node" configuration, copied as an operator copies it with only the
/// paths and the harness changed to this machine's, is a configuration `config check` passes:
/// every key in it exists, none is set twice and every value is in range.
#[test]
fn readmes_node_configuration_passes_config_check() {
    let hub = Hub::builder().nodes(&["host-a"]).stopped().start();
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme.split("## Running a node\n").nth(1).expect("README has \"## Running a node\"");
    let example = section.split("```toml\n").nth(1).and_then(|s| s.split("```").next()).expect("a TOML example");
    let dir = hub.scratch("readme");
    let files = Files::of(&hub, "host-a");
    let quoted = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("json");
    let mut copied = String::new();
    for line in example.lines() {
        let key = line.split('=').next().unwrap_or_default().trim();
        let ours = match key {
            "ca_file" => Some(quoted(&files.ca)),
            "cert_file" => Some(quoted(&files.cert)),
            "key_file" => Some(quoted(&files.key)),
            "data_dir" => Some(quoted(&dir.join("data"))),
            "command" => Some(r#"["sh"]"#.to_string()),
            _ => None,
        };
        match ours {
            Some(value) => copied.push_str(&format!("{key} = {value}\n")),
            None => copied.push_str(&format!("{line}\n")),
        }
    }
    let config = dir.join("node.toml");
    std::fs::write(&config, &copied).expect("write node.toml");
    let out = node(&["config", "check"], &config);
    assert_eq!(out.status.code(), Some(0), "README's node.toml:\n{copied}\n{}{}", text(&out.stdout), text(&out.stderr));
}

/// `run` refused by several failed checks names the first and says where to see the rest:
/// `config check`, since `run` prints no list of checks above its error.
#[test]
fn run_refused_by_several_checks_points_at_config_check() {
    let hub = Hub::builder().nodes(&["host-a"]).stopped().start();
    let dir = hub.scratch("missing-key");
    let files = Files { key: dir.join("host-a.key"), ..Files::of(&hub, "host-a") };
    let config = write_config(&dir, "https://127.0.0.1:9", &files);
    let run = node(&["run"], &config);
    let stderr = text(&run.stderr);
    assert_eq!(run.status.code(), USAGE, "{stderr}");
    assert!(stderr.contains("key_file") && stderr.contains("host-a.key"), "{stderr}");
    assert!(!stderr.contains("above"), "run lists no checks above its error: {stderr}");
    assert!(stderr.contains("1 more failed check") && stderr.contains("baton-node config check"), "{stderr}");
}

/// A configuration file that is not there is named once, with the reason once.
#[test]
fn a_missing_config_file_is_named_with_its_reason_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-node.toml");
    let out = node(&["config", "check"], &missing);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), USAGE, "{stderr}");
    assert!(stderr.contains("no-such-node.toml"), "{stderr}");
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "the reason is given once: {stderr}");
}
