//! Traces: a producer's W3C `traceparent` kept with its message, shown in its view, handed out
//! with the claim and given to the harness as `TRACEPARENT`; the hub's and the node's spans of
//! one delivery received by a real OTLP/HTTP receiver (`baton_testkit::otlp`, decoding the
//! protocol) as one trace under the producer's span; a message without a `traceparent` in a
//! trace the hub starts; a batch's header kept with every message of it; a malformed header
//! refused naming it. One hub and one node serve every check.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};
use baton_testkit::otlp::{Keep, OtlpSink, ReceivedSpan};
use serde_json::json;

/// The producer's trace and span, as its own tracer would have made them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// The spans of one delivery each side records.
const HUB_SPANS: [&str; 3] = ["accept", "fan-out", "claim"];
const NODE_SPANS: [&str; 4] = ["handoff", "start", "run", "report"];

/// How soon the test's exporters send what they hold (OpenTelemetry's batch delay, 5 s by
/// default, shortened so the test waits for spans less).
const EXPORT_DELAY_MS: &str = "100";

/// The spans of `trace_id` the sink holds, once every one named in `names` has arrived.
fn spans_of(sink: &OtlpSink, trace_id: &str, names: &[&str]) -> Vec<ReceivedSpan> {
    wait_for(&format!("the spans {names:?} of trace {trace_id}"), NODE_WAIT, || {
        let spans: Vec<ReceivedSpan> = sink.spans().into_iter().filter(|s| s.trace_id == trace_id).collect();
        names.iter().all(|n| spans.iter().any(|s| s.name == *n)).then_some(spans)
    })
}

