//! The status page on the operator listener: server-rendered HTML that refreshes itself (no
//! script at all), read-only. `/` (also `/status`) shows, top first: a search box (`?q=`: a
//! delivery id or a prefix of one, a message id, a conversation or a host), what needs
//! attention (`attention`, exactly what `baton-hub status` flags), the counts by state and by
//! outcome, messages, deliveries and outcomes per minute over the last hour, the turns running
//! with their age, hosts with their last contact (silent ones flagged against
//! `host_silence_warn`) and their backlog (marked paused or held under a fence), the pools
//! (each member active, fenced, silent or without a node, and busy when it holds pool work;
//! queued, the oldest queued age, in flight, bound conversations), the backlog per conversation, active fences with who, why and until, and the recent deliveries that
//! failed or ended `unknown`; each delivery links to `/status/deliveries/ID`, its event
//! history and attempts. Colour marks unknown, failed, held, paused and silent, always with
//! the word beside it.
//!
//! Invariant: no certificate guards this page, so it never shows a harness's result (what the
//! work produced). Failure reasons (the delivery's and its run's, which may say what the work
//! was about) and the end of a run's harness stderr (which may too) are shown only as
//! `status_page_reasons` says: by default while the listener is bound to loopback, which only
//! the machine itself reaches. Fence reasons, which operators write for each other, are always
//! shown.
//!
//! Invariant: every stored text reaches the page through `esc` (HTML-escaped, control
//! characters replaced), and every id in a link or a form through `url_segment` or `esc`.
//!
//! Why one file over 700 lines: the page is one read of the record rendered as one HTML
//! document, and the invariants above hold for every cell, so they are checked in one place.
//! Where it splits when it grows: the handlers and `routes`; the escaping and layout helpers
//! (`esc`, `url_segment`, `layout`); the overview's tables; the delivery page.

use crate::attention::{self, Attention};
use crate::datadir::DataDir;
use crate::runtime::AppState;
use crate::store::StoreError;
use crate::store::registry::fences::{FenceKind, FenceRow, FenceScope};
use crate::store::views::fleet::SilentHost;
pub use crate::store::views::overview::Overview;
use crate::store::views::overview::{self, ConversationBacklog, Rates, RunningTurn, Trouble};
use crate::store::views::pool_standing::PoolStanding;
use crate::store::views::read::{DeliveryDetail, DeliveryRow};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use baton_shared::duration::human_ms;
use baton_shared::states::{DeliveryState, Outcome};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the page reloads itself, at the most: the overview waits longer when reading it
/// took more than `gauge_read_share` of the time (`reload_secs`).
pub const PAGE_REFRESH_SECS: u32 = 10;
/// Longest stored text (a fence reason, a name) shown whole; longer ones are cut and marked.
pub const TEXT_SHOWN_CHARS_MAX: usize = 2000;
/// Longest failure reason shown in the failures table (the delivery's page shows it whole).
pub const REASON_SHOWN_CHARS_MAX: usize = 300;
/// Most characters of the end of a run's stderr shown in the failures table: its last ones,
/// where an error's last lines are (the delivery's page shows up to `TEXT_SHOWN_CHARS_MAX`).
pub const STDERR_SHOWN_CHARS_MAX: usize = 300;
/// How long the per-minute rates are kept before they are read again: the outcomes come from a
/// scan of the attempts, which a page reloading every few seconds must not repeat each time.
pub const RATES_REFRESH: Duration = Duration::from_secs(60);
/// Longest search text taken; a longer `q` is refused with 400.
pub const SEARCH_CHARS_MAX: usize = 200;

/// What the page needs from the configuration.
#[derive(Debug, Clone)]
pub struct PageConfig {
    /// A host whose open node session has been silent longer than this is flagged.
    pub host_silence_warn: Duration,
    /// `limits.store_bytes_max`, which a record over it needs attention for.
    pub store_bytes_max: u64,
    /// The data directory (its CA bundle and server certificate, for what needs attention).
    pub dir: DataDir,
    /// Whether failure reasons are shown (`status_page_reasons`).
    pub reasons: bool,
    /// The rates last read, and when (unix ms); see `RATES_REFRESH`.
    pub rates: Arc<Mutex<Option<Rates>>>,
    /// `gauge_read_share`: most of the time, in percent, that reading the record for an open
    /// page reloading itself may take.
    pub read_share: u32,
}

/// The page's routes (state: the hub's shared state).
pub fn routes(page: PageConfig) -> Router<AppState> {
    Router::new()
        .route("/", get(overview_page))
        .route("/status", get(overview_page))
        .route("/status/deliveries/{delivery_id}", get(delivery_page))
        .layer(Extension(page))
}

/// The overview's query: `?q=` searches.
#[derive(Debug, serde::Deserialize)]
struct PageQuery {
    q: Option<String>,
}

/// Everything the overview shows, read at one moment.
pub struct View<'a> {
    /// The record's overview.
    pub overview: &'a Overview,
    /// What needs attention.
    pub attention: &'a [Attention],
    /// The last hour, per minute.
    pub rates: Option<&'a Rates>,
    /// A search and what it found.
    pub search: Option<(&'a str, &'a [DeliveryRow])>,
    /// Whether failure reasons are shown.
    pub reasons: bool,
    /// After how many seconds the page reloads itself (`reload_secs`).
    pub reload_secs: u32,
}

/// After how many seconds the overview reloads itself when reading the record for it took
/// `took`: `PAGE_REFRESH_SECS`, or longer, so that a page left open spends at most
/// `read_share` percent of the time reading (on a record that keeps millions of finished
/// deliveries, counting their outcomes and finding the running turns takes seconds).
pub fn reload_secs(took: Duration, read_share: u32) -> u32 {
    let wait = crate::metrics::gauge_wait(Duration::from_secs(PAGE_REFRESH_SECS.into()), read_share, took);
    u32::try_from(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).unwrap_or(u32::MAX)
}

