use super::*;
use crate::error::ApiError;
use baton_shared::wire::Payload;

fn req(conversation: &str, key: &str, payload: &str) -> SubmitRequest {
    SubmitRequest {
        conversation: conversation.into(),
        idempotency_key: key.into(),
        payload: Payload::from_text(payload.into()).unwrap(),
        to: Some(vec!["host-a".into()]),
        pools: None,
        max_attempts: None,
        retry_backoff_ms: None,
        approval: None,
        approval_timeout_ms: None,
        deadline_ms: None,
        stall_ms: None,
    }
}

fn open(dir: &Path) -> Spool {
    Spool::open(dir, SpoolLimits::default()).unwrap()
}

/// The keys `next_ready` hands out when each is confirmed in turn.
fn drain(s: &mut Spool) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(r) = s.next_ready().unwrap() {
        assert!(s.confirmed(r.position).unwrap());
        out.push(r.request.idempotency_key);
    }
    out
}

#[test]
fn messages_go_in_the_order_they_were_spooled_and_keep_their_exact_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let payload = r#"{"n": 1.50, "big": 12345678901234567890123}"#;
    for (c, k) in [("c1", "k1"), ("c2", "k2"), ("c1", "k3")] {
        let spooled = s.push(&req(c, k, payload), 1_000).unwrap();
        assert!(!spooled.already);
    }
    let first = s.next_ready().unwrap().unwrap();
    assert_eq!(first.request.payload.as_str(), payload, "the payload's exact text");
    assert_eq!(first.request.to.as_deref(), Some(&["host-a".to_string()][..]));
    assert_eq!(drain(&mut s), ["k1", "k2", "k3"]);
}

#[test]
fn a_message_stays_until_the_hub_confirmed_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let p = s.push(&req("c", "k1", "{}"), 1_000).unwrap().position;
    s.push(&req("c", "k2", "{}"), 1_001).unwrap();
    s.tried(p, "hub unreachable: connection refused", 2_000).unwrap();
    s.tried(p, "hub unreachable: connection refused", 3_000).unwrap();
    assert_eq!(s.next_ready().unwrap().unwrap().position, p, "a failed try keeps its place");
    let st = s.status().unwrap();
    assert_eq!((st.waiting, st.oldest_spooled_at_ms), (2, Some(1_000)));
    assert_eq!(st.last_error, Some((3_000, "hub unreachable: connection refused".to_string())));
    // Closed and opened again (a crash after the commit): everything is still there.
    drop(s);
    let mut s = open(dir.path());
    assert_eq!(drain(&mut s), ["k1", "k2"]);
    assert!(!s.confirmed(p).unwrap(), "confirming twice removes nothing");
    assert_eq!(s.status().unwrap().waiting, 0);
}

#[test]
fn positions_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let a = s.push(&req("c", "k1", "{}"), 1).unwrap().position;
    assert!(s.confirmed(a).unwrap());
    let b = s.push(&req("c", "k2", "{}"), 2).unwrap().position;
    assert!(b > a, "{b} after {a}");
}

#[test]
fn the_same_key_is_spooled_once_and_other_content_under_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let first = s.push(&req("c", "k1", "{}"), 1).unwrap();
    let again = s.push(&req("c", "k1", "{}"), 2).unwrap();
    assert!(again.already && again.position == first.position);
    let e = s.push(&req("c", "k1", "[1]"), 3).unwrap_err();
    assert!(matches!(e, SpoolError::KeyConflict { .. }) && e.to_string().contains("k1"), "{e}");
    assert_eq!(s.keys().unwrap().len(), 1);
}

#[test]
fn a_refused_message_blocks_its_conversation_only_until_discarded_or_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let bad = s.push(&req("c1", "k1", "{}"), 1).unwrap().position;
    s.push(&req("c2", "k2", "{}"), 2).unwrap();
    s.push(&req("c1", "k3", "{}"), 3).unwrap();
    let ready = s.next_ready().unwrap().unwrap();
    assert_eq!(ready.position, bad);
    assert!(s.failed(bad, 403, "forbidden", "outside the publish scope", 4).unwrap());
    assert!(!s.confirmed(bad).unwrap(), "a failed message is not removed by a confirmation");
    // c2 goes on; c1's later message waits behind the failed one.
    assert_eq!(drain(&mut s), ["k2"]);
    let st = s.status().unwrap();
    assert_eq!((st.waiting, st.blocked), (1, 1));
    assert_eq!(st.failed.len(), 1);
    assert_eq!((st.failed[0].position, st.failed[0].status, st.failed[0].code.as_str()), (bad, 403, "forbidden"));
    // Retried, it goes first again; failed again and discarded, the one behind it goes.
    s.retry(bad).unwrap();
    assert_eq!(s.next_ready().unwrap().unwrap().position, bad);
    assert!(s.failed(bad, 400, "invalid_field", "bad", 5).unwrap());
    assert!(matches!(s.discard(bad + 100), Err(SpoolError::NotFailed { .. })));
    let waiting = s.next_ready().unwrap();
    assert!(waiting.is_none(), "k3 waits behind k1: {waiting:?}");
    s.discard(bad).unwrap();
    assert_eq!(drain(&mut s), ["k3"]);
    assert!(matches!(s.discard(bad), Err(SpoolError::NotFailed { .. })));
}

