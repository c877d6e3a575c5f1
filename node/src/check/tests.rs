//! Tests of `config check`.

use super::online::{Failure, answered, combined, rustls_error, tls_failure};
use super::*;
use crate::config::Harness;
use crate::config::Layer;
use baton_shared::ids::Role;
use baton_shared::pki::{self, Issued, LeafKind};
use rustls::{AlertDescription, CertificateError};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

const DAY_MS: i64 = 24 * 3600 * 1000;

/// A directory with a CA, and a config whose files and command the test points anywhere.
struct Setup {
    dir: tempfile::TempDir,
    ca: Issued,
}

impl Setup {
    fn new() -> Setup {
        Setup { dir: tempfile::tempdir().unwrap(), ca: pki::create_ca("test ca").unwrap() }
    }

    fn leaf(&self, role: Role, name: &str) -> Issued {
        let kind = LeafKind::Client { role, name: name.into(), lifetime: pki::LEAF_VALIDITY_DEFAULT };
        pki::issue(&self.ca.cert_pem, &self.ca.key_pem, &kind).unwrap()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A config with `ca.crt`, `cert` and `key` from the directory and `command`.
    fn config(&self, cert: &str, key: &str, command: &str) -> NodeConfig {
        let ca = self.write("ca.crt", &self.ca.cert_pem);
        let mut layer = Layer::default();
        let d = |n: &str| self.dir.path().join(n).display().to_string();
        for (k, v) in [
            ("hub_url", "https://127.0.0.1:1".to_string()),
            ("ca_file", ca.display().to_string()),
            ("cert_file", d(cert)),
            ("key_file", d(key)),
            ("data_dir", d("data")),
            ("command", command.to_string()),
        ] {
            layer.set(k, &v).unwrap();
        }
        NodeConfig::validate(layer).unwrap()
    }

    /// A config of the node `host-a`, valid in every way.
    fn good(&self) -> (NodeConfig, Issued) {
        let leaf = self.leaf(Role::Node, "host-a");
        self.write("n.crt", &leaf.cert_pem);
        self.write("n.key", &leaf.key_pem);
        (self.config("n.crt", "n.key", "sh"), leaf)
    }
}

fn find<'a>(report: &'a Report, name: &str) -> &'a Check {
    report.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no {name} in {report:?}"))
}

#[track_caller]
fn check(report: &Report, name: &str, status: Status, says: &[&str]) {
    let c = find(report, name);
    assert_eq!(c.status, status, "{c:?}");
    for s in says {
        assert!(c.detail.contains(s), "{name}: {:?} does not contain {s:?}", c.detail);
    }
}

#[test]
fn a_good_config_passes_every_check_and_run_starts() {
    let s = Setup::new();
    let (config, leaf) = s.good();
    let report = offline(&config, baton_shared::clock::system_now_ms());
    assert!(report.ok(), "{report:?}");
    let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
    assert_eq!(names, ["files", "harness", "key", "identity", "ca"]);
    check(&report, "identity", Status::Ok, &["host-a", &leaf.serial]);
    check(&report, "harness", Status::Ok, &["on PATH"]);
    assert!(report.error().is_none());
    before_run(&config).unwrap();
    let json = report.json();
    assert_eq!(json["ok"], true);
    assert_eq!(
        json["checks"][0],
        serde_json::json!({"name": "files", "status": "ok", "detail": report.checks[0].detail})
    );
    assert!(report.human(&config).contains("\nconfiguration is valid (hub https://127.0.0.1:1"));
}

/// The validity window by the injected clock: expired and not yet valid are two messages, and
/// a certificate ending within `EXPIRY_WARNING` is a warning that passes.
#[test]
fn validity_is_judged_at_the_time_given() {
    let s = Setup::new();
    let (config, leaf) = s.good();
    let end_ms = leaf.not_after_unix * 1000;
    let at = |now_ms: i64| offline(&config, now_ms);
    let expired = at(end_ms + 3 * DAY_MS);
    check(&expired, "ca", Status::Fail, &["cert_file", "expired on", "3days ago", "baton-hub renew"]);
    assert!(!expired.ok());
    let early = at(end_ms - 400 * DAY_MS);
    check(&early, "ca", Status::Fail, &["cert_file", "not valid yet", "clock"]);
    let soon = at(end_ms - 10 * DAY_MS);
    check(&soon, "ca", Status::Warn, &["expires on", "10days", "renew"]);
    assert!(soon.ok(), "a warning passes");
    check(&at(end_ms - 31 * DAY_MS), "ca", Status::Ok, &["valid until"]);
    // Validity is the hub's to judge at run time (a renewal arrives by SIGHUP).
    before_run(&config).unwrap();
}