async fn overview_page(
    State(shared): State<AppState>,
    Extension(page): Extension<PageConfig>,
    Query(query): Query<PageQuery>,
) -> Response {
    let now_ms = shared.clock.now_ms();
    let silence = page.host_silence_warn;
    let q = query.q.map(|q| q.trim().to_string()).filter(|q| !q.is_empty());
    if q.as_ref().is_some_and(|q| q.chars().count() > SEARCH_CHARS_MAX) {
        let body =
            format!("<p>A search takes at most {SEARCH_CHARS_MAX} characters.</p><p><a href=\"/\">← status</a></p>");
        return html(StatusCode::BAD_REQUEST, layout("Search too long", &body, None));
    }
    let began = std::time::Instant::now();
    let o = match shared.store.overview(now_ms, silence).await {
        Ok(o) => o,
        Err(e) => return failed(&e),
    };
    let watch = attention::Watch {
        unknown_since_ms: now_ms
            .saturating_sub(i64::try_from(attention::UNKNOWN_WINDOW_DEFAULT.as_millis()).unwrap_or(i64::MAX)),
        host_silence_warn: silence,
        store_bytes_max: page.store_bytes_max,
    };
    let mut items = match attention::from_record(&shared.store, now_ms, watch).await {
        Ok(items) => items,
        Err(e) => return failed(&e),
    };
    match attention::from_files(&page.dir, now_ms) {
        Ok(more) => items.extend(more),
        Err(e) => items.push(Attention { kind: "unreadable", subject: "data directory".into(), detail: e }),
    }
    let rates = rates(&shared, &page, now_ms).await;
    let found = match &q {
        Some(q) => match shared.store.search(q.clone()).await {
            Ok(rows) => Some(rows),
            Err(e) => return failed(&e),
        },
        None => None,
    };
    let view = View {
        overview: &o,
        attention: &items,
        rates: rates.as_ref(),
        search: q.as_deref().zip(found.as_deref()),
        reasons: page.reasons,
        reload_secs: reload_secs(began.elapsed(), page.read_share),
    };
    html(StatusCode::OK, render_overview(&view, now_ms, silence))
}

/// The rates, read again when older than `RATES_REFRESH`; `None` (said on the page) when the
/// read failed.
async fn rates(shared: &AppState, page: &PageConfig, now_ms: i64) -> Option<Rates> {
    let fresh_after = now_ms.saturating_sub(i64::try_from(RATES_REFRESH.as_millis()).unwrap_or(i64::MAX));
    if let Ok(cached) = page.rates.lock()
        && let Some(r) = cached.as_ref().filter(|r| r.until_ms > fresh_after && r.until_ms <= now_ms)
    {
        return Some(r.clone());
    }
    match shared.store.rates(now_ms).await {
        Ok(r) => {
            if let Ok(mut cached) = page.rates.lock() {
                *cached = Some(r.clone());
            }
            Some(r)
        }
        Err(e) => {
            tracing::warn!(error = %e, "the status page could not read the rates");
            None
        }
    }
}

async fn delivery_page(
    State(shared): State<AppState>,
    Extension(page): Extension<PageConfig>,
    Path(delivery_id): Path<String>,
) -> Response {
    let now_ms = shared.clock.now_ms();
    match shared.store.delivery_detail(delivery_id).await {
        Ok(d) => html(StatusCode::OK, render_delivery(&d, now_ms, page.reasons)),
        Err(StoreError::NotFound(m)) => {
            html(StatusCode::NOT_FOUND, layout("Not found", &format!("<p>{}</p>", esc(&m)), None))
        }
        Err(e) => failed(&e),
    }
}

fn html(status: StatusCode, body: String) -> Response {
    (status, [(CONTENT_TYPE, "text/html; charset=utf-8"), (CACHE_CONTROL, "no-store")], body).into_response()
}

/// A read that failed: logged in full, shown as a short page (the record's text may be damaged).
fn failed(e: &StoreError) -> Response {
    tracing::warn!(error = %e, "the status page could not read the record");
    html(
        StatusCode::INTERNAL_SERVER_ERROR,
        layout("Cannot read the record", "<p>The record could not be read; see the hub's log.</p>", None),
    )
}

/// Stored text as HTML: escaped, control characters shown as U+FFFD, cut at
/// `TEXT_SHOWN_CHARS_MAX` characters.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        if i == TEXT_SHOWN_CHARS_MAX {
            out.push_str("… (cut)");
            break;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// An id as one URL path segment (percent-encoded but for unreserved characters).
pub fn url_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A stored moment (unix ms) as UTC; one out of range shows as its number.
fn when(ms: i64) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// How long ago `at_ms` was, to the whole second.
fn ago(now_ms: i64, at_ms: i64) -> String {
    human_ms(now_ms.saturating_sub(at_ms).max(0) / 1000 * 1000)
}

fn delivery_link(id: &str) -> String {
    format!("<a href=\"/status/deliveries/{}\">{}</a>", url_segment(id), esc(id))
}

fn opt(s: Option<&str>) -> String {
    s.map(esc).unwrap_or_else(|| "—".to_string())
}

/// Text cut to `max` characters (marked), then escaped.
fn esc_cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return esc(s);
    }
    let cut: String = s.chars().take(max).collect();
    format!("{}… (cut)", esc(&cut))
}

/// `esc` of the last `max` characters of `s` (the end of a stderr, where its last lines are),
/// marked at the front when the start was cut.
fn esc_tail(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return esc(s);
    }
    let cut: String = s.chars().skip(n - max).collect();
    format!("(cut) …{}", esc(&cut))
}

/// The end of a run's stderr as a block, with how much came before it when the node or the hub
/// dropped some.
fn stderr_block(tail: &str, dropped: Option<u64>, max: usize) -> String {
    let note = match dropped {
        Some(n) if n > 0 => format!("<span class=\"muted\">({n} earlier bytes dropped)</span>\n"),
        _ => String::new(),
    };
    format!("<pre class=\"stderr\">{note}{}</pre>", esc_tail(tail, max))
}

