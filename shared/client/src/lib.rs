//! `baton-client`: the typed async client of Baton's v1 HTTP API over mTLS, for producers (submit,
//! read with long-poll wait by id or idempotency key, cancel) and for nodes (sessions, claim,
//! mirrored, ack, reject, starts, holdings, reports), and `baton`, the producer command line
//! built on it (`src/bin/baton`).
//!
//! Every request and answer is a `baton_shared::wire` type; every failure is a `ClientError`
//! that keeps the hub's refusals (typed by `baton_shared::error::ErrorCode`) apart from
//! transport failures. Only idempotent calls are retried.
//!
//! Layout:
//! - `client`: `Client` (producer calls) and `NodeClient` (node calls), `BuildError`.
//! - `tls`: `TlsFiles` and `http_client`, the one mTLS reqwest client builder.
//! - `error`: `ClientError`, `ApiError`, and how a reqwest failure is classified.
//! - `retry`: `RetryPolicy` and the bounded, paced retry of idempotent calls.
//! - `limits`: the client's timeouts and retry bounds.
//!
//! Invariant: this crate depends on `baton-shared` alone among Baton's crates; it opens no
//! store and starts no server.

pub mod client;
pub mod error;
pub mod limits;
pub mod retry;
pub mod submit_batch;
pub mod tls;

pub use client::{BuildError, Client, NodeClient};
pub use error::{ApiError, ClientError};
pub use retry::RetryPolicy;
pub use tls::{TlsError, TlsFiles};
