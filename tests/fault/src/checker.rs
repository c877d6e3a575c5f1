//! The invariant checker (RELIABILITY.md §6.3): loads the hub's record, every node database, the
//! client history and the effects ledger, and reports every violation with the chain of events
//! behind it.
//!
//! The hub's record is either backend (`HubRecord`): an SQLite file, or a PostgreSQL database
//! named by its `postgres://` URL, which several hubs may share. Both are read through the
//! store's own connection seam (`baton_hub::store::engine::Db`), with the same SQL. Node databases
//! are always SQLite files.
//!
//! Nothing is changed by reading: an SQLite file is opened read-only (`SQLITE_OPEN_READ_ONLY`
//! plus `query_only`), so the checker can run against a live hub; a PostgreSQL record is read in
//! one `READ ONLY`, `REPEATABLE READ` transaction, so every query sees one snapshot of a record
//! that live hubs may still be writing. The hub-side rules already in `baton_hub::verify::check`
//! are reused (and sorted into their invariant families); the rules that need more than the
//! hub's record are here.
//!
//! Event order: I5 and I6 replay `delivery_events` in `id` order as the commit order. On one
//! SQLite file that holds (one writer). On PostgreSQL it holds because every hub's write
//! transaction takes the record's write lock (`baton_hub::store::engine::WRITE_LOCK_KEY`) before it
//! draws an event id, so ids are drawn in commit order across every hub sharing the record.

use crate::records::{EffectLine, HistoryLine, read_lines};
use baton_hub::store::engine::{Db, PgConn, Row};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// Violations that get their full event chain; a flood of violations (one bug seen thousands of
/// times) still reports quickly, every one counted and named.
pub const CHAINS_MAX: usize = 50;

/// Where the hub's record is.
#[derive(Clone, PartialEq, Eq)]
pub enum HubRecord {
    /// The hub's SQLite file (`HUB_DATA_DIR/hub.db`). The file-level rules of I12 (`PRAGMA
    /// integrity_check` and the foreign-key check) apply to it.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by its `postgres://` URL (as in a hub's `database_url`). The server
    /// checks its own pages and enforces foreign keys at every write, so the SQLite file-level
    /// rules of I12 do not apply; every other rule does, on the same SQL.
    Postgres(String),
}

impl std::fmt::Debug for HubRecord {
    /// Never shows a password: a PostgreSQL URL is shown as `PgUrl::shown` gives it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for HubRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubRecord::Sqlite(p) => write!(f, "{}", p.display()),
            HubRecord::Postgres(url) => match baton_hub::store::engine::postgres::PgUrl::parse(url) {
                Ok(u) => f.write_str(u.shown()),
                Err(_) => f.write_str("postgres://(an unparsable URL)"),
            },
        }
    }
}

impl HubRecord {
    /// Runs `f` on a read-only connection to the record (see the module documentation), and
    /// returns what it returns. A PostgreSQL connection is synchronous on a runtime of its own,
    /// so it is made and used on a thread of its own: callers may be inside an async runtime or
    /// not. Each call opens a new connection and closes it after `f`.
    pub fn read<T: Send>(&self, f: impl FnOnce(&dyn Db) -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
        match self {
            HubRecord::Sqlite(path) => f(&open_read_only(path)?),
            HubRecord::Postgres(url) => std::thread::scope(|s| {
                s.spawn(|| -> anyhow::Result<T> {
                    let parsed = baton_hub::store::engine::postgres::PgUrl::parse(url)?;
                    let conn = PgConn::connect(&parsed).map_err(|e| anyhow::anyhow!("{e}"))?;
                    conn.begin_read()?;
                    let out = f(&conn);
                    // Read only: ending the transaction either way changes nothing.
                    let _ = Db::control(&conn, "ROLLBACK");
                    out
                })
                .join()
                .map_err(|_| anyhow::anyhow!("reading {self} panicked"))?
            }),
        }
    }
}

/// What to check.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The hub's record.
    pub hub: HubRecord,
    /// Every node database (`DATA_DIR/node.db`).
    pub node_dbs: Vec<PathBuf>,
    /// Those of `node_dbs` whose data directory a copy took over (another process of the same
    /// instance, on a copy of it): read for everything they recorded, but not held to the
    /// node-side liveness rule (I10), since what they left unsettled the copy settles.
    pub retired_node_dbs: Vec<PathBuf>,
    /// The client history (JSON lines), if any.
    pub history: Option<PathBuf>,
    /// The effects ledger (JSON lines), if any.
    pub ledger: Option<PathBuf>,
    /// Whether the system is quiescent after heal, so the liveness rules (I10) apply.
    pub liveness: bool,
    /// What a turn may run past its message's `deadline_ms` (I19): the nodes' `kill_grace`
    /// plus the stated bound, `DEADLINE_SLACK` (and, in a run that pauses nodes, the longest
    /// pause: a paused node's timer stands still while its harness runs on).
    pub deadline_allowance: std::time::Duration,
}

/// The bound I19 states beyond `kill_grace`: how late past a deadline a node may notice it,
/// signal the group and reap it (its timer, the group poll, a loaded machine's scheduling).
pub const DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_secs(2);
/// The nodes' `kill_grace` when a run does not say (the node's default).
pub const KILL_GRACE_ASSUMED: std::time::Duration = std::time::Duration::from_secs(10);

impl Inputs {
    /// Inputs for a hub's record alone, liveness off.
    pub fn hub_only(hub: HubRecord) -> Inputs {
        Inputs {
            hub,
            node_dbs: Vec::new(),
            retired_node_dbs: Vec::new(),
            history: None,
            ledger: None,
            liveness: false,
            deadline_allowance: KILL_GRACE_ASSUMED + DEADLINE_SLACK,
        }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The invariant family: `I1` … `I19`.
    pub invariant: String,
    /// What it is about (a delivery id, a key, a database).
    pub subject: String,
    /// What is wrong.
    pub message: String,
    /// Every recorded fact about the subject, in order: hub events, attempts, node rows,
    /// history and ledger lines.
    pub chain: Vec<String>,
}

/// The checker's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Sizes of what was read.
    pub counts: BTreeMap<String, u64>,
    /// Every violation found; empty means the run is clean.
    pub violations: Vec<Violation>,
}

impl Report {
    /// The invariant families that were violated, deduplicated.
    pub fn families(&self) -> BTreeSet<String> {
        self.violations.iter().map(|v| v.invariant.clone()).collect()
    }

    /// A human-readable rendering: counts, then each violation with its chain.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.counts {
            s.push_str(&format!("{k}: {v}\n"));
        }
        for v in &self.violations {
            s.push_str(&format!("\n[{}] {}: {}\n", v.invariant, v.subject, v.message));
            for c in &v.chain {
                s.push_str(&format!("    {c}\n"));
            }
        }
        s.push_str(&format!("violations: {}\n", self.violations.len()));
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The loaded model

struct Message {
    id: String,
    producer: String,
    key: String,
    /// How many runs a harness may ask for (exit 75) before a failure is final.
    max_attempts: i64,
    /// The longest each turn may run (I19).
    deadline_ms: Option<i64>,
}

struct Delivery {
    id: String,
    message_id: String,
    /// The host it is for; for a pool delivery the host whose claim bound it, empty while it
    /// waits in its pool (host NULL on the record).
    host: String,
    /// The recipient pool of a pool delivery (for life); `None` for a host delivery.
    pool: Option<String>,
    conversation: String,
    state: String,
    instance_id: Option<String>,
    reason: Option<String>,
    /// The current run: 1, then one more for each retry or redrive.
    run: i64,
    /// Why the current run happens when it is not the first: `retry` or `redrive`.
    rerun: Option<String>,
    /// While (or since) queued for a retry: not to be handed out before (unix ms, hub clock).
    not_before: Option<i64>,
    /// When the hub recorded the current run's start (unix ms, hub clock).
    started_at: Option<i64>,
    /// When a cancel of the current run was recorded (unix ms, hub clock).
    cancel_requested_at: Option<i64>,
}

impl Delivery {
    /// Cancelled before it was delivered (queued, held, claimed or mirrored): failed with a
    /// reason that starts with `cancelled`, so its current run never ran anywhere.
    fn cancelled_before_delivery(&self) -> bool {
        self.state == "failed" && self.reason.as_deref().is_some_and(|r| r.starts_with("cancelled"))
    }
}

struct Event {
    id: i64,
    delivery_id: String,
    from: Option<String>,
    to: String,
    actor_kind: String,
    actor: String,
    instance_id: Option<String>,
    reason: Option<String>,
    at: i64,
}

struct HubAttempt {
    id: String,
    delivery_id: String,
    host: String,
    instance_id: String,
    report_id: String,
    outcome: String,
    /// The run this attempt ended.
    run: i64,
    /// Why that run happened when it was not the first.
    rerun: Option<String>,
    /// How long the run took, as its node measured it.
    duration_ms: Option<i64>,
    /// Written by the hub itself (an `unknown` after a retire or requeue), not reported by a node.
    by_hub: bool,
}

/// A progress event recorded after its run's outcome (I19): the delivery, the run, the event's
/// position and the outcome's.
struct LateProgress {
    delivery_id: String,
    run: i64,
    n: i64,
    outcome_n: i64,
}

struct Fence {
    id: i64,
    kind: String,
    scope: String,
    target: Option<String>,
    set_at: i64,
    lifted_at: Option<i64>,
    set_after_event: i64,
    lifted_after_event: Option<i64>,
}

struct NodeDelivery {
    delivery_id: String,
    state: String,
}

struct NodeAttempt {
    attempt_id: String,
    delivery_id: String,
    /// The run of the delivery it was.
    run: i64,
    ended: bool,
    outcome: Option<String>,
}

struct NodeDb {
    path: String,
    /// A data directory a copy took over (`Inputs::retired_node_dbs`).
    retired: bool,
    instance_id: Option<String>,
    deliveries: Vec<NodeDelivery>,
    attempts: Vec<NodeAttempt>,
}

/// A change of a pool's membership, as the hub audited it in `operator_events`.
struct PoolAudit {
    id: i64,
    /// Joined (`pool_add`) or left (`pool_remove`, also a retire's).
    joined: bool,
    pool: String,
    host: String,
    /// Hub clock, unix ms.
    at: i64,
}

/// The audit actions of pool membership (`baton_hub::store::registry::pools`), and the subject
/// they record: `pool NAME host HOST`.
const POOL_ADD: &str = "pool_add";
const POOL_REMOVE: &str = "pool_remove";

