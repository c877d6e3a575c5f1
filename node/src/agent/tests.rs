//! The loop against an in-memory hub that follows SPEC §2/§12: claims, holdings, mirrored,
//! ack, report, with faults on demand (refused acks, lost claim answers, outages).
//!
//! Timing: every wait is for an event (a call the hub saw, a row, a file) under one generous
//! deadline, and nothing asserts how many things happen per wall-clock interval; a loaded
//! machine only makes these tests slower, never wrong.

use super::*;
use crate::config::{Handoff, Harness, LogFormat};
use crate::store::{Db, LocalState};
use baton_client::{ApiError, ItemAnswer};
use baton_shared::states::Outcome;
use baton_shared::wire::{
    AttemptView, ClaimResponse, HolderItem, ReportRequest, ReportResponse, RunningTurnItem, RunningTurnResult,
    SessionResponse, StartItem, StartResult, TransitionResponse,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

#[derive(Default)]
struct HubState {
    /// Claimable, oldest first.
    queue: VecDeque<ClaimedDelivery>,
    /// What our instance holds, with the hub-side state.
    held: BTreeMap<String, (ClaimedDelivery, DeliveryState)>,
    /// Every report received, duplicates included.
    reports: Vec<ReportRequest>,
    /// report_id of the recorded outcome, per delivery.
    outcomes: HashMap<String, String>,
    /// Deliveries whose ack is refused with 409 stale_claim (as after an operator requeue).
    refuse_ack: HashSet<String>,
    /// Reports are refused with 409 report_conflict.
    refuse_reports: bool,
    /// The next this many claims commit but their answer is lost.
    lose_claim_answers: usize,
    /// Every call fails as if the hub were unreachable.
    down: bool,
    /// Every call is refused with 401 certificate_revoked.
    revoked: bool,
    /// Call log: "claim", "holdings", "mirrored d1", "ack d1", "report d1".
    calls: Vec<String>,
    /// When each claim arrived.
    claim_times: Vec<Instant>,
    /// The node store to look into at each claim, when a test wants that.
    node_db: Option<PathBuf>,
    /// The node's unstarted executions at the moment each claim arrived (with `node_db`).
    queued_at_claim: Vec<i64>,
    /// The host's newest session on the hub (0: none registered yet).
    newest_session: u64,
    /// The session the node registered (sent with every later request; 0 before).
    node_session: u64,
    /// Every call after the first registration, with the session it carried.
    sent_sessions: Vec<(String, u64)>,
    /// Sessions the node ended cleanly.
    ended_sessions: Vec<u64>,
    /// Every `POST /v1/starts`, as the delivery ids it asked for.
    start_requests: Vec<Vec<String>>,
    /// The session that started each delivery's current run.
    started: HashMap<String, u64>,
    /// Start refusals on demand: delivery id → code.
    refuse_start: HashMap<String, String>,
    /// Cancels asked for: delivery id → (run, reason); listed in claim answers and holdings.
    cancels: BTreeMap<String, (u32, String)>,
    /// A hub that predates sessions and starts: both routes answer 404.
    no_turn_control: bool,
    /// Claim answers leave the cancels out (so only holdings carry them).
    cancels_only_in_holdings: bool,
    /// A hub that predates batches: the batch routes answer 404.
    no_batches: bool,
    /// A hub that knows batches but predates the combined handoff: its route answers 404.
    no_handoff: bool,
    /// The hub refuses every combined handoff whole for what it carries (413, a bound).
    handoff_too_large: bool,
    /// Reports (single or in a batch) fail as if the hub were unreachable.
    reports_down: bool,
    /// Every batch request, as "batch mirrored 3" (route and item count).
    batches: Vec<String>,
    /// Moves to another hub of the node's list (`Hub::hub_moves`), made by a test.
    moves: u64,
    /// The start lease the hub grants, in ms: `FAKE_START_LEASE_MS` when unset, none with
    /// `Some(0)`.
    start_lease_ms: Option<u64>,
    /// When set, each `mirrored` or `handoff` batch waits for a permit of this semaphore first.
    mirrored_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Every progress event forwarded (`POST /v1/running`), with its delivery, in arrival order.
    progress: Vec<(String, baton_shared::wire::ProgressItem)>,
}

#[derive(Clone, Default)]
struct FakeHub(Arc<Mutex<HubState>>);

/// The start lease the fake hub grants unless a test says otherwise: longer than any test.
const FAKE_START_LEASE_MS: u64 = 600_000;

/// The hub's refusal with `status` and `code` (sent as is, parsed as the client does).
fn refusal(status: u16, code: &str, message: &str) -> ClientError {
    let (code_text, message) = (code.to_string(), message.to_string());
    ClientError::Api(ApiError { status, code: ErrorCode::parse(code), code_text, message })
}

fn refused(code: ErrorCode) -> ClientError {
    refusal(code.status(), code.as_str(), "fake")
}

fn revoked() -> ClientError {
    refusal(401, "certificate_revoked", "certificate 0a was revoked")
}

fn down() -> ClientError {
    ClientError::Transport { detail: "connection refused".into(), maybe_sent: false }
}

fn no_route() -> ClientError {
    refusal(404, "not_found", "no route")
}

fn superseded() -> ClientError {
    refusal(409, ErrorCode::SessionSuperseded.as_str(), "session 2 replaced session 1")
}

impl HubState {
    /// Notes a call with the session it carried; refuses it when a newer session exists.
    fn session_check(&mut self, call: &str) -> Result<(), ClientError> {
        if self.node_session > 0 {
            self.sent_sessions.push((call.to_string(), self.node_session));
            if self.node_session < self.newest_session {
                return Err(superseded());
            }
        }
        Ok(())
    }
}

impl FakeHub {
    fn with<T>(&self, f: impl FnOnce(&mut HubState) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }

    fn transition(
        &self,
        what: &str,
        id: &str,
        token: &str,
        from: DeliveryState,
        to: DeliveryState,
    ) -> Result<TransitionResponse, ClientError> {
        self.with(|s| {
            s.calls.push(format!("{what} {id}"));
            s.session_check(what)?;
            if s.revoked {
                return Err(revoked());
            }
            if s.down {
                return Err(down());
            }
            if what == "ack" && s.refuse_ack.contains(id) {
                s.held.remove(id);
                return Err(refused(ErrorCode::StaleClaim));
            }
            let Some((d, state)) = s.held.get_mut(id) else { return Err(refused(ErrorCode::StaleClaim)) };
            if d.claim_token != token {
                return Err(refused(ErrorCode::StaleClaim));
            }
            let changed = if *state == from {
                *state = to;
                true
            } else if *state == to || (what == "mirrored" && *state == DeliveryState::Delivered) {
                false
            } else {
                return Err(refused(ErrorCode::InvalidTransition));
            };
            Ok(TransitionResponse { delivery_id: id.into(), state: *state, changed })
        })
    }
}

impl Hub for FakeHub {
    async fn register_session(&self) -> Result<SessionResponse, ClientError> {
        self.with(|s| {
            s.calls.push("session".into());
            if s.no_turn_control {
                return Err(no_route());
            }
            if s.revoked {
                return Err(revoked());
            }
            if s.down {
                return Err(down());
            }
            let took_over = (s.newest_session > 0).then_some(s.newest_session);
            s.newest_session += 1;
            s.node_session = s.newest_session;
            let start_lease_ms = match s.start_lease_ms {
                None => Some(FAKE_START_LEASE_MS),
                Some(0) => None,
                Some(ms) => Some(ms),
            };
            Ok(SessionResponse { session: s.newest_session, took_over, start_lease_ms })
        })
    }

    async fn end_session(&self) -> Result<(), ClientError> {
        self.with(|s| {
            s.calls.push("session end".into());
            s.session_check("session end")?;
            s.ended_sessions.push(s.node_session);
            Ok(())
        })
    }

    async fn starts(&self, items: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
        self.with(|s| {
            s.calls.push("starts".into());
            if s.no_turn_control {
                return Err(no_route());
            }
            s.session_check("starts")?;
            if s.revoked {
                return Err(revoked());
            }
            if s.down {
                return Err(down());
            }
            s.start_requests.push(items.iter().map(|i| i.delivery_id.clone()).collect());
            let session = s.node_session;
            let answer = |id: &str, code: Option<&str>| StartResult {
                delivery_id: id.into(),
                start: code.is_none(),
                code: code.map(str::to_string),
                message: code.map(|c| format!("fake {c}")),
                retry_after_ms: None,
            };
            let mut out = Vec::new();
            for i in items {
                let id = i.delivery_id.as_str();
                if let Some(code) = s.refuse_start.get(id).cloned() {
                    // A real hub refuses a stale claim because the delivery is no longer this
                    // node's: its holdings stop listing it too (a resync racing the start must
                    // not find it held).
                    if code == "stale_claim" {
                        s.held.remove(id);
                    }
                    out.push(answer(id, Some(code.as_str())));
                    continue;
                }
                let ok = matches!(s.held.get(id), Some((d, DeliveryState::Delivered))
                    if d.claim_token == i.claim_token && d.attempt == i.attempt);
                if !ok {
                    out.push(answer(id, Some("stale_claim")));
                } else if s.cancels.get(id).is_some_and(|(run, _)| *run == i.attempt) {
                    out.push(answer(id, Some("cancelled")));
                } else if s.started.get(id).is_some_and(|by| *by != session) {
                    out.push(answer(id, Some("started_elsewhere")));
                } else {
                    s.started.insert(id.to_string(), session);
                    out.push(answer(id, None));
                }
            }
            Ok(out)
        })
    }

    async fn claim(&self, max: u32, _wait: Duration) -> Result<ClaimResponse, ClientError> {
        let (out, lost, cancels) = self.with(|s| {
            s.calls.push("claim".into());
            s.session_check("claim")?;
            s.claim_times.push(Instant::now());
            if let Some(path) = &s.node_db {
                // The node decided to claim after counting these; none can start in between
                // without shrinking the count, and only the claim loop adds to it.
                let conn =
                    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
                let queued = conn.query_row("SELECT count(*) FROM executions WHERE state = 'queued'", [], |r| r.get(0));
                s.queued_at_claim.push(queued.unwrap());
            }
            if s.revoked {
                return Err(revoked());
            }
            if s.down {
                return Err(down());
            }
            let mut out = Vec::new();
            while out.len() < max as usize {
                let Some(mut d) = s.queue.pop_front() else { break };
                d.state = DeliveryState::Claimed;
                s.held.insert(d.delivery_id.clone(), (d.clone(), DeliveryState::Claimed));
                out.push(d);
            }
            let lost = !out.is_empty() && s.lose_claim_answers > 0;
            if lost {
                s.lose_claim_answers -= 1;
            }
            let cancels = s
                .cancels
                .iter()
                .filter(|(id, _)| !s.outcomes.contains_key(*id) && !s.cancels_only_in_holdings)
                .map(|(id, (run, reason))| CancelNotice {
                    delivery_id: id.clone(),
                    attempt: *run,
                    reason: reason.clone(),
                })
                .collect();
            Ok((out, lost, cancels))
        })?;
        if out.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if lost {
            return Err(ClientError::Transport { detail: "timed out".into(), maybe_sent: true });
        }
        Ok(ClaimResponse { deliveries: out, cancels })
    }

    async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
        self.with(|s| {
            s.calls.push("holdings".into());
            s.session_check("holdings")?;
            if s.revoked {
                return Err(revoked());
            }
            if s.down {
                return Err(down());
            }
            Ok(s.held
                .values()
                .filter(|(d, _)| !s.outcomes.contains_key(&d.delivery_id))
                .map(|(d, st)| ClaimedDelivery {
                    state: *st,
                    cancel_requested: s.cancels.get(&d.delivery_id).is_some_and(|(run, _)| *run == d.attempt),
                    ..d.clone()
                })
                .collect())
        })
    }

    async fn mirrored(&self, id: &str, token: &str) -> Result<TransitionResponse, ClientError> {
        self.transition("mirrored", id, token, DeliveryState::Claimed, DeliveryState::Mirrored)
    }

    async fn ack(&self, id: &str, token: &str) -> Result<TransitionResponse, ClientError> {
        self.transition("ack", id, token, DeliveryState::Mirrored, DeliveryState::Delivered)
    }

    async fn reject(&self, id: &str, _token: &str, _reason: &str) -> Result<TransitionResponse, ClientError> {
        self.with(|s| s.calls.push(format!("reject {id}")));
        Ok(TransitionResponse { delivery_id: id.into(), state: DeliveryState::Failed, changed: true })
    }

    async fn report(&self, body: &ReportRequest) -> Result<ReportResponse, ClientError> {
        self.with(|s| {
            s.calls.push(format!("report {}", body.delivery_id));
            s.session_check("report")?;
            if s.revoked {
                return Err(revoked());
            }
            if s.down {
                return Err(down());
            }
            if s.refuse_reports {
                return Err(refused(ErrorCode::ReportConflict));
            }
            if s.reports_down {
                return Err(down());
            }
            match s.held.get(&body.delivery_id) {
                Some((d, DeliveryState::Delivered)) if d.claim_token == body.claim_token => {}
                _ => return Err(refused(ErrorCode::StaleClaim)),
            }
            let duplicate = s.outcomes.get(&body.delivery_id) == Some(&body.report_id);
            s.outcomes.insert(body.delivery_id.clone(), body.report_id.clone());
            s.reports.push(body.clone());
            Ok(ReportResponse {
                attempt: AttemptView {
                    attempt_id: format!("a-{}", body.report_id),
                    report_id: body.report_id.clone(),
                    outcome: body.outcome,
                    exit_code: body.exit_code,
                    duration_ms: body.duration_ms,
                    result: body.result.clone(),
                    reason: body.reason.clone(),
                    reported_at_ms: 0,
                    signal: body.signal,
                    attempt: body.attempt.unwrap_or(1),
                    retryable: false,
                    rerun: None,
                    caused_by: None,
                    stderr_tail: body.stderr_tail.clone(),
                    stderr_dropped_bytes: body.stderr_dropped_bytes,
                },
                delivery_id: body.delivery_id.clone(),
                duplicate,
                retry_at_ms: None,
            })
        })
    }

    async fn mirrored_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        let gate = self.with(|s| s.mirrored_gate.clone());
        if let Some(gate) = gate {
            let _permit = gate.acquire().await.unwrap();
        }
        self.holder_batch("mirrored", items)
    }

    async fn ack_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.holder_batch("ack", items)
    }

    /// As the hub does: per item, `mirrored` (a no-op past `claimed`) then `ack`, the ack's
    /// answer or the first refusal. Logged as the two steps in `calls`.
    async fn handoff_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        let gate = self.with(|s| s.mirrored_gate.clone());
        if let Some(gate) = gate {
            let _permit = gate.acquire().await.unwrap();
        }
        self.batch_call("handoff", items.len())?;
        if self.with(|s| s.no_handoff) {
            return Err(no_route());
        }
        if self.with(|s| s.handoff_too_large) {
            return Err(refusal(413, "too_large", "the batch is over its bound"));
        }
        let (claimed, mirrored, delivered) =
            (DeliveryState::Claimed, DeliveryState::Mirrored, DeliveryState::Delivered);
        items
            .iter()
            .map(|i| {
                let (id, token) = (&i.delivery_id, &i.claim_token);
                batch_item(
                    self.transition("mirrored", id, token, claimed, mirrored)
                        .and_then(|_| self.transition("ack", id, token, mirrored, delivered)),
                )
            })
            .collect()
    }

    async fn report_batch(&self, reports: Vec<ReportRequest>) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
        self.batch_call("reports", reports.len())?;
        let mut out = Vec::with_capacity(reports.len());
        for r in &reports {
            out.push(batch_item(self.report(r).await)?);
        }
        Ok(out)
    }

    async fn running(&self, turns: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
        Ok(self.with(|s| {
            s.progress.extend(turns.iter().flat_map(|t| t.events.iter().map(|e| (t.delivery_id.clone(), e.clone()))));
            turns
                .iter()
                .map(|t| RunningTurnResult {
                    delivery_id: t.delivery_id.clone(),
                    running: true,
                    kept: t.events.len() as u64,
                    dropped: 0,
                })
                .collect()
        }))
    }

    fn hub_moves(&self) -> u64 {
        self.with(|s| s.moves)
    }
}

