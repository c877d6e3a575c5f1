//! Every text the store keeps comes back as it was given, on both backends (the PostgreSQL run
//! of the store tests repeats these): NUL, which PostgreSQL's `text` cannot hold, the character
//! its store writes NUL with, and texts of a mebibyte. A value is never a storage error.

use super::engine::{Db, PG_TEXT_ESCAPE};
use super::lifecycle::accept::testing::accept_one;
use super::lifecycle::claim;
use super::lifecycle::report::{self, NewReport};
use super::lifecycle::transition::Holder;
use super::lifecycle::turns;
use super::registry::fences::{self, FenceKind, FenceScope, NewFence};
use super::registry::instances::RebindLimit;
use super::registry::sessions;
use super::views::{fleet, read};
use super::{StoreError, testing};
use crate::store::engine::params;
use baton_shared::states::Outcome;
use baton_shared::wire::ClaimedDelivery;

const LIMITS: super::lifecycle::accept::AcceptLimits =
    super::lifecycle::accept::AcceptLimits { queued_per_host_max: 1 << 40, queued_per_pool_max: 1 << 40 };

/// Texts a backend could mangle: NUL alone, inside and at the ends, the escape character and
/// what it escapes with, both mixed, characters of every UTF-8 length, and a mebibyte of them.
fn hostile() -> Vec<String> {
    let e = PG_TEXT_ESCAPE;
    let mut v: Vec<String> = vec![
        "\0".into(),
        "a\0b".into(),
        "\0\0end".into(),
        "start\0".into(),
        e.to_string(),
        format!("{e}0"),
        format!("{e}{e}"),
        format!("x{e}\0{e}0\0{e}"),
        "é\0😀\u{1}\u{7f}\u{fffd}".into(),
    ];
    let unit = format!("hello\0world{e} é😀 ");
    v.push(unit.repeat((1 << 20) / unit.len() + 1));
    v
}

/// What a text is, for a message that must not print a mebibyte.
fn shown(s: &str) -> String {
    let head: String = s.chars().take(24).collect();
    format!("{head:?}… ({} bytes)", s.len())
}

fn same(what: &str, got: Option<&str>, sent: &str) {
    assert!(got == Some(sent), "{what}: sent {}, read {:?}", shown(sent), got.map(shown));
}

/// Through the connection itself: stored, read back, found by equality, concatenated, and
/// ordered as the bytes are.
#[test]
fn every_text_round_trips_through_the_connection() {
    let db = testing::db();
    let c: &dyn Db = &*db.conn;
    c.execute_batch("CREATE TEMP TABLE text_probe (n INTEGER, v TEXT)").unwrap();
    for (n, v) in hostile().iter().enumerate() {
        c.execute("INSERT INTO text_probe (n, v) VALUES ($1, $2)", params![n as i64, v])
            .unwrap_or_else(|e| panic!("storing {}: {e}", shown(v)));
        let back: String = c.query_row("SELECT v FROM text_probe WHERE n = $1", [n as i64], |r| r.get(0)).unwrap();
        same("read back", Some(&back), v);
        let found: i64 =
            c.query_row("SELECT n FROM text_probe WHERE v = $1", [v], |r| r.get(0)).expect("found by equality");
        assert_eq!(found, n as i64, "{}", shown(v));
        let joined: String =
            c.query_row("SELECT v || $2 FROM text_probe WHERE n = $1", params![n as i64, v], |r| r.get(0)).unwrap();
        same("concatenated", Some(&joined), &format!("{v}{v}"));
        let param: String = c.query_row("SELECT $1", [v], |r| r.get(0)).unwrap();
        same("a parameter read back", Some(&param), v);
    }
}