#[test]
fn a_full_spool_refuses_the_message_naming_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spool::open(dir.path(), SpoolLimits { messages_max: 2, bytes_max: 10_000 }).unwrap();
    s.push(&req("c", "k1", "{}"), 1).unwrap();
    s.push(&req("c", "k2", "{}"), 2).unwrap();
    let e = s.push(&req("c", "k3", "{}"), 3).unwrap_err();
    assert!(matches!(e, SpoolError::Full { .. }) && e.to_string().contains("spool_messages_max is 2"), "{e}");
    // A key already spooled is no new message: still answered.
    assert!(s.push(&req("c", "k2", "{}"), 4).unwrap().already);
    assert_eq!(s.keys().unwrap().len(), 2);
    drop(s);

    let mut s = Spool::open(dir.path(), SpoolLimits { messages_max: 100, bytes_max: 300 }).unwrap();
    let big = format!("\"{}\"", "x".repeat(200));
    let e = s.push(&req("c", "k4", &big), 5).unwrap_err();
    assert!(e.to_string().contains("spool_bytes_max is 300"), "{e}");
    assert_eq!(s.keys().unwrap().len(), 2, "nothing was spooled");
    assert!(Spool::open(dir.path(), SpoolLimits { messages_max: 0, bytes_max: 1 }).is_err());
}

#[test]
fn the_spool_is_durable_and_its_pragmas_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let read = |p: &str| s.conn().query_row(&format!("PRAGMA {p}"), [], |r| r.get::<_, rusqlite::types::Value>(0));
    assert_eq!(read("journal_mode").unwrap(), rusqlite::types::Value::Text("wal".into()));
    assert_eq!(read("synchronous").unwrap(), rusqlite::types::Value::Integer(2), "FULL");
    assert_eq!(read("user_version").unwrap(), rusqlite::types::Value::Integer(MIGRATIONS.len() as i64));
}

#[test]
fn a_damaged_or_newer_spool_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(SPOOL_FILE);
    std::fs::write(&file, b"this is not a database, just some bytes that are long enough to be a header....").unwrap();
    let e = Spool::open(dir.path(), SpoolLimits::default()).unwrap_err();
    assert!(e.is_refused() && e.to_string().contains(&file.display().to_string()), "{e}");
    assert!(e.to_string().contains("damaged"), "{e}");

    let newer = tempfile::tempdir().unwrap();
    drop(open(newer.path()));
    let path = newer.path().join(SPOOL_FILE);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let e = Spool::open(newer.path(), SpoolLimits::default()).unwrap_err();
    let text = e.to_string();
    assert!(e.is_refused() && text.contains(&path.display().to_string()) && text.contains("newer"), "{text}");
    let e = Spool::open_read_only(newer.path(), SpoolLimits::default()).unwrap_err();
    assert!(e.to_string().contains("newer"), "{e}");
    let e = Spool::open_read_only(&newer.path().join("absent"), SpoolLimits::default()).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn a_row_that_does_not_parse_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let p = s.push(&req("c", "k1", "{}"), 1).unwrap().position;
    s.conn().execute("UPDATE spool SET request = 'nope' WHERE position = ?1", [p]).unwrap();
    let e = s.next_ready().unwrap_err();
    assert!(e.is_refused() && e.to_string().contains(&format!("position {p}")), "{e}");
}

#[test]
fn what_the_hub_refuses_for_good_is_told_apart() {
    let api = |status: u16| {
        ClientError::Api(ApiError { status, code: None, code_text: String::new(), message: String::new() })
    };
    for (status, message, identity) in [
        (400, true, false),
        (403, true, false),
        (409, true, false),
        (413, true, false),
        (401, false, true),
        (408, false, false),
        (429, false, false),
        (500, false, false),
        (503, false, false),
    ] {
        assert_eq!(refuses_message(&api(status)), message, "{status}");
        assert_eq!(refuses_identity(&api(status)), identity, "{status}");
    }
    let lost = ClientError::Transport { detail: "reset".into(), maybe_sent: true };
    assert!(!refuses_message(&lost) && !refuses_identity(&lost));
}
