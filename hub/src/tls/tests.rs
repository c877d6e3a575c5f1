//! Tests of the hub's TLS: reloads, bounds, refusals.

use super::accept::{Noted, PerCert, RefusedPeers};
use super::answer431::Answer431;
use super::*;
use crate::datadir::DataDir;
use baton_shared::pki::{self, LeafKind};
use std::net::IpAddr;
use std::time::Duration;

fn write_server_cert(dir: &DataDir, ca: &pki::Issued) -> pki::Issued {
    let kind = LeafKind::Server { hostnames: vec!["localhost".into()], lifetime: pki::SERVER_VALIDITY };
    let leaf = pki::issue(&ca.cert_pem, &ca.key_pem, &kind).unwrap();
    std::fs::write(dir.server_cert(), &leaf.cert_pem).unwrap();
    std::fs::write(dir.server_key(), &leaf.key_pem).unwrap();
    leaf
}

/// A reload serves new files from the next handshake; files that do not load (garbage, or
/// a key that is not the certificate's) leave the current certificate served.
#[test]
fn a_reload_replaces_the_certificate_and_a_bad_one_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = DataDir::new(tmp.path());
    let ca = pki::create_ca("test ca").unwrap();
    let first = write_server_cert(&dir, &ca);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cert = ServerCert::load(&dir, provider).unwrap();
    assert_eq!(cert.facts().serial, first.serial);
    assert_eq!(cert.reload(&dir).unwrap(), Reloaded::Unchanged);

    let second = write_server_cert(&dir, &ca);
    let facts = ServerCertFacts { serial: second.serial.clone(), not_after_unix: second.not_after_unix };
    assert_eq!(cert.reload(&dir).unwrap(), Reloaded::Replaced(facts));
    assert_eq!(cert.facts().serial, second.serial);

    std::fs::write(dir.server_cert(), "not a certificate").unwrap();
    assert!(cert.reload(&dir).is_err());
    std::fs::write(dir.server_cert(), &first.cert_pem).unwrap();
    let e = cert.reload(&dir).unwrap_err();
    assert!(format!("{e:#}").contains("does not match"), "{e:#}");
    assert_eq!(cert.facts().serial, second.serial, "the previous certificate is still served");
}

/// A peer's refusal is logged once per reason and interval, a new reason at once (also when
/// a peer's reasons alternate); past the remembered bound only counted, until the
/// remembered ones age out.
#[test]
fn refused_handshakes_are_logged_once_per_peer_and_reason() {
    let peers = RefusedPeers::default();
    let t0 = std::time::Instant::now();
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    assert_eq!(peers.note(a, "UnknownIssuer", t0), Noted::Log);
    assert_eq!(peers.note(a, "UnknownIssuer", t0 + Duration::from_secs(60)), Noted::Repeat);
    assert_eq!(peers.note(a, "Expired", t0 + Duration::from_secs(61)), Noted::Log);
    assert_eq!(peers.note(a, "UnknownIssuer", t0 + Duration::from_secs(62)), Noted::Repeat, "reasons alternate");
    assert_eq!(peers.note(a, "Expired", t0 + HANDSHAKE_REASON_REPEAT + Duration::from_secs(62)), Noted::Log);
    for i in 2..HANDSHAKE_PEERS_REMEMBERED_MAX {
        let ip = IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
        assert_eq!(peers.note(ip, "x", t0), Noted::Log);
    }
    let late: IpAddr = "10.9.9.9".parse().unwrap();
    assert_eq!(peers.note(late, "x", t0 + Duration::from_secs(1)), Noted::Full, "the table is bounded");
    assert_eq!(peers.note(late, "x", t0 + HANDSHAKE_REASON_REPEAT + Duration::from_secs(1)), Noted::Log);
    assert!(peers.seen.lock().unwrap().len() <= HANDSHAKE_PEERS_REMEMBERED_MAX);
}

/// hyper's bodiless 431 gets the JSON body; earlier bytes in the same write go first,
/// unchanged; other answers pass through.
#[tokio::test]
async fn a_431_answer_gets_its_json_body() {
    use tokio::io::AsyncWriteExt;
    let (client, mut server) = tokio::io::duplex(1 << 16);
    let mut io = Answer431::new(client);
    let before = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let hyper =
        b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
    io.write_all(&[&before[..], &hyper[..]].concat()).await.unwrap();
    io.shutdown().await.unwrap();
    let mut seen = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut server, &mut seen).await.unwrap();
    let (ok, rest) = seen.split_at(before.len());
    assert_eq!(ok.as_bytes(), before);
    let (head, body) = rest.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 431 ") && head.contains("content-type: application/json"), "{head}");
    assert!(head.contains(&format!("content-length: {}", body.len())) && !head.contains("content-length: 0"), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["code"], "headers_too_large");
    assert!(v["message"].as_str().unwrap().contains("100 fields"), "{v}");
}

/// A certificate gets at most its slots; a slot left is free again, and the table forgets
/// a certificate with no connection.
#[test]
fn per_cert_slots_are_bounded_and_freed() {
    let table = Arc::new(PerCert::default());
    let a1 = PerCert::enter(&table, b"a".to_vec(), 2).unwrap();
    let _a2 = PerCert::enter(&table, b"a".to_vec(), 2).unwrap();
    assert!(PerCert::enter(&table, b"a".to_vec(), 2).is_none());
    let b = PerCert::enter(&table, b"b".to_vec(), 2).unwrap();
    drop(a1);
    assert!(PerCert::enter(&table, b"a".to_vec(), 2).is_some());
    drop(b);
    assert!(!table.open.lock().unwrap().contains_key(b"b".as_slice()));
}