/// The whole-request answer of a batch when one of its items met a refusal of the request
/// itself (an outage, a revoked certificate, a newer session); otherwise the item's own answer.
fn batch_item<T>(answer: Result<T, ClientError>) -> Result<ItemAnswer<T>, ClientError> {
    match answer {
        Ok(body) => Ok(Ok(body)),
        Err(e) if e.refused_for_good().is_some() || e.superseded().is_some() => Err(e),
        Err(e @ ClientError::Api(_)) => Ok(Err(e)),
        Err(e) => Err(e),
    }
}

impl FakeHub {
    /// Notes a batch request; a hub without batches answers 404 to it.
    fn batch_call(&self, what: &str, n: usize) -> Result<(), ClientError> {
        self.with(|s| {
            s.calls.push(format!("batch {what}"));
            s.batches.push(format!("batch {what} {n}"));
            if s.no_batches {
                return Err(no_route());
            }
            Ok(())
        })
    }

    fn holder_batch(
        &self,
        what: &str,
        items: Vec<HolderItem>,
    ) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.batch_call(what, items.len())?;
        let (from, to) = match what {
            "mirrored" => (DeliveryState::Claimed, DeliveryState::Mirrored),
            _ => (DeliveryState::Mirrored, DeliveryState::Delivered),
        };
        items.iter().map(|i| batch_item(self.transition(what, &i.delivery_id, &i.claim_token, from, to))).collect()
    }
}

fn delivery(id: &str, conversation: &str, seq: i64) -> ClaimedDelivery {
    crate::store::tests::delivery(id, conversation, seq)
}

fn config(dir: &Path, script: &str) -> NodeConfig {
    NodeConfig {
        hub_url: "https://hub.invalid".parse().unwrap(),
        ca_file: dir.join("ca.crt"),
        cert_file: dir.join("h.crt"),
        key_file: dir.join("h.key"),
        data_dir: dir.to_path_buf(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        parallel_conversations: 4,
        exec_timeout: Duration::from_secs(30),
        claim_wait: Duration::ZERO,
        claim_batch_max: 16,
        queue_ahead_batches: 4,
        handoffs_in_flight: 2,
        result_bytes_max: 4096,
        stderr_tail_bytes: 4096,
        store_bytes_max: crate::limits::STORE_BYTES_MAX_DEFAULT,
        shutdown_grace: Duration::from_secs(5),
        kill_grace: Duration::from_secs(5),
        cancel_grace: Duration::from_secs(5),
        local_retention: Duration::from_secs(24 * 3600),
        backoff_max: Duration::from_millis(200),
        renew_interval: Duration::from_secs(1),
        progress_flush_interval: Duration::from_millis(20),
        progress_event_bytes_max: 4096,
        progress_events_per_turn_max: 10_000,
        progress_events_per_second_max: 10_000,
        progress_buffer_events_max: 10_000,
        log_format: LogFormat::Text,
        harness: Harness::Command,
        synchronous: baton_shared::sqlite::Synchronous::Full,
        checkpoint_interval: baton_shared::sqlite::CHECKPOINT_INTERVAL,
        handoff: Handoff::Combined,
        metrics_listen: None,
        otlp_endpoint: None,
    }
}

fn open_db(dir: &Path) -> Db {
    let mut db = Db::open(&dir.join("node.db"), baton_shared::sqlite::Synchronous::Full).unwrap();
    db.instance_id().unwrap();
    db
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        let r = tokio::time::timeout(Duration::from_secs(20), self.task).await.expect("node stops in time");
        r.unwrap().unwrap();
    }
}

