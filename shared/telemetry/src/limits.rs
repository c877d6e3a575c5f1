//! The exporter's bounds. The batch processor's own (queue, batch size, delay) are
//! OpenTelemetry's defaults, set by its `OTEL_BSP_*` environment variables.

use std::time::Duration;

/// Longest one export to the collector may take before it is given up (its spans are dropped):
/// a collector that hangs costs the exporter thread this much per batch, never a request.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest shutdown waits for the last spans to be exported.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

/// Longest `otlp_endpoint` value taken (a URL's usual bound).
pub const ENDPOINT_CHARS_MAX: usize = 2048;
