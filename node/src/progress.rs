//! Progress of running turns, and their renewal with the hub.
//!
//! The channel. A command turn starts with one extra open file descriptor, the write end of a
//! pipe, at fd 3, named in the harness's environment as `BATON_PROGRESS_FD` (`exec::spawn`). The harness
//! writes one JSON object per line (UTF-8, newline-terminated); anything it starts (its process
//! group) may write too. The node reads the pipe while the turn runs (`exec::read_progress`) and
//! hands each line to the turn's `Sink`.
//!
//! Bounds, each a named key: a line longer than `progress_event_bytes_max` is dropped; past
//! `progress_events_per_turn_max` events in a run, or beyond `progress_events_per_second_max` a
//! second (a token bucket of that many), events are dropped; so is a line that is not one JSON
//! object. Events wait in memory until sent: at most `progress_buffer_events_max` for the whole
//! node, beyond which new ones are dropped. Every drop is counted per run and sent with the
//! next request (`dropped`), logged once per run at its end, and counted in
//! `baton_node_progress_dropped_total` (`counters`).
//!
//! Why memory rather than the store's outbox: progress is advisory and frequent; putting each
//! event through a durable commit would cost the node's disk what the turn's own work costs.
//! What a node loses of it is bounded and said: an outage of the hub keeps up to the buffer's
//! bound (the rest counted as dropped) and sends it when the hub answers again; a node that
//! dies loses what it had not sent (at most one `progress_flush_interval`'s worth while the hub
//! answers), and its turn is reported `unknown` anyway.
//!
//! The renewal (`renewal::renewal_loop`): one `POST /v1/running` per pass lists every turn running now,
//! with its events waiting (at most `PROGRESS_EVENTS_PER_REQUEST_MAX` and `BATCH_BYTES_MAX` bytes
//! per request), at least every `renew_interval` while a turn runs, and every
//! `progress_flush_interval` while events wait. A pass with no events costs the hub no write.
//! The outbox sends the events of ended turns (`renewal::flush_ended`) before their reports, so the hub
//! has them before the outcome it would refuse them after.
//!
//! Invariant: each run's events carry `seq` 1, 2, ... in the order the harness wrote them (a
//! dropped event takes no number); an event leaves the buffer only once the hub answered the
//! request that carried it, so a failed request is sent again with the same numbers and the hub
//! keeps each once.

use baton_shared::limits::{BATCH_BYTES_MAX, BATCH_ITEMS_MAX, PROGRESS_EVENTS_PER_REQUEST_MAX};
use baton_shared::wire::{Payload, ProgressItem, RunningTurnItem, RunningTurnResult};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The node's bounds on progress (its configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressLimits {
    /// Longest line kept (`progress_event_bytes_max`).
    pub event_bytes_max: usize,
    /// Most events of one run kept (`progress_events_per_turn_max`).
    pub events_per_turn_max: u64,
    /// Most events of one run kept per second (`progress_events_per_second_max`).
    pub events_per_second_max: u64,
    /// Most events waiting to be sent, the whole node (`progress_buffer_events_max`).
    pub buffer_events_max: usize,
}

/// Why an event was dropped (the counts a run's drops are made of).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Longer than `progress_event_bytes_max`.
    TooLarge,
    /// Not one JSON object.
    NotAnObject,
    /// Past `progress_events_per_turn_max`.
    OverCount,
    /// Past `progress_events_per_second_max`.
    OverRate,
    /// The buffer was full (the hub did not answer for a while).
    BufferFull,
    /// The hub no longer takes progress for the run (its outcome is recorded).
    NotRunning,
}

impl Dropped {
    /// The label of `baton_node_progress_dropped_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::TooLarge => "too_large",
            Dropped::NotAnObject => "not_an_object",
            Dropped::OverCount => "over_count",
            Dropped::OverRate => "over_rate",
            Dropped::BufferFull => "buffer_full",
            Dropped::NotRunning => "not_running",
        }
    }
}

/// Every turn's progress waiting to be sent.
#[derive(Debug)]
pub struct Progress {
    limits: ProgressLimits,
    state: Mutex<State>,
    /// Wakes the renewal loop: events wait, or a turn started or ended.
    pub(crate) wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    turns: HashMap<(String, u32), Turn>,
    /// Events waiting in all turns.
    buffered: usize,
}

