//! Attempt reports (`POST /delivery-report`): one attempt per node-scoped report id, and what
//! its outcome does to the delivery (a retry the harness asks for, the breaker).
//!
//! Invariant: `(host, report_id)` is unique, so a retried report is counted once; the same id
//! with different content is refused and changes nothing (how a report is recognised again:
//! `replay`).
//!
//! Invariant (reports at once): on PostgreSQL a report job takes the record's write lock in
//! shared mode (`Writer::call_shared`), beside other hubs' claims, holders' steps, starts and
//! reports, unless a breaker is configured (`ReportBounds::shared`: a trip writes a fence and an
//! operator event, which stay with the exclusive writers). It locks the rows of the deliveries
//! it reports on first (`transition::lock_rows`), then reads them with their attempts: a report
//! or start of the same run on another hub committed before (and is read: a repeat is answered
//! as one) or waits for this job. What else it writes is kept apart by row locks too: the
//! message row before settling (`settle`), a pool conversation's flight row (`pool_flight`), a
//! retry's queue counters (their upserts). Its outcome's feed position and a retry's event are
//! drawn out of commit order, so the feeds' horizon leaves them out (`views::feed`).
//!
//! Why one file over 700 lines: a report is one transaction's steps, read top to bottom, and
//! the tests that hold its answers to the row the record keeps sit beside them; without its
//! tests it is about 630 lines.

use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::DbResult;
use crate::store::engine::OptionalExtension;
use crate::store::engine::Row;
use crate::store::engine::dialect;
use crate::store::engine::params;
use crate::store::lifecycle::pool_flight;
use crate::store::lifecycle::replay::same_as_stored;
use crate::store::lifecycle::transition::{self, Change, Holder};
use crate::store::registry::sessions;
use crate::store::registry::sessions::NodeAt;
use crate::store::views::read::attempt;
use crate::store::writer::SharedJob;
use crate::store::{Actor, StoreError, StoreResult, new_id};
use baton_shared::crash_point;
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::wire::AttemptView;
use baton_shared::wire::ReportRequest;
use std::collections::HashMap;
use std::time::Duration;

/// A validated report, as the store records it; defined with its identity (`replay`).
pub use crate::store::lifecycle::replay::NewReport;

/// What a report recorded: the attempt, whether it was recorded before (a replay), and when a
/// retry the harness asked for becomes due.
pub type Reported = (AttemptView, bool, Option<i64>);

/// The retry bounds a report applies (`limits.retry_backoff`, `limits.retry_backoff_max`).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first retry's backoff when the message names none.
    pub base: Duration,
    /// The longest backoff.
    pub max: Duration,
}

/// The bounds a report applies: its retry's backoff, and how much of its stderr tail the record
/// keeps (`limits.stderr_tail_bytes_max`).
#[derive(Debug, Clone, Copy)]
pub struct ReportBounds {
    /// The retry bounds.
    pub backoff: Backoff,
    /// Most bytes of a stderr tail kept: its last ones, the rest counted as dropped.
    pub stderr_tail_bytes_max: u64,
    /// Failed turns in a row that trip a conversation's breaker (`limits.breaker_failures`;
    /// 0: off).
    pub breaker_failures: u32,
    /// Turns within a period that trip it (`limits.breaker_turns`, `limits.breaker_period`;
    /// 0 turns: off).
    pub breaker_turns: crate::store::lifecycle::breaker_period::TurnsPerPeriod,
}

impl ReportBounds {
    /// Whether reports under these bounds may share the record's write lock: neither breaker
    /// is on, so none trips (a trip sets a fence and records an operator event, written only by
    /// exclusive writers).
    pub fn shared(&self) -> bool {
        self.breaker_failures == 0 && self.breaker_turns.turns == 0
    }
}

impl From<Backoff> for ReportBounds {
    /// These retry bounds, and the default stderr bound.
    fn from(backoff: Backoff) -> ReportBounds {
        ReportBounds {
            backoff,
            stderr_tail_bytes_max: baton_shared::limits::STDERR_TAIL_BYTES_MAX_DEFAULT,
            breaker_failures: 0,
            breaker_turns: Default::default(),
        }
    }
}

/// A report request as the store records it.
pub(super) fn new_report(req: &ReportRequest) -> NewReport<'_> {
    NewReport {
        delivery_id: &req.delivery_id,
        holder: Holder { instance_id: &req.instance_id, claim_token: &req.claim_token },
        report_id: &req.report_id,
        outcome: req.outcome,
        exit_code: req.exit_code,
        duration_ms: req.duration_ms,
        result: req.result.as_deref(),
        reason: req.reason.as_deref(),
        stderr_tail: req.stderr_tail.as_deref(),
        stderr_dropped_bytes: req.stderr_dropped_bytes,
    }
}

