//! What each command does, and the exit status it ends with. The connection is built once
//! (`config::settings`, then `Client::new`) before any command that talks to the hub.

use crate::args::{Cli, Command, SendArgs, Which};
use crate::error::{CliError, call_failed, failure, printed, usage};
use crate::verdict::{ended, verdict};
use crate::{config, output};
use baton_client::{Client, ClientError};
use baton_shared::exit;
use baton_shared::files::{read_all_text_bounded, read_text_bounded};
use baton_shared::limits::PAYLOAD_FILE_BYTES_MAX;
use baton_shared::manuals;
use baton_shared::traceparent::{TRACEPARENT_ENV, TraceParent};
use baton_shared::wire::{MessageView, Payload, SubmitRequest};
use clap::CommandFactory as _;
use std::time::{Duration, Instant};

/// The pause between two reads of `wait` while the hub cannot answer (restarting, unreachable,
/// overloaded).
const WAIT_RETRY_PACE: Duration = Duration::from_secs(1);

/// The name the completion scripts and man pages are generated for.
const BIN_NAME: &str = "baton";

/// Runs the command; returns the exit status of a command that did its job.
pub(crate) fn run(cli: Cli) -> Result<u8, CliError> {
    match &cli.command {
        Command::Completions { shell } => {
            let script = manuals::completion_script(Cli::command(), BIN_NAME, *shell).map_err(failure)?;
            printed(output::lines(&[script.trim_end().to_string()]))?;
            return Ok(exit::OK);
        }
        Command::Man { out } => {
            let pages = manuals::write_man_pages(Cli::command(), out).map_err(failure)?;
            printed(output::lines(&pages.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()))?;
            return Ok(exit::OK);
        }
        _ => {}
    }
    if let Command::Spool { command } = &cli.command
        && let Some(status) = crate::spool::run_local(command, cli.json)?
    {
        return Ok(status);
    }
    let settings = config::settings(&cli.connection).map_err(usage)?;
    let client = Client::new(&settings.hub_url, &settings.files).map_err(|e| usage(format!("configuration: {e}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failure(format!("starting the runtime: {e}")))?;
    let json = cli.json;
    rt.block_on(async move {
        match cli.command {
            Command::Send(args) => send(&client, *args, json).await,
            Command::Get { which, wait } => get(&client, &which, wait, json).await,
            Command::Wait { which, timeout } => wait(&client, &which, timeout, json).await,
            Command::Cancel { id, reason } => cancel(&client, &id, &reason, json).await,
            Command::Watch { id, after, timeout } => crate::watch::watch(&client, &id, after, timeout, json).await,
            Command::Follow { conversation, after, for_, once } => {
                crate::watch::follow(&client, &conversation, after, for_, once, json).await
            }
            Command::List { conversation, after, limit } => {
                list(&client, &conversation, after.as_deref(), limit, json).await
            }
            Command::Spool { command } => crate::spool::flush(&client, command, json).await,
            Command::Completions { .. } | Command::Man { .. } => Ok(exit::OK),
        }
    })
}

/// The payload's text from the one source given.
fn payload(args: &SendArgs) -> Result<Payload, CliError> {
    let text = match (&args.payload, &args.payload_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => read_text_bounded(path, PAYLOAD_FILE_BYTES_MAX, "PAYLOAD_FILE_BYTES_MAX")
            .map_err(|e| usage(format!("--payload-file: cannot read {}: {e}", path.display())))?,
        (None, None) => read_all_text_bounded(std::io::stdin(), PAYLOAD_FILE_BYTES_MAX, "PAYLOAD_FILE_BYTES_MAX")
            .map_err(|e| usage(format!("reading the payload from stdin: {e}")))?,
    };
    Payload::from_text(text).map_err(|e| usage(format!("payload: not one JSON value: {e}")))
}

async fn send(client: &Client, args: SendArgs, json: bool) -> Result<u8, CliError> {
    let payload = payload(&args)?;
    let retry_backoff_ms = match args.retry_backoff {
        Some(d) => Some(u64::try_from(d.as_millis()).map_err(|_| usage("--retry-backoff: too long"))?),
        None => None,
    };
    let req = SubmitRequest {
        conversation: args.conversation,
        idempotency_key: args.key,
        payload,
        to: (!args.to.is_empty()).then_some(args.to),
        pools: (!args.pools.is_empty()).then_some(args.pools),
        max_attempts: args.max_attempts,
        retry_backoff_ms,
        approval: args.approval,
        approval_timeout_ms: match args.approval_timeout {
            Some(d) => Some(u64::try_from(d.as_millis()).map_err(|_| usage("--approval-timeout: too long"))?),
            None => None,
        },
        deadline_ms: ms(args.deadline, "--deadline")?,
        stall_ms: ms(args.stall, "--stall")?,
    };
    if args.spool.spool.is_some() {
        return crate::spool::send(client, req, &args.spool, json).await;
    }
    let trace = trace_from_env()?;
    let r = match &trace {
        Some(tp) => client.submit_traced(&req, tp).await,
        None => client.submit(&req).await,
    }
    .map_err(call_failed)?;
    printed(if json { output::json(&r) } else { output::lines(&output::submitted(&r, &req.conversation)) })?;
    Ok(exit::OK)
}

/// The trace a send joins: `TRACEPARENT` from the environment (W3C Trace Context, as the node
/// gives it to a turn's harness), so a turn that hands work on with `baton send` keeps its
/// trace; `None` when unset or empty (the hub starts a trace). A malformed one is refused, naming
/// the variable, rather than silently dropped. A spooled send keeps no trace: the spool's record
/// of a message is its request alone.
fn trace_from_env() -> Result<Option<TraceParent>, CliError> {
    match std::env::var(TRACEPARENT_ENV) {
        Ok(text) if !text.trim().is_empty() => TraceParent::parse(text.trim())
            .map(Some)
            .map_err(|e| usage(format!("{TRACEPARENT_ENV}: {e} (a W3C traceparent, or unset)"))),
        _ => Ok(None),
    }
}

/// A duration flag in milliseconds.
fn ms(d: Option<Duration>, flag: &str) -> Result<Option<u64>, CliError> {
    d.map(|d| u64::try_from(d.as_millis()).map_err(|_| usage(format!("{flag}: too long")))).transpose()
}

async fn read(client: &Client, which: &Which, wait: Option<Duration>) -> Result<MessageView, ClientError> {
    match (&which.id, &which.key) {
        (Some(id), _) => client.message(id, wait).await,
        (None, Some(key)) => client.message_by_key(key, wait).await,
        (None, None) => Err(ClientError::Invalid("name the message by its id or with --key".into())),
    }
}

/// `read` for `wait`: a transient failure (the hub restarting, unreachable or busy) is read
/// again every `WAIT_RETRY_PACE` until `deadline`, saying so once on stderr; a read changes
/// nothing, so repeating it is safe.
async fn read_until(
    client: &Client,
    which: &Which,
    wait: Option<Duration>,
    deadline: Instant,
) -> Result<MessageView, CliError> {
    let mut said = false;
    loop {
        match read(client, which, wait).await {
            Err(e) if e.is_transient() && Instant::now() + WAIT_RETRY_PACE < deadline => {
                if !said {
                    eprintln!("baton: {e}; reading again until the timeout");
                    said = true;
                }
                tokio::time::sleep(WAIT_RETRY_PACE).await;
            }
            other => return other.map_err(call_failed),
        }
    }
}

async fn get(client: &Client, which: &Which, wait: Option<Duration>, json: bool) -> Result<u8, CliError> {
    let view = read(client, which, wait).await.map_err(call_failed)?;
    printed(if json { output::json(&view) } else { output::lines(&output::message(&view)) })?;
    Ok(exit::OK)
}

async fn wait(client: &Client, which: &Which, timeout: Duration, json: bool) -> Result<u8, CliError> {
    let deadline = Instant::now() + timeout;
    let mut view = read_until(client, which, None, deadline).await?;
    let status = loop {
        if let Some(status) = verdict(&view) {
            break status;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break exit::TIMED_OUT;
        }
        view = read_until(client, which, Some(remaining), deadline).await?;
    };
    if json {
        printed(output::json(&view))?;
    } else {
        let mut lines = output::message(&view);
        let done = view.deliveries.iter().filter(|d| ended(d).is_some()).count();
        let succeeded = view.deliveries.iter().filter(|d| ended(d) == Some(true)).count();
        let total = view.deliveries.len();
        lines.push(match status {
            exit::TIMED_OUT => format!("timed out: {done} of {total} deliveries ended, {succeeded} succeeded"),
            _ => format!("{succeeded} of {total} deliveries succeeded"),
        });
        printed(output::lines(&lines))?;
    }
    Ok(status)
}

async fn list(
    client: &Client,
    conversation: &str,
    after: Option<&str>,
    limit: Option<u32>,
    json: bool,
) -> Result<u8, CliError> {
    let page = client.list_messages(conversation, after, limit).await.map_err(call_failed)?;
    printed(if json { output::json(&page) } else { output::lines(&output::page(&page)) })?;
    Ok(exit::OK)
}

async fn cancel(client: &Client, id: &str, reason: &str, json: bool) -> Result<u8, CliError> {
    let r = client.cancel(id, reason).await.map_err(call_failed)?;
    printed(if json { output::json(&r) } else { output::lines(&output::cancelled(&r)) })?;
    let changed = r.deliveries.iter().any(|d| d.effect != "final");
    Ok(if changed { exit::OK } else { exit::NOTHING })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::EXIT_HELP;
    use baton_shared::wire::DeliveryView;

    #[test]
    fn every_exit_status_is_documented() {
        for status in
            [exit::OK, exit::NOTHING, exit::USAGE, exit::FAILURE, exit::NOT_SUCCEEDED, exit::TIMED_OUT, exit::DENIED]
                .into_iter()
                .chain([exit::REFUSED, exit::SPOOLED, exit::SPOOL_FAILED])
        {
            assert!(EXIT_HELP.contains(&format!("  {status}  ")), "{status} is not in the help");
        }
    }

    /// Every visible command has its page and every top-level one its completion.
    #[test]
    fn every_command_has_a_man_page_and_a_completion() {
        let dir = tempfile::tempdir().unwrap();
        manuals::write_man_pages(Cli::command(), dir.path()).unwrap();
        assert_eq!(manuals::missing(&Cli::command(), BIN_NAME, dir.path()), Vec::<String>::new());
        let paths = manuals::visible_command_paths(&Cli::command());
        assert!(paths.iter().any(|p| p == "baton-send") && paths.iter().any(|p| p == "baton-wait"), "{paths:?}");
    }

    fn delivery(state: &str, attempt: u32, outcomes: &[(u32, &str)]) -> DeliveryView {
        let attempts: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|(n, o)| {
                serde_json::json!({"attempt_id": "a", "report_id": "r", "outcome": o, "exit_code": null,
                "duration_ms": null, "result": null, "reason": null, "reported_at_ms": 0, "attempt": n})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"delivery_id": "d", "host": "h", "state": state, "reason": null,
            "updated_at_ms": 0, "attempts": attempts, "attempt": attempt, "max_attempts": 3}))
        .unwrap()
    }

    #[test]
    fn a_delivery_has_ended_when_its_current_run_has() {
        let check = |d: DeliveryView, expected: Option<bool>| assert_eq!(ended(&d), expected, "{d:?}");
        check(delivery("queued", 1, &[]), None);
        check(delivery("delivered", 1, &[]), None);
        check(delivery("delivered", 1, &[(1, "succeeded")]), Some(true));
        check(delivery("delivered", 1, &[(1, "cancelled")]), Some(false));
        check(delivery("delivered", 1, &[(1, "unknown")]), Some(false));
        // A retry runs: the earlier run's outcome is not this run's.
        check(delivery("delivered", 2, &[(1, "failed")]), None);
        check(delivery("queued", 2, &[(1, "failed")]), None);
        check(delivery("delivered", 2, &[(1, "failed"), (2, "succeeded")]), Some(true));
        check(delivery("failed", 1, &[]), Some(false));
        check(delivery("unknown", 1, &[]), Some(false));
    }
}