fn start(config: NodeConfig, hub: &FakeHub) -> Running {
    start_with_clock(config, hub, baton_shared::clock::system())
}

fn start_with_clock(config: NodeConfig, hub: &FakeHub, clock: SharedClock) -> Running {
    let mut db = open_db(&config.data_dir);
    let instance_id = db.instance_id().unwrap();
    let store = Store::new(db);
    let stop = CancellationToken::new();
    let s = stop.clone();
    let hub = hub.clone();
    let task = tokio::spawn(async move {
        run_agent(config, store, hub, instance_id, clock, crate::exec::Gate::shell(), s.cancelled_owned()).await
    });
    Running { stop, task }
}

/// How long a test waits for an event before it fails: far beyond what a loaded machine needs.
const EVENT_WAIT: Duration = Duration::from_secs(60);

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + EVENT_WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {EVENT_WAIT:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

/// A harness that appends its delivery id to `ran` and echoes its payload.
fn recording(dir: &Path) -> String {
    format!("echo $BATON_DELIVERY_ID >> {}; cat", dir.join("ran").display())
}

#[tokio::test]
async fn claims_mirror_ack_run_and_report_each_turn_once() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.extend([delivery("a1", "a", 1), delivery("a2", "a", 2), delivery("b1", "b", 1)]));
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("three reports", || hub.with(|s| s.reports.len() == 3)).await;
    node.stop().await;
    let ran = lines(&dir.path().join("ran"));
    assert_eq!(ran.len(), 3, "{ran:?}");
    let pos = |id: &str| ran.iter().position(|r| r == id).unwrap();
    assert!(pos("a1") < pos("a2"), "a conversation runs in sequence order: {ran:?}");
    hub.with(|s| {
        for r in &s.reports {
            assert_eq!(r.outcome, Outcome::Succeeded);
            assert!(uuid::Uuid::parse_str(&r.instance_id).is_ok());
            let seq = s.held[&r.delivery_id].0.seq;
            assert_eq!(r.result.as_deref(), Some(format!("{{\"turn\":{seq}}}").as_str()));
            let at = |c: &str| s.calls.iter().position(|x| x == &format!("{c} {}", r.delivery_id)).unwrap();
            assert!(at("mirrored") < at("ack") && at("ack") < at("report"), "{:?}", s.calls);
            assert!(at("ack") < s.calls.iter().position(|c| c == "starts").unwrap(), "{:?}", s.calls);
            assert_eq!(r.attempt, Some(1), "the report names its run");
        }
        assert_eq!(s.calls.first().map(String::as_str), Some("session"), "the session comes first: {:?}", s.calls);
        assert!(s.sent_sessions.iter().all(|(_, n)| *n == 1), "every request carries the session");
        assert!(s.sent_sessions.iter().any(|(c, _)| c == "holdings"));
        assert_eq!(s.ended_sessions, [1], "a clean shutdown ends the session");
    });
    let last = open_db(dir.path()).last_session().unwrap().unwrap();
    assert_eq!((last.session, last.took_over, last.ended.as_deref()), (1, None, Some("clean")));
}

/// Work that arrives while a batch is handed off is claimed before that handoff ends, up to
/// `handoffs_in_flight` batches: with two handoffs held at the hub, a third delivery waits.
#[tokio::test]
async fn work_arriving_during_a_handoff_is_claimed_before_the_handoff_ends() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    hub.with(|s| {
        s.queue.push_back(delivery("h1", "h", 1));
        s.mirrored_gate = Some(gate.clone());
    });
    let mut cfg = config(dir.path(), &recording(dir.path()));
    cfg.handoffs_in_flight = 2;
    let node = start(cfg, &hub);
    // From here the first batch's handoff waits at `mirrored` until the gate opens.
    wait_until("the first delivery is claimed", || hub.with(|s| s.held.contains_key("h1"))).await;
    hub.with(|s| s.queue.push_back(delivery("g1", "g", 1)));
    wait_until("the second delivery is claimed while the first handoff still waits", || {
        hub.with(|s| s.held.contains_key("g1"))
    })
    .await;
    hub.with(|s| {
        assert_eq!(s.held["h1"].1, DeliveryState::Claimed, "the first handoff has not gone past mirrored");
    });
    hub.with(|s| s.queue.push_back(delivery("k1", "k", 1)));
    // Longer than the pace of claims after an empty answer (`claim_wait` is zero here).
    tokio::time::sleep(EMPTY_CLAIM_PACE * 2 + Duration::from_millis(500)).await;
    assert!(!hub.with(|s| s.held.contains_key("k1")), "a third batch was claimed while two handoffs waited");
    gate.add_permits(16);
    wait_until("all three reports", || hub.with(|s| s.reports.len() == 3)).await;
    node.stop().await;
    let ran = lines(&dir.path().join("ran"));
    assert_eq!(ran.len(), 3, "each turn ran once: {ran:?}");
}

#[tokio::test]
async fn stored_timestamps_come_from_the_injected_clock() {
    const T0_MS: i64 = 1_234_000;
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("t1", "t", 1)));
    let clock = baton_shared::clock::ManualClock::new(T0_MS);
    let node = start_with_clock(config(dir.path(), "cat"), &hub, Arc::new(clock));
    wait_until("t1 reported", || hub.with(|s| s.reports.len() == 1)).await;
    node.stop().await;
    let db = open_db(dir.path());
    for sql in [
        "SELECT min(mirrored_at_ms), max(updated_at_ms) FROM deliveries",
        "SELECT min(queued_at_ms), max(queued_at_ms) FROM executions",
        "SELECT min(started_at_ms), max(ended_at_ms) FROM attempts",
        "SELECT min(created_at_ms), max(confirmed_at_ms) FROM outbox",
    ] {
        let (low, high): (i64, i64) = db.conn().query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        assert_eq!((low, high), (T0_MS, T0_MS), "{sql}");
    }
}

/// Local retention on the injected clock: a turn the hub confirmed is removed once it is older
/// than `local_retention` (the sweep runs at every start), a younger one is kept.
#[tokio::test]
async fn turns_the_hub_confirmed_are_removed_after_local_retention() {
    const T0_MS: i64 = 1_700_000_000_000;
    const HOUR_MS: i64 = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    let clock = baton_shared::clock::ManualClock::new(T0_MS);
    let cfg = config(dir.path(), "cat");
    assert_eq!(cfg.local_retention, Duration::from_secs(24 * 3600));
    hub.with(|s| s.queue.push_back(delivery("old", "a", 1)));
    let node = start_with_clock(cfg.clone(), &hub, Arc::new(clock.clone()));
    wait_until("old reported", || hub.with(|s| s.reports.len() == 1)).await;
    clock.set_ms(T0_MS + 2 * HOUR_MS);
    hub.with(|s| s.queue.push_back(delivery("young", "b", 1)));
    wait_until("young reported", || hub.with(|s| s.reports.len() == 2)).await;
    node.stop().await;
    let held = |id: &str| open_db(dir.path()).local(id).unwrap().is_some();
    assert!(held("old") && held("young"), "nothing is due while the node runs at T0 + 2h");

    // A day and an hour after the first turn: the first is due, the second (2 h) is not.
    clock.set_ms(T0_MS + 25 * HOUR_MS);
    let node = start_with_clock(cfg, &hub, Arc::new(clock.clone()));
    wait_until("the old turn is removed", || !held("old")).await;
    node.stop().await;
    assert!(held("young"), "a turn confirmed less than local_retention ago stays");
    let size = open_db(dir.path()).size().unwrap();
    assert_eq!(size.rows, vec![("deliveries", 1), ("executions", 1), ("attempts", 1), ("outbox", 1)]);
}

#[tokio::test]
async fn a_refused_ack_drops_the_copy_and_never_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.extend([delivery("x1", "x", 1), delivery("y1", "y", 1)]);
        s.refuse_ack.insert("x1".into());
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("y1 reported", || hub.with(|s| s.reports.len() == 1)).await;
    // The refusal is answered by dropping the copy before the claim loop takes another step,
    // and the loop finishes that step before it stops: no sleep needed to see it.
    wait_until("x1's ack was refused", || hub.with(|s| s.calls.iter().any(|c| c == "ack x1"))).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["y1"]);
    let local = open_db(dir.path()).local("x1").unwrap().unwrap();
    assert_eq!(local.state, LocalState::Dropped);
}

#[tokio::test]
async fn a_lost_claim_answer_is_found_again_by_resync() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.push_back(delivery("l1", "l", 1));
        s.lose_claim_answers = 1;
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("l1 reported", || hub.with(|s| s.reports.len() == 1)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["l1"]);
    hub.with(|s| assert!(s.calls.iter().filter(|c| *c == "holdings").count() >= 2, "{:?}", s.calls));
}

#[tokio::test]
async fn an_interrupted_attempt_is_reported_unknown_and_never_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let d = delivery("u1", "u", 1);
    {
        let mut db = open_db(dir.path());
        db.mirror(&d, true, 1).unwrap();
        db.start_attempt("u1", 2).unwrap().unwrap();
    }
    let hub = FakeHub::default();
    hub.with(|s| s.held.insert("u1".into(), (d.clone(), DeliveryState::Delivered)));
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    // A holdings list taken before the report landed makes the node send it again under the
    // same report id (counted once by the hub), so wait for the first, not for exactly one.
    wait_until("u1 reported", || hub.with(|s| !s.reports.is_empty())).await;
    node.stop().await;
    hub.with(|s| {
        assert!(s.reports.iter().all(|r| r.report_id == s.reports[0].report_id), "one report id");
        assert_eq!(s.reports[0].outcome, Outcome::Unknown);
        let reason = s.reports[0].reason.as_deref().unwrap_or_default();
        assert_eq!(reason, format!("{}; no harness process was recorded for it", crate::store::REASON_RESTARTED));
    });
    assert!(lines(&dir.path().join("ran")).is_empty(), "never run again");
}