/// A report's run and its bounds.
pub(super) fn run_report(req: &ReportRequest, session: Option<u64>, bounds: ReportBounds) -> RunReport {
    RunReport {
        attempt: req.attempt,
        signal: req.signal,
        session,
        retry_backoff: bounds.backoff.base,
        retry_backoff_max: bounds.backoff.max,
        stderr_tail_bytes_max: bounds.stderr_tail_bytes_max,
        breaker_failures: bounds.breaker_failures,
        breaker_turns: bounds.breaker_turns,
        stopped_by: req.stopped_by.as_deref().and_then(StoppedBy::parse),
    }
}

pub use baton_shared::states::StoppedBy;

/// Records a newly recorded attempt (committed: `accepted_at_ms` is `None` for a replay) in the
/// turn histograms: how long the turn ran, as its node measured it, and, when the outcome
/// settles the delivery (no retry follows), how long after its message's acceptance.
pub(super) fn observe_turn(attempt: &AttemptView, accepted_at_ms: Option<i64>) {
    let Some(accepted_at_ms) = accepted_at_ms else { return };
    let outcome = attempt.outcome.as_str();
    if let Some(ms) = attempt.duration_ms {
        metrics::histogram!("baton_hub_turn_duration_seconds", "outcome" => outcome).record(ms as f64 / 1000.0);
    }
    if !attempt.retryable {
        let ms = attempt.reported_at_ms.saturating_sub(accepted_at_ms).max(0);
        metrics::histogram!("baton_hub_accept_to_outcome_seconds", "outcome" => outcome).record(ms as f64 / 1000.0);
    }
}

impl Store {
    /// Records one attempt report (after the session check); with it, which waiting claims it
    /// may have given work to (`report_run_lifting`).
    pub async fn report(
        &self,
        node: NodeAt,
        req: ReportRequest,
        bounds: impl Into<ReportBounds>,
    ) -> StoreResult<(Reported, Freed)> {
        let (clock, bounds) = (self.clock.clone(), bounds.into());
        let (reported, accepted_at_ms) = self
            .conns
            .write_shared(bounds.shared().then_some(SharedJob::Reports), move |c| {
                sessions::check(c, &node.host, node.session)?;
                let run = run_report(&req, node.session, bounds);
                let (reported, freed, accepted_at_ms) =
                    report_run_lifting(c, &node.host, &new_report(&req), &run, clock.now_ms())?;
                Ok(((reported, freed), accepted_at_ms))
            })
            .await?;
        observe_turn(&reported.0.0, accepted_at_ms);
        Ok(reported)
    }
}

/// Records one attempt of the delivery's current run, with the default retry bounds. Returns the
/// attempt and whether it was already recorded.
pub fn report(conn: &dyn Db, host: &str, r: &NewReport<'_>, now_ms: i64) -> StoreResult<(AttemptView, bool)> {
    let (attempt, duplicate, _) = report_run(conn, host, r, &RunReport::default(), now_ms)?;
    Ok((attempt, duplicate))
}

/// What a report says beyond `NewReport`, and the bounds of the retry it may cause.
#[derive(Debug, Clone, Copy)]
pub struct RunReport {
    /// The run the report is for; `None` means the delivery's current run.
    pub attempt: Option<u32>,
    /// The signal that ended the harness.
    pub signal: Option<i32>,
    /// The reporting node session, recorded with the attempt.
    pub session: Option<u64>,
    /// The first retry's backoff when the message names none (`limits.retry_backoff`).
    pub retry_backoff: Duration,
    /// The longest backoff (`limits.retry_backoff_max`).
    pub retry_backoff_max: Duration,
    /// Most bytes of the stderr tail kept (`limits.stderr_tail_bytes_max`): the last ones.
    pub stderr_tail_bytes_max: u64,
    /// Failed turns in a row that trip the conversation's breaker (`limits.breaker_failures`;
    /// 0: off).
    pub breaker_failures: u32,
    /// The bound that stopped the turn, when one did (a stall is retryable).
    pub stopped_by: Option<StoppedBy>,
    /// Turns within a period that trip the conversation's breaker (off: 0 turns).
    pub breaker_turns: crate::store::lifecycle::breaker_period::TurnsPerPeriod,
}

impl Default for RunReport {
    fn default() -> Self {
        RunReport {
            attempt: None,
            signal: None,
            session: None,
            retry_backoff: RETRY_BACKOFF_DEFAULT,
            retry_backoff_max: RETRY_BACKOFF_MAX_DEFAULT,
            stderr_tail_bytes_max: baton_shared::limits::STDERR_TAIL_BYTES_MAX_DEFAULT,
            breaker_failures: 0,
            stopped_by: None,
            breaker_turns: Default::default(),
        }
    }
}

/// The exit status a harness asks for a retry with (`EX_TEMPFAIL`).
pub const RETRY_EXIT_CODE: i32 = 75;

/// The first retry's backoff when a message names none (the default of `limits.retry_backoff`).
pub const RETRY_BACKOFF_DEFAULT: Duration = Duration::from_secs(1);
/// The longest backoff before a retry, however many runs came before (the default of
/// `limits.retry_backoff_max`).
pub const RETRY_BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(300);
const _: () = assert!(RETRY_BACKOFF_DEFAULT.as_millis() <= RETRY_BACKOFF_MAX_DEFAULT.as_millis());