/// The colour classes: each marks a word that is always shown beside it, so the page reads
/// the same without colour.
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
     table{border-collapse:collapse;margin-bottom:1.5em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
     th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}.warn{color:#a00;font-weight:bold}\
     .muted{color:#777}pre{white-space:pre-wrap;margin:0}\
     .unknown{background:#ffe8b3}.failed{background:#f8c9cc}.held{background:#e3d7f5}.paused{background:#cfe3f7}\
     .silent{background:#f8c9cc}.ok{background:#d4edda}.tag{padding:0 .35em;border-radius:.25em;font-size:.9em}\
     #attention li{margin:.2em 0;padding:.2em .4em;list-style:none}#attention{padding:0}\
     .bars{display:flex;align-items:flex-end;height:2.2em;gap:1px}.bars span{display:inline-block;width:4px;background:#5b8bd0}\
     .bars.b-failed span{background:#c33}.bars.b-unknown span{background:#d90}\
     form{margin:.5em 0 1em}input[name=q]{width:28em;padding:.2em}";

/// The page around `body`; `refresh` adds the self-reload after that many seconds.
fn layout(title: &str, body: &str, refresh: Option<u32>) -> String {
    let refresh = refresh.map(|secs| format!("<meta http-equiv=\"refresh\" content=\"{secs}\">")).unwrap_or_default();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}<title>{} · Baton hub</title>\
         <style>{STYLE}</style></head><body>\n{body}\n</body></html>\n",
        esc(title)
    )
}

/// The colour class of a state, if it has one.
fn state_class(s: DeliveryState) -> &'static str {
    match s {
        DeliveryState::Failed => "failed",
        DeliveryState::Unknown => "unknown",
        DeliveryState::Held => "held",
        _ => "",
    }
}

/// The colour class of an outcome, if it has one.
fn outcome_class(o: Outcome) -> &'static str {
    match o {
        Outcome::Failed => "failed",
        Outcome::Unknown => "unknown",
        _ => "",
    }
}

/// The colour class of an attention item.
fn attention_class(kind: &str) -> &'static str {
    match kind {
        "held" => "held",
        "unknown_outcomes" => "unknown",
        "host_silent" | "host_no_node" | "store_full" | "unreadable" => "silent",
        "fence_active" => "paused",
        "breaker_tripped" => "held",
        _ => "unknown",
    }
}

/// Renders the overview page.
pub fn render_overview(v: &View<'_>, now_ms: i64, silence: Duration) -> String {
    let o = v.overview;
    let mut b = format!(
        "<h1>Baton hub</h1><p class=\"muted\">Version {} · read at {} UTC · reloads every {} s · \
         hosts silent longer than {} are flagged</p>",
        env!("CARGO_PKG_VERSION"),
        when(now_ms),
        v.reload_secs,
        human_ms(i64::try_from(silence.as_millis()).unwrap_or(i64::MAX))
    );
    let q = v.search.map_or("", |(q, _)| q);
    b.push_str(&format!(
        "<form method=\"get\" action=\"/status\" id=\"search-form\"><input name=\"q\" value=\"{}\" maxlength=\"{SEARCH_CHARS_MAX}\" \
         placeholder=\"delivery id (or its start), message id, conversation or host\"> <button type=\"submit\">Search</button></form>",
        esc(q)
    ));
    if let Some((q, rows)) = v.search {
        b.push_str(&search_table(q, rows, now_ms));
    }
    b.push_str(&attention_block(v.attention));
    b.push_str("<h2>Deliveries</h2><table id=\"states\"><tr>");
    for (state, _) in &o.status.deliveries {
        b.push_str(&format!("<th>{}</th>", state.as_str()));
    }
    b.push_str("<th>fences active</th></tr><tr>");
    for (state, n) in &o.status.deliveries {
        let class = if *n > 0 { state_class(*state) } else { "" };
        b.push_str(&format!("<td class=\"num {class}\" data-state=\"{}\">{n}</td>", state.as_str()));
    }
    b.push_str(&format!("<td class=\"num\" id=\"fences-active\">{}</td></tr></table>", o.status.active_fences));
    b.push_str("<p class=\"muted\">By the outcome of their current run:</p><table id=\"outcomes\"><tr>");
    for (outcome, _) in &o.outcomes {
        b.push_str(&format!("<th>{}</th>", outcome.as_str()));
    }
    b.push_str("</tr><tr>");
    for (outcome, n) in &o.outcomes {
        let class = if *n > 0 { outcome_class(*outcome) } else { "" };
        b.push_str(&format!("<td class=\"num {class}\" data-outcome=\"{}\">{n}</td>", outcome.as_str()));
    }
    b.push_str("</tr></table>");
    b.push_str(&rates_table(v.rates));
    b.push_str(&running_table(o.running_total, &o.running, &o.silent, now_ms));
    b.push_str(&hosts_table(o, now_ms));
    b.push_str(&pools_table(&o.pools, now_ms));
    b.push_str(&conversations_table(&o.conversations, &o.fences, now_ms));
    b.push_str(&fences_table(&o.fences, now_ms));
    b.push_str(&trouble_table(&o.trouble, now_ms, v.reasons));
    layout("Status", &b, v.search.is_none().then_some(v.reload_secs))
}

fn attention_block(items: &[Attention]) -> String {
    if items.is_empty() {
        return "<h2>Needs attention</h2><p class=\"ok tag\" id=\"attention-none\">Nothing needs attention.</p>"
            .to_string();
    }
    let mut b = format!(
        "<h2>Needs attention ({})</h2><p class=\"muted\">What <code>baton-hub status</code> flags (it exits 1 while \
         any is here).</p><ul id=\"attention\">",
        items.len()
    );
    for a in items {
        b.push_str(&format!(
            "<li class=\"{}\" data-kind=\"{}\"><b>{}</b> · {}: {}</li>",
            attention_class(a.kind),
            a.kind,
            a.kind.replace('_', " "),
            esc(&a.subject),
            esc(&a.detail)
        ));
    }
    b.push_str("</ul>");
    b
}

/// One row of bars, one per minute, scaled to the row's own peak.
fn bars(slots: &[i64], class: &str) -> String {
    let peak = slots.iter().copied().max().unwrap_or(0).max(1);
    let mut b = format!("<div class=\"bars b-{class}\">");
    for n in slots {
        let pct = if *n == 0 { 0 } else { (n * 100 / peak).max(4) };
        b.push_str(&format!("<span style=\"height:{pct}%\" title=\"{n}\"></span>"));
    }
    b.push_str("</div>");
    b
}

fn rates_table(rates: Option<&Rates>) -> String {
    let Some(r) = rates else {
        return "<h2>Last hour</h2><p class=\"muted\" id=\"rates\">The rates could not be read; see the hub's log.</p>"
            .to_string();
    };
    let mut b = format!(
        "<h2>Last hour</h2><p class=\"muted\">Per minute, from the record, up to {} UTC (read at most every {} s); \
         the bars are the {} minutes, oldest first.</p><table id=\"rates\"><tr><th></th><th>last hour</th>\
         <th>per minute</th><th>last 5 minutes, per minute</th><th>minute by minute</th></tr>",
        when(r.until_ms),
        RATES_REFRESH.as_secs(),
        overview::RATE_MINUTES
    );
    let mut row = |name: &str, key: &str, slots: &[i64], class: &str| {
        let total: i64 = slots.iter().sum();
        let recent: i64 = slots.iter().rev().take(5).sum();
        let minutes = i64::try_from(slots.len()).unwrap_or(1).max(1);
        b.push_str(&format!(
            "<tr><th>{name}</th><td class=\"num\" data-rate=\"{key}\">{total}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td></tr>",
            per_minute(total, minutes),
            per_minute(recent, 5),
            bars(slots, class)
        ));
    };
    row("messages accepted", "messages", &r.messages, "");
    row("deliveries made", "deliveries", &r.deliveries, "");
    for (outcome, slots) in &r.outcomes {
        let name = format!("runs {}", outcome.as_str());
        row(&name, outcome.as_str(), slots, outcome_class(*outcome));
    }
    b.push_str("</table>");
    b
}

/// `n` over `minutes`, to two decimals.
fn per_minute(n: i64, minutes: i64) -> String {
    let hundredths = n.saturating_mul(100) / minutes.max(1);
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

fn running_table(total: i64, rows: &[RunningTurn], silent: &[SilentHost], now_ms: i64) -> String {
    if rows.is_empty() {
        return "<h2>Running turns</h2><p class=\"muted\" id=\"running\">None.</p>".to_string();
    }
    let mut b = format!(
        "<h2>Running turns ({total})</h2><p class=\"muted\">Started on their node, no report yet; the {} that have \
         run longest. The node's last contact (its renewals) says whether it is still heard from: a turn on a \
         silent host is handed to no other host; an operator decides. Progress: the events the harness sent \
         and when the last one came (their text is the producer's, not shown here).</p><table id=\"running\">\
         <tr><th>delivery</th><th>host</th><th>conversation</th><th>seq</th><th>run</th><th>running for</th>\
         <th>started (UTC)</th><th>node last heard</th><th>progress</th></tr>",
        overview::RUNNING_SHOWN_MAX
    );
    for t in rows {
        let heard = t.node_last_contact_ms.map_or("—".to_string(), |at| format!("{} ago", ago(now_ms, at)));
        let (row_class, heard) = if silent.iter().any(|h| h.host == t.host) {
            (" class=\"silent\"", format!("{heard} <span class=\"warn\" data-silent=\"true\">silent</span>"))
        } else {
            ("", heard)
        };
        let progress = match &t.progress {
            None => "—".to_string(),
            Some(p) => {
                let last =
                    p.last.as_ref().map(|(_, at, _)| format!(", last {} ago", ago(now_ms, *at))).unwrap_or_default();
                let dropped = if p.dropped > 0 { format!(", {} dropped", p.dropped) } else { String::new() };
                format!("<span data-progress-events=\"{}\">{} event(s){last}{dropped}</span>", p.events, p.events)
            }
        };
        b.push_str(&format!(
            "<tr data-running=\"{}\"{row_class}><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td data-running-secs=\"{}\">{}</td><td>{}</td><td>{heard}</td><td>{progress}</td></tr>",
            esc(&t.delivery_id),
            delivery_link(&t.delivery_id),
            esc(&t.host),
            esc(&t.conversation),
            t.seq,
            t.attempt,
            now_ms.saturating_sub(t.started_at_ms).max(0) / 1000,
            ago(now_ms, t.started_at_ms),
            when(t.started_at_ms),
        ));
    }
    b.push_str("</table>");
    b
}

/// The fences that stop `host`'s work now: its own and those on everything (a fence past its
/// time is the hub's to lift and stops nothing).
fn host_fences<'a>(fences: &'a [FenceRow], host: &str, now_ms: i64) -> impl Iterator<Item = &'a FenceRow> {
    fences.iter().filter(move |f| {
        f.expires_at_ms.is_none_or(|at| at > now_ms)
            && match f.scope {
                FenceScope::All => true,
                FenceScope::Host => f.target.as_deref() == Some(host),
                FenceScope::Conversation | FenceScope::Pool => false,
            }
    })
}