/// A harness a crashed node left running (recorded with its attempt) is stopped at the next start
/// before the attempt is reported `unknown`: SIGTERM first (it records it), SIGKILL after the
/// grace since it ignores SIGTERM, and the report says so.
#[tokio::test]
async fn an_orphaned_harness_is_stopped_before_its_attempt_is_reported_unknown() {
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    let signals = dir.path().join("signals");
    let script =
        format!("trap 'echo TERM >> {0}' TERM; echo ready >> {0}; while :; do sleep 0.05; done", signals.display());
    let mut orphan = std::process::Command::new("sh").args(["-c", &script]).process_group(0).spawn().unwrap();
    wait_until("the orphan is ready", || std::fs::read_to_string(&signals).unwrap_or_default().contains("ready")).await;
    let d = delivery("o1", "o", 1);
    {
        let mut db = open_db(dir.path());
        db.mirror(&d, true, 1).unwrap();
        let turn = db.next_attempt("o1").unwrap().unwrap();
        let process = crate::group::ProcessIdentity::of_leader(orphan.id() as i32).unwrap();
        assert!(db.begin_attempt(&turn, Some(&process), 2).unwrap());
    }
    let hub = FakeHub::default();
    hub.with(|s| s.held.insert("o1".into(), (d.clone(), DeliveryState::Delivered)));
    let mut cfg = config(dir.path(), &recording(dir.path()));
    cfg.kill_grace = Duration::from_millis(300);
    let node = start(cfg, &hub);
    // A holdings list taken before the report landed makes the node send it again under the
    // same report id; the hub counts that once, so any number of copies is one report.
    wait_until("o1 reported", || hub.with(|s| !s.reports.is_empty())).await;
    node.stop().await;
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(orphan.wait().unwrap().signal(), Some(nix::sys::signal::Signal::SIGKILL as i32));
    assert!(std::fs::read_to_string(&signals).unwrap().contains("TERM"), "SIGTERM came first");
    hub.with(|s| {
        assert!(s.reports.iter().all(|r| r.report_id == s.reports[0].report_id), "one report id");
        assert_eq!(s.reports[0].outcome, Outcome::Unknown);
        let reason = s.reports[0].reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with(crate::store::REASON_RESTARTED), "{reason}");
        assert!(reason.contains("killed with SIGKILL after kill_grace (300ms)"), "{reason}");
    });
    assert!(lines(&dir.path().join("ran")).is_empty(), "never run again");
}

#[tokio::test]
async fn acked_on_the_hub_but_not_locally_runs_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = delivery("k1", "k", 1);
    open_db(dir.path()).mirror(&d, false, 1).unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.held.insert("k1".into(), (d.clone(), DeliveryState::Delivered)));
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("k1 reported", || hub.with(|s| s.reports.len() == 1)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["k1"]);
    hub.with(|s| assert!(!s.calls.iter().any(|c| c == "ack k1"), "no second ack needed: {:?}", s.calls));
}

/// A hub outage: a running turn goes on and its report waits in the outbox, then arrives once;
/// a turn the hub has not confirmed the start of waits for the hub (no start without it).
#[tokio::test]
async fn during_an_outage_reports_wait_and_starts_wait_for_the_hub() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "echo $BATON_DELIVERY_ID >> {}; while [ ! -f {} ]; do sleep 0.05; done",
        dir.path().join("ran").display(),
        go.display()
    );
    open_db(dir.path()).mirror(&delivery("o1", "o", 1), true, 1).unwrap();
    // The next turn of the same conversation: it may start only after o1 ended.
    open_db(dir.path()).mirror(&delivery("p1", "o", 2), true, 1).unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.held.insert("o1".into(), (delivery("o1", "o", 1), DeliveryState::Delivered));
        s.held.insert("p1".into(), (delivery("p1", "o", 2), DeliveryState::Delivered));
    });
    let node = start(config(dir.path(), &script), &hub);
    wait_until("o1 runs", || lines(&dir.path().join("ran")) == ["o1"]).await;
    hub.with(|s| s.down = true);
    std::fs::write(&go, "").unwrap();
    wait_until("a report try failed", || hub.with(|s| s.calls.iter().any(|c| c == "report o1"))).await;
    wait_until("p1's start was asked for", || hub.with(|s| s.calls.iter().filter(|c| *c == "starts").count() >= 2))
        .await;
    assert_eq!(lines(&dir.path().join("ran")), ["o1"], "p1 does not start while the hub cannot confirm it");
    hub.with(|s| s.down = false);
    wait_until("both reported", || hub.with(|s| s.outcomes.len() == 2)).await;
    // Stopping flushes the outbox: a report not marked confirmed would be sent again here.
    node.stop().await;
    hub.with(|s| assert_eq!(s.reports.iter().filter(|r| r.delivery_id == "o1").count(), 1));
    let local = open_db(dir.path()).local("o1").unwrap().unwrap();
    assert!(matches!(local.report, Some((_, crate::store::ReportState::Confirmed))), "{local:?}");
}

/// SPEC §4: the node keeps running what it holds while the hub is down. A turn whose ack the
/// hub confirmed to this very process starts on the local gate when the hub cannot record its
/// start (unlike a turn acked by an earlier process, above, which waits for the hub); the
/// session then does not end cleanly at shutdown.
#[tokio::test]
async fn during_an_outage_a_turn_acked_by_this_process_still_starts() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "echo $BATON_DELIVERY_ID >> {}; while [ ! -f {} ]; do sleep 0.05; done",
        dir.path().join("ran").display(),
        go.display()
    );
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.push_back(delivery("o1", "o", 1));
        s.queue.push_back(delivery("p1", "o", 2));
    });
    let node = start(config(dir.path(), &script), &hub);
    wait_until("o1 runs", || lines(&dir.path().join("ran")) == ["o1"]).await;
    wait_until("p1 acked", || hub.with(|s| s.calls.iter().any(|c| c == "ack p1"))).await;
    // Only a renewal sent after its ack lets p1 start on the node's own: one follows at once.
    wait_until("a start request after the ack of p1", || {
        hub.with(|s| s.calls.iter().skip_while(|c| *c != "ack p1").any(|c| c == "starts"))
    })
    .await;
    hub.with(|s| s.down = true);
    std::fs::write(&go, "").unwrap();
    wait_until("p1 runs while the hub is down", || lines(&dir.path().join("ran")) == ["o1", "p1"]).await;
    hub.with(|s| s.down = false);
    wait_until("both reported", || hub.with(|s| s.outcomes.len() == 2)).await;
    node.stop().await;
    // A session that started a turn without the hub's start record never ends cleanly: a clean
    // end would give up the lease, and with it the hub's rule that the next session does not
    // start what this one acked.
    hub.with(|s| assert!(s.ended_sessions.is_empty(), "ended cleanly: {:?}", s.ended_sessions));
    let last = open_db(dir.path()).last_session().unwrap().unwrap();
    assert_eq!(last.ended, None, "{last:?}");
}

/// The start lease bounds what a cut-off node starts on its own: once the lease it measured has
/// ended (its renewals failing while the hub is down), a turn its own ack made ours waits for
/// the hub instead of starting, and starts when the hub answers again.
#[tokio::test]
async fn during_an_outage_nothing_starts_once_the_start_lease_has_ended() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "echo $BATON_DELIVERY_ID >> {}; while [ ! -f {} ]; do sleep 0.05; done",
        dir.path().join("ran").display(),
        go.display()
    );
    let hub = FakeHub::default();
    hub.with(|s| {
        s.start_lease_ms = Some(1_500);
        s.queue.push_back(delivery("o1", "o", 1));
        s.queue.push_back(delivery("p1", "o", 2));
    });
    let node = start(config(dir.path(), &script), &hub);
    wait_until("o1 runs", || lines(&dir.path().join("ran")) == ["o1"]).await;
    wait_until("p1 acked", || hub.with(|s| s.calls.iter().any(|c| c == "ack p1"))).await;
    hub.with(|s| s.down = true);
    // Past the lease (the node counts 90 % of 1.5 s from its last renewal's request).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    std::fs::write(&go, "").unwrap();
    wait_until("the node asked to start p1 while the hub was down", || {
        hub.with(|s| s.calls.iter().filter(|c| *c == "starts").count() >= 3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lines(&dir.path().join("ran")), ["o1"], "p1 must not start on the local gate after the lease");
    hub.with(|s| s.down = false);
    wait_until("p1 runs once the hub answers", || lines(&dir.path().join("ran")) == ["o1", "p1"]).await;
    wait_until("both reported", || hub.with(|s| s.outcomes.len() == 2)).await;
    node.stop().await;
}

/// While a turn this process acked waits behind a running one, the node keeps its start lease
/// alive with empty `POST /v1/starts`, so a hub outage that begins long after the ack still
/// finds the lease running: the waiting turn starts on the local gate.
#[tokio::test]
async fn a_waiting_acked_turn_keeps_the_start_lease_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "echo $BATON_DELIVERY_ID >> {}; while [ ! -f {} ]; do sleep 0.05; done",
        dir.path().join("ran").display(),
        go.display()
    );
    let hub = FakeHub::default();
    hub.with(|s| {
        s.start_lease_ms = Some(1_500);
        s.queue.push_back(delivery("o1", "o", 1));
        s.queue.push_back(delivery("p1", "o", 2));
    });
    let node = start(config(dir.path(), &script), &hub);
    wait_until("o1 runs", || lines(&dir.path().join("ran")) == ["o1"]).await;
    wait_until("p1 acked", || hub.with(|s| s.calls.iter().any(|c| c == "ack p1"))).await;
    // Several lease lengths pass while p1 waits: only renewals keep the lease.
    wait_until("three renewals", || hub.with(|s| s.start_requests.iter().filter(|r| r.is_empty()).count() >= 3)).await;
    hub.with(|s| s.down = true);
    std::fs::write(&go, "").unwrap();
    wait_until("p1 runs on the local gate within the renewed lease", || lines(&dir.path().join("ran")) == ["o1", "p1"])
        .await;
    hub.with(|s| s.down = false);
    wait_until("both reported", || hub.with(|s| s.outcomes.len() == 2)).await;
    node.stop().await;
}