#[test]
fn a_key_of_another_certificate_is_named() {
    let s = Setup::new();
    let (_, _) = s.good();
    let other = s.leaf(Role::Node, "host-b");
    s.write("other.key", &other.key_pem);
    let config = s.config("n.crt", "other.key", "sh");
    let report = offline(&config, baton_shared::clock::system_now_ms());
    check(&report, "key", Status::Fail, &["key_file", "other.key", "n.crt", "public keys differ"]);
    let e = before_run(&config).unwrap_err().to_string();
    assert!(e.starts_with("key_file: ") && e.contains("other.key"), "{e}");
}

#[test]
fn a_producer_certificate_or_one_without_identity_is_refused() {
    let s = Setup::new();
    let prod = s.leaf(Role::Producer, "prod");
    s.write("p.crt", &prod.cert_pem);
    s.write("p.key", &prod.key_pem);
    let config = s.config("p.crt", "p.key", "sh");
    let report = offline(&config, baton_shared::clock::system_now_ms());
    check(
        &report,
        "identity",
        Status::Fail,
        &["cert_file", "producer certificate", "urn:baton:producer:prod", "enroll node"],
    );
    check(&report, "key", Status::Ok, &[]);
    let e = before_run(&config).unwrap_err();
    assert!(matches!(e, ConfigError::Check { field: "cert_file", .. }), "{e}");

    let server = pki::issue(
        &s.ca.cert_pem,
        &s.ca.key_pem,
        &LeafKind::Server { hostnames: vec!["localhost".into()], lifetime: pki::SERVER_VALIDITY },
    )
    .unwrap();
    s.write("s.crt", &server.cert_pem);
    s.write("s.key", &server.key_pem);
    let report = offline(&s.config("s.crt", "s.key", "sh"), baton_shared::clock::system_now_ms());
    check(&report, "identity", Status::Fail, &["carries no Baton identity"]);
}

#[test]
fn a_certificate_of_another_ca_does_not_verify() {
    let s = Setup::new();
    let foreign = Setup::new();
    let leaf = foreign.leaf(Role::Node, "host-a");
    s.write("f.crt", &leaf.cert_pem);
    s.write("f.key", &leaf.key_pem);
    let report = offline(&s.config("f.crt", "f.key", "sh"), baton_shared::clock::system_now_ms());
    check(&report, "ca", Status::Fail, &["cert_file", "f.crt", "not signed by the CA in ca_file", "ca.crt"]);
    check(&report, "identity", Status::Ok, &[]);
}

#[test]
fn unreadable_files_are_named_and_the_checks_needing_them_say_so() {
    let s = Setup::new();
    s.write("junk.crt", "not pem\n");
    let config = s.config("junk.crt", "missing.key", "sh");
    let report = offline(&config, baton_shared::clock::system_now_ms());
    check(
        &report,
        "files",
        Status::Fail,
        &["cert_file", "junk.crt", "holds no PEM certificate", "key_file", "missing.key"],
    );
    check(&report, "key", Status::Fail, &["not checked", "cert_file"]);
    let e = before_run(&config).unwrap_err().to_string();
    assert!(e.starts_with("cert_file: ") && e.contains("and 2 more failed checks"), "{e}");
}

#[test]
fn the_harness_program_is_found_as_the_node_finds_it() {
    let s = Setup::new();
    s.good();
    let script = s.write("harness", "#!/bin/sh\n");
    let at = |command: &str| {
        let report = offline(&s.config("n.crt", "n.key", command), baton_shared::clock::system_now_ms());
        find(&report, "harness").clone()
    };
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = script.display().to_string();
    let c = at(&path);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("is not executable by this user") && c.detail.contains(&path), "{c:?}");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(at(&path).status, Status::Ok);
    let missing = at(&s.dir.path().join("nope").display().to_string());
    assert!(missing.status == Status::Fail && missing.detail.contains("does not exist"), "{missing:?}");
    let dir = at(&s.dir.path().display().to_string());
    assert!(dir.status == Status::Fail && dir.detail.contains("is a directory"), "{dir:?}");
    let unknown = at("baton-no-such-harness");
    assert!(unknown.status == Status::Fail && unknown.detail.contains("not found on PATH"), "{unknown:?}");
    assert_eq!(at("sh").status, Status::Ok);
    let relative = at("./no-such-harness");
    assert!(relative.detail.contains("relative to the working directory"), "{relative:?}");
}

#[test]
fn the_noop_harness_needs_no_program() {
    let s = Setup::new();
    let (config, _) = s.good();
    let noop = NodeConfig { harness: Harness::Noop, command: Vec::new(), ..config };
    check(&offline(&noop, baton_shared::clock::system_now_ms()), "harness", Status::Ok, &["noop"]);
}

