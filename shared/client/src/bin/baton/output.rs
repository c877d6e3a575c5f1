//! Everything `baton` writes to stdout: JSON exactly as the API answered (serde writes it, the
//! payload's text untouched), or text for a human in which every piece of stored text goes
//! through `esc`.

use baton_shared::states::DeliveryState;
use baton_shared::wire::{CancelResponse, DeliveryView, MessagePage, MessageView, SubmitResponse};
use serde::Serialize;
use std::borrow::Cow;
use std::io::Write as _;

/// A character a terminal must not receive raw: C0 and C1 controls, DEL, and the bidirectional
/// overrides and isolates that reorder what follows them.
fn unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Stored text (a payload, a reason, a result, a name) made safe for a terminal: every control
/// character, escape sequence introducer, DEL and bidi override is shown escaped (`\x1b`, `\n`,
/// `\u{202e}`), so nothing stored can move the cursor, fake a line or write the clipboard.
pub(crate) fn esc(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) && (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Writes `lines` to stdout, one per line.
pub(crate) fn lines(lines: &[String]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}")?;
    }
    out.flush()
}

/// Writes `value` as pretty JSON.
pub(crate) fn json<T: Serialize>(value: &T) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    lines(&[text])
}

/// Who a delivery is for: its host, and for a pool delivery its pool (`pool gpu`, or
/// `host-a (pool gpu)` once a member's claim bound it).
fn recipient(host: Option<&str>, pool: Option<&str>) -> String {
    match (host, pool) {
        (Some(h), None) => esc(h).into_owned(),
        (Some(h), Some(p)) => format!("{} (pool {})", esc(h), esc(p)),
        (None, Some(p)) => format!("pool {}", esc(p)),
        (None, None) => "-".into(),
    }
}

/// `send`'s answer.
pub(crate) fn submitted(r: &SubmitResponse, conversation: &str) -> Vec<String> {
    let what = if r.duplicate { "already accepted (same key and content)" } else { "accepted" };
    let mut out = vec![format!("message {} {what}: {} #{}", esc(&r.message_id), esc(conversation), r.seq)];
    for d in &r.deliveries {
        out.push(format!(
            "  {}  {}  {}",
            recipient(d.host.as_deref(), d.pool.as_deref()),
            d.state,
            esc(&d.delivery_id)
        ));
    }
    out
}

/// A message, its deliveries and their attempts.
pub(crate) fn message(m: &MessageView) -> Vec<String> {
    let mut out = vec![
        format!("message {}", esc(&m.message_id)),
        format!(
            "  conversation {} #{}, key {}, producer {}",
            esc(&m.conversation),
            m.seq,
            esc(&m.idempotency_key),
            esc(&m.producer)
        ),
        format!("  payload {}", esc(m.payload.as_str())),
    ];
    if let Some(tp) = &m.traceparent {
        out.push(format!("  traceparent {}", esc(tp)));
    }
    for d in &m.deliveries {
        out.push(delivery(d));
        for a in &d.attempts {
            let exit = a.exit_code.map(|c| format!(" exit {c}")).unwrap_or_default();
            let signal = a.signal.map(|s| format!(" signal {s}")).unwrap_or_default();
            let reason = a.reason.as_deref().map(|r| format!(" ({})", esc(r))).unwrap_or_default();
            out.push(format!("    attempt {}: {}{exit}{signal}{reason}", a.attempt, a.outcome.as_str()));
            if let Some(result) = a.result.as_deref().filter(|r| !r.is_empty()) {
                out.push(format!("      result: {}", esc(result.trim_end())));
            }
            if let Some(tail) = a.stderr_tail.as_deref().filter(|t| !t.trim().is_empty()) {
                out.extend(stderr_lines(tail, a.stderr_dropped_bytes));
            }
        }
    }
    out
}

/// The end of a run's stderr: a heading saying how much came before it, then each of its lines
/// on a line of its own, escaped.
fn stderr_lines(tail: &str, dropped: Option<u64>) -> Vec<String> {
    let heading = match dropped {
        Some(n) if n > 0 => format!("      stderr (last part; {n} earlier bytes dropped):"),
        _ => "      stderr:".to_string(),
    };
    std::iter::once(heading)
        .chain(tail.trim_end().split('\n').map(|l| format!("        {}", esc(l.strip_suffix('\r').unwrap_or(l)))))
        .collect()
}

fn delivery(d: &DeliveryView) -> String {
    let reason = d.reason.as_deref().map(|r| format!(" ({})", esc(r))).unwrap_or_default();
    let runs = format!("run {}/{}", d.attempt, d.max_attempts);
    format!(
        "  {}  {}{reason}  {runs}  {}",
        recipient(d.host.as_deref(), d.pool.as_deref()),
        d.state,
        esc(&d.delivery_id)
    )
}

/// `list`'s page: one line per message (its `seq`, key, id and each delivery's host and state),
/// then where to continue.
pub(crate) fn page(p: &MessagePage) -> Vec<String> {
    let mut out = Vec::with_capacity(p.messages.len() + 1);
    for m in &p.messages {
        let deliveries: Vec<String> = m
            .deliveries
            .iter()
            .map(|d| format!("{} {}", recipient(d.host.as_deref(), d.pool.as_deref()), d.state))
            .collect();
        out.push(format!(
            "{} #{}  key {}  {}  {}",
            esc(&p.conversation),
            m.seq,
            esc(&m.idempotency_key),
            esc(&m.message_id),
            deliveries.join(", ")
        ));
    }
    let more = if p.more { "more follows: list again --after it" } else { "the end for now" };
    out.push(format!("next {} ({more})", esc(&p.next_cursor)));
    out
}

/// `cancel`'s answer.
pub(crate) fn cancelled(r: &CancelResponse) -> Vec<String> {
    let mut out = vec![format!("message {}", esc(&r.message_id))];
    for d in &r.deliveries {
        let state: DeliveryState = d.state;
        out.push(format!(
            "  {}  {}  now {state}  {}",
            recipient(d.host.as_deref(), d.pool.as_deref()),
            esc(&d.effect),
            esc(&d.delivery_id)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        assert_eq!(esc(input), expected, "{input:?}");
    }

    #[test]
    fn a_stderr_tail_is_shown_line_by_line_escaped() {
        assert_eq!(
            stderr_lines("first\r\nsecond \x1b[2J\n\n", Some(10)),
            ["      stderr (last part; 10 earlier bytes dropped):", "        first", "        second \\x1b[2J",]
        );
        assert_eq!(stderr_lines("only", Some(0)), ["      stderr:", "        only"]);
    }

    #[test]
    fn stored_text_cannot_reach_the_terminal_raw() {
        check("plain text, é", "plain text, é");
        check("a\nb\tc\r", "a\\nb\\tc\\r");
        check("\x1b[2J\x1b]52;c;aGk=\x07", "\\x1b[2J\\x1b]52;c;aGk=\\x07");
        check("\u{9b}31m", "\\x9b31m");
        check("x\u{7f}", "x\\x7f");
        check("\u{202e}evil", "\\u{202e}evil");
    }
}
