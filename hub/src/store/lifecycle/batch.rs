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
use crate::store::writer::SharedJob;
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
                    each(c, &messages, |c, (msg, retry)| {
                        accept::accept_and_fan_out_with(c, msg, *retry, limits, now, &mut terms)
                    })
                },
                |rs| gained_hosts(rs.iter().filter_map(|r| r.as_ref().ok())),
            )
            .await
    }

    /// A holder's `step` on each delivery, in one transaction after one session check; one
    /// result per delivery, in order. Acks and handoffs are moved in one statement first where
    /// the backend can (`handoff::deliver_many`), the rest stepped one by one.
    pub async fn holder_steps(
        &self,
        step: Step,
        node: NodeAt,
        instance_id: String,
        items: Vec<HolderItem>,
    ) -> StoreResult<Vec<StoreResult<TransitionResponse>>> {
        let clock = self.clock.clone();
        self.conns
            .write_shared(Some(SharedJob::HolderSteps), move |c| {
                sessions::check(c, &node.host, node.session)?;
                holder_steps_in(c, step, &node, &instance_id, &items, clock.now_ms())
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
                each(c, &items, |c, d| {
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
            .write_shared(bounds.shared().then_some(SharedJob::Reports), move |c| {
                sessions::check(c, &node.host, node.session)?;
                let now = clock.now_ms();
                let pairs: Vec<(&str, &str)> =
                    reports.iter().map(|q| (q.delivery_id.as_str(), q.report_id.as_str())).collect();
                let ids: Vec<&str> = pairs.iter().map(|(d, _)| *d).collect();
                crate::store::lifecycle::transition::lock_rows(c, &ids)?;
                let mut read = report::read_reports(c, &node.host, &pairs)?;
                each(c, &reports, |c, req| {
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

/// `Store::holder_steps`' body, in the writer's transaction after the session check.
fn holder_steps_in(
    c: &dyn Db,
    step: Step,
    node: &NodeAt,
    instance_id: &str,
    items: &[HolderItem],
    now: i64,
) -> StoreResult<Vec<StoreResult<TransitionResponse>>> {
    let moved = handoff::deliver_many(c, step, node, instance_id, items, now)?;
    each(c, items, |c, d| {
        if moved.contains(&d.delivery_id) {
            let state = baton_shared::states::DeliveryState::Delivered;
            return Ok(TransitionResponse { delivery_id: d.delivery_id.clone(), state, changed: true });
        }
        let h = Holder { instance_id, claim_token: &d.claim_token };
        apply_step(c, step, node, &d.delivery_id, h, now)
    })
}

/// The savepoint a batch runs in first, its items without savepoints of their own (nested in
/// the writer's job savepoint).
const BATCH_SAVEPOINT: &str = "SAVEPOINT batch";
/// Keeps the batch's changes.
const BATCH_RELEASE: &str = "RELEASE batch";
/// Drops the batch's changes (then `BATCH_RELEASE` ends its savepoint).
const BATCH_ROLLBACK: &str = "ROLLBACK TO batch";
/// The savepoint each item runs in when the batch is run again item by item.
const ITEM_SAVEPOINT: &str = "SAVEPOINT batch_item";
/// Keeps an item's changes.
const ITEM_RELEASE: &str = "RELEASE batch_item";
/// Drops an item's changes (then `ITEM_RELEASE` ends its savepoint).
const ITEM_ROLLBACK: &str = "ROLLBACK TO batch_item";

/// Runs `apply` on every item in order, and returns one result per item, each as if the item
/// ran in its own savepoint: an item's error (other than a storage failure or conflict) rolls
/// back that item only; a storage failure or conflict ends the batch with that error. Call
/// inside a write transaction.
///
/// Most batches fail no item, so the items first run together in one savepoint, without one
/// of their own and without waiting for their unread writes: on PostgreSQL an item's unread
/// writes ride with the next item's first statement instead of a round trip per item, and no
/// item pays for its savepoint's statements. Any error in that pass (an item's, or an unread
/// write's, which may surface in a later item) rolls the whole pass back, and the batch runs
/// again item by item, each in its own savepoint with its writes waited for (`one_by_one`):
/// every error is then its own item's, as the results say. `apply` must therefore give the same
/// answer when run again on an item whose first run was rolled back (what it keeps between
/// items may only save reads).
pub fn each<I, T>(
    conn: &dyn Db,
    items: &[I],
    mut apply: impl FnMut(&dyn Db, &I) -> StoreResult<T>,
) -> StoreResult<Vec<StoreResult<T>>> {
    control(conn, BATCH_SAVEPOINT)?;
    let together = items
        .iter()
        .map(|item| apply(conn, item))
        .collect::<StoreResult<Vec<T>>>()
        .and_then(|values| conn.flush().map(|()| values).map_err(StoreError::from));
    match together {
        Ok(values) => {
            control(conn, BATCH_RELEASE)?;
            Ok(values.into_iter().map(Ok).collect())
        }
        Err(first) => {
            // Where the pass cannot even be rolled back (the connection is gone, or SQLite
            // ended the transaction), its error is the batch's.
            if control(conn, BATCH_ROLLBACK).and_then(|()| control(conn, BATCH_RELEASE)).is_err() {
                return Err(first);
            }
            metrics::counter!("baton_hub_batches_run_item_by_item_total").increment(1);
            one_by_one(conn, items, apply)
        }
    }
}

/// `each`'s second pass: every item in its own savepoint, its unread writes waited for before
/// the next item runs, so that each failure is its own item's.
fn one_by_one<I, T>(
    conn: &dyn Db,
    items: &[I],
    mut apply: impl FnMut(&dyn Db, &I) -> StoreResult<T>,
) -> StoreResult<Vec<StoreResult<T>>> {
    let mut results = Vec::with_capacity(items.len());
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

    /// The numbers `batch_probe` holds, in order.
    fn kept(conn: &dyn Db) -> Vec<i64> {
        conn.prepare("SELECT n FROM batch_probe ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_failed_item_is_rolled_back_alone_and_results_keep_the_order() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        let results = each(conn, &[1, 2, 3], |c, &n| {
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
        let r = each(conn, &[1, 2, 3], |c, &n| {
            seen.push(n);
            c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n])?;
            if n == 2 { Err(StoreError::Storage("disk full".into())) } else { Ok(n) }
        });
        assert!(matches!(r, Err(StoreError::Storage(_))));
        assert_eq!(seen, vec![1, 2, 1, 2], "run together, then item by item; no item runs after the failure");
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
            each(conn, &[1, 2, 2, 3], |c, &n| match c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n]) {
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
    /// batch there, and once the batch runs item by item no later item runs.
    #[test]
    fn an_unread_write_that_fails_fails_its_own_item() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER UNIQUE)").unwrap();
        conn.begin_write().unwrap();
        let mut seen = Vec::new();
        let r = each(conn, &[1, 2, 2, 3], |c, &n| {
            seen.push(n);
            c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n])?;
            Ok(n)
        });
        assert!(matches!(&r, Err(StoreError::Storage(m)) if m.contains("batch_probe")), "{r:?}");
        assert!(seen.ends_with(&[1, 2, 2]), "the item whose write failed is the last one run: {seen:?}");
        conn.control("ROLLBACK").unwrap();
    }

    /// The unread writes of an item that fails are undone with it, and those of the others kept.
    #[test]
    fn the_unread_writes_of_a_failed_item_are_undone_with_it() {
        let db = testing::db();
        let conn = &db.conn;
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER UNIQUE)").unwrap();
        conn.begin_write().unwrap();
        let results = each(conn, &[1, 7, 2], |c, &n| {
            c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n])?;
            c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n + 100])?;
            if n == 7 { Err(StoreError::StaleClaim(format!("item {n}"))) } else { Ok(n) }
        })
        .unwrap();
        assert!(matches!(&results[1], Err(StoreError::StaleClaim(m)) if m == "item 7"), "{results:?}");
        assert_eq!([&results[0], &results[2]].map(|r| r.as_ref().ok().copied()), [Some(1), Some(2)]);
        conn.control("COMMIT").unwrap();
        let kept = kept(conn);
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
        let kept = kept(conn);
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
        let results = each(conn, &[1, 2, 3], |c, &n| {
            c.execute("INSERT INTO batch_probe (n) VALUES ($1)", [n])?;
            if n == 2 { Err(server("22021")) } else { Ok(n) }
        })
        .unwrap();
        assert!(matches!(&results[1], Err(StoreError::Invalid(_))), "{results:?}");
        assert_eq!([&results[0], &results[2]].map(|r| r.as_ref().ok().copied()), [Some(1), Some(3)]);
        assert_eq!(count(conn), 2);
        let r = each(conn, &[4, 5], |_, &n| if n == 4 { Err(server("40P01")) } else { Ok(n) });
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

    /// A connection that notes every savepoint statement its caller sends.
    struct Noting<'a> {
        conn: &'a dyn Db,
        controls: std::cell::RefCell<Vec<String>>,
    }

    impl Db for Noting<'_> {
        fn prepare_cached(&self, sql: &str) -> crate::store::engine::DbResult<crate::store::engine::Stmt<'_>> {
            self.conn.prepare_cached(sql)
        }
        fn execute_batch(&self, sql: &str) -> crate::store::engine::DbResult<()> {
            self.conn.execute_batch(sql)
        }
        fn control(&self, sql: &str) -> crate::store::engine::DbResult<()> {
            self.controls.borrow_mut().push(sql.to_string());
            self.conn.control(sql)
        }
        fn begin_write(&self) -> crate::store::engine::DbResult<()> {
            self.conn.begin_write()
        }
        fn begin_read(&self) -> crate::store::engine::DbResult<()> {
            self.conn.begin_read()
        }
        fn dialect(&self) -> crate::store::engine::Dialect {
            self.conn.dialect()
        }
        fn broken(&self) -> bool {
            self.conn.broken()
        }
        fn sqlite_file(&self) -> Option<crate::store::engine::SqliteFile<'_>> {
            self.conn.sqlite_file()
        }
        fn flush(&self) -> crate::store::engine::DbResult<()> {
            self.conn.flush()
        }
    }

    /// A batch no item of which fails runs in one savepoint, its items without their own; one
    /// that fails an item is rolled back and run again item by item, each in its own savepoint,
    /// with the same answers as if it had run so from the start.
    #[test]
    fn items_run_together_and_again_one_by_one_only_when_one_fails() {
        let db = testing::db();
        let conn = Noting { conn: &*db.conn, controls: Default::default() };
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        let insert = |c: &dyn Db, n: i64| c.prepare("INSERT INTO batch_probe (n) VALUES ($1)")?.execute_unread([n]);
        let ok = each(&conn, &[1, 2, 3], |c, &n| Ok(insert(c, n)?)).unwrap();
        assert_eq!(ok.iter().map(|r| *r.as_ref().unwrap()).collect::<Vec<_>>(), [(), (), ()]);
        assert_eq!(*conn.controls.borrow(), ["SAVEPOINT batch", "RELEASE batch"]);
        conn.controls.borrow_mut().clear();
        let mut runs = Vec::new();
        let answers = each(&conn, &[10, 11, 12], |c, &n| {
            runs.push(n);
            insert(c, n)?;
            if n == 11 { Err(StoreError::StaleClaim(format!("item {n}"))) } else { Ok(n) }
        })
        .unwrap();
        assert_eq!(runs, [10, 11, 10, 11, 12], "together up to the failure, then each alone");
        assert!(matches!(&answers[1], Err(StoreError::StaleClaim(m)) if m == "item 11"), "{answers:?}");
        assert_eq!([&answers[0], &answers[2]].map(|r| r.as_ref().ok().copied()), [Some(10), Some(12)]);
        let controls = conn.controls.borrow().clone();
        assert_eq!(controls[..3], ["SAVEPOINT batch", "ROLLBACK TO batch", "RELEASE batch"], "{controls:?}");
        assert_eq!(controls.iter().filter(|c| *c == "SAVEPOINT batch_item").count(), 3, "{controls:?}");
        assert_eq!(controls.iter().filter(|c| *c == "ROLLBACK TO batch_item").count(), 1, "{controls:?}");
        conn.control("COMMIT").unwrap();
        let kept = kept(&*db.conn);
        assert_eq!(kept, [1, 2, 3, 10, 12], "the first pass left nothing; the failed item's write is gone");
    }

    /// An item's unread write refused as a value the record cannot hold fails that item alone,
    /// though the refusal comes back with a later item's statement (PostgreSQL's; on SQLite
    /// nothing is left unread and each write fails at once).
    #[test]
    fn an_unread_write_refused_in_a_later_items_round_trip_fails_its_own_item() {
        let db = testing::db();
        let conn = &*db.conn;
        if conn.dialect() == crate::store::engine::Dialect::Sqlite {
            return;
        }
        conn.execute_batch("CREATE TEMP TABLE batch_probe (n INTEGER)").unwrap();
        conn.begin_write().unwrap();
        // The server refuses 100 / 0 (a division by zero is a data exception).
        let answers = each(conn, &[1, 0, 2], |c, &n| {
            // The earlier item's unread write goes in this read's round trip.
            let seen: i64 = c.query_row("SELECT count(*) FROM batch_probe", [], |r| r.get(0))?;
            c.prepare("INSERT INTO batch_probe (n) VALUES (100 / $1)")?.execute_unread([n])?;
            Ok(seen)
        })
        .unwrap();
        assert!(matches!(&answers[1], Err(StoreError::Invalid(_))), "{answers:?}");
        assert_eq!([&answers[0], &answers[2]].map(|r| r.as_ref().ok().copied()), [Some(0), Some(1)]);
        conn.control("COMMIT").unwrap();
        assert_eq!(count(conn), 2);
    }

    /// A batch of handoffs answers each item as if stepped alone, in order (on PostgreSQL those
    /// named once and still claimed by the instance move in one statement first): a delivery
    /// named twice is handed off once and then unchanged, one already mirrored is acked, a
    /// wrong token and an unknown delivery are refused, and each handed-off delivery has each
    /// step's event once, in order, with the ack's session.
    #[test]
    fn a_batch_of_handoffs_answers_each_item_as_if_alone() {
        use crate::store::lifecycle::{accept::testing::accept_one, claim::claim};
        let db = testing::db();
        let c = &*db.conn;
        for n in 0..4 {
            accept_one(c, &format!("c{n}"), &format!("k{n}"), &["host-a"]);
        }
        let got = claim(c, "host-a", "i", 10, 1).unwrap();
        let node = NodeAt { host: "host-a".into(), session: Some(7) };
        let h = Holder { instance_id: "i", claim_token: &got[2].claim_token };
        c.begin_write().unwrap();
        handoff::mirrored(c, "host-a", &got[2].delivery_id, h, 2).unwrap();
        c.control("COMMIT").unwrap();
        let item =
            |i: usize| HolderItem { delivery_id: got[i].delivery_id.clone(), claim_token: got[i].claim_token.clone() };
        let wrong = HolderItem { claim_token: "0000".into(), ..item(3) };
        let unknown = HolderItem { delivery_id: crate::store::new_id(), ..item(3) };
        let items = [item(0), item(1), item(0), item(2), wrong, unknown];
        c.begin_write().unwrap();
        let answers = holder_steps_in(c, Step::Handoff, &node, "i", &items, 3).unwrap();
        c.control("COMMIT").unwrap();
        let changed: Vec<Option<bool>> = answers.iter().map(|a| a.as_ref().ok().map(|r| r.changed)).collect();
        assert_eq!(changed, [Some(true), Some(true), Some(false), Some(true), None, None], "{answers:?}");
        assert!(
            answers[..4].iter().all(|a| a.as_ref().unwrap().state == baton_shared::states::DeliveryState::Delivered)
        );
        assert!(matches!(&answers[5], Err(StoreError::NotFound(_))), "{:?}", answers[5]);
        for (i, steps) in [
            (0, ["claimed", "mirrored", "delivered"].as_slice()),
            (1, &["claimed", "mirrored", "delivered"]),
            (2, &["claimed", "mirrored", "delivered"]),
            (3, &["claimed"]),
        ] {
            let (session, events): (Option<i64>, Vec<String>) = (
                c.query_row("SELECT acked_session FROM deliveries WHERE id = $1", [&got[i].delivery_id], |r| r.get(0))
                    .unwrap(),
                c.prepare("SELECT to_state FROM delivery_events WHERE delivery_id = $1 AND from_state IS NOT NULL ORDER BY id")
                    .unwrap()
                    .query_map([&got[i].delivery_id], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap(),
            );
            assert_eq!(events, steps, "delivery {i}");
            assert_eq!(session, (i < 3).then_some(7), "delivery {i}");
        }
        // On PostgreSQL the one statement moves what it can: both of two fresh claims here.
        accept_one(c, "e", "k5", &["host-a"]);
        accept_one(c, "f", "k6", &["host-a"]);
        let more = claim(c, "host-a", "i", 10, 4).unwrap();
        let items: Vec<HolderItem> = more
            .iter()
            .map(|d| HolderItem { delivery_id: d.delivery_id.clone(), claim_token: d.claim_token.clone() })
            .collect();
        c.begin_write().unwrap();
        let moved = handoff::deliver_many(c, Step::Handoff, &node, "i", &items, 5).unwrap();
        c.control("COMMIT").unwrap();
        let expected: std::collections::HashSet<String> = match c.dialect() {
            crate::store::engine::Dialect::Postgres => more.iter().map(|d| d.delivery_id.clone()).collect(),
            crate::store::engine::Dialect::Sqlite => Default::default(),
        };
        assert_eq!(moved, expected);
    }
}
