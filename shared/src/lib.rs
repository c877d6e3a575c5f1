//! Code both Baton binaries use: the wire types of the HTTP API, identifier grammar, error
//! codes, default limits, the certificate authority helpers, the strict SQLite open sequence
//! and crash points for fault tests.
//!
//! Layout:
//! - `ids`: identifier grammar and roles.
//! - `states`: delivery states and attempt outcomes.
//! - `wire`: request and response bodies (the public API contract); `json_int`, the whole
//!   numbers they take as JSON Schema reads them (`12.0` is 12).
//! - `error`: stable error codes and their HTTP statuses.
//! - `limits`: default bounds.
//! - `pki`: CA creation, certificate issue, identity from a verified certificate.
//! - `sqlite`: opening a store with pragmas asserted and migrations applied.
//! - `crash`: crash points, compiled in only for fault tests.
//! - `duration`: human durations (`"30s"`) in configuration.
//! - `exit`: the exit statuses both binaries share.
//! - `clock`: injected wall-clock time (`Clock`, `SystemClock`, `ManualClock`).
//! - `logging`: one log filter variable (`BATON_LOG`) and format for both binaries.
//! - `signal`: the one SIGTERM/SIGINT shutdown path and SIGHUP.
//! - `files`: reading a file a user named within its bound (`limits::…_FILE_BYTES_MAX`).
//! - `traceparent`: the W3C trace context a message carries from its producer to the harness.
//!
//! Invariant: nothing here opens a socket or a listener.

pub mod clock;
pub mod crash;
pub mod duration;
pub mod error;
pub mod exit;
pub mod files;
pub mod ids;
pub mod json_int;
pub mod limits;
pub mod logging;
pub mod manuals;
pub mod pki;
pub mod signal;
pub mod sqlite;
pub mod states;
pub mod traceparent;
pub mod wire;

pub use crash::crash_point;