/// The fences that stop `conversation`'s work on every host now.
fn conversation_fences<'a>(
    fences: &'a [FenceRow],
    conversation: &str,
    now_ms: i64,
) -> impl Iterator<Item = &'a FenceRow> {
    fences.iter().filter(move |f| {
        f.expires_at_ms.is_none_or(|at| at > now_ms)
            && match f.scope {
                FenceScope::All => true,
                FenceScope::Conversation => f.target.as_deref() == Some(conversation),
                FenceScope::Host | FenceScope::Pool => false,
            }
    })
}

/// The tags a backlog under these fences carries: `paused`, `held`, `blocked`, each once.
fn fence_tags<'a>(fences: impl Iterator<Item = &'a FenceRow>) -> String {
    let mut kinds: Vec<FenceKind> = Vec::new();
    for f in fences {
        if !kinds.contains(&f.kind) {
            kinds.push(f.kind);
        }
    }
    kinds
        .iter()
        .map(|k| {
            let (class, word) = match k {
                FenceKind::Pause => ("paused", "paused"),
                FenceKind::Hold => ("held", "held"),
                FenceKind::Block => ("failed", "blocked"),
            };
            format!(" <span class=\"tag {class}\" data-fenced=\"{word}\">{word}</span>")
        })
        .collect()
}

