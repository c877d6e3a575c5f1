//! The client against the real `baton-hub` (started by the test kit with its own CA and
//! enrolled certificates): every producer call and the node calls of one turn, with refusals
//! typed by their error codes and transport failures kept apart.

use baton_client::{Client, ClientError, RetryPolicy, TlsFiles};
use baton_shared::error::ErrorCode;
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::wire::{Payload, ReportRequest, StartItem, SubmitRequest};
use baton_testkit::{Binaries, Hub, Identity, Role, Started};
use std::time::{Duration, Instant};

/// A running hub with the node host `host-a` and the producers `prod` and `other`.
fn hub(root: &std::path::Path) -> Hub {
    let bins = Binaries::build().unwrap();
    let mut hub = Hub::init(&bins, root, "client-tests").unwrap();
    hub.enroll(Role::Node, "host-a").unwrap();
    hub.enroll(Role::Producer, "prod").unwrap();
    hub.enroll(Role::Producer, "other").unwrap();
    match hub.serve(None).unwrap() {
        Started::Ready(_) => hub,
        Started::Exited(status) => panic!("the hub exited: {status}"),
    }
}

fn files(id: &Identity) -> TlsFiles {
    TlsFiles { ca_file: id.ca.clone(), cert_file: id.cert.clone(), key_file: id.key.clone() }
}

fn client(hub: &Hub, name: &str) -> Client {
    let url = format!("https://{}", hub.addr().unwrap());
    Client::new(&url, &files(hub.identity(name).unwrap())).unwrap()
}

fn submit(key: &str, payload: &str) -> SubmitRequest {
    SubmitRequest {
        conversation: "support".into(),
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

fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A producer submits, reads by id and by key, waits, and sees a turn the node side of the
/// client claims, mirrors, acks, starts and reports end as `succeeded`.
#[test]
fn a_message_goes_from_submit_through_a_turn_to_its_outcome() {
    let root = tempfile::tempdir().unwrap();
    let hub = hub(root.path());
    let producer = client(&hub, "prod");
    let node = client(&hub, "host-a").node("instance-1");
    let rt = runtime();
    rt.block_on(async {
        // Exact payload text, kept byte for byte.
        let text = r#"{"b": 1.50, "a": [12345678901234567890123]}"#;
        let accepted = producer.submit(&submit("k1", text)).await.unwrap();
        assert!(!accepted.duplicate);
        assert_eq!(accepted.deliveries.len(), 1);
        let again = producer.submit(&submit("k1", text)).await.unwrap();
        assert!(again.duplicate && again.message_id == accepted.message_id, "{again:?}");
        let conflict = producer.submit(&submit("k1", r#"{"other": true}"#)).await.unwrap_err();
        assert_eq!(conflict.code(), Some(ErrorCode::IdempotencyConflict), "{conflict}");

        let by_id = producer.message(&accepted.message_id, None).await.unwrap();
        let by_key = producer.message_by_key("k1", None).await.unwrap();
        assert_eq!(by_id, by_key);
        assert_eq!(by_id.payload.as_str(), text);
        assert_eq!(by_id.deliveries[0].state, DeliveryState::Queued);

        let session = node.open_session(Some("test")).await.unwrap();
        assert_eq!(node.session(), session.session);
        let claimed = node.claim(8, Duration::from_secs(5)).await.unwrap();
        let d = &claimed.deliveries[0];
        assert_eq!((d.message_id.as_str(), d.payload.as_str()), (accepted.message_id.as_str(), text));
        assert_eq!(node.holdings().await.unwrap().len(), 1);
        assert!(node.mirrored(&d.delivery_id, &d.claim_token).await.unwrap().changed);
        assert_eq!(node.ack(&d.delivery_id, &d.claim_token).await.unwrap().state, DeliveryState::Delivered);
        let item = StartItem { delivery_id: d.delivery_id.clone(), claim_token: d.claim_token.clone(), attempt: 1 };
        assert!(node.starts(vec![item]).await.unwrap()[0].start);

        // A producer's long-poll that began before the report ends with it.
        let waiting = producer.message(&accepted.message_id, Some(Duration::from_secs(30)));
        let report = ReportRequest {
            delivery_id: d.delivery_id.clone(),
            instance_id: node.instance_id().into(),
            claim_token: d.claim_token.clone(),
            report_id: "r-1".into(),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(5),
            result: Some("done".into()),
            reason: None,
            attempt: None,
            signal: None,
            stderr_tail: Some("warning: low disk\n".into()),
            stderr_dropped_bytes: Some(0),
            stopped_by: None,
        };
        let reporting = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            node.report(&report).await
        };
        let started = Instant::now();
        let (view, reported) = tokio::join!(waiting, reporting);
        assert!(!reported.unwrap().duplicate);
        let view = view.unwrap();
        // The wait (30 s) ended with the report, not by elapsing.
        assert!(started.elapsed() < Duration::from_secs(20), "the wait was not woken by the report");
        let attempts = &view.deliveries[0].attempts;
        assert_eq!((attempts.len(), attempts[0].outcome), (1, Outcome::Succeeded), "{view:?}");
        assert_eq!(attempts[0].stderr_tail.as_deref(), Some("warning: low disk\n"), "{view:?}");
        assert_eq!(attempts[0].stderr_dropped_bytes, Some(0), "{view:?}");
        // The same report again is counted once.
        assert!(node.report(&report).await.unwrap().duplicate);

        // A report that names its run, sent again (its answer lost), is counted once too.
        let accepted = producer.submit(&submit("k2", "{}")).await.unwrap();
        let claimed = node.claim(8, Duration::from_secs(5)).await.unwrap();
        let d = &claimed.deliveries[0];
        assert_eq!(d.message_id, accepted.message_id);
        node.mirrored(&d.delivery_id, &d.claim_token).await.unwrap();
        node.ack(&d.delivery_id, &d.claim_token).await.unwrap();
        let item = StartItem { delivery_id: d.delivery_id.clone(), claim_token: d.claim_token.clone(), attempt: 1 };
        assert!(node.starts(vec![item]).await.unwrap()[0].start);
        let report = ReportRequest {
            delivery_id: d.delivery_id.clone(),
            claim_token: d.claim_token.clone(),
            report_id: "r-2".into(),
            attempt: Some(1),
            ..report
        };
        assert!(!node.report(&report).await.unwrap().duplicate);
        assert!(node.report(&report).await.unwrap().duplicate, "a repeat of a report naming its run is a replay");
        node.end_session().await.unwrap();
    });
}

/// Cancel answers per delivery; refusals carry their codes: someone else's message, an unknown
/// one, a producer certificate on a node endpoint.
#[test]
fn cancel_and_refusals_are_typed() {
    let root = tempfile::tempdir().unwrap();
    let hub = hub(root.path());
    let producer = client(&hub, "prod");
    let rt = runtime();
    rt.block_on(async {
        let accepted = producer.submit(&submit("c1", "{}")).await.unwrap();
        let cancelled = producer.cancel(&accepted.message_id, "not needed").await.unwrap();
        assert_eq!(cancelled.deliveries[0].effect, "cancelled");
        assert_eq!(cancelled.deliveries[0].state, DeliveryState::Failed);
        // Repeating a cancel answers the same and records nothing more.
        let again = producer.cancel(&accepted.message_id, "not needed").await.unwrap();
        assert_eq!(again, cancelled);

        let other = client(&hub, "other");
        let e = other.message(&accepted.message_id, None).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotYours), "{e}");
        let e = producer.message("00000000-0000-7000-8000-000000000000", None).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
        let e = producer.message_by_key("no-such-key", None).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
        let e = producer.node("i-1").claim(1, Duration::ZERO).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::WrongRole), "{e}");
        assert!(!e.is_transient());
    });
}