/// What the hub answered the holdings read, told apart.
#[test]
fn the_hub_answers_are_read() {
    let s = Setup::new();
    let (config, _) = s.good();
    let url = "https://127.0.0.1:1";
    let ok = answered(url, 200, br#"{"deliveries": []}"#);
    assert_eq!(ok.status, Status::Ok, "{ok:?}");
    let producer = answered(
        url,
        403,
        br#"{"code": "wrong_role", "message": "a producer certificate may not use node endpoints"}"#,
    );
    assert!(
        producer.status == Status::Fail
            && producer.detail.contains("refused this node's certificate")
            && producer.detail.contains("enroll node"),
        "{producer:?}"
    );
    let revoked = answered(url, 401, br#"{"code": "certificate_revoked", "message": "revoked"}"#);
    assert!(
        revoked.detail.contains("refused this node's certificate") && revoked.detail.contains("renew"),
        "{revoked:?}"
    );
    let busy = answered(url, 503, b"\x1b[2Jnot ready");
    assert!(busy.status == Status::Fail && busy.detail.contains("could not serve the check"), "{busy:?}");
    let shown = Report { checks: vec![busy] }.human(&config);
    assert!(!shown.contains('\x1b') && shown.contains("\\u{1b}[2J"), "{shown}");
    let other = answered(url, 200, b"<html>");
    assert!(other.status == Status::Fail && other.detail.contains("not as a Baton hub does"), "{other:?}");
}

/// The TLS connector wraps the handshake's error in two io::Errors; the rustls error inside
/// decides between a refused certificate and a TLS failure.
#[test]
fn a_handshake_failure_is_found_inside_its_io_errors_and_told_apart() {
    let s = Setup::new();
    let (config, _) = s.good();
    let wrapped = |e: rustls::Error| std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    let server = wrapped(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer));
    let found = rustls_error(&server).unwrap();
    let (failure, why) = tls_failure(&config, found);
    assert!(failure == Failure::Tls && why.contains("server certificate does not verify"), "{why}");
    let refused = wrapped(rustls::Error::AlertReceived(AlertDescription::CertificateRequired));
    let (failure, why) = tls_failure(&config, rustls_error(&refused).unwrap());
    assert!(failure == Failure::Refused && why.contains("CertificateRequired"), "{why}");
    assert!(rustls_error(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)).is_none());
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let s = Setup::new();
    let (config, _) = s.good();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let hub_url = format!("https://127.0.0.1:{port}").parse().unwrap();
    let config = NodeConfig { hub_url, ..config };
    let c = online(&config).await;
    assert!(
        c.status == Status::Fail && c.detail.contains("is unreachable") && c.detail.contains("cannot connect"),
        "{c:?}"
    );
    // Every hub of a list is contacted and named, in order.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let hub_url = format!("https://127.0.0.1:{port},https://localhost:{other}").parse().unwrap();
    let c = online(&NodeConfig { hub_url, ..config }).await;
    let (first, second) = (
        format!("[1] the hub at https://127.0.0.1:{port} is unreachable"),
        format!("[2] the hub at https://localhost:{other} is unreachable"),
    );
    assert!(c.status == Status::Fail && c.detail.starts_with("hub_url: 0 of 2 hubs answered: "), "{c:?}");
    assert!(c.detail.contains(&first) && c.detail.contains(&second), "{c:?}");
}

/// Several hubs' verdicts make one check that says which answered: a standby that does not
/// answer is a warning while another answers; a hub refusing the certificate fails.
#[test]
fn several_hubs_are_judged_together() {
    let ok = |url: &str| (answered(url, 200, br#"{"deliveries": []}"#), false);
    let down = |url: &str| {
        let check = Check::new("hub", Status::Fail, "hub_url", Failure::Unreachable.lead(url));
        (check, true)
    };
    let refused = |url: &str| (answered(url, 401, br#"{"code": "certificate_revoked", "message": "r"}"#), false);
    let (a, b) = ("https://a:1", "https://b:1");
    let c = combined(vec![ok(a), down(b)]);
    assert_eq!((c.status, c.field), (Status::Warn, "hub_url"), "{c:?}");
    assert!(c.detail.starts_with("hub_url: 1 of 2 hubs answered: [1] the hub at https://a:1 answered"), "{c:?}");
    assert!(c.detail.contains("[2] the hub at https://b:1 is unreachable"), "{c:?}");
    assert_eq!(combined(vec![ok(a), ok(b)]).status, Status::Ok);
    assert_eq!(combined(vec![down(a), down(b)]).status, Status::Fail);
    let c = combined(vec![ok(a), refused(b)]);
    assert_eq!((c.status, c.field), (Status::Fail, "cert_file"), "{c:?}");
    // One hub: its own verdict, worded as ever.
    assert_eq!(combined(vec![down(a)]), down(a).0);
}
