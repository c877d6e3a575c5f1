//! What `baton-node status` shows: counts and lists of what the node holds, read without the
//! hub.

use super::deliveries::LocalState;
use super::{Db, StoreError};
use rusqlite::OptionalExtension;

/// A delivery that is neither done nor dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenDelivery {
    /// The delivery's id.
    pub delivery_id: String,
    /// Its conversation.
    pub conversation: String,
    /// Its sequence number in the conversation.
    pub seq: i64,
    /// `Mirrored` or `Acked`.
    pub state: LocalState,
}

/// A report the hub refused for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadReport {
    /// The report id (= attempt id).
    pub report_id: String,
    /// Why the hub refused it.
    pub reason: String,
}

/// The last session a node process registered with the hub from this data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastSession {
    /// The session number the hub gave.
    pub session: u64,
    /// When it was registered (unix milliseconds).
    pub started_at_ms: i64,
    /// The session it replaced without that one having ended cleanly, if any.
    pub took_over: Option<u64>,
    /// How it ended (`clean`, `superseded`); `None` while it runs, or when the process died.
    pub ended: Option<String>,
}

/// How big the store is: what `local_retention` keeps bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSize {
    /// `(table, rows)` for every table that grows with the turns run, in a fixed order.
    pub rows: Vec<(&'static str, i64)>,
    /// The database's size (page count × page size, including what the WAL adds).
    pub bytes: i64,
    /// Of `bytes`, the free pages that new rows reuse before the file grows.
    pub free_bytes: i64,
}

/// Counts and lists for `baton-node status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// The instance id, when one was created.
    pub instance_id: Option<String>,
    /// Every delivery not done or dropped, by conversation and sequence.
    pub open: Vec<OpenDelivery>,
    /// Delivery ids whose attempt is running (start marker, no end marker).
    pub running: Vec<String>,
    /// Report ids waiting for the hub.
    pub awaiting_report: Vec<String>,
    /// Reports the hub refused for good.
    pub dead_reports: Vec<DeadReport>,
    /// `(local state, count)` for every delivery state present, alphabetically by name.
    pub counts: Vec<(LocalState, i64)>,
    /// How big the store is.
    pub size: StoreSize,
    /// The last session registered with the hub, when there was one.
    pub session: Option<LastSession>,
    /// Why the node claims nothing new, while it does not (its store over `store_bytes_max`).
    pub claims_paused: Option<String>,
}

/// Attempts running: a start marker and no end marker (what `status` lists as running).
const RUNNING: &str = "FROM attempts WHERE ended_at_ms IS NULL";
/// Reports waiting for the hub: neither confirmed nor refused for good.
const AWAITING_REPORT: &str = "FROM outbox WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL";
/// Reports the hub refused for good.
const DEAD_REPORTS: &str = "FROM outbox WHERE dead_at_ms IS NOT NULL";

/// The counts `/metrics` shows, by the same definitions as `summary`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Turns waiting here to start (`Db::queued_count`, what `queue_ahead_batches` bounds).
    pub queued: i64,
    /// Turns running (`Summary::running`).
    pub running: i64,
    /// Reports waiting for the hub's confirmation (`Summary::awaiting_report`).
    pub awaiting_report: i64,
    /// When the oldest of them was queued (unix ms).
    pub oldest_awaiting_ms: Option<i64>,
    /// Reports the hub refused for good (`Summary::dead_reports`).
    pub dead_reports: i64,
}

/// The tables that grow with the turns run (`meta` holds a row or two), as `size` counts them.
const GROWING_TABLES: [&str; 4] = ["deliveries", "executions", "attempts", "outbox"];

impl Db {
    /// The counts `/metrics` shows: a few counts over indexed or small sets (the queue, the
    /// attempts without an end marker, the outbox's waiting index).
    pub fn gauges(&self) -> Result<Gauges, StoreError> {
        let count = |from: &str| -> Result<i64, StoreError> {
            Ok(self.conn.prepare_cached(&format!("SELECT count(*) {from}"))?.query_row([], |r| r.get(0))?)
        };
        let oldest_awaiting_ms = self
            .conn
            .prepare_cached(&format!("SELECT min(created_at_ms) {AWAITING_REPORT}"))?
            .query_row([], |r| r.get(0))?;
        Ok(Gauges {
            queued: self.queued_count()?,
            running: count(RUNNING)?,
            awaiting_report: count(AWAITING_REPORT)?,
            oldest_awaiting_ms,
            dead_reports: count(DEAD_REPORTS)?,
        })
    }