/// One run's progress.
#[derive(Debug)]
struct Turn {
    claim_token: String,
    /// The number the next kept event gets.
    next_seq: u64,
    /// Kept, not yet answered by the hub.
    pending: VecDeque<ProgressItem>,
    /// Dropped so far, and how many of those the hub was told.
    dropped: u64,
    dropped_told: u64,
    /// Tokens of the rate bound, and when they were last added.
    tokens: f64,
    refilled: Instant,
    /// The harness ended (the run's last events may still wait).
    ended: bool,
    /// The hub no longer takes this run's progress.
    refused: bool,
    /// When the harness last wrote a line (the stall clock).
    last_line: Instant,
}

/// What a turn's pipe reader hands its lines to: one run's end of `Progress`.
#[derive(Debug, Clone)]
pub struct Sink {
    progress: Arc<Progress>,
    key: (String, u32),
}

impl Progress {
    /// Nothing waiting yet.
    pub fn new(limits: ProgressLimits) -> Progress {
        Progress { limits, state: Mutex::new(State::default()), wake: Notify::new() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A run starts: its events are numbered from 1. Returns its sink.
    pub fn start(self: &Arc<Self>, delivery_id: &str, run: u32, claim_token: &str) -> Sink {
        let now = Instant::now();
        let key = (delivery_id.to_string(), run);
        self.state().turns.insert(
            key.clone(),
            Turn {
                claim_token: claim_token.to_string(),
                next_seq: 1,
                pending: VecDeque::new(),
                dropped: 0,
                dropped_told: 0,
                tokens: self.limits.events_per_second_max as f64,
                refilled: now,
                ended: false,
                refused: false,
                last_line: now,
            },
        );
        self.wake.notify_one();
        Sink { progress: Arc::clone(self), key }
    }

    /// A run's harness ended: what waits of it is still sent (before its report), then it is
    /// forgotten. Returns how many of its events were dropped.
    pub(crate) fn end(&self, delivery_id: &str, run: u32) -> u64 {
        let mut st = self.state();
        let key = (delivery_id.to_string(), run);
        let dropped = st.turns.get(&key).map_or(0, |t| t.dropped);
        if let Some(t) = st.turns.get_mut(&key) {
            t.ended = true;
        }
        Self::forget_done(&mut st);
        dropped
    }

    /// The events of a run waiting to be sent, in order.
    pub fn waiting_events(&self, delivery_id: &str, run: u32) -> Vec<ProgressItem> {
        self.state()
            .turns
            .get(&(delivery_id.to_string(), run))
            .map_or(Vec::new(), |t| t.pending.iter().cloned().collect())
    }

    /// Whether events wait to be sent.
    pub(crate) fn waiting(&self) -> bool {
        self.state().buffered > 0
    }

    /// Whether a turn is running (the renewal is due while one is).
    pub(crate) fn any_running(&self) -> bool {
        self.state().turns.values().any(|t| !t.ended)
    }

    /// The next request: every running turn, and the ended ones with events or a drop count
    /// to tell, with their waiting events (within the request's bounds). `only_ended` leaves
    /// out the running ones (the outbox's flush before reports).
    pub(crate) fn request(&self, only_ended: bool) -> Vec<(RunningTurnItem, usize, u64)> {
        let st = self.state();
        let mut out = Vec::new();
        let (mut events, mut bytes) = (0usize, 0u64);
        let mut keys: Vec<&(String, u32)> = st.turns.keys().collect();
        keys.sort();
        for key in keys {
            let Some(t) = st.turns.get(key) else { continue };
            if out.len() >= BATCH_ITEMS_MAX || (only_ended && !t.ended) || t.refused {
                continue;
            }
            let news = !t.pending.is_empty() || t.dropped != t.dropped_told;
            if t.ended && !news {
                continue;
            }
            let mut item = RunningTurnItem {
                delivery_id: key.0.clone(),
                claim_token: t.claim_token.clone(),
                attempt: key.1,
                events: Vec::new(),
                dropped: (t.dropped != t.dropped_told).then_some(t.dropped),
            };
            for e in &t.pending {
                let size = e.progress.as_str().len() as u64 + 32;
                if events >= PROGRESS_EVENTS_PER_REQUEST_MAX || bytes + size > BATCH_BYTES_MAX / 2 {
                    break;
                }
                events += 1;
                bytes += size;
                item.events.push(e.clone());
            }
            let n = item.events.len();
            out.push((item, n, t.dropped));
        }
        out
    }

    /// The hub answered a request: its events leave the buffer, its drop counts are told, and
    /// a run the hub no longer takes progress for drops what waits of it.
    pub(crate) fn answered(&self, sent: &[(RunningTurnItem, usize, u64)], results: &[RunningTurnResult]) {
        let mut st = self.state();
        let mut freed = 0usize;
        for ((item, n, dropped), result) in sent.iter().zip(results) {
            let Some(t) = st.turns.get_mut(&(item.delivery_id.clone(), item.attempt)) else { continue };
            let n = (*n).min(t.pending.len());
            t.pending.drain(..n);
            freed += n;
            t.dropped_told = t.dropped_told.max(*dropped);
            if !result.running && !t.refused {
                t.refused = true;
                let left = t.pending.len();
                t.pending.clear();
                freed += left;
                t.dropped += left as u64;
                count_drop(Dropped::NotRunning, left as u64);
            }
        }
        st.buffered = st.buffered.saturating_sub(freed);
        Self::forget_done(&mut st);
    }

    fn forget_done(st: &mut State) {
        let mut freed = 0;
        st.turns.retain(|_, t| {
            let done = t.ended && (t.refused || (t.pending.is_empty() && t.dropped == t.dropped_told));
            if done {
                freed += t.pending.len();
            }
            !done
        });
        st.buffered = st.buffered.saturating_sub(freed);
    }
}

impl Sink {
    /// One complete line the harness wrote (without its newline): kept as the run's next event,
    /// or dropped and counted. Any line restarts the stall clock.
    pub fn line(&self, line: &[u8]) {
        let limits = self.progress.limits;
        let mut st = self.progress.state();
        let full = st.buffered >= limits.buffer_events_max;
        let Some(t) = st.turns.get_mut(&self.key) else { return };
        let now = Instant::now();
        t.last_line = now;
        let elapsed = now.duration_since(t.refilled).as_secs_f64();
        let rate = limits.events_per_second_max as f64;
        t.tokens = (t.tokens + elapsed * rate).min(rate);
        t.refilled = now;
        let why = if line.len() > limits.event_bytes_max {
            Some(Dropped::TooLarge)
        } else if t.refused {
            Some(Dropped::NotRunning)
        } else if t.next_seq > limits.events_per_turn_max {
            Some(Dropped::OverCount)
        } else if t.tokens < 1.0 {
            Some(Dropped::OverRate)
        } else if full {
            Some(Dropped::BufferFull)
        } else {
            None
        };
        let event = match why {
            Some(why) => Err(why),
            None => object(line).ok_or(Dropped::NotAnObject),
        };
        match event {
            Ok(progress) => {
                t.tokens -= 1.0;
                t.pending.push_back(ProgressItem { seq: t.next_seq, progress });
                t.next_seq += 1;
                st.buffered += 1;
                drop(st);
                self.progress.wake.notify_one();
            }
            Err(why) => {
                t.dropped += 1;
                count_drop(why, 1);
            }
        }
    }

    /// The run's events kept so far and when its harness last wrote a line (its start when it
    /// wrote none): what the stall bound counts from and a stopped turn's reason names.
    pub fn last(&self) -> Option<(u64, Instant)> {
        self.progress.state().turns.get(&self.key).map(|t| (t.next_seq - 1, t.last_line))
    }

    /// A line longer than `progress_event_bytes_max` was skipped without being read whole.
    pub fn too_large(&self) {
        let mut st = self.progress.state();
        if let Some(t) = st.turns.get_mut(&self.key) {
            t.last_line = Instant::now();
            t.dropped += 1;
        }
        count_drop(Dropped::TooLarge, 1);
    }
}

/// The line as one JSON object, its text kept exactly (trailing whitespace and a `\r` trimmed).
fn object(line: &[u8]) -> Option<Payload> {
    let text = std::str::from_utf8(line).ok()?.trim();
    if !text.starts_with('{') {
        return None;
    }
    Payload::from_text(text.to_string()).ok()
}

/// Every reason an event is dropped, in the order `/metrics` lists them.
pub const DROPPED_ALL: [Dropped; 6] = [
    Dropped::TooLarge,
    Dropped::NotAnObject,
    Dropped::OverCount,
    Dropped::OverRate,
    Dropped::BufferFull,
    Dropped::NotRunning,
];

/// Events dropped since the node started, by `DROPPED_ALL`'s order (`baton_node_progress_dropped_total`).
static DROPPED_TOTAL: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
/// Events the hub answered for since the node started (`baton_node_progress_sent_total`).
static SENT_TOTAL: AtomicU64 = AtomicU64::new(0);

fn count_drop(why: Dropped, n: u64) {
    if let Some(i) = DROPPED_ALL.iter().position(|d| *d == why) {
        DROPPED_TOTAL[i].fetch_add(n, Ordering::Relaxed);
    }
}

/// The counters `/metrics` shows: events sent (answered by the hub), and dropped per reason.
pub fn counters() -> (u64, Vec<(Dropped, u64)>) {
    let dropped = DROPPED_ALL.iter().zip(&DROPPED_TOTAL).map(|(d, n)| (*d, n.load(Ordering::Relaxed))).collect();
    (SENT_TOTAL.load(Ordering::Relaxed), dropped)
}

/// Counts `n` events the hub answered for (`counters`).
pub(crate) fn count_sent(n: usize) {
    SENT_TOTAL.fetch_add(n as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ProgressLimits {
        ProgressLimits {
            event_bytes_max: 64,
            events_per_turn_max: 5,
            events_per_second_max: 1000,
            buffer_events_max: 100,
        }
    }

    #[test]
    fn lines_are_numbered_and_bounded_and_drops_counted() {
        let p = Arc::new(Progress::new(limits()));
        let sink = p.start("d", 1, "t");
        sink.line(br#"{"step":1}"#);
        sink.line(b"not json");
        sink.line(br#"[1,2]"#);
        sink.line(&[b'{'; 65]);
        sink.line(br#" {"step":2} "#);
        let req = p.request(false);
        assert_eq!(req.len(), 1);
        let (item, n, dropped) = &req[0];
        assert_eq!((*n, *dropped), (2, 3));
        assert_eq!(item.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(item.events[1].progress.as_str(), r#"{"step":2}"#);
        assert_eq!(item.dropped, Some(3));
        // Past the per-run count: 5 numbered at most.
        for i in 3..10 {
            sink.line(format!(r#"{{"step":{i}}}"#).as_bytes());
        }
        let (item, _, dropped) = p.request(false).remove(0);
        assert_eq!(item.events.len(), 5);
        assert_eq!(dropped, 3 + 4);
    }

    #[test]
    fn events_leave_only_when_answered_and_a_run_ends_once_sent() {
        let p = Arc::new(Progress::new(limits()));
        let sink = p.start("d", 1, "t");
        sink.line(br#"{"a":1}"#);
        let first = p.request(false);
        // Not answered (the hub was down): the same event is sent again.
        let again = p.request(false);
        assert_eq!(first[0].0.events, again[0].0.events);
        sink.line(br#"{"a":2}"#);
        let ok = RunningTurnResult { delivery_id: "d".into(), running: true, kept: 1, dropped: 0 };
        p.answered(&first, std::slice::from_ref(&ok));
        let next = p.request(false);
        assert_eq!(next[0].0.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
        assert_eq!(p.end("d", 1), 0);
        assert_eq!(p.request(true).len(), 1, "the ended run's last event still goes");
        p.answered(&next, &[ok]);
        assert!(p.request(false).is_empty(), "sent and ended: forgotten");
        assert!(!p.waiting());
    }

    #[test]
    fn the_rate_bound_drops_a_burst_beyond_it() {
        let p = Arc::new(Progress::new(ProgressLimits { events_per_second_max: 3, ..limits() }));
        let sink = p.start("d", 1, "t");
        for _ in 0..5 {
            sink.line(br#"{}"#);
        }
        let (item, _, dropped) = p.request(false).remove(0);
        assert_eq!((item.events.len(), dropped), (3, 2));
    }

    #[test]
    fn a_run_the_hub_refuses_drops_what_waits() {
        let p = Arc::new(Progress::new(limits()));
        let sink = p.start("d", 1, "t");
        sink.line(br#"{}"#);
        let sent = p.request(false);
        p.answered(&sent, &[RunningTurnResult { delivery_id: "d".into(), running: false, kept: 0, dropped: 1 }]);
        sink.line(br#"{}"#);
        assert!(p.request(false).is_empty(), "refused: nothing more is sent");
        assert_eq!(p.end("d", 1), 1);
    }
}
