//! `OtlpSink`: a real OTLP/HTTP trace receiver on loopback, for the suites that configure
//! `otlp_endpoint`: it takes `POST /v1/traces` with an `application/x-protobuf` body, decodes
//! the `ExportTraceServiceRequest` as any collector does (`opentelemetry-proto`, `prost`) and
//! answers `ExportTraceServiceResponse`. The end-to-end tests read back the spans it received;
//! the benchmark uses it as the local sink it exports to, keeping counts only.
//!
//! It runs on a thread of its own with its own runtime, so a test with or without a runtime
//! can start it, and it stops when dropped.

use anyhow::Context;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Most bytes of one export request the sink reads (OTLP exporters send a few hundred KiB at
/// most per batch).
const EXPORT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// What the sink keeps of what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Every span, decoded (the tests).
    Spans,
    /// Counts only (the benchmark: a long run would otherwise hold every span).
    Counts,
}

/// One span as the sink received it: its process's `service.name`, its name, ids in lowercase
/// hex (the parent empty for a root), and its attributes (text and integer values as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The `service.name` of the resource it came with.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Its trace id, 32 hex digits.
    pub trace_id: String,
    /// Its span id, 16 hex digits.
    pub span_id: String,
    /// Its parent's span id, 16 hex digits, or empty.
    pub parent_span_id: String,
    /// Its attributes.
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    span_count: u64,
    requests: u64,
    refused: Vec<String>,
}

/// A running OTLP/HTTP receiver (see the module docs).
#[derive(Debug)]
pub struct OtlpSink {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpSink {
    /// Binds a free loopback port and starts serving.
    pub fn start(keep: Keep) -> anyhow::Result<OtlpSink> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding the OTLP sink")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Received::default()));
        let (stop, stopped) = oneshot::channel();
        let shared = received.clone();
        let thread = std::thread::Builder::new().name("otlp-sink".into()).spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(serve(listener, shared, keep, stopped));
        })?;
        Ok(OtlpSink { addr, received, stop: Some(stop), thread: Some(thread) })
    }

    /// The base URL to configure as `otlp_endpoint` (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far (empty with `Keep::Counts`).
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.lock().spans.clone()
    }

    /// How many spans arrived, and in how many export requests.
    pub fn counts(&self) -> (u64, u64) {
        let r = self.lock();
        (r.span_count, r.requests)
    }

    /// The requests it refused (wrong path, type or body), each with why: a correct exporter
    /// makes none.
    pub fn refused(&self) -> Vec<String> {
        self.lock().refused.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    received: Arc<Mutex<Received>>,
    keep: Keep,
    mut stopped: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = &mut stopped => return,
        };
        let received = received.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let received = received.clone();
                async move { Ok::<_, std::convert::Infallible>(export(req, &received, keep).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

/// Answers one request: an export is decoded and kept; anything else is refused and noted.
async fn export(req: Request<Incoming>, received: &Mutex<Received>, keep: Keep) -> Response<Full<Bytes>> {
    let refuse = |status: StatusCode, why: String| {
        received.lock().unwrap_or_else(|p| p.into_inner()).refused.push(why.clone());
        let mut r = Response::new(Full::new(Bytes::from(why)));
        *r.status_mut() = status;
        r
    };
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" {
        return refuse(StatusCode::NOT_FOUND, format!("{} {}", req.method(), req.uri()));
    }
    let protobuf = req.headers().get(hyper::header::CONTENT_TYPE).is_some_and(|v| v == "application/x-protobuf");
    if !protobuf {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type {:?}", req.headers().get("content-type")),
        );
    }
    let body = match http_body_util::Limited::new(req.into_body(), EXPORT_BYTES_MAX).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("not an ExportTraceServiceRequest: {e}")),
    };
    let spans = decode_spans(request);
    {
        let mut r = received.lock().unwrap_or_else(|p| p.into_inner());
        r.requests += 1;
        r.span_count += spans.len() as u64;
        if keep == Keep::Spans {
            r.spans.extend(spans);
        }
    }
    let mut r = Response::new(Full::new(Bytes::from(ExportTraceServiceResponse::default().encode_to_vec())));
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/x-protobuf"));
    r
}

fn decode_spans(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let text = |v: Option<Value>| match v {
        Some(Value::StringValue(s)) => s,
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    };
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.clone().and_then(|v| v.value)))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(ReceivedSpan {
                    service: service.clone(),
                    name: s.name,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    attributes: s
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, text(kv.value.and_then(|v| v.value))))
                        .collect(),
                });
            }
        }
    }
    out
}
