//! `baton-client`: the typed async client of Baton's v1 HTTP API over mTLS, for producers (submit,
//! read with long-poll wait by id or idempotency key, cancel) and for nodes (sessions, claim,
//! mirrored, ack, reject, starts, holdings, reports), and `baton`, the producer command line
//! built on it (`src/bin/baton`).
//!
//! Every request and answer is a `baton_shared::wire` type; every failure is a `ClientError`
//! that keeps the hub's refusals (typed by `baton_shared::error::ErrorCode`) apart from
//! transport failures. Only idempotent calls are retried.
//!
//! Examples, runnable programs in `shared/client/examples/` (built by the test command and run
//! against a real hub by `tests/examples.rs`), each connecting through the variables `baton`
//! reads (`BATON_HUB_URL`, `BATON_CA_FILE`, `BATON_CERT_FILE`, `BATON_KEY_FILE`):
//! - `submit_and_wait`: `Client::submit_traced` (the producer's `traceparent` kept with the
//!   message), then long-poll reads (`Client::message` with a wait) until every delivery ended:
//!   `cargo run -p baton-client --example submit_and_wait -- CONVERSATION HOST KEY`.
//! - `list_messages`: `Client::list_messages` from a cursor, following `next_cursor` while
//!   `more`, starting over when the cursor expired:
//!   `cargo run -p baton-client --example list_messages -- CONVERSATION [CURSOR]`.
//! - `spool`: `Spooler::open`, `Spooler::spool` (durable when it returns), `Spooler::flush`:
//!   `cargo run -p baton-client --example spool -- DIR CONVERSATION HOST KEY`.
//!
//! In short, a producer that submits and waits (the example `in_short`, which the test command
//! builds, so this cannot fall behind the API):
//!
//! ```no_run
#![doc = include_str!("../examples/in_short.rs")]
//! ```
//!
//! Layout:
//! - `client`: `Client` (producer calls, the listing `list_messages` among them) and
//!   `NodeClient` (node calls), `BuildError`.
//! - `hubs`: the hub URLs a client may talk to and the one in use (`Client::with_hubs`,
//!   `Client::advance_from`): a node moves on, round robin, from a hub that cannot answer.
//! - `node_batch`: the node's batch calls (`NodeClient::mirrored_batch`, `ack_batch`,
//!   `handoff_batch`, `reject_batch`, `report_batch`), one typed answer per item.
//! - `tls`: `TlsFiles` and `http_client`, the one mTLS reqwest client builder.
//! - `error`: `ClientError`, `ApiError`, and how a reqwest failure is classified.
//! - `retry`: `RetryPolicy` and the bounded, paced retry of idempotent calls; `Backoff`, the
//!   pacing of a caller that retries for as long as it runs.
//! - `limits`: the client's timeouts and retry bounds.
//! - `spool`: the producer's durable local outbox (`Spooler`, `Spool`): sends kept while no hub
//!   answers, delivered later in order, each once.
//!
//! Invariant: this crate depends on `baton-shared` alone among Baton's crates; it starts no
//! server and opens no store but the producer's own spool (`spool`).

pub mod client;
pub mod error;
mod hubs;
pub mod limits;
pub mod node_batch;
pub mod retry;
pub mod spool;
pub mod submit_batch;
pub mod tls;

pub use client::{BuildError, Client, NodeClient};
pub use error::RefusedForGood;
pub use error::{ApiError, ClientError};
pub use node_batch::ItemAnswer;
pub use retry::Backoff;
pub use retry::RetryPolicy;
pub use spool::{SpoolError, SpoolLimits, Spooler};
pub use tls::{TlsError, TlsFiles};
