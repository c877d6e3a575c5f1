//! Page through this producer's own messages of a conversation, from a cursor, and say where
//! to go on from.
//!
//! ```sh
//! export BATON_HUB_URL=https://hub.example.net:7443 BATON_CA_FILE=ca.crt \
//!        BATON_CERT_FILE=billing.crt BATON_KEY_FILE=billing.key
//! cargo run -p baton-client --example list_messages -- support             # from the oldest kept
//! cargo run -p baton-client --example list_messages -- support CURSOR      # what came since
//! ```
//!
//! It follows `next_cursor` while the hub says `more`, printing each message, then prints the
//! last cursor: kept by the caller, it is where the next run starts, so a producer tails its
//! messages run after run, each seen once. A cursor past which the hub removed messages
//! (retention, a purge) is refused as expired (`cursor_expired`): the example then starts over
//! from the oldest message kept, as a producer would.

use baton_client::{Client, TlsFiles};
use baton_shared::error::ErrorCode;

/// Messages asked for per page (the hub caps it at its `limits.message_page_max`).
const PAGE_LIMIT: u32 = 50;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (conversation, mut after) = match args.as_slice() {
        [c] => (c.clone(), None),
        [c, cursor] => (c.clone(), Some(cursor.clone())),
        _ => return Err("usage: list_messages CONVERSATION [CURSOR]".into()),
    };
    let client = client_from_env()?;
    loop {
        let page = match client.list_messages(&conversation, after.as_deref(), Some(PAGE_LIMIT)).await {
            Ok(page) => page,
            Err(e) if e.code() == Some(ErrorCode::CursorExpired) => {
                eprintln!("the cursor expired ({e}); starting from the oldest message kept");
                after = None;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for m in &page.messages {
            let states: Vec<String> = m
                .deliveries
                .iter()
                .map(|d| format!("{} {}", d.host.as_deref().or(d.pool.as_deref()).unwrap_or("-"), d.state))
                .collect();
            println!("#{} {} {} [{}]", m.seq, m.idempotency_key, m.message_id, states.join(", "));
        }
        after = Some(page.next_cursor);
        if !page.more {
            break;
        }
    }
    println!("next {}", after.unwrap_or_default());
    Ok(())
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