#[derive(Default)]
struct Model {
    messages: Vec<Message>,
    recipients: Vec<(String, String)>,
    /// Routing to pools: (message, pool).
    pool_recipients: Vec<(String, String)>,
    /// Every audited change of pool membership, in id order.
    pool_audit: Vec<PoolAudit>,
    obligations: Vec<(String, Option<i64>)>,
    deliveries: Vec<Delivery>,
    events: Vec<Event>,
    attempts: Vec<HubAttempt>,
    fences: Vec<Fence>,
    late_progress: Vec<LateProgress>,
    progress_events: i64,
    nodes: Vec<NodeDb>,
    history: Vec<HistoryLine>,
    ledger: Vec<EffectLine>,
}

/// Opens an SQLite file strictly read-only.
pub fn open_read_only(path: &Path) -> anyhow::Result<Connection> {
    if !path.exists() {
        anyhow::bail!("{} does not exist", path.display());
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// Every row of `sql` (no parameters), mapped by `f`.
pub fn rows<T>(
    conn: &dyn Db,
    sql: &str,
    f: impl FnMut(&Row<'_>) -> baton_hub::store::engine::DbResult<T>,
) -> anyhow::Result<Vec<T>> {
    let mut stmt = conn.prepare(sql)?;
    let out = stmt.query_map([], f)?.collect::<Result<Vec<_>, _>>()?;
    Ok(out)
}

fn load_hub(conn: &dyn Db, m: &mut Model) -> anyhow::Result<()> {
    // In acceptance order (a PostgreSQL table has no rowid).
    m.messages = rows(
        conn,
        "SELECT id, producer, idempotency_key, max_attempts, deadline_ms FROM messages
         ORDER BY accepted_at, conversation, seq",
        |r| {
            Ok(Message {
                id: r.get(0)?,
                producer: r.get(1)?,
                key: r.get(2)?,
                max_attempts: r.get(3)?,
                deadline_ms: r.get(4)?,
            })
        },
    )?;
    m.recipients = rows(conn, "SELECT message_id, host FROM message_recipients", |r| Ok((r.get(0)?, r.get(1)?)))?;
    m.obligations = rows(conn, "SELECT message_id, done_at FROM fanout_obligations", |r| Ok((r.get(0)?, r.get(1)?)))?;
    m.pool_recipients =
        rows(conn, "SELECT message_id, pool FROM message_pool_recipients", |r| Ok((r.get(0)?, r.get(1)?)))?;
    let audit: Vec<(i64, String, String, i64)> = rows(
        conn,
        &format!(
            "SELECT id, action, subject, at FROM operator_events WHERE action IN ('{POOL_ADD}', '{POOL_REMOVE}')
             ORDER BY id"
        ),
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    for (id, action, subject, at) in audit {
        // An audit row this reader cannot place is kept as a membership of nobody: the claims
        // it would explain then show up as claims by non-members.
        let (pool, host) = subject
            .strip_prefix("pool ")
            .and_then(|rest| rest.split_once(" host "))
            .map(|(p, h)| (p.to_string(), h.to_string()))
            .unwrap_or_default();
        m.pool_audit.push(PoolAudit { id, joined: action == POOL_ADD, pool, host, at });
    }
    m.deliveries = rows(
        conn,
        "SELECT id, message_id, coalesce(host, ''), conversation, state, instance_id, reason, attempt, rerun,
                not_before, started_at, cancel_requested_at, pool
         FROM deliveries ORDER BY n",
        |r| {
            Ok(Delivery {
                id: r.get(0)?,
                message_id: r.get(1)?,
                host: r.get(2)?,
                conversation: r.get(3)?,
                state: r.get(4)?,
                instance_id: r.get(5)?,
                reason: r.get(6)?,
                run: r.get(7)?,
                rerun: r.get(8)?,
                not_before: r.get(9)?,
                started_at: r.get(10)?,
                cancel_requested_at: r.get(11)?,
                pool: r.get(12)?,
            })
        },
    )?;
    m.events = rows(
        conn,
        "SELECT id, delivery_id, from_state, to_state, actor_kind, actor, instance_id, reason, at
         FROM delivery_events ORDER BY id",
        |r| {
            Ok(Event {
                id: r.get(0)?,
                delivery_id: r.get(1)?,
                from: r.get(2)?,
                to: r.get(3)?,
                actor_kind: r.get(4)?,
                actor: r.get(5)?,
                instance_id: r.get(6)?,
                reason: r.get(7)?,
                at: r.get(8)?,
            })
        },
    )?;
    m.attempts = rows(
        conn,
        "SELECT id, delivery_id, host, instance_id, report_id, outcome, attempt, rerun, duration_ms,
                request_hash = '' FROM attempts
         ORDER BY reported_at, id",
        |r| {
            Ok(HubAttempt {
                id: r.get(0)?,
                delivery_id: r.get(1)?,
                host: r.get(2)?,
                instance_id: r.get(3)?,
                report_id: r.get(4)?,
                outcome: r.get(5)?,
                run: r.get(6)?,
                rerun: r.get(7)?,
                duration_ms: r.get(8)?,
                by_hub: r.get(9)?,
            })
        },
    )?;
    // Only the violations are read: a progress event positioned after its run's outcome.
    m.late_progress = rows(
        conn,
        "SELECT p.delivery_id, p.attempt, p.n, a.event_n FROM progress_events p
         JOIN attempts a ON a.delivery_id = p.delivery_id AND a.attempt = p.attempt
         WHERE a.event_n IS NOT NULL AND p.n > a.event_n ORDER BY p.n",
        |r| Ok(LateProgress { delivery_id: r.get(0)?, run: r.get(1)?, n: r.get(2)?, outcome_n: r.get(3)? }),
    )?;
    m.progress_events = conn.query_row("SELECT count(*) FROM progress_events", [], |r| r.get(0))?;
    m.fences = rows(
        conn,
        "SELECT id, kind, scope, target, set_at, lifted_at, set_after_event, lifted_after_event FROM fences ORDER BY id",
        |r| {
            Ok(Fence {
                id: r.get(0)?,
                kind: r.get(1)?,
                scope: r.get(2)?,
                target: r.get(3)?,
                set_at: r.get(4)?,
                lifted_at: r.get(5)?,
                set_after_event: r.get(6)?,
                lifted_after_event: r.get(7)?,
            })
        },
    )?;
    Ok(())
}

fn load_node(path: &Path, retired: bool, out: &mut Vec<Violation>) -> anyhow::Result<NodeDb> {
    let conn = open_read_only(path)?;
    let shown = path.display().to_string();
    integrity(&conn, &shown, out)?;
    let instance_id =
        conn.query_row("SELECT value FROM meta WHERE key = 'instance_id'", [], |r| r.get::<_, String>(0)).optional()?;
    let deliveries = rows(&conn, "SELECT delivery_id, state FROM deliveries ORDER BY mirrored_at_ms", |r| {
        Ok(NodeDelivery { delivery_id: r.get(0)?, state: r.get(1)? })
    })?;
    let attempts = rows(
        &conn,
        "SELECT attempt_id, delivery_id, coalesce(run, 1), ended_at_ms IS NOT NULL, outcome FROM attempts
         ORDER BY started_at_ms",
        |r| {
            Ok(NodeAttempt {
                attempt_id: r.get(0)?,
                delivery_id: r.get(1)?,
                run: r.get(2)?,
                ended: r.get(3)?,
                outcome: r.get(4)?,
            })
        },
    )?;
    Ok(NodeDb { path: shown, retired, instance_id, deliveries, attempts })
}

/// I12 on one SQLite file (a node database; the hub's file is checked by
/// `baton_hub::verify::check`): `integrity_check` and `foreign_key_check`.
fn integrity(conn: &Connection, shown: &str, out: &mut Vec<Violation>) -> anyhow::Result<()> {
    let check: Vec<String> = rows(conn, "PRAGMA integrity_check", |r| r.get(0))?;
    if check != ["ok"] {
        out.push(violation("I12", shown, format!("integrity_check: {}", check.join("; ")), Vec::new()));
    }
    let fk: Vec<String> =
        rows(conn, "SELECT \"table\" || ' row ' || rowid FROM pragma_foreign_key_check", |r| r.get(0))?;
    if !fk.is_empty() {
        out.push(violation("I12", shown, format!("foreign_key_check: {}", fk.join("; ")), Vec::new()));
    }
    Ok(())
}

fn violation(inv: &str, subject: &str, message: String, chain: Vec<String>) -> Violation {
    Violation { invariant: inv.into(), subject: subject.into(), message, chain }
}

/// Runs every check. An `Err` means the inputs could not be read at all (not a violation).
pub fn check(inputs: &Inputs) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // One read of the record: the model and the hub-side rules see the same snapshot.
    let (mut m, problems) = inputs.hub.read(|db| {
        let mut m = Model::default();
        load_hub(db, &mut m)?;
        let problems = baton_hub::verify::check(db).map_err(|e| anyhow::anyhow!("verify: {e}"))?;
        Ok((m, problems))
    })?;
    let mut v: Vec<Violation> = problems.iter().map(hub_problem).collect();
    for p in &inputs.node_dbs {
        let node = load_node(p, inputs.retired_node_dbs.contains(p), &mut v)?;
        m.nodes.push(node);
    }
    if let Some(h) = &inputs.history {
        let lines = read_lines::<HistoryLine>(h)?;
        report.counts.insert("history_unreadable_lines".into(), lines.unreadable as u64);
        m.history = lines.items;
    }
    if let Some(l) = &inputs.ledger {
        let lines = read_lines::<EffectLine>(l)?;
        report.counts.insert("ledger_unreadable_lines".into(), lines.unreadable as u64);
        m.ledger = lines.items;
    }
    let ix = Index::new(&m);
    check_accepts(&m, &ix, &mut v);
    check_fanout(&m, &ix, &mut v);
    check_exclusivity(&m, &ix, &mut v);
    check_fences(&m, &ix, &mut v);
    check_effects(&m, &ix, inputs, &mut v);
    check_reports(&m, &ix, &mut v);
    check_agreement(&m, &ix, &mut v);
    report.counts.insert("ordered_effects".into(), check_order(&m, &ix, &mut v) as u64);
    report.counts.insert("reruns".into(), check_turn_control(&m, &ix, &mut v) as u64);
    check_one_execution_per_run(&m, &ix, &mut v);
    let pools = check_pools(&m, &ix, &mut v);
    report.counts.insert("pool_claims".into(), pools.claims as u64);
    report.counts.insert("pool_ordered_effects".into(), pools.ordered as u64);
    report.counts.insert("pool_handovers".into(), pools.handovers as u64);
    report.counts.insert("deadlines_checked".into(), check_progress_and_deadlines(&m, &ix, inputs, &mut v) as u64);
    if inputs.liveness {
        check_liveness(&m, &ix, &mut v);
    }
    for (i, viol) in v.iter_mut().enumerate() {
        if viol.chain.is_empty() && i < CHAINS_MAX {
            viol.chain = ix.chain_for(&m, &viol.subject);
        } else if viol.chain.is_empty() {
            viol.chain.push(format!("(chain omitted: only the first {CHAINS_MAX} violations carry one)"));
        }
        if viol.chain.is_empty() {
            viol.chain.push(format!("(a finding about {} as a whole; no delivery, message or key)", viol.subject));
        }
    }
    report.counts.insert("messages".into(), m.messages.len() as u64);
    report.counts.insert("deliveries".into(), m.deliveries.len() as u64);
    report.counts.insert("events".into(), m.events.len() as u64);
    report.counts.insert("hub_attempts".into(), m.attempts.len() as u64);
    report.counts.insert("fences".into(), m.fences.len() as u64);
    report.counts.insert("node_dbs".into(), m.nodes.len() as u64);
    report.counts.insert("history_lines".into(), m.history.len() as u64);
    report.counts.insert("effects".into(), m.ledger.len() as u64);
    report.counts.insert("progress_events".into(), u64::try_from(m.progress_events).unwrap_or(0));
    report.violations = v;
    Ok(report)
}

/// Sorts a typed `baton_hub::verify` problem into its invariant family. The match is
/// exhaustive: a new kind of problem must be given its family here.
fn hub_problem(p: &baton_hub::verify::Problem) -> Violation {
    use baton_hub::verify::ProblemKind as K;
    let family = match p.kind {
        K::Integrity | K::ForeignKey => "I12",
        K::AtomicAccept => "I3",
        K::FanOut => "I4",
        K::AttemptWithoutDelivery => "I8",
        K::Settlement => "I9",
        K::PoolFlight => "I18",
        K::SequenceBehind | K::BacklogCount | K::EventLog | K::IllegalTransition | K::CorruptValue => "I14",
    };
    violation(family, &p.subject, format!("hub verify: {p}"), Vec::new())
}

// ---------------------------------------------------------------------------------------------
// Indices and chains

struct Index {
    message_by_key: HashMap<(String, String), Vec<usize>>,
    message_by_id: HashMap<String, usize>,
    delivery_by_id: HashMap<String, usize>,
    deliveries_by_message: HashMap<String, Vec<usize>>,
    events_by_delivery: HashMap<String, Vec<usize>>,
    attempts_by_delivery: HashMap<String, Vec<usize>>,
    ledger_by_delivery: HashMap<String, Vec<usize>>,
    history_by_key: HashMap<String, Vec<usize>>,
    /// Every node attempt id → (node index, attempt index).
    node_attempt: HashMap<String, (usize, usize)>,
}

fn push<K: std::hash::Hash + Eq>(map: &mut HashMap<K, Vec<usize>>, k: K, i: usize) {
    map.entry(k).or_default().push(i);
}

impl Index {
    fn new(m: &Model) -> Index {
        let mut ix = Index {
            message_by_key: HashMap::new(),
            message_by_id: HashMap::new(),
            delivery_by_id: HashMap::new(),
            deliveries_by_message: HashMap::new(),
            events_by_delivery: HashMap::new(),
            attempts_by_delivery: HashMap::new(),
            ledger_by_delivery: HashMap::new(),
            history_by_key: HashMap::new(),
            node_attempt: HashMap::new(),
        };
        for (i, msg) in m.messages.iter().enumerate() {
            push(&mut ix.message_by_key, (msg.producer.clone(), msg.key.clone()), i);
            ix.message_by_id.insert(msg.id.clone(), i);
        }
        for (i, d) in m.deliveries.iter().enumerate() {
            ix.delivery_by_id.insert(d.id.clone(), i);
            push(&mut ix.deliveries_by_message, d.message_id.clone(), i);
        }
        for (i, e) in m.events.iter().enumerate() {
            push(&mut ix.events_by_delivery, e.delivery_id.clone(), i);
        }
        for (i, a) in m.attempts.iter().enumerate() {
            push(&mut ix.attempts_by_delivery, a.delivery_id.clone(), i);
        }
        for (i, l) in m.ledger.iter().enumerate() {
            push(&mut ix.ledger_by_delivery, l.delivery_id.clone(), i);
        }
        for (i, h) in m.history.iter().enumerate() {
            push(&mut ix.history_by_key, h.key.clone(), i);
        }
        // A copied data directory holds the original's attempts too: of the rows of one
        // attempt, the one that knows its end (the process that ran it) tells the outcome.
        let known = |(n, a): (usize, usize)| {
            let att: &NodeAttempt = &m.nodes[n].attempts[a];
            att.ended && att.outcome.as_deref() != Some("unknown")
        };
        for (n, node) in m.nodes.iter().enumerate() {
            for (a, att) in node.attempts.iter().enumerate() {
                match ix.node_attempt.get(&att.attempt_id) {
                    Some(&first) if known(first) || !known((n, a)) => {}
                    _ => {
                        ix.node_attempt.insert(att.attempt_id.clone(), (n, a));
                    }
                }
            }
        }
        ix
    }

    /// Messages with this key, whatever the producer (`None`) or for one producer.
    fn messages_with_key(&self, m: &Model, producer: Option<&str>, key: &str) -> Vec<usize> {
        match producer {
            Some(p) => self.message_by_key.get(&(p.to_string(), key.to_string())).cloned().unwrap_or_default(),
            None => m.messages.iter().enumerate().filter(|(_, msg)| msg.key == key).map(|(i, _)| i).collect(),
        }
    }

    /// Every recorded fact about `subject` (a delivery id, message id or idempotency key).
    fn chain_for(&self, m: &Model, subject: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut keys: BTreeSet<String> = BTreeSet::new();
        let mut deliveries: Vec<usize> = Vec::new();
        if let Some(&d) = self.delivery_by_id.get(subject) {
            deliveries.push(d);
        }
        let mut message_ids: Vec<String> = Vec::new();
        if let Some(&mi) = self.message_by_id.get(subject) {
            message_ids.push(m.messages[mi].id.clone());
        }
        for d in &deliveries {
            message_ids.push(m.deliveries[*d].message_id.clone());
        }
        for (i, msg) in m.messages.iter().enumerate() {
            if msg.key == subject {
                message_ids.push(m.messages[i].id.clone());
            }
        }
        if self.history_by_key.contains_key(subject) {
            keys.insert(subject.to_string());
        }
        message_ids.sort();
        message_ids.dedup();
        for mid in &message_ids {
            if let Some(&mi) = self.message_by_id.get(mid) {
                let msg = &m.messages[mi];
                out.push(format!("hub message {} producer={} key={}", msg.id, msg.producer, msg.key));
                keys.insert(msg.key.clone());
            }
            for &d in self.deliveries_by_message.get(mid).map(Vec::as_slice).unwrap_or(&[]) {
                if !deliveries.contains(&d) {
                    deliveries.push(d);
                }
            }
        }
        for key in &keys {
            for &h in self.history_by_key.get(key).map(Vec::as_slice).unwrap_or(&[]) {
                let line = &m.history[h];
                out.push(format!(
                    "history {} {} key={} hash={} message_id={:?} http={:?} err={:?}",
                    line.op, line.phase, line.key, line.payload_hash, line.message_id, line.http, line.err
                ));
            }
        }
        for &d in &deliveries {
            let del = &m.deliveries[d];
            out.push(format!(
                "hub delivery {} host={} pool={:?} conversation={} state={} holder={:?} run={} rerun={:?} \
                 not_before={:?} started_at={:?} cancel_requested_at={:?} reason={:?}",
                del.id,
                del.host,
                del.pool,
                del.conversation,
                del.state,
                del.instance_id,
                del.run,
                del.rerun,
                del.not_before,
                del.started_at,
                del.cancel_requested_at,
                del.reason
            ));
            for &e in self.events_by_delivery.get(&del.id).map(Vec::as_slice).unwrap_or(&[]) {
                let ev = &m.events[e];
                out.push(format!(
                    "  event #{} at={} {:?} -> {} by {} {} instance={:?} reason={:?}",
                    ev.id, ev.at, ev.from, ev.to, ev.actor_kind, ev.actor, ev.instance_id, ev.reason
                ));
            }
            for &a in self.attempts_by_delivery.get(&del.id).map(Vec::as_slice).unwrap_or(&[]) {
                let at = &m.attempts[a];
                out.push(format!(
                    "  hub attempt {} run={} rerun={:?} host={} instance={} report_id={} outcome={}",
                    at.id, at.run, at.rerun, at.host, at.instance_id, at.report_id, at.outcome
                ));
            }
            for node in &m.nodes {
                for nd in node.deliveries.iter().filter(|nd| nd.delivery_id == del.id) {
                    out.push(format!(
                        "  node {} (instance {:?}) local state={}",
                        node.path, node.instance_id, nd.state
                    ));
                }
                for na in node.attempts.iter().filter(|na| na.delivery_id == del.id) {
                    out.push(format!(
                        "  node {} attempt {} ended={} outcome={:?}",
                        node.path, na.attempt_id, na.ended, na.outcome
                    ));
                }
            }
            for &l in self.ledger_by_delivery.get(&del.id).map(Vec::as_slice).unwrap_or(&[]) {
                let e = &m.ledger[l];
                out.push(format!(
                    "  effect attempt={} run={} rerun={:?} host={} instance={:?} session={:?} nonce={} signal={:?} \
                     exit={:?}",
                    e.attempt_id,
                    e.run_number(),
                    e.rerun,
                    e.host,
                    e.instance,
                    e.session,
                    e.nonce,
                    e.signal,
                    e.exit_code
                ));
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// I1, I2: accepts against the record

fn check_accepts(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    let mut keys: Vec<&String> = ix.history_by_key.keys().collect();
    keys.sort();
    for key in keys {
        let lines: Vec<&HistoryLine> = ix.history_by_key[key].iter().map(|&i| &m.history[i]).collect();
        let producer = lines.iter().find_map(|l| l.producer.as_deref());
        let rows = ix.messages_with_key(m, producer, key);
        let oks: Vec<&&HistoryLine> = lines.iter().filter(|l| l.op == "accept" && l.phase == "ok").collect();
        if rows.len() > 1 {
            v.push(violation("I2", key, format!("{} messages carry this idempotency key", rows.len()), Vec::new()));
        }
        let ids: BTreeSet<Option<&str>> = oks.iter().map(|l| l.message_id.as_deref()).collect();
        if ids.len() > 1 {
            v.push(violation(
                "I2",
                key,
                format!("replays of this key were answered with different ids: {ids:?}"),
                Vec::new(),
            ));
        }
        let hashes: BTreeSet<&str> = oks.iter().map(|l| l.payload_hash.as_str()).collect();
        if hashes.len() > 1 {
            v.push(violation(
                "I2",
                key,
                "the same key was accepted with different content (must be 409)".into(),
                Vec::new(),
            ));
        }
        for ok in &oks {
            let Some(id) = ok.message_id.as_deref() else {
                v.push(violation("I1", key, "an ok accept without a message id".into(), Vec::new()));
                continue;
            };
            if !rows.iter().any(|&r| m.messages[r].id == id) {
                v.push(violation(
                    "I1",
                    key,
                    format!("accept answered ok with message {id}, but the record has no such message for the key"),
                    Vec::new(),
                ));
                break;
            }
        }
        let invoked = lines.iter().any(|l| l.phase == "invoke");
        if !rows.is_empty() && !invoked && !lines.is_empty() {
            v.push(violation("I2", key, "a message exists for a key the client never submitted".into(), Vec::new()));
        }
    }
    // A message whose key the history never mentions, when a history covers its producer.
    let producers: BTreeSet<&str> = m.history.iter().filter_map(|l| l.producer.as_deref()).collect();
    if !m.history.is_empty() {
        for msg in &m.messages {
            let covered = producers.is_empty() || producers.contains(msg.producer.as_str());
            if covered && !ix.history_by_key.contains_key(&msg.key) {
                v.push(violation("I2", &msg.id, "a message no client submitted (phantom accept)".into(), Vec::new()));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I3, I4: routing, obligations and deliveries

fn check_fanout(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    let mut routed: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for (mid, host) in &m.recipients {
        routed.entry(mid.as_str()).or_default().insert(host.as_str());
    }
    let obligations: HashMap<&str, Option<i64>> = m.obligations.iter().map(|(id, d)| (id.as_str(), *d)).collect();
    for (mid, _) in &m.obligations {
        if !ix.message_by_id.contains_key(mid) {
            v.push(violation("I3", mid, "a fan-out obligation without its message".into(), Vec::new()));
        }
    }
    for (mid, _) in &m.recipients {
        if !ix.message_by_id.contains_key(mid) {
            v.push(violation("I3", mid, "routing without its message".into(), Vec::new()));
        }
    }
    let mut routed_pools: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for (mid, pool) in &m.pool_recipients {
        routed_pools.entry(mid.as_str()).or_default().insert(pool.as_str());
    }
    // Routing rows belong to a fan-out that ran after its accept's transaction, with its
    // obligation; a message fanned out in its accept's transaction keeps neither, and its
    // deliveries are its routing.
    for mid in routed.keys().chain(routed_pools.keys()).collect::<BTreeSet<_>>() {
        if ix.message_by_id.contains_key(*mid) && !obligations.contains_key(*mid) {
            v.push(violation("I3", mid, "routing without its fan-out obligation".into(), Vec::new()));
        }
    }
    for msg in &m.messages {
        let of_message: Vec<&Delivery> = ix
            .deliveries_by_message
            .get(&msg.id)
            .map(|ds| ds.iter().map(|&d| &m.deliveries[d]).collect())
            .unwrap_or_default();
        // A pool's delivery is the pool's, whichever host claimed it: it is matched against the
        // routed pools, the host deliveries against the routed hosts.
        let hosts: Vec<&str> = of_message.iter().filter(|d| d.pool.is_none()).map(|d| d.host.as_str()).collect();
        let pools: Vec<&str> = of_message.iter().filter_map(|d| d.pool.as_deref()).collect();
        let unique_pools: BTreeSet<&str> = pools.iter().copied().collect();
        if unique_pools.len() != pools.len() {
            v.push(violation("I4", &msg.id, "two deliveries of one message for the same pool".into(), Vec::new()));
        }
        let unique: BTreeSet<&str> = hosts.iter().copied().collect();
        if unique.len() != hosts.len() {
            v.push(violation("I4", &msg.id, "two deliveries of one message for the same host".into(), Vec::new()));
        }
        if !obligations.contains_key(msg.id.as_str()) {
            // Fanned out in its accept's transaction: its deliveries are its routing.
            if of_message.is_empty() {
                let why = "a message with neither a delivery nor a fan-out obligation";
                v.push(violation("I3", &msg.id, why.into(), Vec::new()));
            }
            continue;
        }
        let want_pools = routed_pools.get(msg.id.as_str()).cloned().unwrap_or_default();
        if let Some(Some(_done)) = obligations.get(msg.id.as_str())
            && unique_pools != want_pools
        {
            v.push(violation(
                "I4",
                &msg.id,
                format!("fan-out marked done but pool deliveries {unique_pools:?} differ from routing {want_pools:?}"),
                Vec::new(),
            ));
        }
        let extra_pools: Vec<&&str> = unique_pools.difference(&want_pools).collect();
        if !extra_pools.is_empty() {
            v.push(violation("I4", &msg.id, format!("deliveries for pools never routed: {extra_pools:?}"), Vec::new()));
        }
        let want = routed.get(msg.id.as_str()).cloned().unwrap_or_default();
        if let Some(Some(_done)) = obligations.get(msg.id.as_str())
            && unique != want
        {
            v.push(violation(
                "I4",
                &msg.id,
                format!("fan-out marked done but deliveries {unique:?} differ from routing {want:?}"),
                Vec::new(),
            ));
        }
        let extra: Vec<&&str> = unique.difference(&want).collect();
        if !extra.is_empty() {
            v.push(violation("I4", &msg.id, format!("deliveries for hosts never routed: {extra:?}"), Vec::new()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I5: one holder at a time, replaying the event log in commit order

fn check_exclusivity(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    let mut holder: HashMap<&str, Option<&str>> = HashMap::new();
    // Per host: which instance holds which delivery (claimed or mirrored) right now.
    let mut active: HashMap<&str, HashMap<&str, &str>> = HashMap::new();
    let mut flagged: BTreeSet<&str> = BTreeSet::new();
    // A pool delivery's host is the one whose claim bound it, claim by claim (a requeue returns
    // it to the pool, and another member may claim it next).
    let mut pool_host: HashMap<&str, &str> = HashMap::new();
    for e in &m.events {
        let Some(&di) = ix.delivery_by_id.get(&e.delivery_id) else { continue };
        let d = &m.deliveries[di];
        let host: &str = match d.pool {
            None => d.host.as_str(),
            Some(_) if e.to == "claimed" && e.actor_kind == "node" => {
                pool_host.insert(d.id.as_str(), e.actor.as_str());
                e.actor.as_str()
            }
            Some(_) => pool_host.get(d.id.as_str()).copied().unwrap_or(d.host.as_str()),
        };
        let cur = holder.entry(e.delivery_id.as_str()).or_insert(None);
        let inst = e.instance_id.as_deref();
        let mut bad = |msg: String| {
            if flagged.insert(d.id.as_str()) {
                v.push(violation("I5", &d.id, format!("event #{}: {msg}", e.id), Vec::new()));
            }
        };
        if e.actor_kind == "node" && e.actor != host {
            bad(format!("node {} moved a delivery of host {host}", e.actor));
        }
        let from_held = matches!(e.from.as_deref(), Some("claimed" | "mirrored" | "delivered"));
        if e.to == "claimed" {
            if let Some(h) = cur {
                bad(format!("claimed by {inst:?} while {h} still held it"));
            }
            if let (Some(i), Some(hosts)) = (inst, active.get(host))
                && let Some((other_d, other_i)) = hosts.iter().find(|(_, hi)| **hi != i)
            {
                bad(format!(
                    "instance {i} claimed on host {host} while instance {other_i} still held delivery {other_d} (clone)"
                ));
            }
        } else if from_held && e.actor_kind == "node" && inst != *cur {
            bad(format!("{:?} -> {} by instance {inst:?}, but the holder is {cur:?}", e.from, e.to));
        } else if from_held
            && e.actor_kind != "node"
            && e.to == "queued"
            && e.actor_kind != "operator"
            && !(e.from.as_deref() == Some("delivered") && e.actor_kind == "hub")
        {
            // The hub drops a holder only to requeue a delivered turn whose harness asked for a
            // retry (delivered -> queued by the hub); that run is over, so it holds nothing.
            bad(format!("holder dropped by {} without an operator requeue", e.actor_kind));
        }
        *cur = match e.to.as_str() {
            "claimed" => inst,
            "mirrored" | "delivered" => *cur,
            _ => None,
        };
        let host_map = active.entry(host).or_default();
        match (e.to.as_str(), *cur) {
            ("claimed" | "mirrored", Some(h)) => {
                host_map.insert(d.id.as_str(), h);
            }
            _ => {
                host_map.remove(d.id.as_str());
            }
        }
    }
    // The record's current holder must be the one the log ends with.
    for d in &m.deliveries {
        let logged = holder.get(d.id.as_str()).copied().flatten();
        if matches!(d.state.as_str(), "claimed" | "mirrored" | "delivered") && logged != d.instance_id.as_deref() {
            v.push(violation(
                "I5",
                &d.id,
                format!("held by {:?} on the record but the event log gives the holder as {logged:?}", d.instance_id),
                Vec::new(),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I6: no claim under an active fence

/// Whether fence `f` keeps delivery `d` from a claim by `host`: a fence on everything, on its
/// conversation, on the claiming host (for a pool delivery, any kind of fence on the host keeps
/// the host from the pool's work), or on its pool.
fn covers(f: &Fence, d: &Delivery, host: &str) -> bool {
    match f.scope.as_str() {
        "all" => true,
        "conversation" => f.target.as_deref() == Some(d.conversation.as_str()),
        "host" => f.target.as_deref() == Some(host),
        "pool" => d.pool.is_some() && f.target.as_deref() == d.pool.as_deref(),
        _ => false,
    }
}

fn check_fences(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    for e in m.events.iter().filter(|e| e.to == "claimed") {
        let Some(&di) = ix.delivery_by_id.get(&e.delivery_id) else { continue };
        let d = &m.deliveries[di];
        // The claiming host: a pool delivery's is the claim's actor.
        let host = if d.pool.is_some() { e.actor.as_str() } else { d.host.as_str() };
        // Fences sit in the commit order: active for every event after `set_after_event` up to
        // and including `lifted_after_event`.
        let fence = m
            .fences
            .iter()
            .find(|f| covers(f, d, host) && f.set_after_event < e.id && f.lifted_after_event.is_none_or(|l| e.id <= l));
        if let Some(f) = fence {
            v.push(violation(
                "I6",
                &d.id,
                format!(
                    "event #{} claimed at {} under {} fence #{} ({} {:?}) set at {} lifted at {:?}",
                    e.id, e.at, f.kind, f.id, f.scope, f.target, f.set_at, f.lifted_at
                ),
                Vec::new(),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I7, I8: effects against attempts

fn check_effects(m: &Model, ix: &Index, inputs: &Inputs, v: &mut Vec<Violation>) {
    let mut dids: Vec<&String> = ix.ledger_by_delivery.keys().collect();
    dids.sort();
    for did in dids {
        let effects: Vec<&EffectLine> = ix.ledger_by_delivery[did].iter().map(|&i| &m.ledger[i]).collect();
        // Two executions of one run are I17's finding (`check_one_execution_per_run`); each
        // run of a retried or redriven delivery is an execution of its own.
        let Some(&di) = ix.delivery_by_id.get(did.as_str()) else {
            v.push(violation("I7", did, "an execution of a delivery the hub does not know".into(), Vec::new()));
            continue;
        };
        let d = &m.deliveries[di];
        // Every instance whose ack the hub confirmed for some run of this delivery.
        let acked_by: BTreeSet<&str> = ix
            .events_by_delivery
            .get(did.as_str())
            .map(|es| es.iter().map(|&i| &m.events[i]).filter(|e| e.to == "delivered"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.instance_id.as_deref())
            .collect();
        for eff in &effects {
            let run = eff.run_number();
            if run > d.run {
                v.push(violation(
                    "I7",
                    did,
                    format!("executed run {run}, but the hub never authorised a run after run {}", d.run),
                    Vec::new(),
                ));
            } else if run == d.run && d.state != "delivered" && !d.cancelled_before_delivery() {
                // (A run cancelled before it was delivered that ran anyway is I16's finding.)
                v.push(violation(
                    "I7",
                    did,
                    format!("run {run} executed although the hub has it {} (gate)", d.state),
                    Vec::new(),
                ));
            }
            // (A pool delivery's host is the one each run was handed to: I18's finding.)
            if d.pool.is_none() && eff.host != d.host {
                v.push(violation("I7", did, format!("executed on host {} for host {}", eff.host, d.host), Vec::new()));
            }
            let node = ix.node_attempt.get(&eff.attempt_id).map(|&(n, a)| (&m.nodes[n], &m.nodes[n].attempts[a]));
            let instance = if eff.instance.is_empty() {
                node.and_then(|(n, _)| n.instance_id.clone())
            } else {
                Some(eff.instance.clone())
            };
            if let Some(inst) = &instance
                && !acked_by.is_empty()
                && !acked_by.contains(inst.as_str())
            {
                v.push(violation(
                    "I7",
                    did,
                    format!("executed by instance {inst}, but the hub confirmed acks only from {acked_by:?}"),
                    Vec::new(),
                ));
            }
            check_effect_visible(m, ix, inputs, d, eff, node.map(|(_, a)| a), v);
        }
    }
    // A succeeded hub attempt is a claim that the harness ran: there must be an effect.
    if inputs.ledger.is_some() {
        for a in m.attempts.iter().filter(|a| a.outcome == "succeeded") {
            let has = ix
                .ledger_by_delivery
                .get(&a.delivery_id)
                .is_some_and(|es| es.iter().any(|&i| m.ledger[i].attempt_id == a.report_id));
            if !has {
                v.push(violation(
                    "I8",
                    &a.delivery_id,
                    format!("attempt {} succeeded without an effect", a.id),
                    Vec::new(),
                ));
            }
        }
    }
    // On each node: no more started attempts per delivery than the hub has runs of it, and
    // every one visible on the hub.
    for node in &m.nodes {
        let mut per: HashMap<&str, usize> = HashMap::new();
        for a in &node.attempts {
            *per.entry(a.delivery_id.as_str()).or_default() += 1;
            if inputs.liveness
                && !m.attempts.iter().any(|h| h.report_id == a.attempt_id)
                && !reported_unknown_by_copy(m, ix, &a.delivery_id, a.run, node.instance_id.as_deref())
            {
                let (family, why) = match ix.delivery_by_id.get(&a.delivery_id).map(|&i| &m.deliveries[i]) {
                    Some(d) if current_run_reported(m, ix, d) && d.run > 1 => {
                        ("I16", ": an earlier run's attempt row is gone (rewritten by a re-run?)")
                    }
                    _ => ("I8", ""),
                };
                v.push(violation(
                    family,
                    &a.delivery_id,
                    format!("node attempt {} (started on {}) has no hub attempt{why}", a.attempt_id, node.path),
                    Vec::new(),
                ));
            }
        }
        for (did, n) in per {
            let runs = ix.delivery_by_id.get(did).map_or(1, |&i| m.deliveries[i].run.max(1)) as usize;
            if n > runs {
                v.push(violation(
                    "I7",
                    did,
                    format!("{n} attempts started on {} for one delivery the hub ran {runs} time(s)", node.path),
                    Vec::new(),
                ));
            }
        }
    }
}

/// Whether another process of `instance`, on a copy of its data directory (two or more of the
/// node databases read name the instance), reported run `run` of delivery `did` `unknown`: the
/// run one process started and did not report (cut off, then taken over) is reported by the
/// other as started elsewhere, under an attempt of its own. Its execution is then visible on the
/// hub as the run's `unknown` outcome, which is what I8 asks of an execution without a known end.
fn reported_unknown_by_copy(m: &Model, ix: &Index, did: &str, run: i64, instance: Option<&str>) -> bool {
    let Some(instance) = instance else { return false };
    let directories = m.nodes.iter().filter(|n| n.instance_id.as_deref() == Some(instance)).count();
    directories > 1
        && ix.attempts_by_delivery.get(did).is_some_and(|as_| {
            as_.iter()
                .map(|&i| &m.attempts[i])
                .any(|a| a.run == run && a.outcome == "unknown" && a.instance_id == instance)
        })
}

/// Whether the hub holds an attempt row for the delivery's current run.
fn current_run_reported(m: &Model, ix: &Index, d: &Delivery) -> bool {
    ix.attempts_by_delivery.get(&d.id).is_some_and(|as_| as_.iter().any(|&i| m.attempts[i].run == d.run))
}

// ---------------------------------------------------------------------------------------------
// I15: order per conversation

/// I15 over the effects ledger: for every (host, conversation), executions taken in the order
/// they started run in increasing `seq` (a later run of the same turn — a harness-requested
/// retry — may follow its earlier run), and each starts no earlier than the previous one on
/// that host ended. Ledger lines carry both a start and an end reading, so both halves are
/// checked; a ledger without readings (an older harness) is taken in file order (the order the
/// executions ended in) and only the `seq` half is checked. Lines without a `seq` cannot be
/// ordered and are skipped, and so is a second execution of one run (that is I17's finding,
/// reported there). The exemptions: a line the record marks as an operator's redrive
/// (`rerun = redrive`), and, for the overlap half only, a turn that follows one the original of
/// a copied data directory ran cut off from the hub and the copy reported `unknown`
/// (`reported_unknown_by_copy`); a retry keeps the order and is checked like a first run. The
/// turns of pool deliveries are left to I18 (`check_pools`): a host's own turns and a pool's
/// keep their orders apart. Returns how many lines were checked.
fn check_order(m: &Model, ix: &Index, v: &mut Vec<Violation>) -> usize {
    let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (i, l) in m.ledger.iter().enumerate() {
        if l.is_redrive() || l.seq.is_none() || !seen.insert((l.delivery_id.as_str(), l.run_number())) {
            continue;
        }
        // A pool's turns keep their order per (pool, conversation), apart from the host's own
        // (I18, `check_pools`).
        if pool_of(m, ix, &l.delivery_id).is_some() {
            continue;
        }
        groups.entry((l.host.as_str(), l.conversation.as_str())).or_default().push(i);
    }
    let mut checked = 0;
    for ((host, conversation), mut lines) in groups {
        checked += lines.len();
        if lines.iter().all(|&i| m.ledger[i].started_ns.is_some()) {
            lines.sort_by_key(|&i| (m.ledger[i].started_ns, i));
        }
        for pair in lines.windows(2) {
            let (a, b) = (&m.ledger[pair[0]], &m.ledger[pair[1]]);
            // Both ledger lines, then the hub's and the nodes' record of both turns.
            let chain = || {
                let mut out: Vec<String> = [a, b]
                    .iter()
                    .map(|l| format!("ledger: {}", serde_json::to_string(l).unwrap_or_default()))
                    .collect();
                out.extend(ix.chain_for(m, &a.delivery_id));
                out.extend(ix.chain_for(m, &b.delivery_id));
                out
            };
            let rerun_of_a = b.seq == a.seq && b.delivery_id == a.delivery_id && b.run_number() > a.run_number();
            if b.seq <= a.seq && !rerun_of_a {
                v.push(violation(
                    "I15",
                    &b.delivery_id,
                    format!(
                        "on host {host}, conversation {conversation:?}: seq {} (run {}{}) started after seq {} (run {})",
                        b.seq.unwrap_or_default(),
                        b.run_number(),
                        b.rerun.as_deref().map(|r| format!(", a {r}")).unwrap_or_default(),
                        a.seq.unwrap_or_default(),
                        a.run_number()
                    ),
                    chain(),
                ));
            }
            // The one overlap the record cannot prevent: the earlier turn ran in the original of
            // a copied data directory, cut off from the hub, and the copy (a newer session)
            // found it started elsewhere and reported it `unknown`. From then on the hub knows
            // that run only as `unknown` — the contract's visible "started, end not known" — and
            // the copy goes on with the next turn while the original may still be running it.
            // The start lease keeps the original from starting anything new meanwhile (I17).
            let overlap_exempt = reported_unknown_by_copy(m, ix, &a.delivery_id, a.run_number(), Some(&a.instance));
            if let (Some(end), Some(start)) = (a.ended_ns, b.started_ns)
                && start < end
                && !overlap_exempt
            {
                v.push(violation(
                    "I15",
                    &b.delivery_id,
                    format!(
                        "on host {host}, conversation {conversation:?}: seq {} started {} ns before seq {} ended",
                        b.seq.unwrap_or_default(),
                        end - start,
                        a.seq.unwrap_or_default()
                    ),
                    chain(),
                ));
            }
        }
    }
    checked
}

fn check_effect_visible(
    m: &Model,
    ix: &Index,
    inputs: &Inputs,
    d: &Delivery,
    eff: &EffectLine,
    node_attempt: Option<&NodeAttempt>,
    v: &mut Vec<Violation>,
) {
    let run = eff.run_number();
    let hub: Vec<&HubAttempt> =
        ix.attempts_by_delivery.get(&d.id).map(|as_| as_.iter().map(|&i| &m.attempts[i]).collect()).unwrap_or_default();
    let mine: Vec<&&HubAttempt> = hub.iter().filter(|a| a.report_id == eff.attempt_id).collect();
    let by_hub: Vec<&&HubAttempt> = hub.iter().filter(|a| a.report_id.starts_with("hub:") && a.run == run).collect();
    if mine.len() > 1 {
        v.push(violation(
            "I8",
            &d.id,
            format!("effect {} maps to {} hub attempts", eff.attempt_id, mine.len()),
            Vec::new(),
        ));
    }
    if let Some(a) = mine.first()
        && (a.run != run || a.rerun != eff.rerun)
    {
        v.push(violation(
            "I16",
            &d.id,
            format!(
                "the execution of run {run} ({:?}) is recorded on the hub as run {} ({:?}): a re-run rewrote \
                 an old attempt row, or a run was recorded as another",
                eff.rerun, a.run, a.rerun
            ),
            Vec::new(),
        ));
    }
    let instance = if eff.instance.is_empty() { None } else { Some(eff.instance.as_str()) };
    if inputs.liveness && mine.is_empty() && by_hub.is_empty() && !reported_unknown_by_copy(m, ix, &d.id, run, instance)
    {
        if run < d.run {
            v.push(violation(
                "I16",
                &d.id,
                format!(
                    "effect {} of run {run} has no hub attempt, though the delivery went on to run {}: the \
                     re-run rewrote or dropped the old attempt row",
                    eff.attempt_id, d.run
                ),
                Vec::new(),
            ));
        } else {
            v.push(violation("I8", &d.id, format!("effect {} has no hub attempt", eff.attempt_id), Vec::new()));
        }
    }
    if node_attempt.is_none() && !inputs.node_dbs.is_empty() {
        v.push(violation(
            "I8",
            &d.id,
            format!("effect {} has no durable start marker on any node", eff.attempt_id),
            Vec::new(),
        ));
    }
    if let (Some(na), Some(ha)) = (node_attempt, mine.first()) {
        let node_unknown = !na.ended || na.outcome.as_deref() == Some("unknown");
        if node_unknown && ha.outcome != "unknown" {
            v.push(violation(
                "I8",
                &d.id,
                format!("attempt {} has no known end on the node but the hub says {}", na.attempt_id, ha.outcome),
                Vec::new(),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I16: cancel and retry

/// I16 over the hub's record and the effects ledger, per delivery:
/// - a turn whose cancel the hub recorded before its start never starts: no ledger line of the
///   current run when the hub recorded the cancel before the start (`cancel_requested_at <
///   started_at`, both hub clock: exact), when the delivery was cancelled before it was
///   delivered (failed, reason `cancelled…`), or — when the hub recorded no start at all — when
///   the harness started after the cancel was recorded (wall clocks of one machine);
/// - a running turn ended by a signal after its cancel was requested ends with the attempt
///   `cancelled` (or `unknown`, from a node that restarted while it was out), and an attempt
///   `cancelled` needs a cancel;
/// - a retry is handed out no earlier than its not-before time: every claim after the requeue
///   of the current run (`rerun = retry`) is at or after `not_before` (hub clock: exact), and
///   its execution starts no earlier. Only the current run's not-before is stored (a later
///   retry overwrites it), so earlier runs are not checked: a bound derived from the attempts'
///   `reported_at` would need the hub's configured backoff and cap, which the record lacks;
/// - no run above the message's `max_attempts` unless it is a redrive (the delivery's current
///   run, every attempt row and every execution);
/// - every run is its own attempt row: none for a run the delivery has not reached; an
///   execution's row records its run (`check_effect_visible`), and two rows of one run are two
///   reports counted for it (I9).
///
/// Returns how many runs after the first the record holds.
fn check_turn_control(m: &Model, ix: &Index, v: &mut Vec<Violation>) -> usize {
    let mut reruns = 0;
    for d in &m.deliveries {
        reruns += (d.run - 1).max(0) as usize;
        let effects: Vec<&EffectLine> =
            ix.ledger_by_delivery.get(&d.id).map(|ls| ls.iter().map(|&i| &m.ledger[i]).collect()).unwrap_or_default();
        let current: Vec<&&EffectLine> = effects.iter().filter(|l| l.run_number() == d.run).collect();
        let attempts: Vec<&HubAttempt> = ix
            .attempts_by_delivery
            .get(&d.id)
            .map(|as_| as_.iter().map(|&i| &m.attempts[i]).collect())
            .unwrap_or_default();
        check_cancel(d, &current, &attempts, v);
        check_not_before(m, ix, d, &current, v);
        let max = ix.message_by_id.get(&d.message_id).map_or(1, |&i| m.messages[i].max_attempts);
        let mut above: BTreeSet<i64> = BTreeSet::new();
        let redrive = Some(crate::records::REDRIVE);
        if d.run > max && d.rerun.as_deref() != redrive {
            above.insert(d.run);
        }
        for a in &attempts {
            if a.run > max && a.rerun.as_deref() != redrive {
                above.insert(a.run);
            }
        }
        for l in &effects {
            if l.run_number() > max && !l.is_redrive() {
                above.insert(l.run_number());
            }
        }
        for run in above {
            v.push(violation(
                "I16",
                &d.id,
                format!("run {run} is above the message's max_attempts {max} and not an operator's redrive"),
                Vec::new(),
            ));
        }
        let rows_per_run: BTreeSet<i64> = attempts.iter().map(|a| a.run).collect();
        // (Two rows of one run are I9's finding: two reports counted for one run.)
        for run in rows_per_run {
            if run > d.run {
                v.push(violation(
                    "I16",
                    &d.id,
                    format!("an attempt row of run {run}, but the delivery's current run is {}", d.run),
                    Vec::new(),
                ));
            }
        }
    }
    reruns
}

/// The cancel half of I16 for one delivery's current run.
fn check_cancel(d: &Delivery, current: &[&&EffectLine], attempts: &[&HubAttempt], v: &mut Vec<Violation>) {
    let started_after_cancel = |l: &EffectLine| match (d.cancel_requested_at, l.started_ns) {
        (Some(c), Some(s)) => s / 1_000_000 > c as u64,
        _ => false,
    };
    let why = if d.cancelled_before_delivery() {
        Some("cancelled before it was delivered".to_string())
    } else {
        match (d.cancel_requested_at, d.started_at) {
            (Some(c), Some(s)) if c < s => Some(format!("the hub recorded its cancel at {c}, before its start at {s}")),
            (Some(c), None) if current.iter().any(|l| started_after_cancel(l)) => {
                Some(format!("the hub recorded its cancel at {c} and never a start"))
            }
            _ => None,
        }
    };
    if let Some(why) = why
        && !current.is_empty()
    {
        v.push(violation("I16", &d.id, format!("run {} was executed although {why}", d.run), Vec::new()));
    }
    let outcome = attempts.iter().find(|a| a.run == d.run).map(|a| a.outcome.as_str());
    let cancel_asked = d.cancel_requested_at.is_some() || d.cancelled_before_delivery();
    // A run's process ended by a signal after its cancel was asked must not claim a result of
    // its own: `cancelled`, or `unknown` from a node that restarted while the run was out (it
    // cannot tell why the process it found ended, and it may itself have stopped the orphaned
    // process group after the cancel was asked).
    if d.cancel_requested_at.is_some()
        && let Some(l) = current.iter().find(|l| l.signal.is_some())
        && outcome.is_some_and(|o| o != "cancelled" && o != "unknown")
    {
        v.push(violation(
            "I16",
            &d.id,
            format!(
                "run {} was terminated ({:?}) after its cancel was requested, but its attempt says {}",
                d.run,
                l.signal,
                outcome.unwrap_or_default()
            ),
            Vec::new(),
        ));
    }
    if outcome == Some("cancelled") && !cancel_asked {
        v.push(violation(
            "I16",
            &d.id,
            format!("run {} ended cancelled, but no cancel of it was requested", d.run),
            Vec::new(),
        ));
    }
}

/// The not-before half of I16 for one delivery's current run, when it is a retry.
fn check_not_before(m: &Model, ix: &Index, d: &Delivery, current: &[&&EffectLine], v: &mut Vec<Violation>) {
    let (Some(nb), Some(crate::records::RETRY)) = (d.not_before, d.rerun.as_deref()) else { return };
    let events: Vec<&Event> =
        ix.events_by_delivery.get(&d.id).map(|es| es.iter().map(|&i| &m.events[i]).collect()).unwrap_or_default();
    // The run's requeue is the last move into queued; its claims come after it.
    let requeue = events.iter().rposition(|e| e.to == "queued").unwrap_or(0);
    for e in events[requeue..].iter().filter(|e| e.to == "claimed" && e.at < nb) {
        v.push(violation(
            "I16",
            &d.id,
            format!("retry run {} claimed at {} (event #{}), before its not-before time {nb}", d.run, e.at, e.id),
            Vec::new(),
        ));
    }
    for l in current {
        if let Some(s) = l.started_ns
            && s / 1_000_000 < nb as u64
        {
            v.push(violation(
                "I16",
                &d.id,
                format!("retry run {} started at {} ms, before its not-before time {nb}", d.run, s / 1_000_000),
                Vec::new(),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I17: one execution per run, whoever ran it

/// I17 over the effects ledger: no two executions of the same (delivery, run), whatever node
/// instance, session or process wrote them — a cloned data directory included.
fn check_one_execution_per_run(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    let mut dids: Vec<&String> = ix.ledger_by_delivery.keys().collect();
    dids.sort();
    for did in dids {
        let mut per_run: BTreeMap<i64, Vec<&EffectLine>> = BTreeMap::new();
        for &i in &ix.ledger_by_delivery[did] {
            per_run.entry(m.ledger[i].run_number()).or_default().push(&m.ledger[i]);
        }
        for (run, lines) in per_run.into_iter().filter(|(_, ls)| ls.len() > 1) {
            let writers: Vec<String> = lines
                .iter()
                .map(|l| format!("instance {:?} session {:?} process {}", l.instance, l.session, l.nonce))
                .collect();
            v.push(violation(
                "I17",
                did,
                format!("{} executions of run {run}: {}", lines.len(), writers.join("; ")),
                Vec::new(),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I18: pools

/// The pool of delivery `did`, when the record knows it as a pool delivery.
fn pool_of<'m>(m: &'m Model, ix: &Index, did: &str) -> Option<&'m str> {
    ix.delivery_by_id.get(did).and_then(|&i| m.deliveries[i].pool.as_deref())
}

/// Whether `host` was a member of `pool` at `at` (hub clock, unix ms) by the audit: some
/// `pool_add` at or before `at` not followed by a `pool_remove` before `at`. The audit rows and
/// the delivery events are numbered apart, so only their times place them against each other;
/// a change in the same millisecond as the claim is taken to be on the claim's side (the one
/// order the record cannot tell).
fn member_at(m: &Model, pool: &str, host: &str, at: i64) -> bool {
    let mut since: Option<i64> = None;
    for a in m.pool_audit.iter().filter(|a| a.pool == pool && a.host == host) {
        if a.joined {
            since = since.or(Some(a.at));
        } else if let Some(joined) = since.take()
            && joined <= at
            && at <= a.at
        {
            return true;
        }
    }
    since.is_some_and(|joined| joined <= at)
}

/// One run of a pool delivery as its events tell it: every host that claimed it (a requeue
/// returns a run that never ran to the pool, so a run may be claimed again, by another
/// member), and the host whose claim went on to `delivered` (the run's handoff), if any.
#[derive(Default)]
struct PoolRun<'m> {
    claimants: Vec<&'m str>,
    handed_to: Option<&'m str>,
}

/// What I18 compared, for the counts.
#[derive(Default)]
struct PoolCounts {
    /// Claims of pool deliveries whose claimant's membership was checked.
    claims: usize,
    /// Executions of pool turns ordered per (pool, conversation).
    ordered: usize,
    /// Consecutive executions of one (pool, conversation) on two different hosts: how often
    /// the order across hosts was put to the test.
    handovers: usize,
}

/// I18 over the hub's record, the pool membership audit and the effects ledger:
///
/// - one host per run, a member at its claim: replaying each pool delivery's events in commit
///   order, a run is claimed only while no other host holds it (a requeue or retire releases
///   it), every claimant was a member of the pool at its claim (`member_at`: the audit of
///   `pools add`, `pools remove` and retire, by time), at most one host's claim of a run goes
///   on to `delivered`, the record names the host of the current claim, and every execution
///   (ledger line) and every node-reported attempt row of a run is that host's;
/// - order across hosts: per (pool, conversation), the ledger's executions taken in the order
///   they started run in increasing `seq`, whichever hosts ran them (a later run of the same
///   turn, a retry, may follow its earlier run), with the exemptions of I15 (`check_order`):
///   a redrive, lines without a `seq`, a second execution of one run (I17's finding);
/// - never at once: per (pool, conversation), each execution starts no earlier than the
///   previous one ended, on whatever host. The ledger records both the start and the end
///   (`started_ns`, `ended_ns`, one machine's wall clock), so this is the rule itself, not a
///   stand-in; a ledger without those readings is taken in file order and only the order half
///   applies. Exempt, as the contract makes them visible instead: a turn after one whose run
///   the hub knows only as `unknown` written by itself (the operator retired or requeued the
///   host that ran it, so its conversation was freed for the other members while that run's
///   end is not known), and a turn after one the original of a copied data directory ran cut
///   off (`reported_unknown_by_copy`, as in I15).
fn check_pools(m: &Model, ix: &Index, v: &mut Vec<Violation>) -> PoolCounts {
    let mut counts = PoolCounts::default();
    for d in m.deliveries.iter() {
        let Some(pool) = d.pool.as_deref() else { continue };
        let runs = pool_runs(m, ix, d, pool, &mut counts, v);
        for &l in ix.ledger_by_delivery.get(&d.id).map(Vec::as_slice).unwrap_or(&[]) {
            let eff = &m.ledger[l];
            let run = eff.run_number();
            let known = runs.get(&run);
            let wrong = match known.and_then(|r| r.handed_to) {
                Some(h) => (h != eff.host).then(|| format!("it was handed to host {h}")),
                None if known.is_some_and(|r| r.claimants.contains(&eff.host.as_str())) => None,
                None => Some(format!(
                    "host {} never claimed that run (its claimants: {:?})",
                    eff.host,
                    known.map(|r| r.claimants.clone()).unwrap_or_default()
                )),
            };
            if let Some(why) = wrong {
                v.push(violation(
                    "I18",
                    &d.id,
                    format!("pool {pool}: run {run} executed on host {}, but {why}", eff.host),
                    Vec::new(),
                ));
            }
        }
        for &a in ix.attempts_by_delivery.get(&d.id).map(Vec::as_slice).unwrap_or(&[]) {
            let at = &m.attempts[a];
            if let Some(h) = runs.get(&at.run).and_then(|r| r.handed_to)
                && !at.by_hub
                && at.host != h
            {
                v.push(violation(
                    "I18",
                    &d.id,
                    format!("pool {pool}: run {} reported by host {}, but it was handed to host {h}", at.run, at.host),
                    Vec::new(),
                ));
            }
        }
    }
    check_pool_order(m, ix, v, &mut counts);
    counts
}

/// The runs of pool delivery `d` from its events (see `check_pools`), reporting on the way a
/// claim while another host held the run, a claimant that was no member of the pool, a second
/// host's handoff in one run, and a record that names another host than the current claim's.
fn pool_runs<'m>(
    m: &'m Model,
    ix: &Index,
    d: &Delivery,
    pool: &str,
    counts: &mut PoolCounts,
    v: &mut Vec<Violation>,
) -> BTreeMap<i64, PoolRun<'m>> {
    let mut runs: BTreeMap<i64, PoolRun<'m>> = BTreeMap::new();
    let mut run = 1;
    let mut holder: Option<&'m str> = None;
    for &i in ix.events_by_delivery.get(&d.id).map(Vec::as_slice).unwrap_or(&[]) {
        let e = &m.events[i];
        // A new run begins where the hub requeues a retry or an operator a redrive: into
        // queued from delivered, failed or unknown (a requeue of a claim is the same run).
        if e.to == "queued" && matches!(e.from.as_deref(), Some("delivered" | "failed" | "unknown")) {
            run += 1;
            holder = None;
            continue;
        }
        let this = runs.entry(run).or_default();
        match e.to.as_str() {
            "claimed" => {
                let host = e.actor.as_str();
                counts.claims += 1;
                if let Some(other) = holder.filter(|h| *h != host) {
                    v.push(violation(
                        "I18",
                        &d.id,
                        format!(
                            "pool {pool}: event #{}: run {run} claimed by host {host} while host {other} held it",
                            e.id
                        ),
                        Vec::new(),
                    ));
                }
                if !member_at(m, pool, host, e.at) {
                    let mut chain: Vec<String> = m
                        .pool_audit
                        .iter()
                        .filter(|a| a.pool == pool && a.host == host)
                        .map(|a| {
                            let action = if a.joined { POOL_ADD } else { POOL_REMOVE };
                            format!("audit #{} at={} {action} pool {} host {}", a.id, a.at, a.pool, a.host)
                        })
                        .collect();
                    if chain.is_empty() {
                        chain.push(format!("audit: no change of pool {pool} names host {host}"));
                    }
                    chain.extend(ix.chain_for(m, &d.id));
                    v.push(violation(
                        "I18",
                        &d.id,
                        format!(
                            "pool {pool}: event #{} at {}: run {run} claimed by host {host}, not a member of the pool then",
                            e.id, e.at
                        ),
                        chain,
                    ));
                }
                this.claimants.push(host);
                holder = Some(host);
            }
            "mirrored" => {}
            "delivered" => {
                if let (Some(first), Some(now)) = (this.handed_to, holder)
                    && first != now
                {
                    v.push(violation(
                        "I18",
                        &d.id,
                        format!("pool {pool}: run {run} was handed off to host {first} and to host {now}"),
                        Vec::new(),
                    ));
                }
                this.handed_to = this.handed_to.or(holder);
            }
            _ => holder = None,
        }
    }
    if matches!(d.state.as_str(), "claimed" | "mirrored" | "delivered")
        && let Some(h) = holder
        && h != d.host
    {
        v.push(violation(
            "I18",
            &d.id,
            format!("pool {pool}: the record names host {:?}, but the current claim is host {h}'s", d.host),
            Vec::new(),
        ));
    }
    runs
}

/// The order and never-at-once halves of I18 (see `check_pools`).
fn check_pool_order(m: &Model, ix: &Index, v: &mut Vec<Violation>, counts: &mut PoolCounts) {
    let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (i, l) in m.ledger.iter().enumerate() {
        let Some(pool) = pool_of(m, ix, &l.delivery_id) else { continue };
        if l.is_redrive() || l.seq.is_none() || !seen.insert((l.delivery_id.as_str(), l.run_number())) {
            continue;
        }
        groups.entry((pool, l.conversation.as_str())).or_default().push(i);
    }
    for ((pool, conversation), mut lines) in groups {
        counts.ordered += lines.len();
        if lines.iter().all(|&i| m.ledger[i].started_ns.is_some()) {
            lines.sort_by_key(|&i| (m.ledger[i].started_ns, i));
        }
        for pair in lines.windows(2) {
            let (a, b) = (&m.ledger[pair[0]], &m.ledger[pair[1]]);
            if a.host != b.host {
                counts.handovers += 1;
            }
            let chain = || {
                let mut out: Vec<String> = [a, b]
                    .iter()
                    .map(|l| format!("ledger: {}", serde_json::to_string(l).unwrap_or_default()))
                    .collect();
                out.extend(ix.chain_for(m, &a.delivery_id));
                out.extend(ix.chain_for(m, &b.delivery_id));
                out
            };
            let rerun_of_a = b.seq == a.seq && b.delivery_id == a.delivery_id && b.run_number() > a.run_number();
            if b.seq <= a.seq && !rerun_of_a {
                v.push(violation(
                    "I18",
                    &b.delivery_id,
                    format!(
                        "pool {pool}, conversation {conversation:?}: seq {} (run {}{}) started on host {} after seq {}                          (run {}) on host {}",
                        b.seq.unwrap_or_default(),
                        b.run_number(),
                        b.rerun.as_deref().map(|r| format!(", a {r}")).unwrap_or_default(),
                        b.host,
                        a.seq.unwrap_or_default(),
                        a.run_number(),
                        a.host
                    ),
                    chain(),
                ));
            }
            let unknown_by_hub = ix.attempts_by_delivery.get(&a.delivery_id).is_some_and(|is| {
                is.iter()
                    .map(|&i| &m.attempts[i])
                    .any(|h| h.run == a.run_number() && h.by_hub && h.outcome == "unknown")
            });
            let exempt =
                unknown_by_hub || reported_unknown_by_copy(m, ix, &a.delivery_id, a.run_number(), Some(&a.instance));
            if let (Some(end), Some(start)) = (a.ended_ns, b.started_ns)
                && start < end
                && !exempt
            {
                let hosts = if a.host == b.host {
                    format!("both on host {}", a.host)
                } else {
                    format!("on hosts {} and {} at once", a.host, b.host)
                };
                v.push(violation(
                    "I18",
                    &b.delivery_id,
                    format!(
                        "pool {pool}, conversation {conversation:?}: seq {} started {} ns before seq {} ended, {hosts}",
                        b.seq.unwrap_or_default(),
                        end - start,
                        a.seq.unwrap_or_default()
                    ),
                    chain(),
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I19: progress and deadlines

/// I19 over the hub's record and the effects ledger: no progress event is recorded after its
/// run's outcome (its feed position is above the outcome's), and no turn of a message with a
/// `deadline_ms` ran longer than the deadline plus `Inputs::deadline_allowance`, as its node
/// measured it (the attempt's `duration_ms`) or as the ledger saw it (its start and end). A run
/// whose outcome is `unknown` is not held to it: its node died, and nothing stopped it then.
/// Returns how many runs with a deadline were compared.
fn check_progress_and_deadlines(m: &Model, ix: &Index, inputs: &Inputs, v: &mut Vec<Violation>) -> usize {
    for p in &m.late_progress {
        v.push(violation(
            "I19",
            &p.delivery_id,
            format!(
                "a progress event of run {} is at feed position {}, after the run's outcome at {}: recorded after \
                 the outcome",
                p.run, p.n, p.outcome_n
            ),
            Vec::new(),
        ));
    }
    let allowance_ms = i64::try_from(inputs.deadline_allowance.as_millis()).unwrap_or(i64::MAX);
    let deadline_of = |delivery_id: &str| -> Option<i64> {
        let d = &m.deliveries[*ix.delivery_by_id.get(delivery_id)?];
        m.messages[*ix.message_by_id.get(&d.message_id)?].deadline_ms
    };
    let mut compared = 0;
    for a in m.attempts.iter().filter(|a| !a.by_hub && a.outcome != "unknown") {
        let (Some(deadline), Some(ran)) = (deadline_of(&a.delivery_id), a.duration_ms) else { continue };
        compared += 1;
        if ran > deadline.saturating_add(allowance_ms) {
            v.push(violation(
                "I19",
                &a.delivery_id,
                format!(
                    "run {} ran {ran} ms (its node's measure), past its deadline_ms = {deadline} by more than {allowance_ms} ms",
                    a.run
                ),
                Vec::new(),
            ));
        }
    }
    for e in &m.ledger {
        let (Some(start), Some(end)) = (e.started_ns, e.ended_ns) else { continue };
        let Some(deadline) = deadline_of(&e.delivery_id) else { continue };
        let unknown = ix.attempts_by_delivery.get(&e.delivery_id).is_some_and(|is| {
            is.iter().any(|&i| m.attempts[i].run == e.run_number() && m.attempts[i].outcome == "unknown")
        });
        if unknown {
            continue;
        }
        let ran = i64::try_from(end.saturating_sub(start) / 1_000_000).unwrap_or(i64::MAX);
        if ran > deadline.saturating_add(allowance_ms) {
            v.push(violation(
                "I19",
                &e.delivery_id,
                format!(
                    "run {} ran {ran} ms (the ledger's measure), past its deadline_ms = {deadline} by more than \
                     {allowance_ms} ms",
                    e.run_number()
                ),
                Vec::new(),
            ));
        }
    }
    compared
}

// ---------------------------------------------------------------------------------------------
// I9: report idempotency

fn check_reports(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    let mut per_key: HashMap<(&str, &str), usize> = HashMap::new();
    for a in &m.attempts {
        *per_key.entry((a.host.as_str(), a.report_id.as_str())).or_default() += 1;
    }
    for ((host, rid), n) in per_key {
        if n > 1 {
            v.push(violation("I9", rid, format!("{n} hub attempts for report {rid} of host {host}"), Vec::new()));
        }
    }
    // Each run of a delivery reports once; runs after a retry or redrive report on their own.
    for (did, list) in &ix.attempts_by_delivery {
        let mut per_run: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
        for a in list.iter().map(|&i| &m.attempts[i]).filter(|a| !a.report_id.starts_with("hub:")) {
            per_run.entry(a.run).or_default().insert(a.report_id.as_str());
        }
        for (run, from_nodes) in per_run.into_iter().filter(|(_, r)| r.len() > 1) {
            v.push(violation(
                "I9",
                did,
                format!(
                    "{} reports with different report ids counted for run {run} of one delivery: {from_nodes:?}",
                    from_nodes.len()
                ),
                Vec::new(),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I13: what nodes believe against the hub's record

fn check_agreement(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    for node in &m.nodes {
        let Some(inst) = node.instance_id.as_deref() else { continue };
        for nd in &node.deliveries {
            let Some(&di) = ix.delivery_by_id.get(&nd.delivery_id) else {
                if matches!(nd.state.as_str(), "acked" | "done") {
                    v.push(violation(
                        "I13",
                        &nd.delivery_id,
                        format!("{} holds a delivery the hub does not know", node.path),
                        Vec::new(),
                    ));
                }
                continue;
            };
            let d = &m.deliveries[di];
            // After a retry or redrive the node's copy may be of an earlier run it reported.
            let earlier_run_here =
                d.run > 1 && m.attempts.iter().any(|a| a.delivery_id == d.id && a.instance_id == inst);
            if matches!(nd.state.as_str(), "acked" | "done")
                && !earlier_run_here
                && (d.state != "delivered" || d.instance_id.as_deref() != Some(inst))
            {
                v.push(violation(
                    "I13",
                    &d.id,
                    format!(
                        "{} believes it acked (local {}), but the hub has it {} held by {:?}",
                        node.path, nd.state, d.state, d.instance_id
                    ),
                    Vec::new(),
                ));
            }
        }
        // Every data directory of the instance (a copy and its original) keeps its own part.
        let of_instance: Vec<&NodeDb> = m.nodes.iter().filter(|n| n.instance_id.as_deref() == Some(inst)).collect();
        for d in m.deliveries.iter().filter(|d| d.instance_id.as_deref() == Some(inst)) {
            let has = of_instance.iter().any(|n| n.deliveries.iter().any(|nd| nd.delivery_id == d.id));
            if matches!(d.state.as_str(), "mirrored" | "delivered") && !has {
                v.push(violation(
                    "I13",
                    &d.id,
                    format!(
                        "the hub has it {} by instance {inst}, but {} has no local copy",
                        d.state,
                        of_instance.iter().map(|n| n.path.as_str()).collect::<Vec<_>>().join(" nor ")
                    ),
                    Vec::new(),
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// I10: liveness after heal

fn check_liveness(m: &Model, ix: &Index, v: &mut Vec<Violation>) {
    for (mid, done) in &m.obligations {
        if done.is_none() {
            v.push(violation("I10", mid, "fan-out obligation still pending after heal".into(), Vec::new()));
        }
    }
    for d in &m.deliveries {
        let paused = m.fences.iter().any(|f| f.lifted_at.is_none() && covers(f, d, &d.host));
        match d.state.as_str() {
            "queued" if paused => {}
            "queued" | "claimed" | "mirrored" => {
                v.push(violation("I10", &d.id, format!("still {} after heal", d.state), Vec::new()));
            }
            "delivered" if !current_run_reported(m, ix, d) => {
                v.push(violation(
                    "I10",
                    &d.id,
                    format!("delivered but no attempt of run {} reported after heal", d.run),
                    Vec::new(),
                ));
            }
            _ => {}
        }
    }
    for node in m.nodes.iter().filter(|n| !n.retired) {
        for nd in node.deliveries.iter().filter(|nd| nd.state == "mirrored" || nd.state == "acked") {
            v.push(violation(
                "I10",
                &nd.delivery_id,
                format!("{} still has it {} locally after heal", node.path, nd.state),
                Vec::new(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit(m: &mut Model, joined: bool, pool: &str, host: &str, at: i64) {
        let id = m.pool_audit.len() as i64 + 1;
        m.pool_audit.push(PoolAudit { id, joined, pool: pool.into(), host: host.into(), at });
    }

    /// Membership at a claim follows the audit by time: joined at or before the claim and not
    /// left before it; a change in the claim's millisecond counts on the claim's side.
    #[test]
    fn membership_at_a_claim_follows_the_audit_by_time() {
        let mut m = Model::default();
        audit(&mut m, true, "p", "h", 10);
        audit(&mut m, false, "p", "h", 20);
        audit(&mut m, true, "p", "h", 30);
        audit(&mut m, true, "q", "other", 0);
        assert!(!member_at(&m, "p", "h", 9));
        assert!(member_at(&m, "p", "h", 10) && member_at(&m, "p", "h", 15) && member_at(&m, "p", "h", 20));
        assert!(!member_at(&m, "p", "h", 25));
        assert!(member_at(&m, "p", "h", 30) && member_at(&m, "p", "h", i64::MAX));
        assert!(!member_at(&m, "q", "h", 15) && !member_at(&m, "p", "other", 15));
        assert!(!member_at(&m, "none", "h", 15), "no audit row, no membership");
    }
}
