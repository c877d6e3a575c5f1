//! `Client::submit_batch` against the real `baton-hub` (started by the test kit with its own CA
//! and enrolled certificates): one typed answer per message in request order, a replayed batch
//! answered as duplicates with the same ids, and a bad message refused alone.

use baton_client::submit_batch::batches;
use baton_client::{Client, ClientError, TlsFiles};
use baton_shared::error::ErrorCode;
use baton_shared::limits::BATCH_ITEMS_MAX;
use baton_shared::wire::{BatchSubmitRequest, Payload, SubmitRequest};
use baton_testkit::{Binaries, Hub, Identity, Role, Started};

/// A running hub with the node host `host-a` and the producer `prod`.
fn hub(root: &std::path::Path) -> Hub {
    let bins = Binaries::build().unwrap();
    let mut hub = Hub::init(&bins, root, "client-batch-tests").unwrap();
    hub.enroll(Role::Node, "host-a").unwrap();
    hub.enroll(Role::Producer, "prod").unwrap();
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

fn message(conversation: &str, key: &str, payload: &str) -> SubmitRequest {
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

fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A batch answers each message in order; sent again it answers the accepted ones as
/// duplicates with the same ids; a message with a bad field, or whose key was used for other
/// content, is refused alone with its code while the others are accepted.
#[test]
fn a_batch_answers_each_message_and_a_replay_with_the_same_ids() {
    let root = tempfile::tempdir().unwrap();
    let hub = hub(root.path());
    let producer = client(&hub, "prod");
    let rt = runtime();
    rt.block_on(async {
        let batch = BatchSubmitRequest {
            messages: vec![
                message("support", "b1", r#"{"n": 1}"#),
                message("Not A Name", "b2", r#"{"n": 2}"#),
                message("support", "b3", r#"{"n": 3.50}"#),
            ],
        };
        let first = producer.submit_batch(&batch).await.unwrap();
        assert_eq!(first.len(), 3);
        let one = first[0].as_ref().unwrap();
        let three = first[2].as_ref().unwrap();
        assert!(!one.duplicate && !three.duplicate, "{first:?}");
        assert_eq!((one.deliveries.len(), one.deliveries[0].host.as_deref().unwrap_or("-")), (1, "host-a"));
        // In request order: the same conversation numbers them as sent.
        assert!(one.seq < three.seq, "{first:?}");
        let bad = first[1].as_ref().unwrap_err();
        assert_eq!((bad.status, bad.code), (400, Some(ErrorCode::InvalidField)), "{bad}");

        // The same batch again: the accepted messages are replays with the same ids.
        let again = producer.submit_batch(&batch).await.unwrap();
        for i in [0, 2] {
            let (was, is) = (first[i].as_ref().unwrap(), again[i].as_ref().unwrap());
            assert!(is.duplicate, "message {i}: {is:?}");
            assert_eq!((is.message_id.as_str(), is.seq), (was.message_id.as_str(), was.seq), "message {i}");
        }
        assert_eq!(again[1].as_ref().unwrap_err().code, Some(ErrorCode::InvalidField));

        // A key reused for other content is refused alone; the new message beside it is taken.
        let mixed = BatchSubmitRequest {
            messages: vec![message("support", "b1", r#"{"n": "other"}"#), message("support", "b4", "{}")],
        };
        let answers = producer.submit_batch(&mixed).await.unwrap();
        let conflict = answers[0].as_ref().unwrap_err();
        assert_eq!((conflict.status, conflict.code), (409, Some(ErrorCode::IdempotencyConflict)), "{conflict}");
        let four = answers[1].as_ref().unwrap();
        assert!(!four.duplicate);

        // Each accepted message reads back as submitted, payload byte for byte.
        let view = producer.message(&three.message_id, None).await.unwrap();
        assert_eq!(view.payload.as_str(), r#"{"n": 3.50}"#);
        let view = producer.message_by_key("b4", None).await.unwrap();
        assert_eq!(view.message_id, four.message_id);
    });
}

/// More messages than one batch may carry are split by `batches` and every one is accepted; a
/// batch over the bound is refused by the client without sending it.
#[test]
fn batches_within_the_bound_are_all_accepted_and_one_over_it_is_not_sent() {
    let root = tempfile::tempdir().unwrap();
    let hub = hub(root.path());
    let producer = client(&hub, "prod");
    let rt = runtime();
    rt.block_on(async {
        let messages: Vec<SubmitRequest> =
            (0..=BATCH_ITEMS_MAX).map(|i| message("bulk", &format!("m{i}"), &format!("{{\"i\":{i}}}"))).collect();
        let e = producer.submit_batch(&BatchSubmitRequest { messages: messages.clone() }).await.unwrap_err();
        assert!(matches!(e, ClientError::Invalid(_)), "{e:?}");
        let e = producer.message_by_key("m0", None).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::NotFound), "the refused batch was sent: {e}");

        let split = batches(messages);
        assert_eq!(split.iter().map(|b| b.messages.len()).collect::<Vec<_>>(), [BATCH_ITEMS_MAX, 1]);
        let mut seqs = Vec::new();
        for batch in &split {
            for answer in producer.submit_batch(batch).await.unwrap() {
                seqs.push(answer.unwrap().seq);
            }
        }
        assert_eq!(seqs.len(), BATCH_ITEMS_MAX + 1);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "not in request order: {seqs:?}");
    });
}
