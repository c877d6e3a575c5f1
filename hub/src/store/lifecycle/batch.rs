//! Batches: many items of one kind (submits, holder steps, reports) applied in one writer job.
//!
//! Each item runs the same guarded function its single endpoint runs, inside its own savepoint
//! nested in the job's: an item that fails is rolled back alone and reported with its error,
//! and the items after it still run; a value the record cannot hold is such an item's error
//! (`StoreError::Invalid`), never the batch's. A storage failure or a conflict is not an item's
//! outcome (the record may not be writable at all, or the server ended the transaction): it
//! ends the batch, and the writer rolls the whole job back, so nothing of it is kept and the
//! caller retries it whole. Replaying a batch is as safe as
//! replaying each item, because each item is as idempotent as its single endpoint (idempotency
//! keys, report ids, holder steps that repeat as no-ops).
//!
//! Invariant: a batch's results are one per item, in the order of the items.

use crate::store::Store;
use crate::store::engine::Db;
use crate::store::lifecycle::accept;
use crate::store::lifecycle::accept::AcceptLimits;
use crate::store::lifecycle::accept::Accepted;
use crate::store::lifecycle::accept::NewMessage;
use crate::store::lifecycle::accept::RetryPolicy;
use crate::store::lifecycle::accept::gained_hosts;
use crate::store::lifecycle::handoff::{self, Step, apply_step};
use crate::store::lifecycle::report;
use crate::store::lifecycle::report::ReportBounds;
use crate::store::lifecycle::report::new_report;
use crate::store::lifecycle::report::observe_turn;
use crate::store::lifecycle::report::run_report;
use crate::store::lifecycle::transition::Holder;
use crate::store::registry::sessions;
use crate::store::registry::sessions::NodeAt;
use crate::store::{StoreError, StoreResult, control};
use baton_shared::wire::DeliverySummary;
use baton_shared::wire::HolderItem;
use baton_shared::wire::RejectItem;
use baton_shared::wire::ReportRequest;
use baton_shared::wire::ReportResponse;
use baton_shared::wire::TransitionResponse;

impl Store {
    /// Accepts and fans out each message as `submit` would, in one transaction; one result per
    /// message, in order (a refused one is rolled back alone).
    pub async fn submit_batch(
        &self,
        messages: Vec<(NewMessage, RetryPolicy)>,
        limits: AcceptLimits,
    ) -> StoreResult<Vec<StoreResult<(Accepted, Vec<DeliverySummary>)>>> {
        let clock = self.clock.clone();
        self.conns
            .write_gaining(
                move |c| {
                    let now = clock.now_ms();
                    // The producer's scope and quota, read once for the batch.
                    let mut terms = crate::store::registry::producers::PostingTerms::default();
                    each(c, messages, |c, (msg, retry)| {
                        accept::accept_and_fan_out_with(c, &msg, retry, limits, now, &mut terms)
                    })
                },
                |rs| gained_hosts(rs.iter().filter_map(|r| r.as_ref().ok())),
            )
            .await
    }

    /// A holder's `step` on each delivery, in one transaction after one session check; one
    /// result per delivery, in order.
    pub async fn holder_steps(
        &self,
        step: Step,
        node: NodeAt,
        instance_id: String,
        items: Vec<HolderItem>,
    ) -> StoreResult<Vec<StoreResult<TransitionResponse>>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let now = clock.now_ms();
                each(c, items, |c, d| {
                    let h = Holder { instance_id: &instance_id, claim_token: &d.claim_token };
                    apply_step(c, step, &node, &d.delivery_id, h, now)
                })
            })
            .await
    }

    /// `reject` for each delivery, in one transaction after one session check; one result per
    /// delivery, in order.
    pub async fn reject_batch(
        &self,
        node: NodeAt,
        instance_id: String,
        items: Vec<RejectItem>,
    ) -> StoreResult<Vec<StoreResult<TransitionResponse>>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let now = clock.now_ms();
                each(c, items, |c, d| {
                    let h = Holder { instance_id: &instance_id, claim_token: &d.claim_token };
                    handoff::reject(c, &node.host, &d.delivery_id, h, &d.reason, now)
                })
            })
            .await
    }

    /// Records each report as `report` would, in one transaction after one session check; one
    /// result per report, in order, each with which waiting claims it may have given work to.
    pub async fn report_batch(
        &self,
        node: NodeAt,
        reports: Vec<ReportRequest>,
        bounds: impl Into<ReportBounds>,
    ) -> StoreResult<Vec<StoreResult<(ReportResponse, report::Freed)>>> {
        let (clock, bounds) = (self.clock.clone(), bounds.into());
        let answers = self
            .conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let now = clock.now_ms();
                let pairs: Vec<(&str, &str)> =
                    reports.iter().map(|q| (q.delivery_id.as_str(), q.report_id.as_str())).collect();
                let mut read = report::read_reports(c, &node.host, &pairs)?;
                each(c, reports.iter(), |c, req| {
                    let run = run_report(req, node.session, bounds);
                    let pre = read.remove(&(req.delivery_id.clone(), req.report_id.clone()));
                    let ((attempt, duplicate, retry_at_ms), lifts, accepted_at_ms) =
                        report::report_run_read(c, &node.host, &new_report(req), &run, now, pre)?;
                    let r = ReportResponse { attempt, delivery_id: req.delivery_id.clone(), duplicate, retry_at_ms };
                    Ok(((r, lifts), accepted_at_ms))
                })
            })
            .await?;
        Ok(answers
            .into_iter()
            .map(|a| {
                a.map(|(r, accepted_at_ms)| {
                    observe_turn(&r.0.attempt, accepted_at_ms);
                    r
                })
            })
            .collect())
    }
}