/// Through the store's operations, every text a node, a producer or an operator hands in: a
/// node version, a reject reason, a report's result, reason and stderr tail, a producer's cancel reason, a
/// fence's reason, an operator event's reason; each read back as it was sent.
#[test]
fn every_stored_text_field_keeps_its_bytes() {
    let db = testing::db();
    let c: &dyn Db = &*db.conn;
    for (n, v) in hostile().iter().enumerate() {
        let instance = format!("i{n}");
        let opened =
            sessions::open(c, "host-a", &instance, Some(v), RebindLimit { max: 1000, ..Default::default() }, 15_000, 1);
        opened.unwrap_or_else(|e| panic!("node_version {}: {e}", shown(v)));
        let session = fleet::host(c, "host-a").unwrap().expect("host-a").host.session.expect("a session");
        same("node_version", session.node_version.as_deref(), v);

        let rejected = accept_one(c, "conv", &format!("rej{n}"), &["host-a"]);
        let reported = accept_one(c, "conv", &format!("rep{n}"), &["host-a"]);
        let cancelled = accept_one(c, "other", &format!("can{n}"), &["host-b"]);
        let claimed = claim::claim(c, "host-a", &instance, 8, 2).unwrap();
        let of = |m: &str| claimed.iter().find(|d| d.message_id == m).expect("claimed").clone();
        let (r, d) = (of(&rejected), of(&reported));
        fn holder<'a>(instance: &'a str, d: &'a ClaimedDelivery) -> Holder<'a> {
            Holder { instance_id: instance, claim_token: &d.claim_token }
        }
        crate::store::lifecycle::handoff::reject(c, "host-a", &r.delivery_id, holder(&instance, &r), v, 3)
            .unwrap_or_else(|e| panic!("reject {}: {e}", shown(v)));
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &d.delivery_id, holder(&instance, &d), 3).unwrap();
        crate::store::lifecycle::handoff::ack(c, "host-a", &d.delivery_id, holder(&instance, &d), 3).unwrap();
        let report = NewReport {
            delivery_id: &d.delivery_id,
            holder: holder(&instance, &d),
            report_id: &format!("r{n}"),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(1),
            result: Some(v),
            reason: Some(v),
            stderr_tail: Some(v),
            stderr_dropped_bytes: Some(7),
        };
        // Every byte of the stderr tail kept, however long, to see each come back.
        let whole = report::RunReport { stderr_tail_bytes_max: u64::MAX, ..Default::default() };
        report::report_run(c, "host-a", &report, &whole, 4).unwrap_or_else(|e| panic!("report {}: {e}", shown(v)));
        // The replay is recognised as the same report (its hash is over the same bytes).
        let (_, duplicate, _) = report::report_run(c, "host-a", &report, &whole, 5).unwrap();
        assert!(duplicate, "the replay of a report with {} is the same report", shown(v));
        turns::cancel_message(c, &cancelled, "prod", v, 5).unwrap_or_else(|e| panic!("cancel {}: {e}", shown(v)));

        let view = read::message_view(c, &rejected).unwrap();
        same("reject reason", view.deliveries[0].reason.as_deref(), &format!("rejected by node: {v}"));
        let view = read::message_view(c, &reported).unwrap();
        let attempt = &view.deliveries[0].attempts[0];
        same("result", attempt.result.as_deref(), v);
        same("report reason", attempt.reason.as_deref(), v);
        same("stderr tail", attempt.stderr_tail.as_deref(), v);
        assert_eq!(attempt.stderr_dropped_bytes, Some(7));
        let view = read::message_view(c, &cancelled).unwrap();
        same("cancel reason", view.deliveries[0].cancel_reason.as_deref(), v);

        let fence = NewFence {
            kind: FenceKind::Pause,
            scope: FenceScope::Conversation,
            target: Some("fenced"),
            operator: "op",
            reason: v,
        };
        let id = fences::set(c, fence, 6).unwrap_or_else(|e| panic!("fence reason {}: {e}", shown(v)));
        fences::lift(c, id, "op", v, 7).unwrap_or_else(|e| panic!("lift reason {}: {e}", shown(v)));
        let row = fences::list(c, true).unwrap().into_iter().find(|f| f.id == id).expect("the fence");
        same("fence reason", Some(&row.reason), v);
        let lifted: Option<String> =
            c.query_row("SELECT lifted_reason FROM fences WHERE id = $1", [id], |r| r.get(0)).unwrap();
        same("lift reason", lifted.as_deref(), v);
        crate::store::registry::audit::record_operator_event(c, "probe", &format!("s{n}"), "op", Some(v), 8).unwrap();
        let stored: Option<String> = c
            .query_row("SELECT reason FROM operator_events WHERE subject = $1", [format!("s{n}")], |r| r.get(0))
            .unwrap();
        same("operator event reason", stored.as_deref(), v);
    }
}

/// An approval's reason, and the delivery reason that quotes it, keep their bytes.
#[test]
fn an_approval_reason_keeps_its_bytes() {
    use super::lifecycle::accept::{NewMessage, RetryPolicy, accept_and_fan_out};
    use super::lifecycle::approval::{Decider, Decision, decide};
    let db = testing::db();
    let c: &dyn Db = &*db.conn;
    for (n, v) in hostile().iter().enumerate() {
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "approve".into(),
            idempotency_key: format!("a{n}"),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        };
        let policy = RetryPolicy { approval_required: true, ..RetryPolicy::default() };
        let (accepted, deliveries) = accept_and_fan_out(c, &msg, policy, LIMITS, 1).unwrap();
        let super::lifecycle::accept::Accepted::New { message_id, .. } = accepted else { panic!("new") };
        decide(c, &message_id, Decider::Operator("op"), Decision::Reject, v, 2)
            .unwrap_or_else(|e| panic!("approval reason {}: {e}", shown(v)));
        let stored: Option<String> =
            c.query_row("SELECT approval_reason FROM messages WHERE id = $1", [&message_id], |r| r.get(0)).unwrap();
        same("approval reason", stored.as_deref(), v);
        let view = read::message_view(c, &message_id).unwrap();
        assert_eq!(view.deliveries[0].delivery_id, deliveries[0].delivery_id);
        same("rejection reason", view.deliveries[0].reason.as_deref(), &format!("rejected by operator:op: {v}"));
    }
}

/// What the store refuses for a value it cannot keep is never a storage failure: a text that is
/// not a string of the payload's JSON (a lone surrogate escape) is refused as the field's.
#[test]
fn a_payload_with_a_lone_surrogate_is_refused_as_invalid_on_both_backends() {
    let db = testing::db();
    let c: &dyn Db = &*db.conn;
    let msg = super::lifecycle::accept::NewMessage {
        traceparent: None,
        producer: "prod".into(),
        conversation: "conv".into(),
        idempotency_key: "k".into(),
        payload: r#"{"x":"\ud800"}"#.into(),
        to: vec!["host-a".into()],
        pools: Vec::new(),
    };
    let e = super::lifecycle::accept::accept(c, &msg, LIMITS, 1).expect_err("a lone surrogate is refused");
    assert!(matches!(&e, StoreError::Invalid(m) if m.starts_with("payload")), "{e:?}");
    let msg = super::lifecycle::accept::NewMessage { payload: r#"{"x":"\u0000\ud83d\ude00"}"#.into(), ..msg };
    super::lifecycle::accept::accept(c, &msg, LIMITS, 1).expect("NUL and a surrogate pair escaped are JSON");
}