/// The one span named `name` of `delivery` (or of `message`, for the hub's accept and fan-out).
#[track_caller]
fn one<'a>(spans: &'a [ReceivedSpan], name: &str, key: &str, id: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> =
        spans.iter().filter(|s| s.name == name && s.attributes.get(key).map(String::as_str) == Some(id)).collect();
    assert_eq!(found.len(), 1, "one {name} span with {key} = {id}: {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_links_the_producer_the_hub_and_the_node() {
    let sink = OtlpSink::start(Keep::Spans).expect("OTLP sink");
    let endpoint = sink.endpoint();
    let mut hub = Hub::builder()
        .nodes(&["host-a"])
        .producers(&["prod"])
        .config(&format!("otlp_endpoint = {endpoint:?}\n"))
        .stopped()
        .start();
    hub.kit_mut().set_env("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS);
    hub.serve(None);
    let _node = hub
        .node_process("host-a")
        .set("otlp_endpoint", &format!("{endpoint:?}"))
        .env("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS)
        .then(r#"echo "tp=${TRACEPARENT-unset}""#)
        .start();
    let api = hub.client("prod");

    // The producer's trace: kept, shown, handed to the harness, and the parent of every span.
    let traceparent = format!("00-{TRACE_ID}-{PRODUCER_SPAN}-01");
    let body = json!({"conversation": "traced", "idempotency_key": "k1", "payload": {"n": 1}, "to": ["host-a"]});
    let r = api.post_with("/v1/messages", &body, &[("traceparent", &traceparent)]).await;
    let accepted = r.ok(201);
    let message = accepted["message_id"].as_str().expect("message_id").to_string();
    let delivery = accepted["deliveries"][0]["delivery_id"].as_str().expect("delivery_id").to_string();
    hub.wait_outcome(&delivery);
    let view = api.message(&message).await;
    let view = view.ok(200);
    assert_eq!(view["traceparent"], traceparent, "{view:#}");
    let result = view["deliveries"][0]["attempts"][0]["result"].as_str().unwrap_or_default();
    assert!(result.contains(&format!("tp={traceparent}")), "the harness saw the producer's trace: {result:?}");

    let spans = spans_of(&sink, TRACE_ID, &[HUB_SPANS.as_slice(), NODE_SPANS.as_slice()].concat());
    for name in ["accept", "fan-out"] {
        let s = one(&spans, name, "baton.message_id", &message);
        assert_eq!((s.service.as_str(), s.parent_span_id.as_str()), ("baton-hub", PRODUCER_SPAN), "{s:#?}");
    }
    let claim = one(&spans, "claim", "baton.delivery_id", &delivery);
    assert_eq!((claim.service.as_str(), claim.parent_span_id.as_str()), ("baton-hub", PRODUCER_SPAN), "{claim:#?}");
    assert_eq!(claim.attributes.get("baton.host").map(String::as_str), Some("host-a"));
    for name in NODE_SPANS {
        let s = one(&spans, name, "baton.delivery_id", &delivery);
        assert_eq!((s.service.as_str(), s.parent_span_id.as_str()), ("baton-node", PRODUCER_SPAN), "{s:#?}");
    }
    let run = one(&spans, "run", "baton.delivery_id", &delivery);
    assert_eq!(run.attributes.get("baton.outcome").map(String::as_str), Some("succeeded"), "{run:#?}");

    // No traceparent: the hub starts the trace; its accept span is the root, the rest its
    // children, and the harness continues that trace.
    let body = json!({"conversation": "traced", "idempotency_key": "k2", "payload": {"n": 2}, "to": ["host-a"]});
    let accepted = api.post("/v1/messages", &body).await;
    let accepted = accepted.ok(201);
    let (message, delivery) = (
        accepted["message_id"].as_str().expect("message_id").to_string(),
        accepted["deliveries"][0]["delivery_id"].as_str().expect("delivery_id").to_string(),
    );
    hub.wait_outcome(&delivery);
    let view = api.message(&message).await;
    let started = view.ok(200)["traceparent"].as_str().expect("a traceparent the hub started").to_string();
    let parts: Vec<&str> = started.split('-').collect();
    assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "a sampled version-00 context: {started}");
    let (trace, root) = (parts[1], parts[2]);
    assert_ne!(trace, TRACE_ID);
    let result = view.ok(200)["deliveries"][0]["attempts"][0]["result"].as_str().unwrap_or_default().to_string();
    assert!(result.contains(&format!("tp={started}")), "{result:?}");
    let spans = spans_of(&sink, trace, &[HUB_SPANS.as_slice(), NODE_SPANS.as_slice()].concat());
    let accept = one(&spans, "accept", "baton.message_id", &message);
    assert_eq!((accept.span_id.as_str(), accept.parent_span_id.as_str()), (root, ""), "{accept:#?}");
    for s in spans.iter().filter(|s| s.name != "accept") {
        assert_eq!(s.parent_span_id, root, "{s:#?}");
    }

    // A batch's header is the request's: every message of it is kept with it.
    let batch = json!({"messages": [
        {"conversation": "traced", "idempotency_key": "b1", "payload": 1, "to": ["host-a"]},
        {"conversation": "traced", "idempotency_key": "b2", "payload": 2, "to": ["host-a"]},
    ]});
    let batch_parent = format!("00-{TRACE_ID}-00000000000000b1-01");
    let r = api.post_with("/v1/batch/messages", &batch, &[("traceparent", &batch_parent)]).await;
    let results = r.ok(200)["results"].as_array().expect("results").clone();
    for item in &results {
        let id = item["ok"]["message_id"].as_str().expect("message_id");
        let view = api.message(id).await;
        assert_eq!(view.ok(200)["traceparent"], batch_parent);
    }

    // A malformed header is refused, naming it; nothing is accepted.
    for bad in ["00-xyz", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"] {
        let body = json!({"conversation": "traced", "idempotency_key": "bad", "payload": 0, "to": ["host-a"]});
        let r = api.post_with("/v1/messages", &body, &[("traceparent", bad)]).await;
        let message = r.err(400, "invalid_field");
        assert!(message.starts_with("traceparent:"), "{message}");
    }
    let r = api.get("/v1/messages?idempotency_key=bad").await;
    r.err(404, "not_found");
    assert_eq!(sink.refused(), Vec::<String>::new(), "the exporters send what an OTLP receiver takes");
}
