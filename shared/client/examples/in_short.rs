//! In short, a producer that submits and waits (shown whole in the crate's documentation; the
//! test command builds it, so the documentation cannot fall behind the API).

use baton_client::{Client, TlsFiles};
use baton_shared::wire::{Payload, SubmitRequest};
use std::time::Duration;

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let files = TlsFiles { ca_file: "ca.crt".into(), cert_file: "billing.crt".into(), key_file: "billing.key".into() };
    let client = Client::new("https://hub.example.net:7443", &files)?;
    let request = SubmitRequest {
        conversation: "support".into(),
        idempotency_key: "order-42".into(),
        payload: Payload::from_text(r#"{"ticket": 42}"#.into())?,
        to: Some(vec!["worker-1".into()]),
        pools: None,
        max_attempts: None,
        retry_backoff_ms: None,
        approval: None,
        approval_timeout_ms: None,
        deadline_ms: None,
        stall_ms: None,
    };
    let accepted = client.submit(&request).await?; // retried: the key makes a repeat the same message
    let view = client.message(&accepted.message_id, Some(Duration::from_secs(20))).await?;
    println!("{:?}", view.deliveries.iter().map(|d| d.state).collect::<Vec<_>>());
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run().await
}