fn hosts_table(o: &Overview, now_ms: i64) -> String {
    let mut b = String::from(
        "<h2>Hosts</h2><table id=\"hosts\"><tr><th>host</th><th>standing</th><th>instance</th><th>node version</th>\
         <th>last contact</th><th>backlog</th><th>oldest waiting</th><th>in flight (claimed / mirrored / running)</th></tr>",
    );
    for h in &o.hosts {
        let backlog = o.backlogs.iter().find(|x| x.host == h.name);
        let waiting = backlog.map_or(h.waiting, |x| x.waiting);
        let oldest = backlog.and_then(|x| x.oldest_created_at_ms).map_or("—".to_string(), |at| ago(now_ms, at));
        let mut row_class = "";
        let contact = match &h.session {
            None => "<span class=\"muted\">no session</span>".to_string(),
            Some(s) if s.ended_at_ms.is_some() => format!("{} ago (session ended)", ago(now_ms, s.last_contact_at_ms)),
            Some(s) => {
                let silent = o.silent.iter().any(|x| x.host == h.name);
                let flag = if silent {
                    row_class = " class=\"silent\"";
                    " <span class=\"warn\" data-silent=\"true\">silent</span>"
                } else {
                    ""
                };
                format!("{} ago{flag}", ago(now_ms, s.last_contact_at_ms))
            }
        };
        let tags = fence_tags(host_fences(&o.fences, &h.name, now_ms));
        let backlog_class = if tags.is_empty() || waiting == 0 { "num" } else { "num paused" };
        b.push_str(&format!(
            "<tr data-host=\"{name}\"{row_class}><td>{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{contact}</td>\
             <td class=\"{backlog_class}\"><span data-host-backlog=\"{name}\">{waiting}</span>{tags}</td><td>{oldest}</td>\
             <td class=\"num\">{} / {} / {}</td></tr>",
            h.state.as_str(),
            opt(h.instance.as_ref().map(|(i, _)| i.as_str())),
            opt(h.session.as_ref().and_then(|s| s.node_version.as_deref())),
            h.holdings.claimed,
            h.holdings.mirrored,
            h.holdings.delivered,
            name = esc(&h.name),
        ));
    }
    b.push_str("</table>");
    b
}

/// The pools: each member tagged with what keeps it from the pool's work (`fenced`, `silent`,
/// `no node`, not active) or `active`, and `busy` when it holds pool work in flight; the
/// pool's queue, its oldest queued delivery's age, its turns in flight and the conversations
/// bound to a member.
fn pools_table(pools: &[PoolStanding], now_ms: i64) -> String {
    if pools.is_empty() {
        return "<h2>Pools</h2><p class=\"muted\" id=\"pools\">No pools.</p>".to_string();
    }
    let mut b = String::from(
        "<h2>Pools</h2><table id=\"pools\"><tr><th>pool</th><th>members</th><th>queued</th><th>oldest queued</th>\
         <th>in flight</th><th>bound conversations</th></tr>",
    );
    for p in pools {
        let s = &p.summary;
        let name = esc(&s.name);
        let members: Vec<String> = p
            .members
            .iter()
            .map(|m| {
                let word = m.words();
                let class = match word.split(',').next().unwrap_or("") {
                    "active" => "",
                    "fenced" => "paused",
                    _ => "silent",
                };
                format!(
                    "<span class=\"tag {class}\" data-pool-member=\"{name}/{host}\">{host} {word}</span>",
                    host = esc(&m.liveness.host),
                    word = esc(&word),
                )
            })
            .collect();
        let members =
            if members.is_empty() { "<span class=\"muted\">none</span>".to_string() } else { members.join(" ") };
        let oldest = s.oldest_queued_at_ms.map_or("—".to_string(), |at| ago(now_ms, at));
        b.push_str(&format!(
            "<tr data-pool=\"{name}\"><td>{name}</td><td>{members}</td>\
             <td class=\"num\"><span data-pool-queued=\"{name}\">{}</span></td><td>{oldest}</td>\
             <td class=\"num\"><span data-pool-in-flight=\"{name}\">{}</span></td>\
             <td class=\"num\"><span data-pool-bound=\"{name}\">{}</span></td></tr>",
            s.queued, s.in_flight, s.bound_conversations,
        ));
    }
    b.push_str("</table>");
    b
}

fn conversations_table(rows: &[ConversationBacklog], fences: &[FenceRow], now_ms: i64) -> String {
    if rows.is_empty() {
        return "<h2>Backlog by conversation</h2><p class=\"muted\" id=\"conversations\">Nothing waits.</p>"
            .to_string();
    }
    let mut b = format!(
        "<h2>Backlog by conversation</h2><p class=\"muted\">The {} deepest; a fence on the conversation or on \
         everything marks it (a host's fence marks the host above).</p><table id=\"conversations\">\
         <tr><th>conversation</th><th>waiting</th><th>of them held</th><th>hosts</th><th>oldest waiting</th></tr>",
        overview::CONVERSATIONS_SHOWN_MAX
    );
    for c in rows {
        let tags = fence_tags(conversation_fences(fences, &c.conversation, now_ms));
        let class = if tags.is_empty() { "num" } else { "num paused" };
        let held_class = if c.held > 0 { "num held" } else { "num" };
        b.push_str(&format!(
            "<tr><td>{name}</td><td class=\"{class}\"><span data-conversation-backlog=\"{name}\">{}</span>{tags}</td>\
             <td class=\"{held_class}\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            c.waiting,
            c.held,
            c.hosts,
            ago(now_ms, c.oldest_created_at_ms),
            name = esc(&c.conversation),
        ));
    }
    b.push_str("</table>");
    b
}

