//! Planner statistics that keep up with a record that grows fast.
//!
//! PostgreSQL plans each statement from the statistics `ANALYZE` gathers, and autovacuum runs it
//! at most once per `autovacuum_naptime` (a minute by default), after a tenth of a table changed.
//! A record that starts empty grows by thousands of rows a minute: until the statistics follow,
//! statements are planned for tables the planner believes tiny (sequential scans, a wide index
//! where a partial one was meant), and every hub connection's prepared statements keep those
//! plans. Measured with `baton-bench` on an empty database: rows read per delivery differed
//! sixty-fold between two runs of the same configuration.
//!
//! So each hub on PostgreSQL runs `run`: every `CHECK_INTERVAL` it reads `pg_stat_user_tables`
//! for `HOT_TABLES` and runs `ANALYZE` on each table that changed, since its last analyze, by at
//! least as many rows as it held then (`due`), and by at least `CHANGED_ROWS_MIN`. A table that
//! only grows is analyzed each time it doubles (1k, 2k, 4k, … rows), so the cost stays a small
//! share of the writes; once a table is large, autovacuum's own thresholds come first.
//!
//! It runs on its own connection, never inside the writer: `ANALYZE` takes a lock that
//! conflicts only with `VACUUM` and schema changes, so no write waits for it. Among hubs on one
//! record, one at a time analyzes (`pg_try_advisory_xact_lock(ANALYZE_LOCK_KEY)`); the others
//! skip that round. A failure (the database away) is logged and retried next round: statistics
//! are a matter of speed, never of correctness.

use super::PgUrl;
use std::time::Duration;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

/// How often a hub looks at how much the hot tables changed.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// The fewest rows changed since a table's last analyze that make it due.
pub const CHANGED_ROWS_MIN: i64 = 1_000;
/// The tables every delivery writes to, whose plans matter on the hot path.
pub const HOT_TABLES: [&str; 8] = [
    "messages",
    "message_recipients",
    "fanout_obligations",
    "deliveries",
    "delivery_events",
    "attempts",
    "conversation_queues",
    "memberships",
];
/// The advisory lock that lets one hub at a time analyze (distinct from the write lock).
pub const ANALYZE_LOCK_KEY: i64 = 0x6261_746f_6e41; // "batonA"

/// One hot table's counts from `pg_stat_user_tables`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableStats {
    /// The table.
    pub table: String,
    /// Live rows (`n_live_tup`).
    pub live_rows: i64,
    /// Rows inserted, updated or deleted since its last analyze (`n_mod_since_analyze`).
    pub changed_rows: i64,
}

/// The tables whose statistics are due: changed by at least `CHANGED_ROWS_MIN` rows and by at
/// least as many rows as they held at their last analyze (about `live_rows - changed_rows`,
/// exact for a table that only grows; updates count as changes without adding rows).
pub fn due(stats: &[TableStats]) -> Vec<&str> {
    stats
        .iter()
        .filter(|s| s.changed_rows >= CHANGED_ROWS_MIN && s.changed_rows >= s.live_rows - s.changed_rows)
        .map(|s| s.table.as_str())
        .collect()
}

/// Every `CHECK_INTERVAL` until `shutdown`, analyzes the hot tables that are due, reconnecting
/// to the database at `url` as needed.
pub async fn run(url: PgUrl, shutdown: CancellationToken) {
    let mut client: Option<Client> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_INTERVAL) => {}
            _ = shutdown.cancelled() => return,
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            client = match super::connect(&url).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "statistics: no connection this round");
                    continue;
                }
            };
        }
        let Some(c) = client.as_mut() else { continue };
        match analyze_due(c).await {
            Ok(tables) if !tables.is_empty() => tracing::debug!(?tables, "statistics: analyzed"),
            Ok(_) => {}
            Err(e) => {
                tracing::info!(error = %super::describe(&e), "statistics: analyze failed; retried next round");
                client = None;
            }
        }
    }
}

/// One round: reads the hot tables' counts and analyzes those `due`, unless another hub holds
/// the analyze lock. Returns the tables analyzed.
pub async fn analyze_due(client: &mut Client) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT relname::text, n_live_tup, n_mod_since_analyze FROM pg_stat_user_tables
             WHERE schemaname = current_schema() AND relname::text = ANY($1)",
            &[&HOT_TABLES.as_slice()],
        )
        .await?;
    let stats: Vec<TableStats> =
        rows.iter().map(|r| TableStats { table: r.get(0), live_rows: r.get(1), changed_rows: r.get(2) }).collect();
    let tables: Vec<String> = due(&stats).into_iter().map(str::to_owned).collect();
    if tables.is_empty() {
        return Ok(tables);
    }
    let tx = client.transaction().await?;
    let locked: bool = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&ANALYZE_LOCK_KEY]).await?.get(0);
    if !locked {
        return Ok(Vec::new());
    }
    // The names come from `HOT_TABLES`, never from the database or a caller.
    let list = tables.iter().filter(|t| HOT_TABLES.contains(&t.as_str())).cloned().collect::<Vec<_>>().join(", ");
    tx.batch_execute(&format!("ANALYZE {list}")).await?;
    tx.commit().await?;
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(table: &str, live_rows: i64, changed_rows: i64) -> TableStats {
        TableStats { table: table.into(), live_rows, changed_rows }
    }

    #[test]
    fn a_table_is_due_once_it_doubled_since_its_last_analyze_and_changed_by_the_minimum() {
        let s = [
            stats("deliveries", 1_500, 1_500),
            stats("attempts", 10_000, 4_999),
            stats("fanout_obligations", 10_000, 5_000),
            stats("messages", 10, 999),
            stats("delivery_events", 0, CHANGED_ROWS_MIN),
            stats("conversation_queues", 100, 5_000),
        ];
        assert_eq!(due(&s), ["deliveries", "fanout_obligations", "delivery_events", "conversation_queues"]);
        assert!(due(&[]).is_empty());
    }
}