    /// The bytes of the store's pages in use, as `store_bytes_max` counts them: free pages are
    /// reused before the file grows, so they do not count.
    pub fn used_bytes(&self) -> Result<i64, StoreError> {
        Ok(self.conn.query_row(
            "SELECT (p.page_count - f.freelist_count) * s.page_size
             FROM pragma_page_count() p, pragma_freelist_count() f, pragma_page_size() s",
            [],
            |r| r.get(0),
        )?)
    }

    /// How big the store is: rows per table and bytes.
    pub fn size(&self) -> Result<StoreSize, StoreError> {
        let mut rows = Vec::with_capacity(GROWING_TABLES.len());
        for table in GROWING_TABLES {
            let n: i64 = self.conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
            rows.push((table, n));
        }
        let pragma = |name: &str| -> Result<i64, StoreError> {
            Ok(self.conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))?)
        };
        let page = pragma("page_size")?;
        Ok(StoreSize { rows, bytes: pragma("page_count")? * page, free_bytes: pragma("freelist_count")? * page })
    }

    /// The last session registered with the hub, from `meta`; a value that does not parse is an
    /// error naming the key.
    pub fn last_session(&self) -> Result<Option<LastSession>, StoreError> {
        let get = |key: &str| -> Result<Option<String>, StoreError> {
            Ok(self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?)
        };
        let number = |key: &'static str, v: String| -> Result<i64, StoreError> {
            v.parse().map_err(|_| StoreError::corrupt(format!("meta {key}"), format!("{v:?} is not a number")))
        };
        let Some(session) = get("session")? else { return Ok(None) };
        let session = number("session", session)?;
        let started_at_ms = number("session_started_at_ms", get("session_started_at_ms")?.unwrap_or_default())?;
        let took_over = get("session_took_over")?.map(|v| number("session_took_over", v)).transpose()?;
        Ok(Some(LastSession {
            session: session.unsigned_abs(),
            started_at_ms,
            took_over: took_over.map(i64::unsigned_abs),
            ended: get("session_ended")?,
        }))
    }

    /// Counts and lists of what the node holds, for `status`. A stored state that does not
    /// parse, or a dead report without its reason, is an error naming the row.
    pub fn summary(&self) -> Result<Summary, StoreError> {
        let instance_id =
            self.conn.query_row("SELECT value FROM meta WHERE key = 'instance_id'", [], |r| r.get(0)).optional()?;
        let strings = |sql: &str| -> Result<Vec<String>, StoreError> {
            let mut st = self.conn.prepare(sql)?;
            Ok(st.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
        };
        let mut st = self.conn.prepare(
            "SELECT delivery_id, conversation, seq, state FROM deliveries
             WHERE state IN ('mirrored', 'acked') ORDER BY conversation, seq",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, String>(3)?)))?;
        let mut open = Vec::new();
        for row in rows {
            let (delivery_id, conversation, seq, state): (String, String, i64, String) = row?;
            let state = LocalState::parse(&delivery_id, &state)?;
            open.push(OpenDelivery { delivery_id, conversation, seq, state });
        }
        let mut st =
            self.conn.prepare(&format!("SELECT report_id, dead_reason {DEAD_REPORTS} ORDER BY created_at_ms"))?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)))?;
        let mut dead_reports = Vec::new();
        for row in rows {
            let (report_id, reason) = row?;
            let reason =
                reason.ok_or_else(|| StoreError::corrupt(format!("outbox {report_id}"), "dead without a reason"))?;
            dead_reports.push(DeadReport { report_id, reason });
        }
        // min(delivery_id) names one row of each state, so a state that does not parse is
        // reported with a row that holds it.
        let mut st = self
            .conn
            .prepare("SELECT state, count(*), min(delivery_id) FROM deliveries GROUP BY state ORDER BY state")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?)))?;
        let mut counts = Vec::new();
        for row in rows {
            let (state, n, example) = row?;
            counts.push((LocalState::parse(&example, &state)?, n));
        }
        let claims_paused =
            self.conn.query_row("SELECT value FROM meta WHERE key = 'claims_paused'", [], |r| r.get(0)).optional()?;
        Ok(Summary {
            claims_paused,
            session: self.last_session()?,
            size: self.size()?,
            instance_id,
            open,
            running: strings(&format!("SELECT delivery_id {RUNNING} ORDER BY started_at_ms"))?,
            awaiting_report: strings(&format!("SELECT report_id {AWAITING_REPORT} ORDER BY created_at_ms"))?,
            dead_reports,
            counts,
        })
    }
}
