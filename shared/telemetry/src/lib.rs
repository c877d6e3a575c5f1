//! Baton's traces: the spans the hub and the node record for each message, in the trace of the
//! producer that submitted it, exported over OTLP/HTTP (protobuf) when an `otlp_endpoint` is
//! configured.
//!
//! Layout:
//! - `endpoint`: the `otlp_endpoint` value both binaries validate (`OtlpEndpoint`).
//! - `limits`: the exporter's bounds.
//! - this file: `Telemetry`, the one handle a process records spans through.
//!
//! Every span is a child of the span named by the message's `traceparent` (the producer's span,
//! or the hub's `accept` span when the hub started the trace), so one trace shows the producer,
//! the hub's accept, fan-out and claim, and the node's handoff, start, run and report of each
//! delivery. Spans are recorded after the fact, with the start and end times the step measured,
//! which keeps the hot path free of open span objects.
//!
//! Invariant: with no endpoint (`Telemetry::off`, the default) nothing is built: `started`
//! answers `None` (no clock read), and `span` returns before its attributes are made.
//! Boundary: no OpenTelemetry type crosses this crate's API; callers name spans, times and
//! attributes in plain types.
//!
//! Exporting runs on the OpenTelemetry batch processor's own thread with reqwest's blocking
//! client (the processor calls its exporter outside any async runtime): a slow or absent
//! collector never holds a request. Its queue is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 spans
//! by default; spans beyond it are dropped and counted by the SDK), and so is every export
//! (`limits::EXPORT_TIMEOUT`).

pub mod endpoint;
pub mod limits;

pub use endpoint::OtlpEndpoint;

use baton_shared::traceparent::TraceParent;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::sync::Arc;
use std::time::SystemTime;

/// One attribute of a span: a name and a text or an integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attr {
    /// A text value.
    Str(&'static str, String),
    /// An integer value.
    Int(&'static str, i64),
}

impl Attr {
    fn into_key_value(self) -> KeyValue {
        match self {
            Attr::Str(k, v) => KeyValue::new(k, v),
            Attr::Int(k, v) => KeyValue::new(k, v),
        }
    }
}

/// The attributes every span of one delivery carries (`baton.*`), so a trace with several
/// deliveries of one message tells them apart.
pub fn delivery_attrs(delivery_id: &str, message_id: &str, conversation: &str, seq: i64, attempt: u32) -> Vec<Attr> {
    vec![
        Attr::Str("baton.delivery_id", delivery_id.to_string()),
        Attr::Str("baton.message_id", message_id.to_string()),
        Attr::Str("baton.conversation", conversation.to_string()),
        Attr::Int("baton.seq", seq),
        Attr::Int("baton.attempt", i64::from(attempt)),
    ]
}

/// What a span stands for, as OpenTelemetry's span kinds say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The hub serving a producer's request (`accept`).
    Server,
    /// A node's request to the hub (`handoff`, `start`, `report`).
    Client,
    /// Work inside one process (`fan-out`, `claim`, `run`).
    Internal,
}

impl Kind {
    fn otel(self) -> SpanKind {
        match self {
            Kind::Server => SpanKind::Server,
            Kind::Client => SpanKind::Client,
            Kind::Internal => SpanKind::Internal,
        }
    }
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (its HTTP client, or the endpoint).
    #[error("the OTLP exporter for {endpoint} could not be built: {detail}")]
    Exporter {
        /// The endpoint as configured.
        endpoint: String,
        /// What went wrong.
        detail: String,
    },
}

/// The handle a process records its spans through: off (nothing built, nothing exported) or
/// exporting to one OTLP endpoint. Cheap to clone; every clone records into the same exporter.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// A root span the hub opened for a message that came without a `traceparent`: its trace is
/// the message's, and its span the parent of everything that follows.
#[derive(Debug)]
pub struct RootSpan {
    span: opentelemetry_sdk::trace::Span,
}

