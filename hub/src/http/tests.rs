//! Tests of the API layer: errors in our shape, and the router and `docs/openapi.json` held to
//! each other.

mod errors {
    use super::super::*;

    /// One case: a store error and the status and code it leaves with.
    fn check(e: StoreError, status: u16, code: &str) {
        let resp = ApiError::from(e.clone()).into_response();
        assert_eq!(resp.status().as_u16(), status, "{e:?}");
        let api = ApiError::from(e);
        assert_eq!(api.code.as_str(), code);
    }

    /// Serde's messages lose the Rust type names they carry.
    #[test]
    fn type_names_are_not_sent() {
        for (given, sent) in [
            (
                "invalid type: string, expected struct SubmitRequest at line 1",
                "invalid type: string, expected a JSON object at line 1",
            ),
            ("expected enum Outcome, found x", "expected one of the allowed values, found x"),
            ("missing field `to`", "missing field `to`"),
        ] {
            assert_eq!(without_type_names(given), sent);
        }
    }

    /// Ids are taken only in the form the hub writes them; another spelling of the same UUID is
    /// refused as malformed (400), not looked up.
    #[test]
    fn ids_are_taken_only_as_the_hub_writes_them() {
        let id = uuid::Uuid::now_v7();
        assert!(check_path_id("delivery_id", &id.hyphenated().to_string()).is_ok());
        for other in [
            id.simple().to_string(),
            id.braced().to_string(),
            id.urn().to_string(),
            id.hyphenated().to_string().to_uppercase(),
            String::new(),
            "not-an-id".into(),
        ] {
            let e = check_path_id("delivery_id", &other).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidField, "{other}");
            assert!(e.message.contains("delivery_id"), "{}", e.message);
        }
    }

    /// Internals are never sent; a bug or a corrupt record is 500 `internal`, which nodes do not
    /// retry forever, and only storage trouble is 503.
    #[test]
    fn store_errors_map_to_stable_codes() {
        check(StoreError::Storage("disk I/O error".into()), 503, "storage_unavailable");
        check(StoreError::Conflict("deadlock detected (40P01)".into()), 503, "storage_unavailable");
        check(StoreError::Invalid("a value the record cannot hold: x".into()), 400, "invalid_field");
        check(StoreError::Internal("index out of bounds".into()), 500, "internal");
        check(StoreError::Corrupt("corrupt record".into()), 500, "internal");
        check(StoreError::StaleClaim("x".into()), 409, "stale_claim");
        let sent = ApiError::from(StoreError::Internal("secret detail".into())).message;
        assert!(!sent.contains("secret detail"), "{sent}");
    }
}

mod openapi {
    use super::super::*;
    use crate::config::Limits;
    use crate::runtime::{TurnState, Work, certs};
    use crate::store::Store;
    use baton_shared::states::{DeliveryState, Outcome};
    use baton_shared::wire::*;
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    const OPENAPI: &str = include_str!("../../../docs/openapi.json");

    fn spec() -> serde_json::Value {
        serde_json::from_str(OPENAPI).unwrap()
    }