/// `start_lease_pending` (an earlier session acked the run and may still start it) is no
/// refusal: the node keeps the turn, starts nothing, and asks again until the hub grants it.
#[tokio::test]
async fn a_start_pending_on_an_older_lease_is_asked_again_and_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.push_back(delivery("l1", "l", 1));
        s.refuse_start.insert("l1".into(), "start_lease_pending".into());
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("asked three times", || {
        hub.with(|s| s.start_requests.iter().filter(|r| r.iter().any(|id| id == "l1")).count() >= 3)
    })
    .await;
    assert!(lines(&dir.path().join("ran")).is_empty(), "nothing runs while the older lease lasts");
    hub.with(|s| {
        assert!(s.reports.is_empty(), "nothing is reported for it: {:?}", s.reports);
        s.refuse_start.clear();
    });
    wait_until("l1 runs once granted", || lines(&dir.path().join("ran")) == ["l1"]).await;
    wait_until("reported", || hub.with(|s| s.outcomes.len() == 1)).await;
    node.stop().await;
}

#[tokio::test]
async fn a_refused_report_is_marked_dead_not_retried_forever() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.push_back(delivery("r1", "r", 1));
        s.refuse_reports = true;
    });
    let node = start(config(dir.path(), "cat"), &hub);
    wait_until("a report was tried", || hub.with(|s| s.calls.iter().any(|c| c == "report r1"))).await;
    // Stopping flushes the outbox: a report not marked dead would be tried again here.
    node.stop().await;
    hub.with(|s| assert_eq!(s.calls.iter().filter(|c| *c == "report r1").count(), 1));
    assert_eq!(open_db(dir.path()).summary().unwrap().dead_reports.len(), 1);
}

#[tokio::test]
async fn shutdown_kills_turns_past_the_grace_and_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("s1", "s", 1)));
    let mut cfg = config(dir.path(), &format!("touch {}; sleep 60", dir.path().join("started").display()));
    cfg.shutdown_grace = Duration::from_millis(200);
    let node = start(cfg, &hub);
    wait_until("the turn started", || dir.path().join("started").exists()).await;
    node.stop().await;
    hub.with(|s| {
        assert_eq!(s.reports.len(), 1, "the shutdown report is flushed before exit");
        assert_eq!(s.reports[0].outcome, Outcome::Failed);
        let reason = s.reports[0].reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with("shutdown: still running"), "{reason}");
    });
}

/// The hub revokes the node's certificate while a turn runs: the node stops claiming at the
/// first refusal, lets the running turn end, keeps its report (refused too) for a later start,
/// and ends with `Finished` (exit status 5) on its own.
#[tokio::test]
async fn a_revoked_certificate_stops_the_node_for_good_and_keeps_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let (started, go) = (dir.path().join("started"), dir.path().join("go"));
    let script =
        format!("touch {}; while [ ! -f {} ]; do sleep 0.05; done; echo done", started.display(), go.display());
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("v1", "v", 1)));
    let mut cfg = config(dir.path(), &script);
    cfg.shutdown_grace = Duration::from_secs(60);
    let node = start(cfg, &hub);
    wait_until("the turn started", || started.exists()).await;
    let revoked_at = hub.with(|s| {
        s.revoked = true;
        s.calls.len()
    });
    wait_until("the node is refused", || hub.with(|s| s.calls.len() > revoked_at)).await;
    std::fs::write(&go, "").unwrap();
    let ended = tokio::time::timeout(EVENT_WAIT, node.task).await.expect("the node stops on its own").unwrap();
    let err = ended.expect_err("a revoked node ends with an error");
    assert!(err.downcast_ref::<Finished>().is_some(), "{err:#}");
    assert_eq!(crate::cli::exit_code(&err), baton_shared::exit::REVOKED);
    hub.with(|s| {
        let claims = s.calls[revoked_at..].iter().filter(|c| *c == "claim").count();
        assert!(claims <= 1, "claims stop at the first refusal: {:?}", &s.calls[revoked_at..]);
        assert!(s.reports.is_empty());
    });
    let local = open_db(dir.path()).local("v1").unwrap().unwrap();
    assert_eq!(local.exec, ExecState::Ended, "the running turn ended within shutdown_grace");
    assert!(matches!(local.report, Some((_, crate::store::ReportState::Pending))), "kept for later: {local:?}");
}

#[tokio::test]
async fn parallel_limit_holds_and_a_conversation_never_overlaps() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let script = format!(
        "touch {live}/$BATON_CONVERSATION-$BATON_SEQ; ls {live} | wc -l >> {max}; \
         echo $BATON_CONVERSATION $BATON_SEQ $(ls {live} | grep -c ^$BATON_CONVERSATION-) >> {log}; \
         sleep 0.3; rm {live}/$BATON_CONVERSATION-$BATON_SEQ",
        live = live.display(),
        max = dir.path().join("max").display(),
        log = dir.path().join("log").display(),
    );
    let hub = FakeHub::default();
    hub.with(|s| {
        for c in ["c", "d", "e", "f"] {
            s.queue.push_back(delivery(&format!("{c}1"), c, 1));
        }
        s.queue.extend([delivery("g1", "g", 1), delivery("g2", "g", 2), delivery("g3", "g", 3)]);
    });
    let mut cfg = config(dir.path(), &script);
    cfg.parallel_conversations = 2;
    let node = start(cfg, &hub);
    wait_until("seven reports", || hub.with(|s| s.reports.len() == 7)).await;
    node.stop().await;
    let most: usize = lines(&dir.path().join("max")).iter().map(|l| l.trim().parse().unwrap()).max().unwrap();
    assert!(most <= 2, "at most 2 conversations at once, saw {most}");
    let g: Vec<String> = lines(&dir.path().join("log")).into_iter().filter(|l| l.starts_with("g ")).collect();
    assert_eq!(g, ["g 1 1", "g 2 1", "g 3 1"], "sequence order, one at a time");
}

#[tokio::test]
async fn noop_harness_goes_through_markers_and_reports_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("n1", "n", 1)));
    let mut cfg = config(dir.path(), "exit 1");
    cfg.harness = Harness::Noop;
    let node = start(cfg, &hub);
    wait_until("n1 reported", || hub.with(|s| s.reports.len() == 1)).await;
    node.stop().await;
    hub.with(|s| assert_eq!((s.reports[0].outcome, s.reports[0].exit_code), (Outcome::Succeeded, Some(0))));
    let db = open_db(dir.path());
    let ended: i64 =
        db.conn().query_row("SELECT count(*) FROM attempts WHERE ended_at_ms IS NOT NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(ended, 1);
}

#[tokio::test]
async fn a_move_to_another_hub_resyncs_the_holdings_there() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    let holdings = || hub.with(|s| s.calls.iter().filter(|c| *c == "holdings").count());
    wait_until("the first resync and a claim after it", || {
        hub.with(|s| s.calls.iter().skip_while(|c| *c != "holdings").any(|c| c == "claim"))
    })
    .await;
    assert_eq!(holdings(), 1, "one resync at start");
    // The node moved to another hub (a claim sent elsewhere found its hub gone): what it
    // holds there, a delivery claimed for it before the move, is resumed and run.
    let d = delivery("m1", "m", 1);
    hub.with(|s| {
        s.held.insert(d.delivery_id.clone(), (d.clone(), DeliveryState::Claimed));
        s.moves += 1;
    });
    wait_until("a resync after the move", || holdings() == 2).await;
    wait_until("the held delivery ran and was reported", || hub.with(|s| s.reports.len() == 1)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), vec!["m1"]);
}

