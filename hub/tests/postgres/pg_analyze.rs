//! The hub's statistics round (`pg::analyze`) against a real throwaway cluster (skipped without
//! PostgreSQL server binaries unless `BATON_REQUIRE_POSTGRES=1`): a hot table filled from empty
//! is analyzed, a round right after finds nothing due, while another hub holds the analyze lock
//! the round leaves it to that hub, and the loop a serving hub runs analyzes the table again
//! once it has doubled.

use baton_hub::store::engine::postgres::{self as pg, PgUrl, analyze};
use baton_testkit::pg::cluster_or_skip;
use std::time::Duration;

/// The longest wait for the server's table counts to show the inserted rows (they are flushed
/// to the statistics about once a second).
const WAIT: Duration = Duration::from_secs(30);

/// Rows inserted: over `CHANGED_ROWS_MIN`.
const ROWS: i64 = 2 * analyze::CHANGED_ROWS_MIN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_table_is_analyzed_each_time_it_doubles_by_one_hub_at_a_time() {
    let Some(cluster) = cluster_or_skip("statistics_round", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let mut client = pg::connect(&url).await.unwrap();
    pg::migrate::migrate(&mut client, &url).await.unwrap();
    // Autovacuum left out of this table, so that only the rounds below analyze it.
    client.batch_execute("ALTER TABLE conversation_queues SET (autovacuum_enabled = false)").await.unwrap();
    add_rows(&client, "c").await;
    // Another hub holds the analyze lock: this one leaves the table to it.
    let other = pg::connect(&url).await.unwrap();
    other.execute("SELECT pg_advisory_lock($1)", &[&analyze::ANALYZE_LOCK_KEY]).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen: i64 = client
            .query_one("SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'conversation_queues'", &[])
            .await
            .unwrap()
            .get(0);
        if seen >= ROWS {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the inserted rows never showed in the table counts");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(analyze::analyze_due(&mut client).await.unwrap().is_empty(), "the lock holder's round, not ours");
    other.execute("SELECT pg_advisory_unlock($1)", &[&analyze::ANALYZE_LOCK_KEY]).await.unwrap();

    let analyzed = analyze::analyze_due(&mut client).await.unwrap();
    assert_eq!(analyzed, ["conversation_queues"], "the doubled table, and only it");
    let done: bool = client
        .query_one(
            "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'conversation_queues'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(done, "the statistics show the analyze");
    let again = analyze::analyze_due(&mut client).await.unwrap();
    assert!(again.is_empty(), "nothing is due right after: {again:?}");

    // As many rows again: the table doubled since its analyze, and the loop a serving hub
    // runs (`analyze::run`) analyzes it within a round or two.
    let before = analyzed_count(&client).await;
    add_rows(&client, "c2").await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let round = tokio::spawn(analyze::run(url.clone(), shutdown.clone()));
    let deadline = tokio::time::Instant::now() + WAIT + 2 * analyze::CHECK_INTERVAL;
    while analyzed_count(&client).await == before {
        assert!(tokio::time::Instant::now() < deadline, "the hub's statistics round never analyzed the doubled table");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown.cancel();
    round.await.unwrap();
}

/// How many times `conversation_queues` was analyzed by hand (`ANALYZE`, not autovacuum).
/// `ROWS` new rows of `conversation_queues`, in conversation `conversation`.
async fn add_rows(client: &tokio_postgres::Client, conversation: &str) {
    client
        .execute(
            "INSERT INTO conversation_queues (host, conversation, queued, since)
             SELECT 'host-' || n, $1, 1, 0 FROM generate_series(1, $2::bigint) AS n",
            &[&conversation, &ROWS],
        )
        .await
        .unwrap();
}

async fn analyzed_count(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'conversation_queues'", &[])
        .await
        .unwrap()
        .get(0)
}