/// A hub that is not there is a transport failure, never a refusal; an idempotent call is
/// retried up to its bound first.
#[test]
fn an_unreachable_hub_is_a_transport_error_after_bounded_retries() {
    let root = tempfile::tempdir().unwrap();
    let mut hub = hub(root.path());
    let producer = client(&hub, "prod").with_retry(RetryPolicy {
        attempts_max: 3,
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_millis(400),
    });
    hub.kill().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let started = Instant::now();
        let e = producer.submit(&submit("u1", "{}")).await.unwrap_err();
        assert!(matches!(e, ClientError::Transport { maybe_sent: false, .. }), "{e:?}");
        assert_eq!(e.code(), None);
        // Two pauses of at least half their ceiling (100 ms, 200 ms) show the retries happened.
        assert!(started.elapsed() >= Duration::from_millis(300), "not retried: {:?}", started.elapsed());
        let e = producer.cancel("m", "r").await.unwrap_err();
        assert!(matches!(e, ClientError::Transport { .. }), "{e:?}");
    });
}

/// A configuration naming a file that is not there says which setting is wrong.
#[test]
fn a_missing_file_names_its_setting() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let files = TlsFiles { ca_file: missing.clone(), cert_file: missing.clone(), key_file: missing };
    let e = Client::new("https://127.0.0.1:1", &files).unwrap_err().to_string();
    assert!(e.starts_with("ca_file: cannot read ") && e.contains("nope.pem"), "{e}");
}

/// `reload` presents what the files hold now (a renewed certificate, here another producer's)
/// on the requests after it; a reload that cannot read a file keeps the client it had.
#[test]
fn reload_presents_the_files_as_they_are_now() {
    let root = tempfile::tempdir().unwrap();
    let hub = hub(root.path());
    let prod = hub.identity("prod").unwrap();
    let dir = root.path().join("reloaded");
    std::fs::create_dir_all(&dir).unwrap();
    let files = TlsFiles { ca_file: prod.ca.clone(), cert_file: dir.join("me.crt"), key_file: dir.join("me.key") };
    let use_identity = |id: &Identity| {
        std::fs::copy(&id.cert, &files.cert_file).unwrap();
        std::fs::copy(&id.key, &files.key_file).unwrap();
    };
    use_identity(prod);
    let client = Client::new(&format!("https://{}", hub.addr().unwrap()), &files).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let accepted = client.submit(&submit("r1", "{}")).await.unwrap();
        assert_eq!(client.generation(), 1);

        use_identity(hub.identity("other").unwrap());
        assert_eq!(client.reload().unwrap(), 2);
        let e = client.message(&accepted.message_id, None).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotYours), "{e}");

        std::fs::remove_file(&files.key_file).unwrap();
        let e = client.reload().unwrap_err();
        assert_eq!(e.key(), "key_file", "{e}");
        assert_eq!(client.generation(), 2);
        let e = client.message(&accepted.message_id, None).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotYours), "the client before the failed reload stays: {e}");
    });
}