/// The savepoint each item runs in (nested in the writer's job savepoint).
const ITEM_SAVEPOINT: &str = "SAVEPOINT batch_item";
/// Keeps an item's changes.
const ITEM_RELEASE: &str = "RELEASE batch_item";
/// Drops an item's changes (then `ITEM_RELEASE` ends its savepoint).
const ITEM_ROLLBACK: &str = "ROLLBACK TO batch_item";

/// Runs `apply` on every item in its own savepoint, in order, and returns one result per item.
/// An item's error (other than a storage failure or conflict) rolls back that item only; a
/// storage failure or conflict ends the batch with that error. Call inside a write transaction.
pub fn each<I, T>(
    conn: &dyn Db,
    items: impl IntoIterator<Item = I>,
    mut apply: impl FnMut(&dyn Db, I) -> StoreResult<T>,
) -> StoreResult<Vec<StoreResult<T>>> {
    let items = items.into_iter();
    let mut results = Vec::with_capacity(items.size_hint().0);
    for item in items {
        control(conn, ITEM_SAVEPOINT)?;
        // A write the item left unread fails this item, not the next one.
        let result = apply(conn, item).and_then(|v| conn.flush().map(|()| v).map_err(StoreError::from));
        if result.is_err() {
            control(conn, ITEM_ROLLBACK)?;
        }
        control(conn, ITEM_RELEASE)?;
        // The record may not be writable at all, or the whole transaction was ended: not this
        // item's outcome.
        if let Err(e @ (StoreError::Storage(_) | StoreError::Conflict(_))) = result {
            return Err(e);
        }
        results.push(result);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    fn count(conn: &dyn Db) -> i64 {
        conn.query_row("SELECT count(*) FROM batch_probe", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_failed_item_is_rolled_back_alone_and_results_keep_the_order() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        let results = each(conn, [1, 2, 3], |c, n| {
            c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n])?;
            if n == 2 { Err(StoreError::StaleClaim(format!("item {n}"))) } else { Ok(n) }
        })
        .unwrap();
        assert_eq!(results.len(), 3);
        assert_eq!(results[0].as_ref().ok(), Some(&1));
        assert!(matches!(&results[1], Err(StoreError::StaleClaim(m)) if m == "item 2"));
        assert_eq!(results[2].as_ref().ok(), Some(&3));
        assert_eq!(count(conn), 2, "the failed item's insert was rolled back, the others kept");
        conn.execute_batch("COMMIT").unwrap();
    }

    #[test]
    fn a_storage_failure_ends_the_batch() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        let mut seen = Vec::new();
        let r = each(conn, [1, 2, 3], |c, n| {
            seen.push(n);
            c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n])?;
            if n == 2 { Err(StoreError::Storage("disk full".into())) } else { Ok(n) }
        });
        assert!(matches!(r, Err(StoreError::Storage(_))));
        assert_eq!(seen, vec![1, 2], "no item runs after a storage failure");
        conn.execute_batch("ROLLBACK").unwrap();
    }

    /// A statement the server refuses inside an item (on PostgreSQL the transaction is then in
    /// error until `ROLLBACK TO`, which goes ahead of the next item's first statement) leaves
    /// the other items and the commit whole.
    #[test]
    fn an_item_whose_statement_fails_is_rolled_back_alone() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER UNIQUE)").unwrap();
        conn.begin_write().unwrap();
        let results =
            each(conn, [1, 2, 2, 3], |c, n| match c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n]) {
                Ok(_) => Ok(n),
                Err(e) => Err(StoreError::InvalidTransition(format!("item {n}: {e}"))),
            })
            .unwrap();
        assert!(results[2].is_err(), "the second 2 breaks the unique constraint: {results:?}");
        assert_eq!(
            [&results[0], &results[1], &results[3]].map(|r| r.as_ref().ok().copied()),
            [Some(1), Some(2), Some(3)]
        );
        conn.control("COMMIT").unwrap();
        assert_eq!(count(conn), 3);
    }

    /// A write left unread (on PostgreSQL sent with a later statement) that the server refuses
    /// is the failure of its own item: a unique key broken is a storage failure, which ends the
    /// batch there, and no later item runs.
    #[test]
    fn an_unread_write_that_fails_fails_its_own_item() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER UNIQUE)").unwrap();
        conn.begin_write().unwrap();
        let mut seen = Vec::new();
        let r = each(conn, [1, 2, 2, 3], |c, n| {
            seen.push(n);
            c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n])?;
            Ok(n)
        });
        assert!(matches!(&r, Err(StoreError::Storage(m)) if m.contains("batch_probe")), "{r:?}");
        assert_eq!(seen, [1, 2, 2], "the item whose write failed is the last one run");
        conn.control("ROLLBACK").unwrap();
    }

    /// The unread writes of an item that fails are undone with it, and those of the others kept.
    #[test]
    fn the_unread_writes_of_a_failed_item_are_undone_with_it() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER UNIQUE)").unwrap();
        conn.begin_write().unwrap();
        let results = each(conn, [1, 7, 2], |c, n| {
            c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n])?;
            c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n + 100])?;
            if n == 7 { Err(StoreError::StaleClaim(format!("item {n}"))) } else { Ok(n) }
        })
        .unwrap();
        assert!(matches!(&results[1], Err(StoreError::StaleClaim(m)) if m == "item 7"), "{results:?}");
        assert_eq!([&results[0], &results[2]].map(|r| r.as_ref().ok().copied()), [Some(1), Some(2)]);
        conn.control("COMMIT").unwrap();
        let kept: Vec<i64> = conn
            .prepare("SELECT n FROM batch_probe ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, [1, 2, 101, 102], "the failed item's writes are gone, the others' kept");
    }

    /// Around one savepoint, by hand: a write left unread before it survives a `ROLLBACK TO`
    /// (on PostgreSQL only the writes after the savepoint are dropped unsent), and a refused
    /// write fails the `RELEASE` of its savepoint at the latest, never a later statement alone.
    #[test]
    fn a_rollback_to_undoes_only_the_writes_after_its_savepoint_and_a_release_carries_its_failures() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER UNIQUE)").unwrap();
        let insert = |n: i64| conn.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n]);
        conn.begin_write().unwrap();
        insert(1).unwrap();
        conn.control("SAVEPOINT s").unwrap();
        insert(2).unwrap();
        conn.control("ROLLBACK TO s").unwrap();
        conn.control("RELEASE s").unwrap();
        let refused = conn
            .control("SAVEPOINT s")
            .and_then(|()| insert(1))
            .and_then(|()| conn.control("RELEASE s"))
            .expect_err("the second 1 breaks the key, by the RELEASE at the latest");
        assert!(refused.to_string().contains("batch_probe"), "{refused}");
        conn.control("ROLLBACK TO s").unwrap();
        conn.control("RELEASE s").unwrap();
        conn.control("COMMIT").unwrap();
        let kept: Vec<i64> = conn
            .prepare("SELECT n FROM batch_probe ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, [1]);
    }

    /// A value the server refused (a data exception, as PostgreSQL raises for a value it cannot
    /// hold) fails its item alone; a conflict (a deadlock) ends the batch, which is run again
    /// whole or not at all.
    #[test]
    fn a_refused_value_fails_its_item_and_a_conflict_the_batch() {
        let server = |code: &str| {
            use crate::store::engine::{DbError, pg_error_kind};
            let kind = pg_error_kind(Some(code), false);
            StoreError::from(DbError::from_server(kind, format!("no ({code})"), None, Some(code.into())))
        };
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        let results = each(conn, [1, 2, 3], |c, n| {
            c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n])?;
            if n == 2 { Err(server("22021")) } else { Ok(n) }
        })
        .unwrap();
        assert!(matches!(&results[1], Err(StoreError::Invalid(_))), "{results:?}");
        assert_eq!([&results[0], &results[2]].map(|r| r.as_ref().ok().copied()), [Some(1), Some(3)]);
        assert_eq!(count(conn), 2);
        let r = each(conn, [4, 5], |_, n| if n == 4 { Err(server("40P01")) } else { Ok(n) });
        assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
        conn.execute_batch("ROLLBACK").unwrap();
    }

    /// A savepoint statement that fails fails the call it was sent with, at the latest: the
    /// transaction never commits past it.
    #[test]
    fn a_failing_savepoint_statement_is_never_lost() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        let failed = conn
            .control("RELEASE never_made")
            .and_then(|()| conn.execute("INSERT INTO batch_probe (n) VALUES (1)", []))
            .expect_err("releasing a savepoint that does not exist fails");
        assert!(failed.to_string().contains("never_made"), "{failed}");
        conn.control("ROLLBACK").unwrap();
        assert_eq!(count(conn), 0);
    }
}