/// Jitter applied to a retry's backoff, in parts per ten thousand either way (±20%).
const RETRY_JITTER_PER_10K: i64 = 2000;

/// The backoff before retry `n` (1 for the first): `base · 2^(n-1)`, jittered by
/// `jitter_per_10k` parts per ten thousand (within ±`RETRY_JITTER_PER_10K`), at most `max_ms`.
pub fn backoff_ms(base_ms: i64, n: u32, max_ms: i64, jitter_per_10k: i64) -> i64 {
    let doublings = n.saturating_sub(1).min(40);
    let raw = i128::from(base_ms.max(0)) << doublings;
    let capped = raw.min(i128::from(max_ms));
    let jitter = i128::from(jitter_per_10k.clamp(-RETRY_JITTER_PER_10K, RETRY_JITTER_PER_10K));
    let jittered = capped * (10_000 + jitter) / 10_000;
    i64::try_from(jittered.clamp(0, i128::from(max_ms))).unwrap_or(max_ms)
}

/// A random jitter in `-RETRY_JITTER_PER_10K..=RETRY_JITTER_PER_10K`.
fn random_jitter() -> i64 {
    let span = (2 * RETRY_JITTER_PER_10K + 1) as u128;
    (uuid::Uuid::new_v4().as_u128() % span) as i64 - RETRY_JITTER_PER_10K
}

/// The delivery row a report is checked against.
struct ReportedDelivery {
    message_id: String,
    /// When its message was accepted (unix ms).
    accepted_at: i64,
    host: String,
    state: String,
    instance_id: Option<String>,
    claim_token: Option<String>,
    attempt: u32,
    cancel_requested: bool,
    max_attempts: u32,
    retry_backoff_ms: Option<i64>,
    rerun: Option<String>,
    caused_by: String,
    conversation: String,
    pool: Option<String>,
    /// The request hash of the outcome its current run already has, if any.
    run_reported: Option<String>,
}

/// What a report reads before it writes: an outcome the host already recorded under the report
/// id (a replay: its attempt id and request hash), and the delivery with its message's terms.
/// Either may be missing.
pub struct ReportRead {
    existing: Option<(String, String)>,
    row: Option<ReportedDelivery>,
}

/// A `ReportRead` from a row of `dialect::report_columns!`.
fn report_read_of(row: &Row<'_>) -> DbResult<ReportRead> {
    let existing = match row.get::<_, Option<String>>(0)? {
        Some(id) => Some((id, row.get(1)?)),
        None => None,
    };
    if row.get::<_, Option<String>>(2)?.is_none() {
        return Ok(ReportRead { existing, row: None });
    }
    let d = ReportedDelivery {
        host: row.get(3)?,
        state: row.get(4)?,
        instance_id: row.get(5)?,
        claim_token: row.get(6)?,
        attempt: row.get(7)?,
        cancel_requested: row.get(8)?,
        max_attempts: row.get(9)?,
        retry_backoff_ms: row.get(10)?,
        rerun: row.get(11)?,
        caused_by: row.get(12)?,
        conversation: row.get(13)?,
        pool: row.get(14)?,
        run_reported: row.get(15)?,
        message_id: row.get(16)?,
        accepted_at: row.get(17)?,
    };
    Ok(ReportRead { existing, row: Some(d) })
}

/// What the report `report_id` of `host` for `delivery_id` reads, in one statement.
fn read_report(conn: &dyn Db, host: &str, delivery_id: &str, report_id: &str) -> StoreResult<ReportRead> {
    Ok(conn
        .prepare_cached(concat!(
            "SELECT ",
            dialect::report_columns!(),
            " FROM (SELECT 1 AS one) q
              LEFT JOIN attempts e ON e.host = $2 AND e.report_id = $3
              LEFT JOIN deliveries d ON d.id = $1
              LEFT JOIN messages m ON m.id = d.message_id"
        ))?
        .query_row([delivery_id, host, report_id], report_read_of)?)
}

/// What each report of a batch of `host`'s reads (`(delivery id, report id)` pairs), in one
/// statement (`dialect::REPORTS_OF`): a batch's reads cost one round trip, not one per report.
/// Read before any report of the batch is recorded, so a pair whose delivery or report id
/// comes more than once in the batch is left out (an earlier report of the batch may change
/// what it reads), as is one with an id PostgreSQL stores escaped (`PG_TEXT_ESCAPE`); the
/// caller reads those alone, in turn. Nothing else a report of the batch records is read by
/// another's: each moves its own delivery and attempt.
pub fn read_reports(
    conn: &dyn Db,
    host: &str,
    pairs: &[(&str, &str)],
) -> StoreResult<HashMap<(String, String), ReportRead>> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (d, r) in pairs {
        *seen.entry(d).or_default() += 1;
        *seen.entry(r).or_default() += 1;
    }
    let once: Vec<[&str; 2]> = pairs
        .iter()
        .filter(|(d, r)| seen[d] == 1 && seen[r] == 1 && dialect::listable(d) && dialect::listable(r))
        .map(|(d, r)| [*d, *r])
        .collect();
    let mut reads = HashMap::with_capacity(once.len());
    if once.is_empty() {
        return Ok(reads);
    }
    let list = serde_json::to_string(&once).map_err(|e| StoreError::Invalid(format!("report ids: {e}")))?;
    let mut stmt = conn.prepare_cached(dialect::REPORTS_OF.of(conn))?;
    let rows = stmt.query_map(params![host, list], |row| {
        let key: (String, String) = (row.get(18)?, row.get(19)?);
        Ok((key, report_read_of(row)?))
    })?;
    for row in rows {
        let (key, read) = row?;
        reads.insert(key, read);
    }
    Ok(reads)
}

