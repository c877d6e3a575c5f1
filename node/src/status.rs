//! `baton-node status`: what this node holds locally, read from its store without the hub.

use crate::store::{Db, LocalState, StoreError, Summary};
use std::fmt::Write as _;
use std::path::Path;

/// Reads the store in `data_dir` read-only and renders its summary as text or JSON.
pub fn status(data_dir: &Path, json: bool) -> Result<String, StoreError> {
    let path = crate::config::db_path(data_dir);
    let db = Db::open_read_only(&path)?;
    let s = db.summary()?;
    let wal_bytes = wal_bytes(&path);
    Ok(if json { render_json(&s, wal_bytes) } else { render_text(&s, wal_bytes) })
}

/// The size of the store's write-ahead log file (0 when there is none): disk the store holds
/// until the next checkpoint.
fn wal_bytes(db_path: &Path) -> u64 {
    let mut wal = db_path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

/// The summary as one JSON object (stable field names; scripts read them).
pub fn render_json(s: &Summary, wal_bytes: u64) -> String {
    let open: Vec<_> = s
        .open
        .iter()
        .map(|o| {
            serde_json::json!({
                "delivery_id": o.delivery_id, "conversation": o.conversation, "seq": o.seq, "state": o.state.as_str(),
            })
        })
        .collect();
    let dead: Vec<_> =
        s.dead_reports.iter().map(|d| serde_json::json!({"report_id": d.report_id, "reason": d.reason})).collect();
    let counts: serde_json::Map<String, serde_json::Value> =
        s.counts.iter().map(|(st, n)| (st.as_str().to_string(), serde_json::Value::from(*n))).collect();
    let in_state = |state: LocalState| s.open.iter().filter(|o| o.state == state).count();
    let rows: serde_json::Map<String, serde_json::Value> =
        s.size.rows.iter().map(|(t, n)| (t.to_string(), serde_json::Value::from(*n))).collect();
    let store = serde_json::json!({
        "rows": rows, "bytes": s.size.bytes, "free_bytes": s.size.free_bytes, "wal_bytes": wal_bytes,
    });
    let session = s.session.as_ref().map(|l| {
        serde_json::json!({
            "session": l.session, "started_at_ms": l.started_at_ms, "took_over": l.took_over, "ended": l.ended,
        })
    });
    let v = serde_json::json!({
        "instance_id": s.instance_id,
        "session": session,
        "counts": counts,
        "mirrored": in_state(LocalState::Mirrored),
        "acked": in_state(LocalState::Acked),
        "running": s.running,
        "awaiting_report": s.awaiting_report,
        "dead_reports": dead,
        "open": open,
        "store": store,
        "claims_paused": s.claims_paused,
    });
    v.to_string()
}

/// A stored moment (unix ms) as RFC 3339 UTC to the second, as `config check` prints times;
/// one before 1970 shows as its number.
fn utc(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => {
            humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
        }
        Err(_) => format!("{ms} ms"),
    }
}

/// The summary for a human.
pub fn render_text(s: &Summary, wal_bytes: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "instance id:      {}", s.instance_id.as_deref().unwrap_or("(none yet)"));
    let session = match &s.session {
        None => "none registered yet".to_string(),
        Some(l) => {
            let took_over = l.took_over.map(|t| format!(", took over session {t}")).unwrap_or_default();
            let ended = l.ended.as_deref().map_or_else(|| "not ended".to_string(), |h| format!("ended {h}"));
            format!("{} (registered {}{took_over}; {ended})", l.session, utc(l.started_at_ms))
        }
    };
    let _ = writeln!(out, "last session:     {session}");
    let counts: Vec<String> = s.counts.iter().map(|(st, n)| format!("{} {n}", st.as_str())).collect();
    let _ = writeln!(out, "deliveries:       {}", if counts.is_empty() { "none".into() } else { counts.join(", ") });
    let _ = writeln!(out, "running:          {}", s.running.len());
    let _ = writeln!(out, "awaiting report:  {}", s.awaiting_report.len());
    let _ = writeln!(out, "dead reports:     {}", s.dead_reports.len());
    let rows: Vec<String> = s.size.rows.iter().map(|(t, n)| format!("{t} {n}")).collect();
    let _ = writeln!(out, "store rows:       {}", rows.join(", "));
    let _ =
        writeln!(out, "store bytes:      {} ({} free), write-ahead log {wal_bytes}", s.size.bytes, s.size.free_bytes);
    if let Some(why) = &s.claims_paused {
        let _ = writeln!(out, "claiming:         paused: {why}");
    }
    for o in &s.open {
        let run = if s.running.contains(&o.delivery_id) { " (running)" } else { "" };
        let _ = writeln!(out, "  {}  {} #{}  {}{run}", o.delivery_id, o.conversation, o.seq, o.state.as_str());
    }
    for d in &s.dead_reports {
        let _ = writeln!(out, "  dead report {}: {}", d.report_id, d.reason);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{delivery, open_temp};

    #[test]
    fn status_lists_what_is_held() {
        let (dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), false, 1).unwrap();
        db.mirror(&delivery("d2", "c", 2), true, 1).unwrap();
        db.start_attempt("d2", 2).unwrap().unwrap();
        let g = db.gauges().unwrap();
        assert_eq!(
            g,
            crate::store::Gauges {
                queued: 1,
                running: 1,
                awaiting_report: 0,
                oldest_awaiting_ms: None,
                dead_reports: 0
            },
            "the gauges count what status lists"
        );
        drop(db);
        let text = status(dir.path(), false).unwrap();
        assert!(text.contains("running:          1"), "{text}");
        assert!(text.contains("d2  c #2  acked (running)"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&status(dir.path(), true).unwrap()).unwrap();
        assert_eq!(v["mirrored"], 1);
        assert_eq!(v["running"][0], "d2");
        assert_eq!(v["counts"]["acked"], 1);
        assert_eq!(
            v["store"]["rows"],
            serde_json::json!({"deliveries": 2, "executions": 2, "attempts": 1, "outbox": 0})
        );
        assert!(v["store"]["bytes"].as_i64().is_some_and(|b| b > 0), "{v}");
        assert!(text.contains("store rows:       deliveries 2, executions 2, attempts 1, outbox 0"), "{text}");
        assert!(text.contains("store bytes:      "), "{text}");
    }

    #[test]
    fn missing_store_is_an_error_not_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        assert!(status(dir.path(), false).is_err());
        assert!(!dir.path().join("node.db").exists());
    }
}