/// The node's batch calls against the real hub: a claim batch is mirrored and acked in one
/// request each, one stale item is refused alone with its code while the others move on, a
/// rejected batch fails its deliveries, reports go in one request and a repeat counts once,
/// and a request of a superseded session is recognised as such.
#[test]
fn node_batches_answer_per_item_and_a_newer_session_supersedes() {
    use baton_shared::wire::{HolderItem, RejectItem};
    let root = tempfile::tempdir().unwrap();
    let hub = hub(root.path());
    let producer = client(&hub, "prod");
    let node = client(&hub, "host-a").node("instance-1");
    let rt = runtime();
    rt.block_on(async {
        for i in 0..5 {
            producer.submit(&submit(&format!("b{i}"), "{}")).await.unwrap();
        }
        node.open_session(Some("test")).await.unwrap();
        let mut claimed = Vec::new();
        while claimed.len() < 5 {
            claimed.extend(node.claim(8, Duration::from_secs(5)).await.unwrap().deliveries);
        }
        let item = |d: &baton_shared::wire::ClaimedDelivery| HolderItem {
            delivery_id: d.delivery_id.clone(),
            claim_token: d.claim_token.clone(),
        };
        let mut items: Vec<HolderItem> = claimed[..3].iter().map(item).collect();
        items[2].claim_token = "not-the-token".into();
        let answers = node.mirrored_batch(items.clone()).await.unwrap();
        assert_eq!(answers.len(), 3);
        assert!(answers[0].as_ref().unwrap().changed && answers[1].as_ref().unwrap().changed);
        let stale = answers[2].as_ref().unwrap_err();
        assert_eq!(stale.code(), Some(ErrorCode::StaleClaim), "{stale}");
        assert!(!stale.route_unknown(), "an item's refusal is not the route's");
        let acked = node.ack_batch(items[..2].to_vec()).await.unwrap();
        assert!(acked.iter().all(|a| a.as_ref().unwrap().state == DeliveryState::Delivered), "{acked:?}");
        let handed = node.handoff_batch(vec![item(&claimed[4]), items[0].clone()]).await.unwrap();
        let handed: Vec<(DeliveryState, bool)> =
            handed.into_iter().map(|a| a.map(|t| (t.state, t.changed)).unwrap()).collect();
        assert_eq!(
            handed,
            [(DeliveryState::Delivered, true), (DeliveryState::Delivered, false)],
            "claimed → delivered, then a repeat"
        );

        let reject = RejectItem {
            delivery_id: claimed[3].delivery_id.clone(),
            claim_token: claimed[3].claim_token.clone(),
            reason: "cannot take it".into(),
        };
        let rejected = node.reject_batch(vec![reject]).await.unwrap();
        assert_eq!(rejected[0].as_ref().unwrap().state, DeliveryState::Failed);

        let starts = items[..2]
            .iter()
            .map(|i| StartItem { delivery_id: i.delivery_id.clone(), claim_token: i.claim_token.clone(), attempt: 1 })
            .collect();
        assert!(node.starts(starts).await.unwrap().iter().all(|s| s.start));
        let reports: Vec<ReportRequest> = items[..2]
            .iter()
            .enumerate()
            .map(|(n, i)| ReportRequest {
                delivery_id: i.delivery_id.clone(),
                instance_id: node.instance_id().into(),
                claim_token: i.claim_token.clone(),
                report_id: format!("batch-r{n}"),
                outcome: Outcome::Succeeded,
                exit_code: Some(0),
                duration_ms: Some(1),
                result: None,
                reason: None,
                attempt: Some(1),
                signal: None,
                stderr_tail: None,
                stderr_dropped_bytes: None,
                stopped_by: None,
            })
            .collect();
        let first = node.report_batch(reports.clone()).await.unwrap();
        assert!(first.iter().all(|r| !r.as_ref().unwrap().duplicate), "{first:?}");
        let again = node.report_batch(reports).await.unwrap();
        assert!(again.iter().all(|r| r.as_ref().unwrap().duplicate), "a repeated batch counts once: {again:?}");

        // Another process of the same instance registers a newer session: this one's next
        // request is refused as superseded, which is neither transient nor for good.
        let newer = client(&hub, "host-a").node("instance-1");
        newer.open_session(Some("test")).await.unwrap();
        let e = node.holdings().await.unwrap_err();
        assert!(e.superseded().is_some(), "{e}");
        assert!(e.refused_for_good().is_none() && !e.retry_later(), "{e}");
    });
}