/// Which waiting claims a recorded report may have given work to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Freed {
    /// The reporting host's: the report lifted the retry barrier (it recorded the last run of
    /// a message that may be retried, so later turns of its conversation may go now).
    pub barrier: bool,
    /// A pool's members': the report ended a pool delivery's run, so its conversation may be
    /// free for them (after the affinity wait), or its retry waits in the pool.
    pub pool: Option<String>,
}

/// Records one attempt of a run. Returns the attempt, whether it was already recorded, and,
/// when the harness asked for a retry (failed with exit 75, no cancel asked for, runs left) and
/// the hub requeued the delivery, the time before which it is not handed out again.
pub fn report_run(conn: &dyn Db, host: &str, r: &NewReport<'_>, run: &RunReport, now_ms: i64) -> StoreResult<Reported> {
    Ok(report_run_lifting(conn, host, r, run, now_ms)?.0)
}

/// `report_run`, and which waiting claims it may have given work to (`Freed`): the host's when it
/// lifted the retry barrier, a pool's when it ended a pool delivery's run. The barrier: it recorded the last run of a
/// message that may be retried (`max_attempts > 1`), so the later turns of its conversation on
/// the host, which waited for that outcome, may be claimable now; the caller wakes the host's
/// waiting claims. A report that asks for a retry lifts nothing (the retry comes back first and
/// `retry_at_ms` says when), nor does a replay (its first recording woke them). Last, for a
/// newly recorded attempt, when its message was accepted (unix ms: what the accept-to-outcome
/// latency is measured from, read with the delivery); `None` for a replay.
pub fn report_run_lifting(
    conn: &dyn Db,
    host: &str,
    r: &NewReport<'_>,
    run: &RunReport,
    now_ms: i64,
) -> StoreResult<(Reported, Freed, Option<i64>)> {
    report_run_read(conn, host, r, run, now_ms, None)
}