fn fences_table(rows: &[FenceRow], now_ms: i64) -> String {
    if rows.is_empty() {
        return "<h2>Active fences</h2><p class=\"muted\" id=\"fences\">None.</p>".to_string();
    }
    let mut b = String::from(
        "<h2>Active fences</h2><table id=\"fences\"><tr><th>id</th><th>kind</th><th>scope</th><th>set by</th>\
         <th>why</th><th>since</th><th>until</th></tr>",
    );
    for f in rows {
        let scope = match &f.target {
            Some(t) => format!("{} {}", f.scope.as_str(), esc(t)),
            None => f.scope.as_str().to_string(),
        };
        let until = match f.expires_at_ms {
            Some(at) => format!("{} UTC (in {})", when(at), ago(at, now_ms)),
            None => "until lifted".to_string(),
        };
        let class = match f.kind {
            FenceKind::Pause => "paused",
            FenceKind::Hold => "held",
            FenceKind::Block => "failed",
        };
        b.push_str(&format!(
            "<tr data-fence=\"{}\"><td class=\"num\">{}</td><td class=\"{class}\">{}</td><td>{scope}</td><td>{}</td>\
             <td><pre>{}</pre></td><td>{} UTC ({} ago)</td><td>{until}</td></tr>",
            f.id,
            f.id,
            f.kind.as_str(),
            esc(&f.set_by),
            esc(&f.reason),
            when(f.set_at_ms),
            ago(now_ms, f.set_at_ms),
        ));
    }
    b.push_str("</table>");
    b
}

/// A delivery's row in a table of deliveries (search results).
/// Where a delivery goes: its host, `pool P` while it waits in pool P, or `H (pool P)` once
/// member H took it (escaped).
fn recipient(d: &DeliveryRow) -> String {
    match (&d.host, &d.pool) {
        (Some(h), None) => esc(h),
        (Some(h), Some(p)) => format!("{} (pool {})", esc(h), esc(p)),
        (None, Some(p)) => format!("pool {}", esc(p)),
        (None, None) => "—".to_string(),
    }
}

fn delivery_cells(d: &DeliveryRow, now_ms: i64) -> String {
    let outcome = d.outcome.map_or("—", |o| o.as_str());
    format!(
        "<td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"{}\">{}</td><td class=\"{}\">{outcome}</td>\
         <td>{} ago</td>",
        delivery_link(&d.delivery_id),
        recipient(d),
        esc(&d.conversation),
        d.seq,
        state_class(d.state),
        d.state.as_str(),
        d.outcome.map_or("", outcome_class),
        ago(now_ms, d.updated_at_ms),
    )
}

fn search_table(q: &str, rows: &[DeliveryRow], now_ms: i64) -> String {
    if rows.is_empty() {
        return format!(
            "<h2>Search</h2><p id=\"search\">No delivery id, message, conversation or host matches “{}”. \
             <a href=\"/\">Clear</a></p>",
            esc(q)
        );
    }
    let mut b = format!(
        "<h2>Search</h2><p class=\"muted\">Deliveries whose id starts with, or whose message, conversation or host \
         is, “{}”: {} (at most {}, newest first). <a href=\"/\">Clear</a> (the page reloads itself only without a \
         search)</p><table id=\"search\"><tr><th>delivery</th><th>host</th><th>conversation</th><th>seq</th>\
         <th>state</th><th>outcome</th><th>changed</th></tr>",
        esc(q),
        rows.len(),
        overview::SEARCH_SHOWN_MAX
    );
    for d in rows {
        b.push_str(&format!("<tr data-found=\"{}\">{}</tr>", esc(&d.delivery_id), delivery_cells(d, now_ms)));
    }
    b.push_str("</table>");
    b
}

/// A failure's reasons as shown in a cell: the delivery's own (why the hub failed it, or why
/// it ended `unknown`), its run's (what its node reported) and the end of its run's stderr.
fn reasons_cell(t: &Trouble) -> String {
    let mut parts = Vec::new();
    if let Some(r) = t.row.reason.as_deref().filter(|r| !r.is_empty()) {
        parts.push(esc_cut(r, REASON_SHOWN_CHARS_MAX));
    }
    if let Some(r) = t.run_reason.as_deref().filter(|r| !r.is_empty()) {
        parts.push(esc_cut(r, REASON_SHOWN_CHARS_MAX));
    }
    let stderr = match t.run_stderr.as_deref().filter(|s| !s.trim().is_empty()) {
        Some(tail) => stderr_block(tail.trim_end(), None, STDERR_SHOWN_CHARS_MAX),
        None => String::new(),
    };
    match (parts.is_empty(), stderr.is_empty()) {
        (true, true) => "—".to_string(),
        (true, false) => stderr,
        _ => format!("<pre>{}</pre>{stderr}", parts.join("\n")),
    }
}

fn trouble_table(rows: &[Trouble], now_ms: i64, reasons: bool) -> String {
    if rows.is_empty() {
        return "<h2>Recent failures and unknown outcomes</h2><p class=\"muted\" id=\"trouble\">None.</p>".to_string();
    }
    let mut b = format!(
        "<h2>Recent failures and unknown outcomes</h2><p class=\"muted\">The {} most recent.</p><table id=\"trouble\">\
         <tr><th>delivery</th><th>host</th><th>conversation</th><th>seq</th><th>state</th><th>outcome</th>\
         <th>changed</th>{}</tr>",
        overview::TROUBLE_SHOWN_MAX,
        if reasons { "<th>why</th>" } else { "" }
    );
    for t in rows {
        let why = if reasons { format!("<td class=\"reason\">{}</td>", reasons_cell(t)) } else { String::new() };
        b.push_str(&format!("<tr>{}{why}</tr>", delivery_cells(&t.row, now_ms)));
    }
    b.push_str("</table>");
    b.push_str(if reasons { NOT_SHOWN } else { REASONS_HIDDEN });
    b
}

