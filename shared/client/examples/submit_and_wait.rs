//! Submit a message and wait until every delivery of it has ended.
//!
//! ```sh
//! export BATON_HUB_URL=https://hub.example.net:7443 BATON_CA_FILE=ca.crt \
//!        BATON_CERT_FILE=billing.crt BATON_KEY_FILE=billing.key
//! cargo run -p baton-client --example submit_and_wait -- support worker-1 order-42
//! ```
//!
//! Arguments: the conversation, the recipient host, the idempotency key. The connection comes
//! from the same variables `baton` reads. The submit is safe to repeat: running the example
//! again with the same key answers with the same message (`duplicate`) and waits for it.
//!
//! It sends its own W3C `traceparent` (a trace of its own here; a traced program passes the
//! context of its current span), which the hub keeps with the message and the harness finds as
//! `TRACEPARENT`. Exit status: 0 when every delivery succeeded, 1 when one did not, 2 when the
//! wait ran out first.

use baton_client::{Client, TlsFiles};
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::traceparent::TraceParent;
use baton_shared::wire::{MessageView, Payload, SubmitRequest};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long the example waits for every delivery to end.
const WAIT_FOR_OUTCOMES: Duration = Duration::from_secs(120);
/// How long one read waits for news (the hub caps it at its `long_poll_wait_max`).
const READ_WAIT: Duration = Duration::from_secs(20);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [conversation, host, key] = args.as_slice() else {
        return Err("usage: submit_and_wait CONVERSATION HOST IDEMPOTENCY_KEY".into());
    };
    let client = client_from_env()?;

    let request = SubmitRequest {
        conversation: conversation.clone(),
        idempotency_key: key.clone(),
        payload: Payload::from_text(format!(r#"{{"ticket": {key:?}}}"#))?,
        to: Some(vec![host.clone()]),
        pools: None,
        max_attempts: None,
        retry_backoff_ms: None,
        approval: None,
        approval_timeout_ms: None,
        deadline_ms: None,
        stall_ms: None,
    };
    // Retried by the client on transient failures: the same key makes a repeat the same message.
    let accepted = client.submit_traced(&request, &TraceParent::generate(true)).await?;
    let what = if accepted.duplicate { "already accepted" } else { "accepted" };
    println!("message {} {what}: {conversation} #{}", accepted.message_id, accepted.seq);

    // Long-poll reads: each answers as soon as a delivery settles, or after READ_WAIT.
    let deadline = Instant::now() + WAIT_FOR_OUTCOMES;
    let mut view = client.message(&accepted.message_id, None).await?;
    while !all_ended(&view) {
        if Instant::now() >= deadline {
            println!("timed out waiting for the outcomes");
            return Ok(ExitCode::from(2));
        }
        view = client.message(&accepted.message_id, Some(READ_WAIT)).await?;
    }
    println!("traceparent {}", view.traceparent.as_deref().unwrap_or("none"));
    let mut all_succeeded = true;
    for d in &view.deliveries {
        let outcome = d.attempts.iter().rev().find(|a| a.attempt == d.attempt).map(|a| a.outcome);
        all_succeeded &= outcome == Some(Outcome::Succeeded);
        let shown = outcome.map_or_else(|| d.state.to_string(), |o| o.as_str().to_string());
        println!("  {}: {shown}", d.host.as_deref().or(d.pool.as_deref()).unwrap_or("-"));
    }
    Ok(if all_succeeded { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Whether every delivery has ended: failed, unknown, or delivered with its current run's
/// outcome (the hub's "settled").
fn all_ended(view: &MessageView) -> bool {
    view.deliveries.iter().all(|d| match d.state {
        DeliveryState::Failed | DeliveryState::Unknown => true,
        DeliveryState::Delivered => d.attempts.iter().any(|a| a.attempt == d.attempt),
        _ => false,
    })
}

/// A client from `BATON_HUB_URL`, `BATON_CA_FILE`, `BATON_CERT_FILE` and `BATON_KEY_FILE`.
fn client_from_env() -> Result<Client, Box<dyn std::error::Error>> {
    // rustls needs one crypto provider; the workspace's is aws-lc-rs.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let files = TlsFiles {
        ca_file: var("BATON_CA_FILE")?.into(),
        cert_file: var("BATON_CERT_FILE")?.into(),
        key_file: var("BATON_KEY_FILE")?.into(),
    };
    Ok(Client::new(&var("BATON_HUB_URL")?, &files)?)
}