/// `report_run_lifting` with what it reads before it writes, when the caller read it already
/// in this transaction (`read_reports`, for a batch).
pub fn report_run_read(
    conn: &dyn Db,
    host: &str,
    r: &NewReport<'_>,
    run: &RunReport,
    now_ms: i64,
    read: Option<ReportRead>,
) -> StoreResult<(Reported, Freed, Option<i64>)> {
    let hash = r.request_hash_stopped(run.attempt, run.signal, run.stopped_by);
    let ReportRead { existing, row } = match read {
        Some(read) => read,
        None => {
            transition::lock_rows(conn, &[r.delivery_id])?;
            read_report(conn, host, r.delivery_id, r.report_id)?
        }
    };
    if let Some((attempt_id, stored)) = existing {
        if !same_as_stored(conn, &attempt_id, &stored, &hash, r)? {
            return Err(StoreError::ReportConflict(format!(
                "report_id {:?} was already used by host {host} for a different report (attempt {attempt_id})",
                r.report_id
            )));
        }
        let view = attempt(conn, &attempt_id)?;
        let retry_at = if view.retryable { retry_time(conn, r.delivery_id, view.attempt)? } else { None };
        return Ok(((view, true, retry_at), Freed::default(), None));
    }
    let Some(d) = row else {
        return Err(StoreError::NotFound(format!("no delivery {}", r.delivery_id)));
    };
    let (d_host, state, inst, tok) = (&d.host, &d.state, &d.instance_id, &d.claim_token);
    if d_host != host {
        return Err(StoreError::NotYours(format!("delivery {} is not for host {host}", r.delivery_id)));
    }
    if inst.as_deref() != Some(r.holder.instance_id) || tok.as_deref() != Some(r.holder.claim_token) {
        return Err(StoreError::StaleClaim(format!(
            "delivery {} is {state} and not held by instance {} with that claim token",
            r.delivery_id, r.holder.instance_id
        )));
    }
    if let Some(n) = run.attempt
        && n != d.attempt
    {
        return Err(StoreError::StaleClaim(format!(
            "delivery {} is on run {}; a report for run {n} is not for the current run",
            r.delivery_id, d.attempt
        )));
    }
    if state != DeliveryState::Delivered.as_str() {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {} is {state}; an attempt can only be reported for a delivered delivery",
            r.delivery_id
        )));
    }
    // One execution, one outcome per run: a second node report (under another report id) for a
    // run that already has one would count a turn twice. An outcome the hub wrote itself
    // (`unknown` after a requeue or retire, empty request hash) gives way to the node's.
    // (`request_hash` is never null: a null here is no outcome yet.)
    match d.run_reported.as_deref() {
        None => {
            // The run's first outcome: a pool delivery's run leaves flight.
            if let Some(pool) = &d.pool {
                pool_flight::ended(conn, pool, &d.conversation, host, now_ms)?;
            }
        }
        Some("") => {
            conn.prepare_cached("DELETE FROM attempts WHERE delivery_id = $1 AND attempt = $2 AND request_hash = ''")?
                .execute(params![r.delivery_id, d.attempt])?;
        }
        Some(_) => {
            return Err(StoreError::ReportConflict(format!(
                "run {} of delivery {} already has a reported outcome; report_id {:?} would count its turn twice",
                d.attempt, r.delivery_id, r.report_id
            )));
        }
    }
    if r.outcome == Outcome::Cancelled && !d.cancel_requested {
        return Err(StoreError::Invalid(format!(
            "outcome: cancelled is accepted only for a run whose cancel was asked for; delivery {} has none",
            r.delivery_id
        )));
    }
    // The harness asked for another run (exit 75), or the turn stalled (`StoppedBy::Stall`).
    let asks_again = r.exit_code == Some(RETRY_EXIT_CODE) || run.stopped_by == Some(StoppedBy::Stall);
    let retryable = r.outcome == Outcome::Failed && asks_again && !d.cancel_requested && d.attempt < d.max_attempts;
    let attempt_id = new_id();
    let (stderr_tail, stderr_dropped) = match r.stderr_tail {
        Some(tail) => {
            let (kept, cut) = stderr_kept(tail, run.stderr_tail_bytes_max);
            let dropped = r.stderr_dropped_bytes.unwrap_or(0).saturating_add(cut);
            (Some(kept), Some(i64::try_from(dropped).unwrap_or(i64::MAX)))
        }
        // A count alone: the harness wrote that much to stderr and none of it was sent.
        None => (None, r.stderr_dropped_bytes.map(|d| i64::try_from(d).unwrap_or(i64::MAX))),
    };
    // The attempt as the row below will read, built from what is written rather than read back.
    let rerun = match d.rerun.as_deref() {
        None => None,
        Some(kind) => Some(baton_shared::states::Rerun::parse(kind).ok_or_else(|| {
            StoreError::Corrupt(format!("deliveries {}: rerun {kind:?} is not a kind of rerun", r.delivery_id))
        })?),
    };
    let view = AttemptView {
        attempt_id: attempt_id.clone(),
        report_id: r.report_id.to_string(),
        outcome: r.outcome,
        exit_code: r.exit_code,
        duration_ms: r.duration_ms,
        signal: run.signal,
        result: r.result.map(str::to_string),
        reason: r.reason.map(str::to_string),
        reported_at_ms: now_ms,
        attempt: d.attempt,
        retryable,
        rerun,
        caused_by: Some(d.caused_by.clone()),
        stderr_tail: stderr_tail.map(str::to_string),
        stderr_dropped_bytes: stderr_dropped.map(|n| n.unsigned_abs()),
    };
    // Its feed position: drawn here, or by the statement itself where it can.
    let event_n = if dialect::ATTEMPT_DRAWS_ITS_POSITION.of(conn) {
        None
    } else {
        Some(crate::store::views::feed::draw(conn, 1)?)
    };
    conn.prepare_cached(dialect::ATTEMPT_INSERT.of(conn))?.execute_unread(params![
        attempt_id,
        r.delivery_id,
        host,
        r.holder.instance_id,
        r.report_id,
        hash,
        r.outcome.as_str(),
        r.exit_code,
        r.duration_ms.map(|d| d as i64),
        r.result,
        r.reason,
        now_ms,
        d.attempt,
        run.signal,
        retryable,
        d.rerun,
        d.caused_by,
        run.session.map(|s| s as i64),
        stderr_tail,
        stderr_dropped,
        event_n
    ])?;
    let retry_at = if retryable {
        Some(requeue_for_retry(conn, r.delivery_id, &d, run, now_ms)?)
    } else {
        // The run's outcome makes the delivery final: its message may be settled now.
        crate::store::lifecycle::settle::message(conn, &d.message_id, now_ms)?;
        None
    };
    // The breaker counts each turn's outcome in the same transaction (off unless configured).
    crate::store::lifecycle::approval::count_outcome(
        conn,
        &d.conversation,
        r.outcome == Outcome::Failed,
        r.outcome == Outcome::Succeeded,
        run.breaker_failures,
        now_ms,
    )?;
    // And every turn for the turns-per-period trigger (off unless configured: nothing written).
    crate::store::lifecycle::breaker_period::count_turn(conn, &d.conversation, run.breaker_turns, now_ms)?;
    crash_point("hub.report.before_commit");
    let freed = Freed { barrier: d.max_attempts > 1 && retry_at.is_none(), pool: d.pool.clone() };
    Ok(((view, false, retry_at), freed, Some(d.accepted_at)))
}