/// What the page never shows (see the module docs).
const NOT_SHOWN: &str = "<p class=\"muted\" id=\"not-shown\">Harness results are not shown on this page, which \
     needs no certificate: <code>baton-hub deliveries show ID</code> shows them.</p>";
/// What the page leaves out when `status_page_reasons` hides reasons.
const REASONS_HIDDEN: &str = "<p class=\"muted\" id=\"not-shown\">Reasons and harness results are not shown on \
     this page, which needs no certificate and is reachable beyond this machine (status_page_reasons): \
     <code>baton-hub deliveries show ID</code> and <code>deliveries explain ID</code> show them.</p>";

/// Renders one delivery's page: what it is, its event history and its attempts; with
/// `reasons`, the delivery's reason and each run's.
pub fn render_delivery(d: &DeliveryDetail, now_ms: i64, reasons: bool) -> String {
    let r = &d.delivery;
    let why = match (reasons, r.reason.as_deref()) {
        (true, Some(why)) => format!("<tr><th>why</th><td id=\"reason\"><pre>{}</pre></td></tr>", esc(why)),
        _ => String::new(),
    };
    let mut b = format!(
        "<p><a href=\"/\">← status</a></p><h1>Delivery {}</h1><table id=\"delivery\">\
         <tr><th>message</th><td>{}</td></tr><tr><th>host</th><td>{}</td></tr><tr><th>conversation</th><td>{}</td></tr>\
         <tr><th>seq</th><td>{}</td></tr><tr><th>state</th><td id=\"state\" class=\"{}\">{}</td></tr>{why}\
         <tr><th>holder</th><td>{}</td></tr><tr><th>last change</th><td>{} UTC ({} ago)</td></tr></table>{}",
        esc(&r.delivery_id),
        esc(&r.message_id),
        recipient(r),
        esc(&r.conversation),
        r.seq,
        state_class(r.state),
        r.state.as_str(),
        opt(r.instance_id.as_deref()),
        when(r.updated_at_ms),
        ago(now_ms, r.updated_at_ms),
        if reasons { NOT_SHOWN } else { REASONS_HIDDEN },
    );
    b.push_str("<h2>History</h2><table id=\"events\"><tr><th>at (UTC)</th><th>transition</th><th>by</th><th>instance</th></tr>");
    for e in &d.events {
        b.push_str(&format!(
            "<tr><td>{}</td><td>{} → {}</td><td>{} {}</td><td>{}</td></tr>",
            when(e.at_ms),
            e.from_state.map_or("(new)", |s| s.as_str()),
            e.to_state.as_str(),
            e.actor_kind.as_str(),
            esc(&e.actor),
            opt(e.instance_id.as_deref()),
        ));
    }
    b.push_str("</table>");
    if d.attempts.is_empty() {
        b.push_str("<h2>Attempts</h2><p class=\"muted\" id=\"attempts\">None reported.</p>");
    } else {
        b.push_str(&format!(
            "<h2>Attempts</h2><table id=\"attempts\"><tr><th>run</th><th>outcome</th><th>exit</th><th>took</th>\
             <th>reported (UTC)</th>{}</tr>",
            if reasons { "<th>why</th><th>stderr (its end)</th>" } else { "" }
        ));
        for a in &d.attempts {
            let why = if reasons {
                format!(
                    "<td class=\"reason\">{}</td>",
                    a.reason.as_deref().map_or("—".to_string(), |w| format!("<pre>{}</pre>", esc(w)))
                ) + &format!(
                    "<td class=\"stderr\">{}</td>",
                    a.stderr_tail.as_deref().map_or("—".to_string(), |t| stderr_block(
                        t,
                        a.stderr_dropped_bytes,
                        TEXT_SHOWN_CHARS_MAX
                    ))
                )
            } else {
                String::new()
            };
            b.push_str(&format!(
                "<tr><td class=\"num\">{}</td><td class=\"{}\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>{why}</tr>",
                a.attempt,
                outcome_class(a.outcome),
                a.outcome.as_str(),
                a.exit_code.map_or("—".to_string(), |c| c.to_string()),
                a.duration_ms.map_or("—".to_string(), |ms| human_ms(i64::try_from(ms).unwrap_or(i64::MAX))),
                when(a.reported_at_ms),
            ));
        }
        b.push_str("</table>");
    }
    layout(&format!("Delivery {}", r.delivery_id), &b, Some(PAGE_REFRESH_SECS))
}

#[cfg(test)]
mod tests {
    /// A page read in milliseconds reloads every `PAGE_REFRESH_SECS`; one whose read took
    /// seconds waits long enough that reading stays within its share, rounded up.
    #[test]
    fn a_slow_overview_reloads_less_often() {
        let ms = Duration::from_millis;
        assert_eq!(super::reload_secs(ms(40), 5), PAGE_REFRESH_SECS);
        assert_eq!(super::reload_secs(ms(3_300), 5), 63, "3.3 s at 5 %: 62.7 s, rounded up");
        assert_eq!(super::reload_secs(ms(3_300), 100), PAGE_REFRESH_SECS);
    }

    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::registry::fences::{FenceKind, FenceScope, NewFence};
    use crate::store::testing;
    use crate::store::views::overview::gather;
    use crate::store::{registry::fences, views::read};

    const SCRIPT: &str = "<script>alert('x')</script>";