#[tokio::test]
async fn instance_conflict_backs_off_and_touches_nothing() {
    // A hub that answers every claim with instance_conflict, noting when each claim arrived.
    #[derive(Clone, Default)]
    struct Conflicted(Arc<Mutex<Vec<Instant>>>);
    impl Hub for Conflicted {
        async fn register_session(&self) -> Result<SessionResponse, ClientError> {
            Ok(SessionResponse { session: 1, took_over: None, start_lease_ms: Some(60_000) })
        }
        async fn end_session(&self) -> Result<(), ClientError> {
            Ok(())
        }
        async fn starts(&self, _: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn claim(&self, _: u32, _: Duration) -> Result<ClaimResponse, ClientError> {
            self.0.lock().unwrap().push(Instant::now());
            Err(refused(ErrorCode::InstanceConflict))
        }
        async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
            Ok(vec![])
        }
        async fn mirrored(&self, _: &str, _: &str) -> Result<TransitionResponse, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn ack(&self, _: &str, _: &str) -> Result<TransitionResponse, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn reject(&self, _: &str, _: &str, _: &str) -> Result<TransitionResponse, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn report(&self, _: &ReportRequest) -> Result<ReportResponse, ClientError> {
            unreachable!("nothing ran")
        }
        async fn mirrored_batch(&self, _: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn ack_batch(&self, _: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn handoff_batch(&self, _: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn report_batch(&self, _: Vec<ReportRequest>) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
            unreachable!("nothing ran")
        }
        async fn running(&self, _: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
            unreachable!("nothing ran")
        }
        fn hub_moves(&self) -> u64 {
            0
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "cat");
    cfg.backoff_max = Duration::from_millis(300);
    let pace = cfg.backoff_max;
    let store = Store::new(open_db(dir.path()));
    let hub = Conflicted::default();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let h = hub.clone();
    let task = tokio::spawn(async move {
        let gate = crate::exec::Gate::shell();
        run_agent(cfg, store, h, "inst-2".into(), baton_shared::clock::system(), gate, s.cancelled_owned()).await
    });
    wait_until("four refused claims", || hub.0.lock().unwrap().len() >= 4).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    // Load can only stretch the pauses, so a lower bound on each is safe; half the pause
    // leaves room for timer granularity and still tells pacing from busy polling (~0).
    let times = hub.0.lock().unwrap().clone();
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= pace / 2, "claims {gap:?} apart: not paced at backoff_max ({pace:?})");
    }
    let held: i64 = open_db(dir.path()).conn().query_row("SELECT count(*) FROM deliveries", [], |r| r.get(0)).unwrap();
    assert_eq!(held, 0, "touches nothing");
}

#[tokio::test]
async fn a_hub_that_does_not_answer_is_retried_within_the_reconnect_cap() {
    // A hub unreachable for its first claims, then answering: however long `backoff_max` is and
    // however many tries failed, the pauses stay within `RECONNECT_PAUSE_MAX`, so the node is
    // back soon after the hub is. (Paced at `backoff_max` these tries would take hours.)
    const OUTAGE_CLAIMS: usize = 15;
    #[derive(Clone, Default)]
    struct Outage(Arc<Mutex<Vec<Instant>>>);
    impl Hub for Outage {
        async fn register_session(&self) -> Result<SessionResponse, ClientError> {
            Ok(SessionResponse { session: 1, took_over: None, start_lease_ms: Some(60_000) })
        }
        async fn end_session(&self) -> Result<(), ClientError> {
            Ok(())
        }
        async fn starts(&self, _: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn claim(&self, _: u32, _: Duration) -> Result<ClaimResponse, ClientError> {
            let mut claims = self.0.lock().unwrap();
            claims.push(Instant::now());
            if claims.len() <= OUTAGE_CLAIMS {
                return Err(down());
            }
            Ok(ClaimResponse { deliveries: vec![], cancels: vec![] })
        }
        async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
            Ok(vec![])
        }
        async fn mirrored(&self, _: &str, _: &str) -> Result<TransitionResponse, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn ack(&self, _: &str, _: &str) -> Result<TransitionResponse, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn reject(&self, _: &str, _: &str, _: &str) -> Result<TransitionResponse, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn report(&self, _: &ReportRequest) -> Result<ReportResponse, ClientError> {
            unreachable!("nothing ran")
        }
        async fn mirrored_batch(&self, _: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn ack_batch(&self, _: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn handoff_batch(&self, _: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
            unreachable!("nothing is claimed")
        }
        async fn report_batch(&self, _: Vec<ReportRequest>) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
            unreachable!("nothing ran")
        }
        async fn running(&self, _: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
            unreachable!("nothing ran")
        }
        fn hub_moves(&self) -> u64 {
            0
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "cat");
    cfg.backoff_max = Duration::from_secs(3600);
    let store = Store::new(open_db(dir.path()));
    let hub = Outage::default();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let h = hub.clone();
    let task = tokio::spawn(async move {
        let gate = crate::exec::Gate::shell();
        run_agent(cfg, store, h, "inst-1".into(), baton_shared::clock::system(), gate, s.cancelled_owned()).await
    });
    wait_until("the node claims again after the outage", || hub.0.lock().unwrap().len() > OUTAGE_CLAIMS + 1).await;
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn claims_stop_while_queue_ahead_batches_wait_unstarted() {
    claims_stop_at_the_bound(0).await;
}

/// The claim loop counts the local queue only when its claims since the last count could have
/// reached the bound, so after a resync (which mirrors what lost answers claimed, outside that
/// estimate) it counts again: the bound holds with claim answers lost as well.
#[tokio::test]
async fn claims_stop_at_the_bound_when_lost_answers_come_back_by_resync() {
    claims_stop_at_the_bound(4).await;
}

/// Ten turns of one conversation, claim batches of one, at most two waiting unstarted; the first
/// `lost` claim answers that carry work are lost (found again by resync).
async fn claims_stop_at_the_bound(lost: usize) {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    // One conversation runs one turn at a time, so everything claimed beyond the running turn waits.
    hub.with(|s| {
        s.queue.extend((1..=10).map(|i| delivery(&format!("q{i}"), "q", i)));
        s.node_db = Some(dir.path().join("node.db"));
        s.lose_claim_answers = lost;
    });
    let mut cfg = config(dir.path(), "sleep 0.2");
    cfg.claim_batch_max = 1;
    cfg.queue_ahead_batches = 2;
    let node = start(cfg, &hub);
    wait_until("ten reports", || hub.with(|s| s.reports.len() == 10)).await;
    node.stop().await;
    // Looked at when each claim arrived, not sampled: no overshoot can slip between samples.
    let queued = hub.with(|s| s.queued_at_claim.clone());
    assert!(queued.len() >= 10, "{queued:?}");
    assert!(
        queued.iter().all(|&n| n < 2),
        "the node claimed while 2 batches of 1 waited unstarted: {queued:?} waiting at each claim"
    );
}

/// A harness that notes its delivery, run and rerun (`-` when absent), notes a SIGTERM it gets
/// (and ignores it), and waits for `go` before it exits with `status`.
fn noting(dir: &Path, status: i32) -> String {
    format!(
        "echo \"$BATON_DELIVERY_ID $BATON_ATTEMPT ${{BATON_RERUN:--}}\" >> {ran}; \
         trap 'echo \"TERM $BATON_DELIVERY_ID\" >> {sig}' TERM; \
         while [ ! -f {go} ]; do sleep 0.05; done; exit {status}",
        ran = dir.join("ran").display(),
        sig = dir.join("signals").display(),
        go = dir.join("go").display(),
    )
}

fn held_delivered(hub: &FakeHub, dir: &Path, d: &ClaimedDelivery) {
    open_db(dir).mirror(d, true, 1).unwrap();
    hub.with(|s| s.held.insert(d.delivery_id.clone(), (d.clone(), DeliveryState::Delivered)));
}

/// Another process registers a newer session for this instance while a turn runs: the node
/// stops claiming at once, stops the running turn (SIGTERM first), does not report it, and
/// ends with `Superseded` (exit status 6); `status` shows the session and how it ended.
#[tokio::test]
async fn a_newer_session_stops_the_node_with_exit_status_6() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("s1", "s", 1)));
    let mut cfg = config(dir.path(), &noting(dir.path(), 0));
    cfg.kill_grace = Duration::from_millis(300);
    cfg.shutdown_grace = Duration::from_secs(60);
    let node = start(cfg, &hub);
    wait_until("the turn runs", || lines(&dir.path().join("ran")).len() == 1).await;
    let taken_at = hub.with(|s| {
        s.newest_session += 1;
        s.calls.len()
    });
    let ended = tokio::time::timeout(EVENT_WAIT, node.task).await.expect("the node stops on its own").unwrap();
    let err = ended.expect_err("a superseded node ends with an error");
    assert!(err.downcast_ref::<Superseded>().is_some(), "{err:#}");
    assert_eq!(crate::cli::exit_code(&err), baton_shared::exit::SUPERSEDED);
    assert!(format!("{err:#}").contains("another process took over this node instance"), "{err:#}");
    assert_eq!(lines(&dir.path().join("signals")), ["TERM s1"], "the running turn got SIGTERM");
    hub.with(|s| {
        let after = &s.calls[taken_at..];
        assert!(after.iter().filter(|c| *c == "claim").count() <= 1, "no claim after the refusal: {after:?}");
        assert!(s.reports.is_empty(), "not this process's to report any more");
        assert!(s.ended_sessions.is_empty());
    });
    let db = open_db(dir.path());
    let last = db.last_session().unwrap().unwrap();
    assert_eq!((last.session, last.ended.as_deref()), (1, Some("superseded")));
    drop(db);
    let text = crate::status::status(dir.path(), false).unwrap();
    assert!(text.contains("last session:     1 "), "{text}");
    let json: serde_json::Value = serde_json::from_str(&crate::status::status(dir.path(), true).unwrap()).unwrap();
    assert_eq!((json["session"]["session"].as_u64(), json["session"]["ended"].as_str()), (Some(1), Some("superseded")));
}

/// The hub refuses some starts: a cancelled one is reported `cancelled`, one another session
/// started is reported `unknown`, a stale one is dropped; none of them runs. The one it
/// confirms runs.
#[tokio::test]
async fn turns_whose_start_the_hub_refuses_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    for (id, code) in
        [("c1", Some("cancelled")), ("e1", Some("started_elsewhere")), ("t1", Some("stale_claim")), ("k1", None)]
    {
        held_delivered(&hub, dir.path(), &delivery(id, id, 1));
        if let Some(code) = code {
            hub.with(|s| s.refuse_start.insert(id.into(), code.into()));
        }
    }
    // The hub whose claim on t1 is stale does not list t1 among this instance's holdings: a
    // listing read before the refusal and resumed after it would otherwise adopt t1 again.
    hub.with(|s| s.held.remove("t1"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    let node = start(config(dir.path(), &noting(dir.path(), 0)), &hub);
    wait_until("three reports", || hub.with(|s| s.outcomes.len() == 3)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["k1 1 -"], "only the confirmed start ran");
    hub.with(|s| {
        let report = |id: &str| s.reports.iter().find(|r| r.delivery_id == id).unwrap();
        assert_eq!(report("k1").outcome, Outcome::Succeeded);
        assert_eq!(report("c1").outcome, Outcome::Cancelled);
        assert!(report("c1").reason.as_deref().unwrap().starts_with("cancelled before it started"));
        assert_eq!(report("e1").outcome, Outcome::Unknown);
        assert_eq!(report("e1").reason.as_deref(), Some(crate::sched::REASON_STARTED_ELSEWHERE));
        assert!(!s.reports.iter().any(|r| r.delivery_id == "t1"));
    });
    assert_eq!(open_db(dir.path()).local("t1").unwrap().unwrap().state, LocalState::Dropped);
}

/// A copy of a data directory (or one restored from an old backup) learns from holdings of a
/// delivered turn it has no record of: it never runs it, and reports it `unknown`.
#[tokio::test]
async fn a_delivered_turn_without_a_local_record_is_reported_unknown_and_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    let d = delivery("x1", "x", 1);
    hub.with(|s| s.held.insert("x1".into(), (d.clone(), DeliveryState::Delivered)));
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("x1 reported", || hub.with(|s| !s.reports.is_empty())).await;
    node.stop().await;
    assert!(lines(&dir.path().join("ran")).is_empty(), "never run");
    hub.with(|s| {
        assert_eq!(s.reports[0].outcome, Outcome::Unknown);
        assert_eq!(s.reports[0].reason.as_deref(), Some(REASON_NO_LOCAL_RECORD));
        assert!(s.start_requests.iter().all(|r| !r.contains(&"x1".to_string())), "never asked to start");
        assert!(!s.calls.iter().any(|c| c == "mirrored x1" || c == "ack x1"));
    });
}

/// A cancel that arrives on a claim answer for a turn waiting behind another of its
/// conversation: it never starts, and is reported `cancelled`; the running one is left alone.
#[tokio::test]
async fn a_cancel_before_the_start_reports_cancelled_and_the_turn_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    held_delivered(&hub, dir.path(), &delivery("a1", "a", 1));
    held_delivered(&hub, dir.path(), &delivery("a2", "a", 2));
    let node = start(config(dir.path(), &noting(dir.path(), 0)), &hub);
    wait_until("a1 runs", || lines(&dir.path().join("ran")).len() == 1).await;
    let claims = hub.with(|s| {
        s.cancels.insert("a2".into(), (1, "wrong prompt".into()));
        s.calls.iter().filter(|c| *c == "claim").count()
    });
    wait_until("a2 reported", || hub.with(|s| s.outcomes.contains_key("a2"))).await;
    hub.with(|s| assert!(s.calls.iter().filter(|c| *c == "claim").count() > claims, "learnt from a claim answer"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    wait_until("a1 reported", || hub.with(|s| s.outcomes.contains_key("a1"))).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["a1 1 -"], "a2 never ran");
    hub.with(|s| {
        let a2 = s.reports.iter().find(|r| r.delivery_id == "a2").unwrap();
        assert_eq!(a2.outcome, Outcome::Cancelled);
        assert_eq!(a2.reason.as_deref(), Some("cancelled before it started: wrong prompt"));
        assert_eq!((a2.exit_code, a2.duration_ms, a2.signal), (None, None, None));
        assert!(s.start_requests.iter().all(|r| !r.contains(&"a2".to_string())), "a2's start was never asked for");
        let a1 = s.reports.iter().find(|r| r.delivery_id == "a1").unwrap();
        assert_eq!(a1.outcome, Outcome::Succeeded);
    });
}

/// A cancel of a running turn: its process group gets SIGTERM (the harness notes it and goes
/// on), SIGKILL after `cancel_grace`, and the attempt is reported `cancelled` with the signal
/// and the duration. A turn that already ended is left alone.
#[tokio::test]
async fn a_cancel_while_running_stops_the_group_and_reports_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("r1", "r", 1)));
    let mut cfg = config(dir.path(), &noting(dir.path(), 0));
    cfg.cancel_grace = Duration::from_millis(300);
    let node = start(cfg, &hub);
    wait_until("r1 runs", || lines(&dir.path().join("ran")).len() == 1).await;
    hub.with(|s| s.cancels.insert("r1".into(), (1, "operator said so".into())));
    wait_until("r1 reported", || hub.with(|s| s.outcomes.contains_key("r1"))).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("signals")), ["TERM r1"], "SIGTERM came first");
    hub.with(|s| {
        let r = s.reports.iter().find(|r| r.delivery_id == "r1").unwrap();
        assert_eq!(r.outcome, Outcome::Cancelled);
        assert_eq!(r.signal, Some(nix::sys::signal::Signal::SIGKILL as i32));
        assert!(r.duration_ms.is_some());
        let reason = r.reason.as_deref().unwrap();
        assert!(reason.starts_with("cancelled: operator said so; "), "{reason}");
        assert!(reason.ends_with("killed with SIGKILL after cancel_grace (300ms)"), "{reason}");
        assert_eq!(s.reports.len(), 1, "one report");
    });
}