/// What the record keeps of a stderr tail of `tail.len()` bytes under a bound of `max` bytes: its
/// last bytes, at most `max`, from a character boundary, and how many bytes were cut before
/// them.
pub fn stderr_kept(tail: &str, max: u64) -> (&str, u64) {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    if tail.len() <= max {
        return (tail, 0);
    }
    let mut start = tail.len() - max;
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    (&tail[start..], start as u64)
}

/// The harness asked for a retry: delivered → queued (by the hub) as the next run, not handed
/// out before the backoff passed. Returns that time.
fn requeue_for_retry(
    conn: &dyn Db,
    delivery_id: &str,
    d: &ReportedDelivery,
    run: &RunReport,
    now_ms: i64,
) -> StoreResult<i64> {
    let base = d.retry_backoff_ms.unwrap_or(run.retry_backoff.as_millis() as i64);
    let wait = backoff_ms(base, d.attempt, run.retry_backoff_max.as_millis() as i64, random_jitter());
    let not_before = now_ms.saturating_add(wait);
    let after = match run.stopped_by {
        Some(StoppedBy::Stall) => "a stall".to_string(),
        _ => format!("exit {RETRY_EXIT_CODE}"),
    };
    let why = format!("retry {} of {} after {after}", d.attempt, d.max_attempts - 1);
    let change = Change {
        delivery_id,
        from: DeliveryState::Delivered,
        to: DeliveryState::Queued,
        expect_holder: None,
        new_holder: None,
        reason: Some(&why),
    };
    transition::apply(conn, change, &Actor::hub(), now_ms)?;
    conn.prepare_cached(
        "UPDATE deliveries SET attempt = attempt + 1, rerun = 'retry', rerun_by = 'hub', rerun_reason = NULL,
                not_before = $2, started_session = NULL, started_at = NULL, acked_session = NULL
         WHERE id = $1",
    )?
    .execute(params![delivery_id, not_before])?;
    Ok(not_before)
}

