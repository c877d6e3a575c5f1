//! The status page on the operator listener: server-rendered HTML that refreshes itself (no
//! script at all), read-only. `/` (also `/status`) shows the backlog per host and per
//! conversation with the oldest waiting age, active fences with who, why and until, hosts with
//! their last contact (silent ones flagged against `host_silence_warn`), and the recent
//! deliveries that failed or ended `unknown`; each delivery links to
//! `/status/deliveries/ID`, its event history and attempts.
//!
//! Invariant: no certificate guards this page, so it shows no harness result and no
//! delivery, event or attempt reason (a harness's or a producer's text, which may hold what the
//! work was about): states, outcomes, exit statuses and times only. `baton-hub deliveries show`
//! and `explain` show the rest to an operator on the hub's machine. Fence reasons, which
//! operators write for each other, are shown.
//!
//! Invariant: every stored text reaches the page through `esc` (HTML-escaped, control
//! characters replaced), and every id in a link through `url_segment`.

use crate::http::AppState;
use crate::store::StoreError;
pub use crate::store::api::Overview;
use crate::store::fences::FenceRow;
use crate::store::overview::{self, ConversationBacklog};
use crate::store::read::{DeliveryDetail, DeliveryRow};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use baton_shared::duration::human_ms;
use std::time::Duration;

/// How often the page reloads itself.
pub const PAGE_REFRESH_SECS: u32 = 10;
/// Longest stored text (a fence reason, a name) shown whole; longer ones are cut and marked.
pub const TEXT_SHOWN_CHARS_MAX: usize = 2000;

/// What the page needs from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct PageConfig {
    /// A host whose open node session has been silent longer than this is flagged.
    pub host_silence_warn: Duration,
}

/// The page's routes (state: the hub's shared state).
pub fn routes(page: PageConfig) -> Router<AppState> {
    Router::new()
        .route("/", get(overview_page))
        .route("/status", get(overview_page))
        .route("/status/deliveries/{delivery_id}", get(delivery_page))
        .layer(Extension(page))
}

async fn overview_page(State(shared): State<AppState>, Extension(page): Extension<PageConfig>) -> Response {
    let now_ms = shared.clock.now_ms();
    let silence = page.host_silence_warn;
    match shared.store.overview(now_ms, silence).await {
        Ok(o) => html(StatusCode::OK, render_overview(&o, now_ms, silence)),
        Err(e) => failed(&e),
    }
}

