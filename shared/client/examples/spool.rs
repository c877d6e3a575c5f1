//! Send through a durable spool: the message is on disk before any hub sees it, and is
//! delivered, once, whenever a hub answers.
//!
//! ```sh
//! export BATON_HUB_URL=https://hub.example.net:7443 BATON_CA_FILE=ca.crt \
//!        BATON_CERT_FILE=billing.crt BATON_KEY_FILE=billing.key
//! cargo run -p baton-client --example spool -- ~/.local/state/billing-spool support worker-1 order-45
//! ```
//!
//! Arguments: the spool's directory, the conversation, the recipient host, the idempotency key.
//! `Spooler::spool` commits the message to `DIR/spool.db` (SQLite, `synchronous=FULL`);
//! `Spooler::flush` then delivers everything waiting there, oldest first, each only once (its
//! idempotency key), trying for `FLUSH_WAIT` while no hub answers. What it could not deliver
//! stays for the next flush: this program's next run, or `baton spool flush --spool DIR`.
//! Exit status: 0 when nothing waits any more, 1 when something still does.

use baton_client::spool::Settled;
use baton_client::{Client, SpoolLimits, Spooler, TlsFiles};
use baton_shared::wire::{Payload, SubmitRequest};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// How long a flush keeps trying while no hub answers.
const FLUSH_WAIT: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, conversation, host, key] = args.as_slice() else {
        return Err("usage: spool DIR CONVERSATION HOST IDEMPOTENCY_KEY".into());
    };
    let client = client_from_env()?;
    let spooler = Spooler::open(&PathBuf::from(dir), SpoolLimits::default(), &client, baton_shared::clock::system())?;

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
    // Durable when this returns: a crash from here on loses nothing.
    let spooled = spooler.spool(request).await?;
    println!("spooled {} at position {}", spooled.idempotency_key, spooled.position);

    let report = spooler.flush(FLUSH_WAIT).await?;
    for settled in &report.settled {
        match settled {
            Settled::Accepted { position, response, .. } => {
                println!("position {position}: accepted as message {}", response.message_id)
            }
            Settled::Refused { position, idempotency_key, error } => {
                println!("position {position} ({idempotency_key}): refused, kept in the spool: {error}")
            }
        }
    }
    let status = spooler.status().await?;
    println!("{} message(s) still waiting, {} refused", status.waiting, status.failed.len());
    if let Some(why) = report.stopped {
        println!("stopped: {why}");
    }
    Ok(if status.waiting == 0 && status.failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
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