/// For a replayed retryable report: the not-before time of the retry it caused, while that
/// retry is still the delivery's current run.
fn retry_time(conn: &dyn Db, delivery_id: &str, reported_run: u32) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT not_before FROM deliveries WHERE id = $1 AND attempt = $2 AND rerun = 'retry'")?
        .query_row(params![delivery_id, reported_run + 1], |r| r.get::<_, Option<i64>>(0))
        .optional()?
        .flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::{lifecycle::claim, testing};

    /// Reports share the record's write lock only while no breaker can trip (a trip writes a
    /// fence and an operator event, which only exclusive writers write).
    #[test]
    fn reports_share_the_write_lock_only_without_a_breaker() {
        let backoff = Backoff { base: RETRY_BACKOFF_DEFAULT, max: RETRY_BACKOFF_MAX_DEFAULT };
        let plain = ReportBounds::from(backoff);
        assert!(plain.shared());
        assert!(!ReportBounds { breaker_failures: 3, ..plain }.shared());
        let turns =
            crate::store::lifecycle::breaker_period::TurnsPerPeriod { turns: 10, period: Duration::from_secs(60) };
        assert!(!ReportBounds { breaker_turns: turns, ..plain }.shared());
    }

    #[test]
    fn one_outcome_per_delivery_and_per_report_id() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let d = claim::claim(&db.conn, "host-a", "i", 1, 1).unwrap().remove(0);
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        let r = |id: &'static str, outcome| NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: id,
            outcome,
            exit_code: Some(0),
            duration_ms: Some(5),
            result: Some("ok"),
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        assert!(matches!(
            report(&db.conn, "host-a", &r("a1", Outcome::Succeeded), 2),
            Err(StoreError::InvalidTransition(_))
        ));
        crate::store::lifecycle::handoff::mirrored(&db.conn, "host-a", &d.delivery_id, holder, 2).unwrap();
        crate::store::lifecycle::handoff::ack(&db.conn, "host-a", &d.delivery_id, holder, 3).unwrap();
        let (first, dup) = report(&db.conn, "host-a", &r("a1", Outcome::Succeeded), 4).unwrap();
        assert!(!dup);
        let (again, dup) = report(&db.conn, "host-a", &r("a1", Outcome::Succeeded), 5).unwrap();
        assert!(dup);
        assert_eq!(again, first, "a replay answers the same attempt");
        assert!(matches!(report(&db.conn, "host-a", &r("a1", Outcome::Failed), 6), Err(StoreError::ReportConflict(_))));
        assert!(matches!(
            report(&db.conn, "host-a", &r("a2", Outcome::Succeeded), 6),
            Err(StoreError::ReportConflict(_))
        ));
        // The one read that finds a replay and the delivery: a delivery that does not exist,
        // or is another host's, is refused by name, and a replay is still answered after the
        // delivery moved on.
        let missing = crate::store::new_id();
        let e = report(&db.conn, "host-a", &NewReport { delivery_id: &missing, ..r("a3", Outcome::Succeeded) }, 7);
        assert!(matches!(&e, Err(StoreError::NotFound(m)) if m.contains(&missing)), "{e:?}");
        let e = report(&db.conn, "host-b", &r("b1", Outcome::Succeeded), 7);
        assert!(matches!(e, Err(StoreError::NotYours(_))), "{e:?}");
        let n: i64 = db.conn.query_row("SELECT count(*) FROM attempts", [], |row| row.get(0)).unwrap();
        assert_eq!(n, 1);
    }

    /// Regression: a replayed report that names its run (and the signal that ended it) was
    /// compared with the hash of a report that names neither, and refused as a conflict, so a
    /// node whose answer was lost could not send its report again.
    #[test]
    fn a_replay_naming_its_run_is_the_same_report() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let d = claim::claim(&db.conn, "host-a", "i", 1, 1).unwrap().remove(0);
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        crate::store::lifecycle::handoff::mirrored(&db.conn, "host-a", &d.delivery_id, holder, 2).unwrap();
        crate::store::lifecycle::handoff::ack(&db.conn, "host-a", &d.delivery_id, holder, 3).unwrap();
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: "r1",
            outcome: Outcome::Failed,
            exit_code: None,
            duration_ms: Some(5),
            result: None,
            reason: Some("killed"),
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        let run = RunReport { attempt: Some(d.attempt), signal: Some(9), ..RunReport::default() };
        let (first, dup, _) = report_run(&db.conn, "host-a", &r, &run, 4).unwrap();
        assert!(!dup);
        let (again, dup, _) = report_run(&db.conn, "host-a", &r, &run, 5).unwrap();
        assert!(dup, "the same report sent again is a replay");
        assert_eq!(again, first);
        let other_signal = RunReport { signal: Some(15), ..run };
        assert!(matches!(report_run(&db.conn, "host-a", &r, &other_signal, 6), Err(StoreError::ReportConflict(_))));
    }

    /// The attempt a report answers is built from what it writes, not read back: it must be the
    /// row the record keeps, field for field, for a first run, a run that asks for a retry, and
    /// the retry's own run; and the message's acceptance time comes with it.
    #[test]
    fn the_attempt_a_report_answers_is_the_row_the_record_keeps() {
        let db = testing::db();
        let m = accept_one(&db.conn, "c", "k", &["host-a"]);
        db.conn.execute("UPDATE messages SET max_attempts = 3 WHERE id = $1", [&m]).unwrap();
        let mut now = 2;
        for (run, exit_code) in [(1, Some(RETRY_EXIT_CODE)), (2, Some(0))] {
            let d = claim::claim(&db.conn, "host-a", "i", 1, now + 10_000_000).unwrap().remove(0);
            let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
            crate::store::lifecycle::handoff::mirrored(&db.conn, "host-a", &d.delivery_id, holder, now).unwrap();
            crate::store::lifecycle::handoff::ack(&db.conn, "host-a", &d.delivery_id, holder, now + 1).unwrap();
            let report_id = format!("r{run}");
            let r = NewReport {
                delivery_id: &d.delivery_id,
                holder,
                report_id: &report_id,
                outcome: if run == 1 { Outcome::Failed } else { Outcome::Succeeded },
                exit_code,
                duration_ms: Some(1234),
                result: Some("out\u{0}put"),
                reason: Some("why"),
                stderr_tail: Some("the tail"),
                stderr_dropped_bytes: Some(3),
            };
            let bounds =
                RunReport { attempt: Some(run), signal: Some(15), stderr_tail_bytes_max: 4, ..Default::default() };
            let ((answered, dup, _), _, accepted_at) =
                report_run_lifting(&db.conn, "host-a", &r, &bounds, now + 2).unwrap();
            assert!(!dup);
            assert_eq!(answered, attempt(&db.conn, &answered.attempt_id).unwrap(), "run {run}");
            assert_eq!(answered.retryable, run == 1);
            // With it, when its message was accepted (the accept-to-outcome latency's start);
            // nothing for a replay.
            let accepted: i64 =
                db.conn.query_row("SELECT accepted_at FROM messages WHERE id = $1", [&m], |row| row.get(0)).unwrap();
            assert_eq!(accepted_at, Some(accepted));
            let (_, _, again) = report_run_lifting(&db.conn, "host-a", &r, &bounds, now + 3).unwrap();
            assert_eq!(again, None);
            now += 20_000_000;
        }
    }

    /// The record keeps the last `stderr_tail_bytes_max` bytes of a stderr tail, from a character
    /// boundary, and adds what it cut to the node's dropped count; the request hash is over what
    /// the node sent, so a replay under another bound is the same report, and another tail under
    /// the same report id is not.
    #[test]
    fn a_long_stderr_tail_is_cut_to_its_last_bytes_and_counted() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let d = claim::claim(&db.conn, "host-a", "i", 1, 1).unwrap().remove(0);
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        crate::store::lifecycle::handoff::mirrored(&db.conn, "host-a", &d.delivery_id, holder, 2).unwrap();
        crate::store::lifecycle::handoff::ack(&db.conn, "host-a", &d.delivery_id, holder, 3).unwrap();
        // 11 bytes, "é" the fourth and fifth: the last 7 start inside it, so the 6 after it are
        // kept and 5 cut.
        let tail = "abcé123456";
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: "r1",
            outcome: Outcome::Failed,
            exit_code: Some(1),
            duration_ms: Some(5),
            result: None,
            reason: Some("exited with status 1"),
            stderr_tail: Some(tail),
            stderr_dropped_bytes: Some(100),
        };
        let run = RunReport { stderr_tail_bytes_max: 7, ..RunReport::default() };
        let (first, dup, _) = report_run(&db.conn, "host-a", &r, &run, 4).unwrap();
        assert!(!dup);
        assert_eq!(first.stderr_tail.as_deref(), Some("123456"));
        assert_eq!(first.stderr_dropped_bytes, Some(105));
        let wider = RunReport { stderr_tail_bytes_max: 1024, ..run };
        let (again, dup, _) = report_run(&db.conn, "host-a", &r, &wider, 5).unwrap();
        assert!(dup, "a replay under another bound is the same report");
        assert_eq!(again, first);
        let other = NewReport { stderr_tail: Some("abcé123457"), ..r.clone() };
        assert!(matches!(report_run(&db.conn, "host-a", &other, &run, 6), Err(StoreError::ReportConflict(_))));
        let fewer = NewReport { stderr_dropped_bytes: Some(99), ..r.clone() };
        assert!(matches!(report_run(&db.conn, "host-a", &fewer, &run, 6), Err(StoreError::ReportConflict(_))));
        let none = NewReport { stderr_tail: None, stderr_dropped_bytes: None, ..r.clone() };
        assert!(matches!(report_run(&db.conn, "host-a", &none, &run, 6), Err(StoreError::ReportConflict(_))));
        // A bound of 0 keeps none of the text, only how much there was.
        assert_eq!(stderr_kept(tail, 0), ("", 11));
        assert_eq!(stderr_kept(tail, 11), (tail, 0));
        assert_eq!(stderr_kept(tail, 1), ("6", 10));
        assert_eq!(stderr_kept("😀", 3), ("", 4));
    }

    /// A batch's reports read together answer as each would alone: a replay of an outcome
    /// recorded before the batch is a replay, a report repeated in the batch is read after its
    /// first and answered as its replay, an unknown delivery is refused by name, and the one
    /// read leaves out what an earlier report of the batch may change.
    #[test]
    fn a_report_batch_read_together_answers_as_each_alone() {
        let db = testing::db();
        let c = &*db.conn;
        accept_one(c, "c", "k1", &["host-a"]);
        accept_one(c, "d", "k2", &["host-a"]);
        let got = claim::claim(c, "host-a", "i", 10, 1).unwrap();
        let holder = |i: usize| Holder { instance_id: "i", claim_token: &got[i].claim_token };
        for (i, d) in got.iter().enumerate() {
            crate::store::lifecycle::handoff::mirrored(c, "host-a", &d.delivery_id, holder(i), 2).unwrap();
            crate::store::lifecycle::handoff::ack(c, "host-a", &d.delivery_id, holder(i), 2).unwrap();
        }
        let r = |i: usize, delivery_id: &'static str, id: &'static str| NewReport {
            delivery_id: if delivery_id.is_empty() { &got[i].delivery_id } else { delivery_id },
            holder: holder(i),
            report_id: id,
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(5),
            result: None,
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        let (recorded, _) = report(c, "host-a", &r(1, "", "r1"), 3).unwrap();
        let batch = [r(0, "", "r0"), r(1, "", "r1"), r(0, "", "r0"), r(0, "nope", "r9")];
        let pairs: Vec<(&str, &str)> = batch.iter().map(|b| (b.delivery_id, b.report_id)).collect();
        let mut read = read_reports(c, "host-a", &pairs).unwrap();
        let mut keys: Vec<(String, String)> = read.keys().cloned().collect();
        keys.sort();
        let mut expected = vec![(got[1].delivery_id.clone(), "r1".to_string()), ("nope".into(), "r9".into())];
        expected.sort();
        assert_eq!(keys, expected, "the repeated pair is left out");
        c.begin_write().unwrap();
        let answers = crate::store::lifecycle::batch::each(c, &batch, |c, b| {
            let pre = read.remove(&(b.delivery_id.to_string(), b.report_id.to_string()));
            report_run_read(c, "host-a", b, &RunReport::default(), 4, pre)
        })
        .unwrap();
        c.control("COMMIT").unwrap();
        let (first, dup) = answers[0].as_ref().map(|a| (&a.0.0, a.0.1)).unwrap();
        assert!(!dup);
        assert_eq!(answers[1].as_ref().map(|a| (&a.0.0, a.0.1)).unwrap(), (&recorded, true));
        assert_eq!(answers[2].as_ref().map(|a| (&a.0.0, a.0.1)).unwrap(), (first, true), "read after its first");
        assert!(matches!(&answers[3], Err(StoreError::NotFound(m)) if m.contains("nope")), "{:?}", answers[3]);
    }
}