/// A delivery comes back for run 2 (the harness exited 75 and the hub requeued it): run 2 is
/// its own attempt with its own report id, the harness sees `BATON_ATTEMPT` and `BATON_RERUN`
/// (absent on run 1), and exit 75 is reported `failed` with exit code 75.
#[tokio::test]
async fn a_second_run_of_a_delivery_gets_its_own_attempt_report_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("go"), "").unwrap();
    let hub = FakeHub::default();
    hub.with(|s| s.queue.push_back(delivery("d1", "d", 1)));
    let node = start(config(dir.path(), &noting(dir.path(), 75)), &hub);
    wait_until("run 1 reported", || hub.with(|s| s.reports.len() == 1)).await;
    hub.with(|s| {
        let mut again = delivery("d1", "d", 1);
        again.attempt = 2;
        again.max_attempts = 2;
        again.rerun = Some(baton_shared::states::Rerun::Retry);
        again.claim_token = "tok-d1-run2".into();
        s.outcomes.remove("d1");
        s.started.remove("d1");
        s.queue.push_back(again);
    });
    wait_until("run 2 reported", || hub.with(|s| s.reports.len() == 2)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["d1 1 -", "d1 2 retry"]);
    hub.with(|s| {
        let (r1, r2) = (&s.reports[0], &s.reports[1]);
        assert_ne!(r1.report_id, r2.report_id, "each run has its own report id");
        assert_eq!((r1.attempt, r2.attempt), (Some(1), Some(2)));
        assert_eq!((r1.claim_token.as_str(), r2.claim_token.as_str()), ("tok-d1", "tok-d1-run2"));
        for r in [r1, r2] {
            assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(75)));
        }
    });
    let db = open_db(dir.path());
    let runs: Vec<(u32, String)> = db
        .conn()
        .prepare("SELECT run, outcome FROM attempts WHERE delivery_id = 'd1' ORDER BY run")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(runs, [(1, "failed".to_string()), (2, "failed".to_string())]);
    assert_eq!(db.local("d1").unwrap().unwrap().run, 2);
}

/// Past `claim_batch_max` turns, one pass asks in more than one request, each within the bound.
#[tokio::test]
async fn a_start_request_holds_at_most_claim_batch_max_turns() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    for c in ["a", "b", "c"] {
        held_delivered(&hub, dir.path(), &delivery(&format!("{c}1"), c, 1));
    }
    let mut cfg = config(dir.path(), "cat");
    cfg.claim_batch_max = 2;
    let node = start(cfg, &hub);
    wait_until("three reports", || hub.with(|s| s.outcomes.len() == 3)).await;
    node.stop().await;
    hub.with(|s| {
        assert!(s.start_requests.iter().all(|r| !r.is_empty() && r.len() <= 2), "{:?}", s.start_requests);
        assert_eq!(s.start_requests.iter().map(Vec::len).sum::<usize>(), 3, "{:?}", s.start_requests);
    });
}

/// A hub that predates sessions and hub-confirmed starts (404 to both): the node works as
/// before, on its local gate alone, and sends no session.
#[tokio::test]
async fn a_hub_without_sessions_or_starts_is_worked_with_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.no_turn_control = true;
        s.queue.extend([delivery("a1", "a", 1), delivery("a2", "a", 2)]);
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("two reports", || hub.with(|s| s.reports.len() == 2)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["a1", "a2"]);
    hub.with(|s| {
        assert!(s.sent_sessions.is_empty());
        assert_eq!(s.calls.iter().filter(|c| *c == "starts").count(), 1, "asked once, then not again");
    });
}

/// A head of a conversation whose start the hub refuses does not hold the conversation back:
/// the next turn starts at once, without waiting for another event.
#[tokio::test]
async fn a_refused_start_lets_the_next_turn_of_its_conversation_run() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    for seq in 0..3 {
        held_delivered(&hub, dir.path(), &delivery(&format!("e{seq}"), "e", seq));
    }
    hub.with(|s| s.refuse_start.insert("e1".into(), "started_elsewhere".into()));
    let node = start(config(dir.path(), &noting(dir.path(), 0)), &hub);
    wait_until("e0 runs", || lines(&dir.path().join("ran")).len() == 1).await;
    // e1 is refused only once e0 ended, after every start-up wake-up has been used.
    std::fs::write(dir.path().join("go"), "").unwrap();
    wait_until("all reported", || hub.with(|s| s.outcomes.len() == 3)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["e0 1 -", "e2 1 -"]);
}