    #[test]
    fn openapi_lists_exactly_the_routes() {
        let spec = spec();
        let mut documented = BTreeSet::new();
        for (path, ops) in spec["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        assert_eq!(documented, served);
    }

    /// The documented properties of each schema are exactly the fields the code sends.
    #[test]
    fn openapi_schemas_match_the_wire_types() {
        let spec = spec();
        let attempt = AttemptView {
            attempt_id: "a".into(),
            report_id: "r".into(),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(1),
            result: None,
            reason: None,
            reported_at_ms: 1,
            signal: None,
            attempt: 1,
            retryable: false,
            rerun: None,
            caused_by: Some("producer:p".into()),
            stderr_tail: Some("traceback".into()),
            stderr_dropped_bytes: Some(0),
        };
        let delivery = DeliveryView {
            delivery_id: "d".into(),
            host: Some("h".into()),
            pool: Some("p".into()),
            state: DeliveryState::Delivered,
            reason: None,
            updated_at_ms: 1,
            attempts: vec![attempt.clone()],
            attempt: 1,
            max_attempts: 1,
            not_before_ms: None,
            cancel_requested_at_ms: None,
            cancel_reason: None,
        };
        let claimed = ClaimedDelivery {
            delivery_id: "d".into(),
            message_id: "m".into(),
            conversation: "c".into(),
            seq: 1,
            payload: serde_json::json!({}).into(),
            claim_token: "t".into(),
            state: DeliveryState::Claimed,
            producer: Some("p".into()),
            attempt: 1,
            max_attempts: 1,
            rerun: None,
            cancel_requested: false,
            deadline_ms: Some(60_000),
            stall_ms: Some(10_000),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let listed = ListedMessage {
            message_id: "m".into(),
            seq: 7,
            idempotency_key: "k".into(),
            payload: serde_json::json!({}).into(),
            accepted_at_ms: 1,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            deliveries: vec![DeliverySummary {
                delivery_id: "d".into(),
                host: Some("h".into()),
                pool: Some("p".into()),
                state: DeliveryState::Queued,
            }],
        };
        let interval = MembershipInterval { join_seq: 0, joined_at_ms: 1, leave_seq: Some(2), left_at_ms: Some(3) };
        let summary = DeliverySummary {
            delivery_id: "d".into(),
            host: Some("h".into()),
            pool: Some("p".into()),
            state: DeliveryState::Queued,
        };
        let notice = CancelNotice { delivery_id: "d".into(), attempt: 1, reason: "r".into() };
        let item = StartItem { delivery_id: "d".into(), claim_token: "t".into(), attempt: 1 };
        let start = StartResult {
            delivery_id: "d".into(),
            start: false,
            code: Some("cancelled".into()),
            message: Some("m".into()),
            retry_after_ms: Some(5),
        };
        let cancelled = CancelResult {
            delivery_id: "d".into(),
            host: Some("h".into()),
            pool: Some("p".into()),
            effect: "requested".into(),
            state: DeliveryState::Delivered,
        };
        let mut samples: Vec<(&str, serde_json::Value)> = vec![
            (
                "SubmitRequest",
                serde_json::to_value(SubmitRequest {
                    conversation: "c".into(),
                    idempotency_key: "k".into(),
                    payload: serde_json::json!(1).into(),
                    to: Some(vec!["h".into()]),
                    pools: Some(vec!["p".into()]),
                    max_attempts: Some(3),
                    retry_backoff_ms: Some(1000),
                    approval: Some("required".into()),
                    approval_timeout_ms: Some(60_000),
                    deadline_ms: Some(60_000),
                    stall_ms: Some(10_000),
                })
                .unwrap(),
            ),
            (
                "SubmitResponse",
                serde_json::to_value(SubmitResponse {
                    message_id: "m".into(),
                    seq: 1,
                    duplicate: false,
                    deliveries: vec![summary.clone()],
                })
                .unwrap(),
            ),
            ("DeliverySummary", serde_json::to_value(&summary).unwrap()),
            ("Attempt", serde_json::to_value(&attempt).unwrap()),
            ("DeliveryView", serde_json::to_value(&delivery).unwrap()),
            (
                "MessageView",
                serde_json::to_value(MessageView {
                    message_id: "m".into(),
                    conversation: "c".into(),
                    seq: 1,
                    producer: "p".into(),
                    idempotency_key: "k".into(),
                    payload: serde_json::json!({}).into(),
                    accepted_at_ms: 1,
                    traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
                    deliveries: vec![delivery.clone()],
                    omitted: Some(ViewOmitted {
                        attempts_of: vec!["d".into()],
                        view_bytes_max: 4096,
                        read_each_at: "/v1/messages/m/deliveries/{delivery_id}".into(),
                    }),
                })
                .unwrap(),
            ),
            (
                "ClaimRequest",
                serde_json::to_value(ClaimRequest { instance_id: "i".into(), max: Some(1), wait_ms: Some(1) }).unwrap(),
            ),
            ("ClaimedDelivery", serde_json::to_value(&claimed).unwrap()),
            (
                "ViewOmitted",
                serde_json::to_value(ViewOmitted {
                    attempts_of: vec!["d".into()],
                    view_bytes_max: 4096,
                    read_each_at: "/v1/messages/m/deliveries/{delivery_id}".into(),
                })
                .unwrap(),
            ),
            (
                "HoldingsResponse",
                serde_json::to_value(HoldingsResponse { deliveries: vec![claimed.clone()], next_cursor: Some(7) })
                    .unwrap(),
            ),
            ("ListedMessage", serde_json::to_value(&listed).unwrap()),
            (
                "MessagePage",
                serde_json::to_value(MessagePage {
                    conversation: "c".into(),
                    messages: vec![listed.clone()],
                    next_cursor: "7.0123456789abcdef".into(),
                    more: false,
                })
                .unwrap(),
            ),
            (
                "ClaimResponse",
                serde_json::to_value(ClaimResponse {
                    deliveries: vec![claimed.clone()],
                    cancels: vec![notice.clone()],
                })
                .unwrap(),
            ),
            (
                "HolderRequest",
                serde_json::to_value(HolderRequest { instance_id: "i".into(), claim_token: "t".into() }).unwrap(),
            ),
            (
                "RejectRequest",
                serde_json::to_value(RejectRequest {
                    instance_id: "i".into(),
                    claim_token: "t".into(),
                    reason: "r".into(),
                })
                .unwrap(),
            ),
            (
                "TransitionResponse",
                serde_json::to_value(TransitionResponse {
                    delivery_id: "d".into(),
                    state: DeliveryState::Mirrored,
                    changed: true,
                })
                .unwrap(),
            ),
            (
                "ReportRequest",
                serde_json::to_value(ReportRequest {
                    delivery_id: "d".into(),
                    instance_id: "i".into(),
                    claim_token: "t".into(),
                    report_id: "r".into(),
                    outcome: Outcome::Failed,
                    exit_code: Some(1),
                    duration_ms: Some(1),
                    result: Some("x".into()),
                    reason: Some("y".into()),
                    attempt: Some(1),
                    signal: Some(15),
                    stderr_tail: Some("z".into()),
                    stderr_dropped_bytes: Some(0),
                    stopped_by: Some("stall".into()),
                })
                .unwrap(),
            ),
            (
                "ReportResponse",
                serde_json::to_value(ReportResponse {
                    attempt,
                    delivery_id: "d".into(),
                    duplicate: false,
                    retry_at_ms: Some(5),
                })
                .unwrap(),
            ),
            (
                "ConversationView",
                serde_json::to_value(ConversationView {
                    conversation: "c".into(),
                    last_seq: 3,
                    open: false,
                    members: vec![MemberView { host: "h".into(), current: true, intervals: vec![interval.clone()] }],
                    pools: vec!["gpu".into()],
                })
                .unwrap(),
            ),
            (
                "MemberView",
                serde_json::to_value(MemberView { host: "h".into(), current: true, intervals: vec![] }).unwrap(),
            ),
            ("MembershipInterval", serde_json::to_value(&interval).unwrap()),
            ("Error", serde_json::to_value(ErrorBody { code: "c".into(), message: "m".into() }).unwrap()),
            ("CancelNotice", serde_json::to_value(&notice).unwrap()),
            (
                "SessionRequest",
                serde_json::to_value(SessionRequest { instance_id: "i".into(), node_version: Some("1".into()) })
                    .unwrap(),
            ),
            (
                "SessionResponse",
                serde_json::to_value(SessionResponse { session: 2, took_over: Some(1), start_lease_ms: Some(15_000) })
                    .unwrap(),
            ),
            (
                "SessionEndRequest",
                serde_json::to_value(SessionEndRequest { instance_id: "i".into(), session: 1 }).unwrap(),
            ),
            ("StartItem", serde_json::to_value(&item).unwrap()),
            (
                "StartRequest",
                serde_json::to_value(StartRequest { instance_id: "i".into(), starts: vec![item.clone()] }).unwrap(),
            ),
            ("StartResult", serde_json::to_value(&start).unwrap()),
            ("StartResponse", serde_json::to_value(StartResponse { results: vec![start.clone()] }).unwrap()),
            ("CancelRequest", serde_json::to_value(CancelRequest { reason: "r".into() }).unwrap()),
            ("CancelResult", serde_json::to_value(&cancelled).unwrap()),
            (
                "CancelResponse",
                serde_json::to_value(CancelResponse { message_id: "m".into(), deliveries: vec![cancelled.clone()] })
                    .unwrap(),
            ),
        ];
        // Batches: an item result's sample carries both of its alternatives, `ok` and `error`.
        let either = |ok: serde_json::Value| {
            let mut v = ok;
            v["error"] = serde_json::to_value(ErrorBody { code: "c".into(), message: "m".into() }).unwrap();
            v
        };
        let submitted = SubmitResponse { message_id: "m".into(), seq: 1, duplicate: false, deliveries: vec![summary] };
        let submit_item = ItemResult { status: 201, outcome: ItemOutcome::Ok(submitted) };
        let moved = TransitionResponse { delivery_id: "d".into(), state: DeliveryState::Mirrored, changed: true };
        let moved_item = ItemResult { status: 200, outcome: ItemOutcome::Ok(moved) };
        let holder = HolderItem { delivery_id: "d".into(), claim_token: "t".into() };
        let rejected = RejectItem { delivery_id: "d".into(), claim_token: "t".into(), reason: "r".into() };
        let sample = |name: &str| samples.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        let report: ReportRequest = serde_json::from_value(sample("ReportRequest")).unwrap();
        let reported: ReportResponse = serde_json::from_value(sample("ReportResponse")).unwrap();
        let submit: SubmitRequest = serde_json::from_value(sample("SubmitRequest")).unwrap();
        let report_item = ItemResult { status: 201, outcome: ItemOutcome::Ok(reported) };
        let decided = ApprovalResponse {
            message_id: "m".into(),
            decision: "approved".into(),
            deliveries: vec![DeliverySummary {
                delivery_id: "d".into(),
                host: Some("h".into()),
                pool: Some("p".into()),
                state: DeliveryState::Queued,
            }],
        };
        samples.extend([
            ("ApprovalRequest", serde_json::to_value(ApprovalRequest { reason: "r".into() }).unwrap()),
            ("ApprovalResponse", serde_json::to_value(&decided).unwrap()),
            ("BatchSubmitRequest", serde_json::to_value(BatchSubmitRequest { messages: vec![submit] }).unwrap()),
            ("SubmitItemResult", either(serde_json::to_value(&submit_item).unwrap())),
            ("BatchSubmitResponse", serde_json::to_value(BatchSubmitResponse { results: vec![submit_item] }).unwrap()),
            ("HolderItem", serde_json::to_value(&holder).unwrap()),
            (
                "BatchHolderRequest",
                serde_json::to_value(BatchHolderRequest { instance_id: "i".into(), deliveries: vec![holder] }).unwrap(),
            ),
            ("RejectItem", serde_json::to_value(&rejected).unwrap()),
            (
                "BatchRejectRequest",
                serde_json::to_value(BatchRejectRequest { instance_id: "i".into(), deliveries: vec![rejected] })
                    .unwrap(),
            ),
            ("TransitionItemResult", either(serde_json::to_value(&moved_item).unwrap())),
            (
                "BatchTransitionResponse",
                serde_json::to_value(BatchTransitionResponse { results: vec![moved_item] }).unwrap(),
            ),
            ("BatchReportRequest", serde_json::to_value(BatchReportRequest { reports: vec![report] }).unwrap()),
            ("ReportItemResult", either(serde_json::to_value(&report_item).unwrap())),
            ("BatchReportResponse", serde_json::to_value(BatchReportResponse { results: vec![report_item] }).unwrap()),
        ]);
        // Every field of every kind set at once: the schema documents each one.
        let event = FeedEvent {
            cursor: "7".into(),
            kind: FeedEventKind::Outcome,
            at_ms: 1,
            message_id: "m".into(),
            delivery_id: "d".into(),
            host: "h".into(),
            from: Some(DeliveryState::Mirrored),
            to: Some(DeliveryState::Delivered),
            actor: Some("hub".into()),
            reason: Some("r".into()),
            attempt: Some(1),
            seq: Some(1),
            progress: Some(serde_json::json!({"step": 1}).into()),
            outcome: Some(Outcome::Succeeded),
            exit_code: Some(0),
            signal: Some(15),
            duration_ms: Some(1),
            retryable: Some(false),
            progress_events: Some(1),
            progress_dropped: Some(0),
        };
        let progress = ProgressItem { seq: 1, progress: serde_json::json!({"step": 1}).into() };
        let turn = RunningTurnItem {
            delivery_id: "d".into(),
            claim_token: "t".into(),
            attempt: 1,
            events: vec![progress.clone()],
            dropped: Some(0),
        };
        let turn_result = RunningTurnResult { delivery_id: "d".into(), running: true, kept: 1, dropped: 0 };
        samples.extend([
            ("FeedEvent", serde_json::to_value(&event).unwrap()),
            (
                "EventsPage",
                serde_json::to_value(EventsPage { events: vec![event], next_cursor: "7".into(), settled: Some(true) })
                    .unwrap(),
            ),
            ("ProgressItem", serde_json::to_value(&progress).unwrap()),
            ("RunningTurnItem", serde_json::to_value(&turn).unwrap()),
            (
                "RunningRequest",
                serde_json::to_value(RunningRequest { instance_id: "i".into(), turns: vec![turn] }).unwrap(),
            ),
            ("RunningTurnResult", serde_json::to_value(&turn_result).unwrap()),
            ("RunningResponse", serde_json::to_value(RunningResponse { turns: vec![turn_result] }).unwrap()),
        ]);
        let schemas = spec["components"]["schemas"].as_object().unwrap();
        assert_eq!(schemas.len(), samples.len(), "every documented schema has a sample here");
        for (name, value) in samples {
            let documented: BTreeSet<&String> = schemas[name]["properties"].as_object().unwrap().keys().collect();
            let sent: BTreeSet<&String> = value.as_object().unwrap().keys().collect();
            assert_eq!(documented, sent, "schema {name}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_router_serves_every_documented_route() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let clock = baton_shared::clock::system();
        let conn = crate::store::open_write(&path, baton_shared::sqlite::Synchronous::Normal).unwrap();
        let store = Store::sqlite(conn, &path, baton_shared::sqlite::CHECKPOINT_INTERVAL, clock.clone()).unwrap();
        let state = Arc::new(Shared {
            store,
            work: Work::default(),
            outcomes: watch::channel(0).0,
            limits: Limits::default(),
            shutdown: CancellationToken::new(),
            ready: AtomicBool::new(true),
            store_bytes: AtomicU64::new(0),
            metrics: None,
            clock,
            turns: TurnState::default(),
            certs: certs::CertCache::new(watch::channel(0).1),
            peers: None,
            feed_horizon: Default::default(),
            tls: None,
            telemetry: baton_telemetry::Telemetry::off(),
        });
        let app = app(state);
        for (method, path) in ROUTES {
            let uri = path
                .replace("{message_id}", &uuid::Uuid::now_v7().to_string())
                .replace("{delivery_id}", &uuid::Uuid::now_v7().to_string())
                .replace("{conversation}", "some-conversation");
            let req = axum::http::Request::builder().method(*method).uri(&uri).body(axum::body::Body::empty()).unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
            let text = String::from_utf8_lossy(&body);
            assert!(!text.contains("no such endpoint"), "{method} {path} is not routed");
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            // Without a verified certificate, every identity-checked route refuses with 401.
            if !matches!(*path, "/healthz" | "/readyz") {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {text}");
                let e: ErrorBody = serde_json::from_slice(&body).unwrap();
                assert_eq!(e.code, "unknown_certificate");
            }
        }
    }
}