async fn delivery_page(State(shared): State<AppState>, Path(delivery_id): Path<String>) -> Response {
    let now_ms = shared.clock.now_ms();
    match shared.store.delivery_detail(delivery_id).await {
        Ok(d) => html(StatusCode::OK, render_delivery(&d, now_ms)),
        Err(StoreError::NotFound(m)) => {
            html(StatusCode::NOT_FOUND, layout("Not found", &format!("<p>{}</p>", esc(&m)), false))
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
        layout("Cannot read the record", "<p>The record could not be read; see the hub's log.</p>", false),
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

/// The page around `body`; `refresh` adds the self-reload.
fn layout(title: &str, body: &str, refresh: bool) -> String {
    let refresh =
        if refresh { format!("<meta http-equiv=\"refresh\" content=\"{PAGE_REFRESH_SECS}\">") } else { String::new() };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}<title>{} · Baton hub</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}}\
         table{{border-collapse:collapse;margin-bottom:1.5em}}th,td{{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}}\
         th{{background:#f0f0f0}}td.num{{text-align:right;font-variant-numeric:tabular-nums}}.warn{{color:#a00;font-weight:bold}}\
         .muted{{color:#777}}pre{{white-space:pre-wrap;margin:0}}</style></head><body>\n{body}\n</body></html>\n",
        esc(title)
    )
}

/// Renders the overview page.
pub fn render_overview(o: &Overview, now_ms: i64, silence: Duration) -> String {
    let mut b = format!(
        "<h1>Baton hub</h1><p class=\"muted\">Version {} · read at {} UTC · reloads every {PAGE_REFRESH_SECS} s · \
         hosts silent longer than {} are flagged</p>",
        env!("CARGO_PKG_VERSION"),
        when(now_ms),
        human_ms(i64::try_from(silence.as_millis()).unwrap_or(i64::MAX))
    );
    b.push_str("<h2>Deliveries</h2><table id=\"states\"><tr>");
    for (state, _) in &o.status.deliveries {
        b.push_str(&format!("<th>{}</th>", state.as_str()));
    }
    b.push_str("<th>fences active</th></tr><tr>");
    for (state, n) in &o.status.deliveries {
        b.push_str(&format!("<td class=\"num\" data-state=\"{}\">{n}</td>", state.as_str()));
    }
    b.push_str(&format!("<td class=\"num\" id=\"fences-active\">{}</td></tr></table>", o.status.active_fences));
    b.push_str("<p class=\"muted\">By the outcome of their current run:</p><table id=\"outcomes\"><tr>");
    for (outcome, _) in &o.outcomes {
        b.push_str(&format!("<th>{}</th>", outcome.as_str()));
    }
    b.push_str("</tr><tr>");
    for (outcome, n) in &o.outcomes {
        b.push_str(&format!("<td class=\"num\" data-outcome=\"{}\">{n}</td>", outcome.as_str()));
    }
    b.push_str("</tr></table>");
    b.push_str(&hosts_table(o, now_ms));
    b.push_str(&conversations_table(&o.conversations, now_ms));
    b.push_str(&fences_table(&o.fences, now_ms));
    b.push_str(&trouble_table(&o.trouble, now_ms));
    layout("Status", &b, true)
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
        let contact = match &h.session {
            None => "<span class=\"muted\">no session</span>".to_string(),
            Some(s) if s.ended_at_ms.is_some() => format!("{} ago (session ended)", ago(now_ms, s.last_contact_at_ms)),
            Some(s) => {
                let silent = o.silent.iter().any(|x| x.host == h.name);
                let flag = if silent { " <span class=\"warn\" data-silent=\"true\">silent</span>" } else { "" };
                format!("{} ago{flag}", ago(now_ms, s.last_contact_at_ms))
            }
        };
        b.push_str(&format!(
            "<tr data-host=\"{name}\"><td>{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{contact}</td>\
             <td class=\"num\" data-host-backlog=\"{name}\">{waiting}</td><td>{oldest}</td><td class=\"num\">{} / {} / {}</td></tr>",
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

fn conversations_table(rows: &[ConversationBacklog], now_ms: i64) -> String {
    if rows.is_empty() {
        return "<h2>Backlog by conversation</h2><p class=\"muted\" id=\"conversations\">Nothing waits.</p>"
            .to_string();
    }
    let mut b = format!(
        "<h2>Backlog by conversation</h2><p class=\"muted\">The {} deepest.</p><table id=\"conversations\">\
         <tr><th>conversation</th><th>waiting</th><th>of them held</th><th>hosts</th><th>oldest waiting</th></tr>",
        overview::CONVERSATIONS_SHOWN_MAX
    );
    for c in rows {
        b.push_str(&format!(
            "<tr><td>{name}</td><td class=\"num\" data-conversation-backlog=\"{name}\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td></tr>",
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
        b.push_str(&format!(
            "<tr data-fence=\"{}\"><td class=\"num\">{}</td><td>{}</td><td>{scope}</td><td>{}</td><td><pre>{}</pre></td>\
             <td>{} UTC ({} ago)</td><td>{until}</td></tr>",
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

fn trouble_table(rows: &[DeliveryRow], now_ms: i64) -> String {
    if rows.is_empty() {
        return "<h2>Recent failures and unknown outcomes</h2><p class=\"muted\" id=\"trouble\">None.</p>".to_string();
    }
    let mut b = format!(
        "<h2>Recent failures and unknown outcomes</h2><p class=\"muted\">The {} most recent.</p><table id=\"trouble\">\
         <tr><th>delivery</th><th>host</th><th>conversation</th><th>seq</th><th>state</th><th>outcome</th>\
         <th>changed</th></tr>",
        overview::TROUBLE_SHOWN_MAX
    );
    for d in rows {
        b.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>\
             <td>{} ago</td></tr>",
            delivery_link(&d.delivery_id),
            esc(&d.host),
            esc(&d.conversation),
            d.seq,
            d.state.as_str(),
            d.outcome.map_or("—", |o| o.as_str()),
            ago(now_ms, d.updated_at_ms),
        ));
    }
    b.push_str("</table>");
    b.push_str(NOT_SHOWN);
    b
}

/// Where the reasons and results the page leaves out are (see the module docs).
const NOT_SHOWN: &str = "<p class=\"muted\" id=\"not-shown\">Reasons and harness results are not shown on this page, \
     which needs no certificate: <code>baton-hub deliveries show ID</code> and <code>deliveries explain ID</code> \
     show them.</p>";

/// Renders one delivery's page: what it is, its event history and its attempts.
pub fn render_delivery(d: &DeliveryDetail, now_ms: i64) -> String {
    let r = &d.delivery;
    let mut b = format!(
        "<p><a href=\"/\">← status</a></p><h1>Delivery {}</h1><table id=\"delivery\">\
         <tr><th>message</th><td>{}</td></tr><tr><th>host</th><td>{}</td></tr><tr><th>conversation</th><td>{}</td></tr>\
         <tr><th>seq</th><td>{}</td></tr><tr><th>state</th><td id=\"state\">{}</td></tr><tr><th>holder</th><td>{}</td></tr>\
         <tr><th>last change</th><td>{} UTC ({} ago)</td></tr></table>{NOT_SHOWN}",
        esc(&r.delivery_id),
        esc(&r.message_id),
        esc(&r.host),
        esc(&r.conversation),
        r.seq,
        r.state.as_str(),
        opt(r.instance_id.as_deref()),
        when(r.updated_at_ms),
        ago(now_ms, r.updated_at_ms),
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
        b.push_str(
            "<h2>Attempts</h2><table id=\"attempts\"><tr><th>run</th><th>outcome</th><th>exit</th><th>took</th>\
             <th>reported (UTC)</th></tr>",
        );
        for a in &d.attempts {
            b.push_str(&format!(
                "<tr><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                a.attempt,
                a.outcome.as_str(),
                a.exit_code.map_or("—".to_string(), |c| c.to_string()),
                a.duration_ms.map_or("—".to_string(), |ms| human_ms(i64::try_from(ms).unwrap_or(i64::MAX))),
                when(a.reported_at_ms),
            ));
        }
        b.push_str("</table>");
    }
    layout(&format!("Delivery {}", r.delivery_id), &b, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::api::gather;
    use crate::store::fences::{FenceKind, FenceScope, NewFence};
    use crate::store::testing;
    use crate::store::{fences, read};

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
        c.execute("UPDATE deliveries SET state = 'failed', reason = ?1", [SCRIPT]).unwrap();
        let id: String = c.query_row("SELECT id FROM deliveries", [], |r| r.get(0)).unwrap();

        let page =
            render_overview(&gather(c, 10_000, Duration::from_secs(60)).unwrap(), 10_000, Duration::from_secs(60));
        assert!(!page.contains("<script"), "{page}");
        // The conversation and the fence's reason; the delivery's reason is not shown.
        assert_eq!(page.matches("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;").count(), 2, "{page}");
        assert!(page.contains(&format!("href=\"/status/deliveries/{id}\"")), "{page}");
        assert!(page.contains("<meta http-equiv=\"refresh\""), "{page}");

        let page = render_delivery(&read::delivery_detail(c, &id).unwrap(), 10_000);
        assert!(!page.contains("<script"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
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
                 VALUES (?1, 1, 'inst', '1.0', ?2, ?3, CASE WHEN ?3 IS NULL THEN NULL ELSE 'clean' END, ?2)",
                rusqlite::params![host, last_contact, ended],
            )
            .unwrap();
        }
        let silence = Duration::from_secs(60);
        let page = render_overview(&gather(c, 100_000, silence).unwrap(), 100_000, silence);
        let row = |host: &str| {
            let start = page.find(&format!("<tr data-host=\"{host}\">")).unwrap();
            page[start..start + page[start..].find("</tr>").unwrap()].to_string()
        };
        assert!(row("host-a").contains("data-silent"), "{}", row("host-a"));
        assert!(!row("host-b").contains("data-silent"), "{}", row("host-b"));
        assert!(!row("host-c").contains("data-silent") && row("host-c").contains("session ended"), "{}", row("host-c"));
    }
}