/// The previous process of this data directory crashed after the hub recorded a turn's start
/// and before the local start marker: the restarted node (a new session taking over that one)
/// reports the turn `unknown` and never runs it.
#[tokio::test]
async fn a_crash_between_the_hubs_start_record_and_the_marker_is_reported_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    held_delivered(&hub, dir.path(), &delivery("h1", "h", 1));
    open_db(dir.path()).record_session(1, None, 5).unwrap();
    hub.with(|s| {
        s.newest_session = 1;
        s.started.insert("h1".into(), 1);
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("h1 reported", || hub.with(|s| !s.reports.is_empty())).await;
    node.stop().await;
    assert!(lines(&dir.path().join("ran")).is_empty(), "never run");
    hub.with(|s| {
        assert_eq!(s.reports[0].outcome, Outcome::Unknown);
        assert_eq!(s.reports[0].reason.as_deref(), Some(crate::sched::REASON_STOPPED_AFTER_HUB_START));
    });
    let last = open_db(dir.path()).last_session().unwrap().unwrap();
    assert_eq!((last.session, last.took_over), (2, Some(1)));
}

/// A cancel the node learns from holdings (at its start-up resync) for a turn it holds and has
/// not started: it never starts, and is reported `cancelled`.
#[tokio::test]
async fn a_cancel_in_the_holdings_reaches_a_turn_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    held_delivered(&hub, dir.path(), &delivery("b1", "b", 1));
    held_delivered(&hub, dir.path(), &delivery("b2", "b", 2));
    hub.with(|s| {
        s.cancels_only_in_holdings = true;
        s.cancels.insert("b2".into(), (1, "the operator's reason".into()));
    });
    let node = start(config(dir.path(), &noting(dir.path(), 0)), &hub);
    wait_until("b2 reported", || hub.with(|s| s.outcomes.contains_key("b2"))).await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    wait_until("b1 reported", || hub.with(|s| s.outcomes.contains_key("b1"))).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["b1 1 -"], "b2 never ran");
    hub.with(|s| {
        let b2 = s.reports.iter().find(|r| r.delivery_id == "b2").unwrap();
        assert_eq!(b2.outcome, Outcome::Cancelled);
        assert_eq!(b2.reason.as_deref(), Some("cancelled before it started: cancel requested"));
    });
}

/// Holdings listed out of `seq` order (the hub lists them in its queue order, which follows
/// fan-out): the node mirrors, acks and runs them in each conversation's `seq` order.
#[tokio::test]
async fn holdings_out_of_seq_order_are_resumed_and_run_in_seq_order() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    // Listed "a2" (seq 2) before "z1" (seq 1): the fake hub lists by id.
    hub.with(|s| {
        s.held.insert("a2".into(), (delivery("a2", "c", 2), DeliveryState::Claimed));
        s.held.insert("z1".into(), (delivery("z1", "c", 1), DeliveryState::Claimed));
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("both reported", || hub.with(|s| s.outcomes.len() == 2)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")), ["z1", "a2"], "run in seq order");
    hub.with(|s| {
        let pos = |c: &str| s.calls.iter().position(|x| x == c).unwrap_or_else(|| panic!("{c}: {:?}", s.calls));
        assert!(pos("ack z1") < pos("mirrored a2"), "seq 1 handed off first: {:?}", s.calls);
    });
}

fn count_where(dir: &Path, sql: &str) -> i64 {
    open_db(dir).conn().query_row(sql, [], |r| r.get(0)).unwrap()
}

/// A claim batch of six, with `handoff` as given, its reports held back until all six turns
/// ended: the hub's batch requests other than reports, after checking that the waiting
/// reports went in one request and every turn was reported.
async fn holder_batches_of_a_claim_batch(handoff: Handoff) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    let batch: Vec<ClaimedDelivery> = (1..=6).map(|i| delivery(&format!("b{i}"), &format!("c{}", i % 3), i)).collect();
    hub.with(|s| {
        s.queue.extend(batch);
        s.reports_down = true;
    });
    let mut cfg = config(dir.path(), "cat");
    cfg.harness = Harness::Noop;
    cfg.handoff = handoff;
    let node = start(cfg, &hub);
    wait_until("six turns ended locally", || {
        count_where(dir.path(), "SELECT count(*) FROM attempts WHERE ended_at_ms IS NOT NULL") == 6
    })
    .await;
    hub.with(|s| s.reports_down = false);
    wait_until("six reports", || hub.with(|s| s.outcomes.len() == 6)).await;
    node.stop().await;
    hub.with(|s| {
        assert!(
            s.batches.iter().any(|b| b == "batch reports 6"),
            "the waiting reports go in one request: {:?}",
            s.batches
        );
        let mut reported: Vec<&str> = s.reports.iter().map(|r| r.delivery_id.as_str()).collect();
        reported.sort();
        reported.dedup();
        assert_eq!(reported.len(), 6);
        s.batches.iter().filter(|b| !b.starts_with("batch reports")).cloned().collect()
    })
}

/// A claim batch is handed off in one request (`mirrored` and `ack` together), and the reports
/// the outbox holds go in one request: the hub sees requests per batch, not per delivery.
#[tokio::test]
async fn a_claim_batch_is_one_handoff_and_its_reports_one_request() {
    assert_eq!(holder_batches_of_a_claim_batch(Handoff::Combined).await, ["batch handoff 6"]);
}

/// With `handoff = "separate"` a claim batch is one `mirrored` and one `ack` request.
#[tokio::test]
async fn a_separate_handoff_is_one_mirrored_and_one_ack_request() {
    assert_eq!(holder_batches_of_a_claim_batch(Handoff::Separate).await, ["batch mirrored 6", "batch ack 6"]);
}

/// Runs two deliveries, then a third, on a hub set up by `hub_is`; checks every turn ran once
/// and returns the holder-step batch requests the hub saw, in order (reports left out).
async fn holder_batches_of_two_claims(hub_is: impl FnOnce(&mut HubState)) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.extend([delivery("w1", "a", 1), delivery("w2", "b", 1)]);
        hub_is(s);
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("two reports", || hub.with(|s| s.outcomes.len() == 2)).await;
    hub.with(|s| s.queue.extend([delivery("w3", "c", 1)]));
    wait_until("three reports", || hub.with(|s| s.outcomes.len() == 3)).await;
    node.stop().await;
    let mut ran = lines(&dir.path().join("ran"));
    ran.sort();
    assert_eq!(ran, ["w1", "w2", "w3"]);
    hub.with(|s| s.batches.iter().filter(|b| !b.starts_with("batch reports")).cloned().collect())
}

/// A hub that knows batches but predates the combined handoff answers 404 to it once; from
/// then on the node sends `mirrored` and `ack` apart, and every turn still runs once.
#[tokio::test]
async fn a_hub_without_the_combined_handoff_gets_mirrored_and_ack_apart() {
    let holder = holder_batches_of_two_claims(|s| s.no_handoff = true).await;
    assert_eq!(
        holder,
        ["batch handoff 2", "batch mirrored 2", "batch ack 2", "batch mirrored 1", "batch ack 1"],
        "one 404 is enough"
    );
}

/// A combined handoff the hub refuses whole for what it carries (a bound) is sent again as one
/// `mirrored` and one `ack` batch, each time: nothing is learnt from it, and every turn runs once.
#[tokio::test]
async fn a_handoff_refused_whole_goes_as_mirrored_and_ack_batches() {
    let holder = holder_batches_of_two_claims(|s| s.handoff_too_large = true).await;
    assert_eq!(
        holder,
        ["batch handoff 2", "batch mirrored 2", "batch ack 2", "batch handoff 1", "batch mirrored 1", "batch ack 1"]
    );
}

/// One stale item of a batch is handled as its single answer would be (its local copy is
/// dropped, it never runs); the others of the same batch run and are reported.
#[tokio::test]
async fn a_stale_item_of_a_batch_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.extend([delivery("s1", "a", 1), delivery("s2", "b", 1), delivery("s3", "c", 1)]);
        s.refuse_ack.insert("s2".into());
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("two reports", || hub.with(|s| s.outcomes.len() == 2)).await;
    wait_until("s2 dropped", || {
        count_where(dir.path(), "SELECT count(*) FROM deliveries WHERE delivery_id = 's2' AND state = 'dropped'") == 1
    })
    .await;
    node.stop().await;
    let mut ran = lines(&dir.path().join("ran"));
    ran.sort();
    assert_eq!(ran, ["s1", "s3"]);
    hub.with(|s| assert!(s.batches.iter().any(|b| b == "batch handoff 3"), "{:?}", s.batches));
}

/// A hub that predates batches answers 404 to the first batch request; from then on every
/// step goes one request per delivery, and every turn still runs once and is reported.
#[tokio::test]
async fn a_hub_without_batch_routes_gets_single_requests() {
    let dir = tempfile::tempdir().unwrap();
    let hub = FakeHub::default();
    hub.with(|s| {
        s.queue.extend([delivery("o1", "a", 1), delivery("o2", "a", 2), delivery("o3", "b", 1)]);
        s.no_batches = true;
    });
    let node = start(config(dir.path(), &recording(dir.path())), &hub);
    wait_until("three reports", || hub.with(|s| s.outcomes.len() == 3)).await;
    hub.with(|s| s.queue.extend([delivery("o4", "b", 2), delivery("o5", "c", 1)]));
    wait_until("five reports", || hub.with(|s| s.outcomes.len() == 5)).await;
    node.stop().await;
    assert_eq!(lines(&dir.path().join("ran")).len(), 5);
    hub.with(|s| {
        assert_eq!(s.batches, ["batch handoff 3", "batch mirrored 3"], "one 404 per route is enough: {:?}", s.batches);
        for id in ["o1", "o2", "o3", "o4", "o5"] {
            for step in ["mirrored", "ack", "report"] {
                let call = format!("{step} {id}");
                assert!(s.calls.contains(&call), "{call} missing: {:?}", s.calls);
            }
        }
    });
}