impl RootSpan {
    /// The `traceparent` naming this span, to be kept with the message.
    pub fn traceparent(&self) -> TraceParent {
        let sc = self.span.span_context();
        TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            parent_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        }
    }

    /// Ends the span at `end` with `attrs`.
    pub fn end(mut self, end: SystemTime, attrs: Vec<Attr>) {
        self.span.set_attributes(attrs.into_iter().map(Attr::into_key_value));
        self.span.end_with_timestamp(end);
    }
}

impl Telemetry {
    /// Tracing off: nothing is recorded or exported.
    pub fn off() -> Telemetry {
        Telemetry { inner: None }
    }

    /// Starts exporting to `endpoint`, naming this process `service` (`baton-hub`,
    /// `baton-node`). The exporter's thread starts here; spans leave in batches.
    pub fn start(endpoint: &OtlpEndpoint, service: &'static str) -> Result<Telemetry, TelemetryError> {
        use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint.traces_url())
            .with_timeout(limits::EXPORT_TIMEOUT)
            .with_headers(Default::default())
            .build()
            .map_err(|e| TelemetryError::Exporter { endpoint: endpoint.to_string(), detail: e.to_string() })?;
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(service)
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        let tracer = provider.tracer("baton");
        Ok(Telemetry { inner: Some(Arc::new(Inner { provider, tracer })) })
    }

    /// Whether spans are recorded.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The time a span starts, read only when spans are recorded.
    pub fn started(&self) -> Option<SystemTime> {
        self.inner.as_ref().map(|_| SystemTime::now())
    }

    /// Records a span `name` from `start` (`started`) until now, a child of the span `parent`
    /// names (a stored `traceparent`). Nothing happens when tracing is off, `start` is `None`,
    /// or `parent` is absent or does not parse (a message from before traces were kept).
    pub fn span(
        &self,
        name: &'static str,
        kind: Kind,
        parent: Option<&str>,
        start: Option<SystemTime>,
        attrs: impl FnOnce() -> Vec<Attr>,
    ) {
        self.span_ending(name, kind, parent, start, None, attrs);
    }

    /// `span`, ending at `end` (`started` read when the step ended), or now when `None`.
    pub fn span_ending(
        &self,
        name: &'static str,
        kind: Kind,
        parent: Option<&str>,
        start: Option<SystemTime>,
        end: Option<SystemTime>,
        attrs: impl FnOnce() -> Vec<Attr>,
    ) {
        let (Some(inner), Some(start), Some(parent)) = (&self.inner, start, parent) else { return };
        let end = end.unwrap_or_else(SystemTime::now);
        let Ok(parent) = TraceParent::parse(parent) else { return };
        let cx = remote_parent(&parent);
        let mut span = inner
            .tracer
            .span_builder(name)
            .with_kind(kind.otel())
            .with_start_time(start)
            .with_attributes(attrs().into_iter().map(Attr::into_key_value))
            .start_with_context(&inner.tracer, &cx);
        span.end_with_timestamp(end);
    }

    /// Opens the root span of a new trace (a message submitted without a `traceparent`), from
    /// `start`; `None` when tracing is off.
    pub fn root(&self, name: &'static str, kind: Kind, start: Option<SystemTime>) -> Option<RootSpan> {
        let (inner, start) = (self.inner.as_ref()?, start?);
        let span = inner
            .tracer
            .span_builder(name)
            .with_kind(kind.otel())
            .with_start_time(start)
            .start_with_context(&inner.tracer, &Context::new());
        Some(RootSpan { span })
    }

    /// Exports what is queued and stops the exporter, waiting at most
    /// `limits::SHUTDOWN_FLUSH`. Blocks: call it off the async runtime's workers.
    pub fn shutdown(&self) {
        if let Some(inner) = &self.inner
            && let Err(e) = inner.provider.shutdown_with_timeout(limits::SHUTDOWN_FLUSH)
        {
            tracing::warn!("traces: the last spans were not all exported at shutdown: {e}");
        }
    }
}

/// A context whose remote parent is the span `tp` names.
fn remote_parent(tp: &TraceParent) -> Context {
    let sc = SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.parent_id),
        TraceFlags::new(tp.flags),
        true,
        TraceState::default(),
    );
    Context::new().with_remote_span_context(sc)
}