    #[test]
    fn escaping_covers_markup_quotes_and_control_characters() {
        assert_eq!(esc("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
        assert_eq!(esc("x\u{1b}[2Jy\n"), "x\u{FFFD}[2Jy\n");
        assert!(esc(&"a".repeat(TEXT_SHOWN_CHARS_MAX + 5)).ends_with("… (cut)"));
        assert_eq!(url_segment("ab-1_.~"), "ab-1_.~");
        assert_eq!(url_segment("a/b?c"), "a%2Fb%3Fc");
    }

    /// Stored text (a fence reason, a delivery reason, a conversation name) cannot add markup
    /// to the page.
    #[test]
    fn stored_text_is_escaped_on_both_pages() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, SCRIPT, "k", &["host-a"]);
        let fence = NewFence {
            kind: FenceKind::Pause,
            scope: FenceScope::Host,
            target: Some("host-a"),
            operator: "op",
            reason: SCRIPT,
        };
        fences::set(c, fence, 1).unwrap();
        c.execute("UPDATE deliveries SET state = 'failed', reason = $1", [SCRIPT]).unwrap();
        let id: String = c.query_row("SELECT id FROM deliveries", [], |r| r.get(0)).unwrap();

        let o = gather(c, 10_000, Duration::from_secs(60)).unwrap();
        let attention = [Attention { kind: "held", subject: SCRIPT.to_string(), detail: SCRIPT.to_string() }];
        let found = read::delivery_detail(c, &id).unwrap().delivery;
        for reasons in [false, true] {
            let found = [found.clone()];
            let v = View {
                overview: &o,
                attention: &attention,
                rates: None,
                search: Some((SCRIPT, &found)),
                reasons,
                reload_secs: PAGE_REFRESH_SECS,
            };
            let page = render_overview(&v, 10_000, Duration::from_secs(60));
            assert!(!page.contains("<script"), "{page}");
            // The search box and its heading, the attention item's subject and detail, the
            // conversation in the search results and in the failures, the fence's reason; and
            // the delivery's reason where reasons are shown.
            let shown = page.matches("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;").count();
            assert_eq!(shown, if reasons { 8 } else { 7 }, "{page}");
            assert!(page.contains(&format!("href=\"/status/deliveries/{id}\"")), "{page}");
            assert!(!page.contains("<meta http-equiv=\"refresh\""), "a search does not reload: {page}");

            let page = render_delivery(&read::delivery_detail(c, &id).unwrap(), 10_000, reasons);
            assert!(!page.contains("<script"), "{page}");
            assert_eq!(page.matches("&lt;script&gt;").count(), if reasons { 2 } else { 1 }, "{page}");
        }
    }

    /// The end of a failed run's stderr is on both pages exactly where reasons are, escaped;
    /// the failures table shows its last characters, the delivery's page how much was dropped.
    #[test]
    fn the_end_of_a_runs_stderr_follows_the_reasons_rule() {
        use crate::store::lifecycle::report::{NewReport, RunReport, report_run};
        use crate::store::{lifecycle::claim, lifecycle::transition::Holder};
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "conv", "k", &["host-a"]);
        let d = claim::claim(c, "host-a", "i", 1, 1).unwrap().remove(0);
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &d.delivery_id, holder, 2).unwrap();
        crate::store::lifecycle::handoff::ack(c, "host-a", &d.delivery_id, holder, 3).unwrap();
        let tail = format!("first-line-LOST\n{}\n{SCRIPT}\nlast-line-SHOWN\n", "x".repeat(400));
        let report = NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: "r1",
            outcome: Outcome::Failed,
            exit_code: Some(2),
            duration_ms: Some(1),
            result: Some("result-SECRET"),
            reason: Some("exited with status 2"),
            stderr_tail: Some(&tail),
            stderr_dropped_bytes: Some(5000),
        };
        report_run(c, "host-a", &report, &RunReport::default(), 4).unwrap();
        let o = gather(c, 10_000, Duration::from_secs(60)).unwrap();
        let detail = read::delivery_detail(c, &d.delivery_id).unwrap();
        for reasons in [false, true] {
            let v = View {
                overview: &o,
                attention: &[],
                rates: None,
                search: None,
                reasons,
                reload_secs: PAGE_REFRESH_SECS,
            };
            let overview = render_overview(&v, 10_000, Duration::from_secs(60));
            let delivery = render_delivery(&detail, 10_000, reasons);
            for page in [&overview, &delivery] {
                assert!(!page.contains("<script") && !page.contains("result-SECRET"), "{page}");
                assert_eq!(page.contains("last-line-SHOWN"), reasons, "{page}");
                assert_eq!(page.contains("&lt;script&gt;"), reasons, "{page}");
            }
            // The failures table keeps the last characters, the delivery's page all of them.
            assert!(!overview.contains("first-line-LOST"), "{overview}");
            assert_eq!(delivery.contains("first-line-LOST"), reasons, "{delivery}");
            assert_eq!(delivery.contains("5000 earlier bytes dropped"), reasons, "{delivery}");
        }
    }

    /// A host whose open session has been quiet longer than `host_silence_warn` is flagged; one
    /// heard from recently, or whose node said goodbye, is not.
    #[test]
    fn only_hosts_silent_longer_than_the_warning_are_flagged() {
        let db = testing::db();
        let c = &db.conn;
        for (host, last_contact, ended) in
            [("host-a", 1_000, None), ("host-b", 95_000, None), ("host-c", 1_000, Some(2_000))]
        {
            c.execute(
                "INSERT INTO node_sessions (host, session, instance_id, node_version, started_at, ended_at, ended_how, last_contact_at)
                 VALUES ($1, 1, 'inst', '1.0', $2, $3, CASE WHEN $3 IS NULL THEN NULL ELSE 'clean' END, $2)",
                crate::store::engine::params![host, last_contact, ended],
            )
            .unwrap();
        }
        let silence = Duration::from_secs(60);
        let o = gather(c, 100_000, silence).unwrap();
        let v = View { overview: &o, attention: &[], rates: None, search: None, reasons: false, reload_secs: 47 };
        let page = render_overview(&v, 100_000, silence);
        assert!(page.contains("<meta http-equiv=\"refresh\" content=\"47\">"), "{page}");
        assert!(page.contains("reloads every 47 s"), "{page}");
        assert!(page.contains("Nothing needs attention"), "{page}");
        let row = |host: &str| {
            let start = page.find(&format!("<tr data-host=\"{host}\"")).unwrap();
            page[start..start + page[start..].find("</tr>").unwrap()].to_string()
        };
        assert!(row("host-a").contains("data-silent"), "{}", row("host-a"));
        assert!(!row("host-b").contains("data-silent"), "{}", row("host-b"));
        assert!(!row("host-c").contains("data-silent") && row("host-c").contains("session ended"), "{}", row("host-c"));
    }
}
