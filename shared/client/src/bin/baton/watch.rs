//! `baton watch ID` and `baton follow --conversation C`: a message's or a conversation's events
//! as they happen (state changes, progress, outcomes), long-polling the hub's events feed and
//! resuming from the last cursor after any failure, so nothing is printed twice or missed.
//!
//! With `--json` each event is one line of JSON exactly as the hub sent it (its `cursor` is
//! what `--after` takes to resume in another process); without, one line of text per event.

use crate::error::{CliError, call_failed, printed};
use crate::output::{self, esc};
use baton_client::Client;
use baton_shared::exit;
use baton_shared::wire::{EventsPage, FeedEvent, FeedEventKind};
use std::time::{Duration, Instant};

/// How long one long poll of the feed waits for the next event (the hub caps it by its
/// `limits.long_poll_wait_max`).
const FEED_WAIT: Duration = Duration::from_secs(25);
/// The pause before reading again after the hub did not answer (restarting, unreachable).
const FEED_RETRY_PACE: Duration = Duration::from_secs(1);

/// Which feed.
enum Feed<'a> {
    Message(&'a str),
    Conversation(&'a str),
}

/// Reads pages after `after` until `stop` says so (that page is returned) or `deadline` passes
/// (`None`), printing each event and moving `after` past it.
async fn pages(
    client: &Client,
    feed: Feed<'_>,
    after: &mut Option<String>,
    deadline: Option<Instant>,
    wait_each: Duration,
    json: bool,
    mut stop: impl FnMut(&EventsPage) -> bool,
) -> Result<Option<EventsPage>, CliError> {
    let mut said = false;
    // After an answer that says the message settled, the next read does not wait: the hub would
    // hold an empty answer for the whole wait (only an operator's redrive adds items then).
    let mut settled = false;
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(None);
        }
        let wait = if settled { Duration::ZERO } else { left.map_or(wait_each, |l| l.min(wait_each)) };
        let read = match feed {
            Feed::Message(id) => client.message_events(id, after.as_deref(), Some(wait), None).await,
            Feed::Conversation(c) => client.conversation_events(c, after.as_deref(), Some(wait), None).await,
        };
        let page = match read {
            Ok(page) => page,
            Err(e) if e.is_transient() => {
                if !said {
                    eprintln!("baton: {e}; reading on from the last event when the hub answers");
                    said = true;
                }
                tokio::time::sleep(FEED_RETRY_PACE).await;
                continue;
            }
            Err(e) => return Err(call_failed(e)),
        };
        said = false;
        settled = page.settled == Some(true);
        printed(print(&page.events, json))?;
        *after = Some(page.next_cursor.clone());
        if stop(&page) {
            return Ok(Some(page));
        }
    }
}

/// `baton watch ID`: until the message settled (exit 0 when every delivery succeeded, 7 when
/// one did not), or `timeout` passed (8).
pub(crate) async fn watch(
    client: &Client,
    id: &str,
    after: Option<String>,
    timeout: Option<Duration>,
    json: bool,
) -> Result<u8, CliError> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut after = after;
    // Settled, and nothing more after the cursor: every event is printed.
    let done = pages(client, Feed::Message(id), &mut after, deadline, FEED_WAIT, json, |p| {
        p.settled == Some(true) && p.events.is_empty()
    })
    .await?;
    if done.is_none() {
        eprintln!("baton: timed out; read on with --after {}", after.as_deref().unwrap_or("0"));
        return Ok(exit::TIMED_OUT);
    }
    let view = loop {
        match client.message(id, None).await {
            Err(e) if e.is_transient() => tokio::time::sleep(FEED_RETRY_PACE).await,
            other => break other.map_err(call_failed)?,
        }
    };
    Ok(crate::verdict::verdict(&view).unwrap_or(exit::NOT_SUCCEEDED))
}

/// `baton follow --conversation C`: this producer's messages' events in the conversation,
/// until interrupted, for `for_` at most, or (`once`) one page.
pub(crate) async fn follow(
    client: &Client,
    conversation: &str,
    after: Option<String>,
    for_: Option<Duration>,
    once: bool,
    json: bool,
) -> Result<u8, CliError> {
    let deadline = for_.map(|t| Instant::now() + t);
    let mut after = after;
    let wait = if once { Duration::ZERO } else { FEED_WAIT };
    pages(client, Feed::Conversation(conversation), &mut after, deadline, wait, json, |_| once).await?;
    eprintln!("baton: read on with --after {}", after.as_deref().unwrap_or("0"));
    Ok(exit::OK)
}

fn print(events: &[FeedEvent], json: bool) -> std::io::Result<()> {
    if json {
        let lines: Vec<String> =
            events.iter().map(|e| serde_json::to_string(e).map_err(std::io::Error::other)).collect::<Result<_, _>>()?;
        return output::lines(&lines);
    }
    output::lines(&events.iter().map(line).collect::<Vec<_>>())
}

/// One event as a line of text.
fn line(e: &FeedEvent) -> String {
    let what = match e.kind {
        FeedEventKind::State => {
            let from = e.from.map_or_else(|| "created".to_string(), |f| f.to_string());
            let to = e.to.map(|t| t.to_string()).unwrap_or_default();
            let by = e.actor.as_deref().map(|a| format!(" by {}", esc(a))).unwrap_or_default();
            let why = e.reason.as_deref().map(|r| format!(": {}", esc(r))).unwrap_or_default();
            format!("{from} -> {to}{by}{why}")
        }
        FeedEventKind::Progress => {
            let body = e.progress.as_ref().map(|p| esc(p.as_str()).into_owned()).unwrap_or_default();
            format!("progress #{} (run {}) {body}", e.seq.unwrap_or(0), e.attempt.unwrap_or(1))
        }
        FeedEventKind::Outcome => {
            let outcome = e.outcome.map(|o| o.to_string()).unwrap_or_default();
            let mut parts = Vec::new();
            if let Some(code) = e.exit_code {
                parts.push(format!("exit {code}"));
            }
            if let Some(ms) = e.duration_ms {
                parts.push(baton_shared::duration::human(Duration::from_millis(ms)));
            }
            if let (Some(kept), Some(dropped)) = (e.progress_events, e.progress_dropped)
                && kept + dropped > 0
            {
                parts.push(format!("progress: {kept} kept, {dropped} dropped"));
            }
            if e.retryable == Some(true) {
                parts.push("retried".into());
            }
            let why = e.reason.as_deref().map(|r| format!(": {}", esc(r))).unwrap_or_default();
            format!("run {} {outcome} ({}){why}", e.attempt.unwrap_or(1), parts.join(", "))
        }
    };
    format!("{}  {}  {}  {what}", clock(e.at_ms), esc(&e.host), esc(&e.delivery_id))
}

/// `HH:MM:SS.mmm` (UTC) of a unix-milliseconds time.
fn clock(ms: i64) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    let (h, m, s, milli) = (day_ms / 3_600_000, day_ms / 60_000 % 60, day_ms / 1000 % 60, day_ms % 1000);
    format!("{h:02}:{m:02}:{s:02}.{milli:03}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc_clock() {
        assert_eq!(clock(0), "00:00:00.000");
        assert_eq!(clock(86_400_000 + 3_723_004), "01:02:03.004");
    }
}
