//! One claim's walk over the host's conversation queues and those of the pools it belongs to
//! (SPEC §5, §2 "Order in a pool"): which queued deliveries a claim hands out, in what order,
//! with each conversation's fences applied on the way.
//!
//! Invariant (order): for each (host, conversation), a claim hands out a delivery with `seq` s
//! only when no earlier message of the conversation routed to that host still has a pending
//! fan-out obligation, none has a delivery that is queued (a retry waiting for its `not_before`
//! included) or held, and none of a message with `max_attempts > 1` is claimed, mirrored or
//! delivered without an outcome of its current run (the retry barrier). A redrive is handed out
//! whatever came before it and holds nothing back: the one run allowed out of order. It is
//! checked inside the claim transaction for every candidate, after the earlier candidates of the
//! same claim were handed out, so one batch may carry several turns of a conversation, in
//! order; a conversation found waiting is skipped for the rest of the claim. A pause or hold of
//! the conversation therefore keeps everything after it back too, and releasing a later held
//! delivery does not let it pass an earlier one.
//!
//! Invariant (order in a pool): the same rule holds per (pool, conversation) across all member
//! hosts, the pool's deliveries and a host's own keeping their orders apart. Besides, while a
//! turn of the conversation is in flight on a host (`pool_flight`), only that host's claims see
//! the conversation's queue, and once nothing is in flight the last host's claims alone see it
//! for `limits.pool_affinity_wait` (`dialect::CLAIM_POOL_QUEUES`). The pools are the host's
//! memberships read in the claim's transaction: a host removed from a pool claims none of its
//! work. A fence on the host keeps it from pool work (the other members take it) and never
//! parks or fails a pool delivery; the pool's, the conversation's and everything's fences apply
//! to it as to a host's (`fences::pool_turn`).
//!
//! Invariant (fairness): the conversations with queued work for a host take turns within a
//! claim, one delivery per turn, least recently served first (`conversation_queues.served`,
//! a per-host tick; among those not served since they gained work, the one waiting longest),
//! and a claim looks at no more than `CLAIM_HEADS_MAX` queue heads; each look is one indexed
//! lookup, so a claim's cost does not grow with the backlog. The host's own queues and each
//! pool's (`pool_queues.served`, a per-pool tick) are lanes that take turns in the first round,
//! so a deep pool cannot starve the host's own work nor the reverse. On PostgreSQL each queue
//! the claim turns to is locked for it, and one another claim holds is skipped
//! (`dialect::CLAIM_QUEUES`, `dialect::CLAIM_POOL_QUEUES`; see `claim`, "claims at once").
//!
//! Why one file over 700 lines: the walk is one type's steps, and the unit tests that hold each
//! order and fairness rule to SPEC §5 read beside them; without its tests it is about 630 lines.

use crate::store::Actor;
use crate::store::engine::{Db, DbResult, OptionalExtension, Row, dialect, params};
use crate::store::lifecycle::pool_flight;
use crate::store::lifecycle::transition::{self, Change, Holder};
use crate::store::registry::fences::{self, Fence, FenceKind, PoolTurn};
use crate::store::registry::members;
use crate::store::{StoreResult, bound_ms_column, json_column, new_token, parse_column_opt};
use baton_shared::states::DeliveryState::{self, *};
use baton_shared::states::Rerun;
use baton_shared::wire::ClaimedDelivery;
use std::collections::{HashMap, VecDeque};

/// Most queue heads one claim looks at (handed out, parked, failed, or found waiting behind an
/// earlier turn). It bounds the claim's transaction however deep the backlog is and however
/// many conversations are blocked; what is left is looked at by the next claim.
pub const CLAIM_HEADS_MAX: usize = 4096;

/// Conversation queues read per step while taking the first round of turns.
const CLAIM_TURNS_CHUNK: i64 = 64;

/// What one turn of a conversation in a claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// One delivery was handed out; the conversation may have more.
    Claimed,
    /// Nothing may be handed out now (paused, an earlier turn queued, held or not fanned out,
    /// or held by the fence); skip it for the rest of this claim.
    Blocked,
    /// No queued delivery is left.
    Empty,
    /// The claim looked at `CLAIM_HEADS_MAX` heads; it stops here.
    Spent,
}

/// A queued delivery of a (host, conversation): the next turn, or one a fence covers.
struct Head {
    id: String,
    message_id: String,
    seq: i64,
    /// While waiting for a retry: not handed out before (unix ms).
    not_before: Option<i64>,
    /// Why this run is a rerun, if it is (an operator's redrive is handed out whatever the
    /// order rule says).
    rerun: Option<Rerun>,
    /// The run a claim hands out (the claim changes neither this nor `rerun`).
    attempt: u32,
    /// Its message's terms, which the claim answers with.
    terms: MessageTerms,
    /// Whether a held delivery of its conversation in the lane comes before it.
    held_before: bool,
}

impl Head {
    /// From `id, message_id, seq, not_before, rerun, attempt`, the message's `payload,
    /// producer, max_attempts, deadline_ms, stall_ms, traceparent`, and whether one is held
    /// before it.
    fn from_row(r: &Row<'_>) -> DbResult<Head> {
        let id: String = r.get(0)?;
        let message_id: String = r.get(1)?;
        let terms = (
            json_column(r, 6, "messages", &message_id)?,
            r.get(7)?,
            r.get(8)?,
            bound_ms_column(r, 9, "messages", &message_id)?,
            bound_ms_column(r, 10, "messages", &message_id)?,
            r.get(11)?,
        );
        Ok(Head {
            seq: r.get(2)?,
            not_before: r.get(3)?,
            rerun: parse_column_opt(r, 4, "deliveries", &id, "rerun", Rerun::parse)?,
            attempt: r.get(5)?,
            terms,
            held_before: r.get(12)?,
            message_id,
            id,
        })
    }

    fn redrive(&self) -> bool {
        self.rerun == Some(Rerun::Redrive)
    }
}

/// Where a claim takes a turn from: the claiming host's own queue of a conversation, or the
/// queue of a conversation in one of the pools the host belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Lane {
    /// The host's own deliveries.
    Host,
    /// A pool's deliveries (not yet bound to a host).
    Pool(String),
}

/// One lane's queues with work, read in chunks during the first round.
struct Source {
    lane: Lane,
    /// The last queue position read.
    after: (i64, i64, String),
    /// Read and not yet turned to.
    ready: VecDeque<(i64, i64, String)>,
    /// Nothing more to read.
    exhausted: bool,
}

/// One claim's walk over the host's conversation queues and its pools'.
pub(super) struct Scan<'a> {
    conn: &'a dyn Db,
    host: &'a str,
    holder_instance: &'a str,
    fences: &'a [Fence],
    max: usize,
    now_ms: i64,
    /// `limits.pool_affinity_wait`: how long a pool conversation's last host is preferred.
    affinity_wait_ms: i64,
    out: Vec<ClaimedDelivery>,
    heads: usize,
    /// Whether any fan-out obligation is pending at all (then the order rule looks them up).
    obligations_pending: bool,
    /// Whether any message may be retried at all (then the retry barrier looks them up).
    retryable_messages: bool,
    /// The pools the host belongs to, read in the claim's transaction.
    pools: Vec<String>,
    /// The last tick given out per lane (the host's, then each pool's in `pools` order); each
    /// turn taken (or found blocked) gets the next one of its lane.
    ticks: Vec<i64>,
    /// Queues turned to in this claim, with their new tick, in turn order.
    turned: Vec<(Lane, String, i64)>,
    /// Whether each conversation looked at has ever had a member (else every host may have
    /// its posts, and the registry need not be asked per delivery).
    managed: HashMap<String, bool>,
    /// The host's own deliveries handed out so far: its waiting count moves by as many at
    /// `finish`.
    host_claimed: i64,
}

impl<'a> Scan<'a> {
    pub(super) fn new(
        conn: &'a dyn Db,
        host: &'a str,
        holder_instance: &'a str,
        fences: &'a [Fence],
        max: usize,
        now_ms: i64,
        affinity_wait_ms: i64,
    ) -> StoreResult<Scan<'a>> {
        // The newest tick among the queues with work (read backwards along the index).
        let tick: i64 = conn
            .prepare_cached(
                "SELECT served FROM conversation_queues WHERE host = $1 AND queued > 0
                 ORDER BY served DESC, since DESC, conversation DESC LIMIT 1",
            )?
            .query_row([host], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        let pools: Vec<String> = conn
            .prepare_cached("SELECT pool FROM pool_members WHERE host = $1 ORDER BY pool")?
            .query_map([host], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut ticks = vec![tick];
        for pool in &pools {
            ticks.push(
                conn.prepare_cached(
                    "SELECT served FROM pool_queues WHERE pool = $1 AND queued > 0
                     ORDER BY served DESC, since DESC, conversation DESC LIMIT 1",
                )?
                .query_row([pool], |r| r.get(0))
                .optional()?
                .unwrap_or(0),
            );
        }
        let obligations_pending: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM fanout_obligations WHERE done_at IS NULL)")?
            .query_row([], |r| r.get(0))?;
        let retryable_messages: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM messages WHERE max_attempts > 1)")?
            .query_row([], |r| r.get(0))?;
        Ok(Scan {
            conn,
            host,
            holder_instance,
            fences,
            max,
            now_ms,
            affinity_wait_ms,
            out: Vec::new(),
            heads: 0,
            obligations_pending,
            retryable_messages,
            pools,
            ticks,
            turned: Vec::new(),
            managed: HashMap::new(),
            host_claimed: 0,
        })
    }

    /// Queues to read per step: as many as the batch still needs, and a few spare where that
    /// costs nothing (some may be blocked; see `dialect::CLAIM_QUEUES_SPARE`).
    fn chunk(&self) -> i64 {
        let needed = (self.max - self.out.len()) as i64;
        (needed + dialect::CLAIM_QUEUES_SPARE.of(self.conn)).min(CLAIM_TURNS_CHUNK)
    }

    fn done(&self) -> bool {
        self.out.len() >= self.max || self.heads >= CLAIM_HEADS_MAX
    }

    /// The next chunk of a lane's queues with work after `after`, least recently served first.
    fn read_queues(&self, lane: &Lane, after: &(i64, i64, String)) -> StoreResult<Vec<(i64, i64, String)>> {
        let row = |r: &Row<'_>| Ok((r.get(0)?, r.get(1)?, r.get(2)?));
        Ok(match lane {
            Lane::Host => self
                .conn
                .prepare_cached(dialect::CLAIM_QUEUES.of(self.conn))?
                .query_map(params![self.host, after.0, after.1, after.2, self.chunk()], row)?
                .collect::<Result<_, _>>()?,
            Lane::Pool(pool) => self
                .conn
                .prepare_cached(dialect::CLAIM_POOL_QUEUES.of(self.conn))?
                .query_map(
                    params![
                        pool,
                        after.0,
                        after.1,
                        after.2,
                        self.chunk(),
                        self.host,
                        self.now_ms.saturating_sub(self.affinity_wait_ms)
                    ],
                    row,
                )?
                .collect::<Result<_, _>>()?,
        })
    }

    /// First round: every conversation with queued work, of the host and of each of its pools,
    /// one turn each, the lanes taking turns (so neither the host's own work nor any pool's can
    /// starve the others) and within a lane least recently served first; then further rounds
    /// over those that handed one out, until the batch is full.
    pub(super) fn run(&mut self) -> StoreResult<()> {
        let mut again: VecDeque<(Lane, String)> = VecDeque::new();
        let mut sources: Vec<Source> = std::iter::once(Lane::Host)
            .chain(self.pools.iter().cloned().map(Lane::Pool))
            .map(|lane| Source {
                lane,
                after: (i64::MIN, i64::MIN, String::new()),
                ready: VecDeque::new(),
                exhausted: false,
            })
            .collect();
        'first: loop {
            let mut turned_any = false;
            for source in sources.iter_mut() {
                if self.done() {
                    break 'first;
                }
                if source.ready.is_empty() && !source.exhausted {
                    let read = self.read_queues(&source.lane, &source.after)?;
                    source.exhausted = read.is_empty();
                    source.ready.extend(read);
                }
                let Some(queue) = source.ready.pop_front() else { continue };
                turned_any = true;
                let conversation = queue.2.clone();
                source.after = queue;
                match self.turn(&source.lane, &conversation)? {
                    Turn::Claimed => {
                        self.turned_to(&source.lane, &conversation);
                        again.push_back((source.lane.clone(), conversation));
                    }
                    Turn::Blocked => self.turned_to(&source.lane, &conversation),
                    Turn::Empty => {}
                    Turn::Spent => break 'first,
                }
            }
            if !turned_any {
                break;
            }
        }
        while !self.done() {
            let Some((lane, conversation)) = again.pop_front() else { break };
            match self.turn(&lane, &conversation)? {
                Turn::Claimed => {
                    self.turned_to(&lane, &conversation);
                    again.push_back((lane, conversation));
                }
                Turn::Blocked => self.turned_to(&lane, &conversation),
                Turn::Empty => {}
                Turn::Spent => break,
            }
        }
        Ok(())
    }

    fn lane_index(&self, lane: &Lane) -> usize {
        match lane {
            Lane::Host => 0,
            Lane::Pool(p) => 1 + self.pools.iter().position(|x| x == p).unwrap_or(0),
        }
    }

    fn turned_to(&mut self, lane: &Lane, conversation: &str) {
        let i = self.lane_index(lane);
        self.ticks[i] += 1;
        self.turned.push((lane.clone(), conversation.to_string(), self.ticks[i]));
    }

    /// Records when each queue was last turned to and how many of the host's own deliveries
    /// stopped waiting, and returns the batch.
    pub(super) fn finish(self) -> StoreResult<Vec<ClaimedDelivery>> {
        if !self.out.is_empty() {
            let handed: Vec<(&str, &str)> =
                self.out.iter().map(|d| (d.delivery_id.as_str(), d.claim_token.as_str())).collect();
            transition::check_handed_out(self.conn, self.holder_instance, &handed)?;
        }
        if self.host_claimed > 0 {
            transition::adjust_backlog(self.conn, self.host, -self.host_claimed)?;
        }
        for (lane, conversation, tick) in &self.turned {
            match lane {
                Lane::Host => self
                    .conn
                    .prepare_cached("UPDATE conversation_queues SET served = $1 WHERE host = $2 AND conversation = $3")?
                    .execute_unread(params![tick, self.host, conversation])?,
                Lane::Pool(pool) => self
                    .conn
                    .prepare_cached("UPDATE pool_queues SET served = $1 WHERE pool = $2 AND conversation = $3")?
                    .execute_unread(params![tick, pool, conversation])?,
            };
        }
        Ok(self.out)
    }

    /// Runs the lane's form of a statement whose `$1` is the host (own deliveries) or the pool.
    fn lane_query<T>(
        &self,
        lane: &Lane,
        host_sql: &str,
        pool_sql: &str,
        rest: &[&dyn crate::store::engine::ToSql],
        f: impl FnOnce(&Row<'_>) -> DbResult<T>,
    ) -> StoreResult<Option<T>> {
        let (sql, key) = match lane {
            Lane::Host => (host_sql, self.host),
            Lane::Pool(pool) => (pool_sql, pool.as_str()),
        };
        let mut args: Vec<&dyn crate::store::engine::ToSql> = vec![&key];
        args.extend_from_slice(rest);
        Ok(self.conn.prepare_cached(sql)?.query_row(args.as_slice(), f).optional()?)
    }

    /// The lowest-`seq` queued delivery of `conversation` in the lane after `seq`, with its
    /// message's terms and whether a held delivery of the lane comes before it.
    fn next_queued(&self, lane: &Lane, conversation: &str, seq: i64) -> StoreResult<Option<Head>> {
        self.lane_query(
            lane,
            "SELECT d.id, d.message_id, d.seq, d.not_before, d.rerun, d.attempt,
                    m.payload, m.producer, m.max_attempts, m.deadline_ms, m.stall_ms, m.traceparent,
                    EXISTS (SELECT 1 FROM deliveries h
                            WHERE h.host = $1 AND h.conversation = $2 AND h.state = 'held' AND h.seq < d.seq)
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.host = $1 AND d.conversation = $2 AND d.state = 'queued' AND d.seq > $3
             ORDER BY d.seq LIMIT 1",
            "SELECT d.id, d.message_id, d.seq, d.not_before, d.rerun, d.attempt,
                    m.payload, m.producer, m.max_attempts, m.deadline_ms, m.stall_ms, m.traceparent,
                    EXISTS (SELECT 1 FROM deliveries h
                            WHERE h.pool = $1 AND h.conversation = $2 AND h.state = 'held' AND h.seq < d.seq)
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.pool = $1 AND d.conversation = $2 AND d.state = 'queued' AND d.seq > $3
             ORDER BY d.seq LIMIT 1",
            &[&conversation, &seq],
            Head::from_row,
        )
    }

    /// The lowest-`seq` queued redrive of `conversation` in the lane (not held back by order),
    /// with its message's terms.
    fn next_redrive(&self, lane: &Lane, conversation: &str) -> StoreResult<Option<Head>> {
        self.lane_query(
            lane,
            "SELECT d.id, d.message_id, d.seq, d.not_before, d.rerun, d.attempt,
                    m.payload, m.producer, m.max_attempts, m.deadline_ms, m.stall_ms, m.traceparent, FALSE
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.host = $1 AND d.conversation = $2 AND d.state = 'queued' AND d.rerun = 'redrive'
             ORDER BY d.seq LIMIT 1",
            "SELECT d.id, d.message_id, d.seq, d.not_before, d.rerun, d.attempt,
                    m.payload, m.producer, m.max_attempts, m.deadline_ms, m.stall_ms, m.traceparent, FALSE
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.pool = $1 AND d.conversation = $2 AND d.state = 'queued' AND d.rerun = 'redrive'
             ORDER BY d.seq LIMIT 1",
            &[&conversation],
            Head::from_row,
        )
    }

    /// The retry barrier: whether an earlier delivery of `conversation` in the lane, of a
    /// message that may be retried, was handed out and has no outcome of its current run yet
    /// (its retry would come back before this turn). A redrive is no barrier. A host's own
    /// deliveries and a pool's keep their orders apart.
    fn retry_pending_before(&self, lane: &Lane, conversation: &str, seq: i64) -> StoreResult<bool> {
        if !self.retryable_messages {
            return Ok(false);
        }
        let pending = self.lane_query(
            lane,
            "SELECT EXISTS (
                SELECT 1 FROM messages m JOIN deliveries d ON d.message_id = m.id AND d.host = $1 AND d.pool IS NULL
                WHERE m.conversation = $2 AND m.seq < $3 AND m.max_attempts > 1
                  AND d.state IN ('claimed', 'mirrored', 'delivered')
                  AND (d.rerun IS NULL OR d.rerun <> 'redrive')
                  AND (d.state <> 'delivered' OR NOT EXISTS (
                        SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))",
            "SELECT EXISTS (
                SELECT 1 FROM messages m JOIN deliveries d ON d.message_id = m.id AND d.pool = $1
                WHERE m.conversation = $2 AND m.seq < $3 AND m.max_attempts > 1
                  AND d.state IN ('claimed', 'mirrored', 'delivered')
                  AND (d.rerun IS NULL OR d.rerun <> 'redrive')
                  AND (d.state <> 'delivered' OR NOT EXISTS (
                        SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))",
            &[&conversation, &seq],
            |r| r.get(0),
        )?;
        Ok(pending.unwrap_or(false))
    }

    /// Whether an earlier message of `conversation` routed to the lane's host or pool is still
    /// owed its fan-out (its delivery does not exist yet).
    fn earlier_not_fanned_out(&self, lane: &Lane, conversation: &str, seq: i64) -> StoreResult<bool> {
        if !self.obligations_pending {
            return Ok(false);
        }
        let (sql, key) = match lane {
            Lane::Host => (dialect::EARLIER_NOT_FANNED_OUT.of(self.conn), self.host),
            Lane::Pool(pool) => (dialect::EARLIER_NOT_FANNED_OUT_TO_POOL.of(self.conn), pool.as_str()),
        };
        Ok(self.conn.prepare_cached(sql)?.query_row(params![conversation, seq, key], |r| r.get(0))?)
    }

    /// Whether this host may receive post `seq` of `conversation` (the registry's re-check).
    /// A conversation that never had a member (most) is looked up once per claim. A pool's
    /// delivery was routed to the pool, and the host is a member of the pool at this claim
    /// (the lane exists only for its pools).
    fn authorized(&mut self, lane: &Lane, conversation: &str, seq: i64) -> StoreResult<bool> {
        if let Lane::Pool(_) = lane {
            return Ok(true);
        }
        let managed = match self.managed.get(conversation) {
            Some(m) => *m,
            None => {
                let m = members::has_membership(self.conn, conversation)?;
                self.managed.insert(conversation.to_string(), m);
                m
            }
        };
        if !managed {
            return Ok(true);
        }
        members::authorized(self.conn, conversation, self.host, seq)
    }

    /// Moves a queued delivery on without handing it out (held by a fence, failed by a fence
    /// or by the re-authorization).
    fn settle(&mut self, id: &str, to: DeliveryState, reason: &str) -> StoreResult<()> {
        self.heads += 1;
        let change =
            Change { delivery_id: id, from: Queued, to, expect_holder: None, new_holder: None, reason: Some(reason) };
        transition::apply(self.conn, change, &Actor::hub(), self.now_ms)
    }

    /// The fence that decides a turn of `conversation` in the lane: `None` when it may be
    /// handed out, `Err(())` when this claim skips it (paused, or a pool's work for a fenced
    /// host), or the hold or block that parks or fails it.
    fn fence_of(&self, lane: &Lane, conversation: &str) -> Result<Option<&'a Fence>, ()> {
        match lane {
            Lane::Host => match fences::strongest(self.fences, conversation, self.host) {
                Some(f) if f.kind == FenceKind::Pause => Err(()),
                other => Ok(other),
            },
            Lane::Pool(pool) => match fences::pool_turn(self.fences, conversation, pool, self.host) {
                PoolTurn::Open => Ok(None),
                PoolTurn::Skip => Err(()),
                PoolTurn::Fenced(f) => Ok(Some(f)),
            },
        }
    }

    /// One turn of `conversation` in the lane: hand out its next delivery if the order rule,
    /// the fences and the registry allow it.
    fn turn(&mut self, lane: &Lane, conversation: &str) -> StoreResult<Turn> {
        match self.fence_of(lane, conversation) {
            Err(()) => return Ok(Turn::Blocked),
            Ok(Some(f)) => {
                // Every queued delivery the fence covers is parked or failed, in seq order.
                let (to, reason) = match f.kind {
                    FenceKind::Hold => (Held, format!("held by {}", f.describe())),
                    _ => (Failed, format!("blocked by {}", f.describe())),
                };
                let mut after = i64::MIN;
                while let Some(head) = self.next_queued(lane, conversation, after)? {
                    if self.heads >= CLAIM_HEADS_MAX {
                        return Ok(Turn::Spent);
                    }
                    self.settle(&head.id, to, &reason)?;
                    after = head.seq;
                }
                return Ok(if to == Held { Turn::Blocked } else { Turn::Empty });
            }
            Ok(None) => {}
        }
        loop {
            if self.heads >= CLAIM_HEADS_MAX {
                return Ok(Turn::Spent);
            }
            // Queued turns before this one were handed out or failed already in this loop.
            let Some(head) = self.next_queued(lane, conversation, i64::MIN)? else { return Ok(Turn::Empty) };
            // A redrive is handed out whatever came before it; anything else keeps the order,
            // and a retry waits for its not-before time (holding later turns back).
            let waits = !head.redrive()
                && (head.not_before.is_some_and(|t| t > self.now_ms)
                    || head.held_before
                    || self.earlier_not_fanned_out(lane, conversation, head.seq)?
                    || self.retry_pending_before(lane, conversation, head.seq)?);
            if waits {
                self.heads += 1;
                let Some(redrive) = self.next_redrive(lane, conversation)? else { return Ok(Turn::Blocked) };
                if !self.authorized(lane, conversation, redrive.seq)? {
                    self.settle(&redrive.id, Failed, NOT_A_MEMBER)?;
                    continue;
                }
                self.hand_out(lane, conversation, redrive)?;
                return Ok(Turn::Claimed);
            }
            if !self.authorized(lane, conversation, head.seq)? {
                self.settle(&head.id, Failed, NOT_A_MEMBER)?;
                continue;
            }
            self.hand_out(lane, conversation, head)?;
            return Ok(Turn::Claimed);
        }
    }

    /// queued → claimed for the claiming instance, and into the batch.
    fn hand_out(&mut self, lane: &Lane, conversation: &str, head: Head) -> StoreResult<()> {
        self.heads += 1;
        let (payload, producer, max_attempts, deadline_ms, stall_ms, traceparent) = head.terms;
        let token = new_token();
        let holder = Holder { instance_id: self.holder_instance, claim_token: &token };
        let change = Change {
            delivery_id: &head.id,
            from: Queued,
            to: Claimed,
            expect_holder: None,
            new_holder: Some(holder),
            reason: None,
        };
        // The host's waiting count moves once for the batch (`finish`); a pool's deliveries
        // wait in their pool's queue, not in a host's count.
        transition::apply_handed_out(self.conn, change, &Actor::node(self.host), self.now_ms)?;
        match lane {
            Lane::Host => self.host_claimed += 1,
            Lane::Pool(pool) => pool_flight::began(self.conn, pool, conversation, self.host)?,
        }
        self.out.push(ClaimedDelivery {
            delivery_id: head.id,
            message_id: head.message_id,
            conversation: conversation.to_string(),
            seq: head.seq,
            payload,
            claim_token: token,
            state: Claimed,
            producer: Some(producer),
            attempt: head.attempt,
            max_attempts,
            rerun: head.rerun,
            cancel_requested: false,
            deadline_ms,
            stall_ms,
            traceparent,
        });
        Ok(())
    }
}

/// What a claim hands out of its message: the payload, the producer, `max_attempts` and the
/// turn's bounds (`deadline_ms`, `stall_ms`) and its trace context (`traceparent`).
type MessageTerms = (baton_shared::wire::Payload, String, u32, Option<u64>, Option<u64>, Option<String>);

/// The reason a delivery fails with when its host is not a member for the message's `seq`.
pub const NOT_A_MEMBER: &str = "not a member";

/// Helpers of the claim's tests (here and in `claim` and `handoff`).
#[cfg(test)]
pub(crate) mod testing {
    use crate::store::StoreResult;
    use crate::store::engine::Db;
    use crate::store::registry::fences::{self, FenceKind, FenceScope, NewFence};
    use baton_shared::wire::ClaimedDelivery;

    pub(crate) fn fence_set(
        conn: &dyn Db,
        kind: FenceKind,
        scope: FenceScope,
        target: Option<&str>,
        reason: &str,
        now_ms: i64,
    ) -> StoreResult<i64> {
        fences::set(conn, NewFence { kind, scope, target, operator: "op", reason }, now_ms)
    }

    /// The (conversation, seq) of each claimed delivery, in batch order.
    pub(crate) fn turns(got: &[ClaimedDelivery]) -> Vec<(&str, i64)> {
        got.iter().map(|d| (d.conversation.as_str(), d.seq)).collect()
    }

    pub(crate) fn delivery_of(conn: &dyn Db, message_id: &str, host: &str) -> String {
        conn.query_row("SELECT id FROM deliveries WHERE message_id = $1 AND host = $2", [message_id, host], |r| {
            r.get(0)
        })
        .unwrap()
    }

    pub(crate) fn state_of_msg(conn: &dyn Db, msg: &str) -> (String, Option<String>) {
        conn.query_row("SELECT state, reason FROM deliveries WHERE message_id = $1", [msg], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{delivery_of, fence_set, state_of_msg, turns};
    use super::*;
    use crate::store::lifecycle::accept::fan_out;
    use crate::store::lifecycle::accept::testing::{accept_one, accept_only};
    use crate::store::lifecycle::claim::claim;
    use crate::store::lifecycle::handoff::holdings;
    use crate::store::lifecycle::operator::{Selector, release};
    use crate::store::registry::fences::{FenceScope, lift as fence_lift};
    use crate::store::testing;

    /// Accept and fan-out are separate writer jobs: a later message can be fanned out (and its
    /// delivery be claimable) before an earlier one is. The claim waits for the earlier one.
    #[test]
    fn a_later_turn_waits_for_an_earlier_one_still_owed_its_fan_out() {
        let db = testing::db();
        let c = &db.conn;
        let m1 = accept_only(c, "c", "k1", &["host-a", "host-b"]);
        let m2 = accept_only(c, "c", "k2", &["host-a"]);
        fan_out(c, &m2, 1).unwrap();
        // An earlier message routed only elsewhere does not hold host-a back.
        let other = accept_only(c, "d", "k3", &["host-b"]);
        let later = accept_only(c, "d", "k4", &["host-a"]);
        fan_out(c, &later, 1).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 2).unwrap()), [("d", 2)]);
        assert!(claim(c, "host-a", "i", 10, 2).unwrap().is_empty(), "c #2 waits for c #1's fan-out");
        fan_out(c, &m1, 3).unwrap();
        fan_out(c, &other, 3).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 4).unwrap()), [("c", 1), ("c", 2)], "both, in seq order");
        assert_eq!(turns(&claim(c, "host-b", "j", 10, 4).unwrap()), [("c", 1), ("d", 1)]);
    }

    /// Deliveries created out of seq order (fan-out of #3 before #2) are handed out by seq.
    #[test]
    fn turns_are_handed_out_by_seq_not_by_creation() {
        let db = testing::db();
        let c = &db.conn;
        let ids: Vec<String> = (1..=3).map(|i| accept_only(c, "c", &format!("k{i}"), &["host-a"])).collect();
        for i in [0, 2, 1] {
            fan_out(c, &ids[i], 1).unwrap();
        }
        assert_eq!(turns(&claim(c, "host-a", "i", 2, 2).unwrap()), [("c", 1), ("c", 2)]);
        assert_eq!(turns(&claim(c, "host-a", "i", 2, 2).unwrap()), [("c", 3)]);
    }

    /// A hold parks a conversation's queued turns; while an earlier one is held, a later one
    /// (accepted after the hold was lifted) is not handed out; after the release both go, in order.
    #[test]
    fn a_held_earlier_turn_keeps_later_ones_back() {
        let db = testing::db();
        let c = &db.conn;
        let hold = fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("c"), "look", 1).unwrap();
        let m1 = accept_one(c, "c", "k1", &["host-a"]);
        accept_one(c, "x", "k0", &["host-a"]);
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 2).unwrap()), [("x", 1)]);
        assert_eq!(state_of_msg(c, &m1).0, "held");
        fence_lift(c, hold, "op", "done", 3).unwrap();
        accept_one(c, "c", "k2", &["host-a"]);
        assert!(claim(c, "host-a", "i", 10, 4).unwrap().is_empty(), "c #2 waits behind the held c #1");
        release(c, Selector::Conversation("c"), "op", "ok", 5).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 6).unwrap()), [("c", 1), ("c", 2)]);
    }

    /// A pause of the conversation keeps every turn back, and the lift lets them go in order.
    #[test]
    fn a_paused_conversation_hands_out_nothing_until_the_lift() {
        let db = testing::db();
        let c = &db.conn;
        let pause = fence_set(c, FenceKind::Pause, FenceScope::Conversation, Some("c"), "r", 1).unwrap();
        for i in 1..=3 {
            accept_one(c, "c", &format!("k{i}"), &["host-a"]);
        }
        assert!(claim(c, "host-a", "i", 10, 2).unwrap().is_empty());
        fence_lift(c, pause, "op", "r", 3).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 4).unwrap()), [("c", 1), ("c", 2), ("c", 3)]);
    }

    /// Releasing a later held turn does not let it pass an earlier one that is still held.
    #[test]
    fn releasing_a_later_held_turn_does_not_jump_an_earlier_held_one() {
        let db = testing::db();
        let c = &db.conn;
        let hold = fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("c"), "r", 1).unwrap();
        let ms: Vec<String> = (1..=3).map(|i| accept_one(c, "c", &format!("k{i}"), &["host-a"])).collect();
        assert!(claim(c, "host-a", "i", 10, 2).unwrap().is_empty());
        for m in &ms {
            assert_eq!(state_of_msg(c, m).0, "held", "the hold parks every queued turn");
        }
        fence_lift(c, hold, "op", "r", 3).unwrap();
        let d2 = delivery_of(c, &ms[1], "host-a");
        release(c, Selector::Delivery(&d2), "op", "r", 4).unwrap();
        assert!(claim(c, "host-a", "i", 10, 5).unwrap().is_empty(), "c #2 must not pass the held c #1");
        let d1 = delivery_of(c, &ms[0], "host-a");
        release(c, Selector::Delivery(&d1), "op", "r", 6).unwrap();
        assert_eq!(turns(&claim(c, "host-a", "i", 10, 7).unwrap()), [("c", 1), ("c", 2)], "c #3 is still held");
    }

    /// 5,000 queued turns in A and 20 in B on one host: B's turns all go out while A still has
    /// almost all of its backlog, and each conversation's turns go out in seq order.
    #[test]
    fn a_deep_conversation_does_not_starve_a_light_one() {
        let db = testing::db();
        let c = &db.conn;
        c.execute_batch("BEGIN").unwrap();
        for i in 0..5_000 {
            accept_one(c, "deep", &format!("a{i}"), &["host-a"]);
        }
        for i in 0..20 {
            accept_one(c, "light", &format!("b{i}"), &["host-a"]);
        }
        c.execute_batch("COMMIT").unwrap();
        let mut seen: Vec<(String, i64)> = Vec::new();
        while seen.iter().filter(|(conv, _)| conv == "light").count() < 20 {
            let got = claim(c, "host-a", "i", 16, 2).unwrap();
            assert!(!got.is_empty());
            seen.extend(got.iter().map(|d| (d.conversation.clone(), d.seq)));
        }
        let deep = seen.iter().filter(|(conv, _)| conv == "deep").count();
        assert!(deep <= 32, "light finished after {deep} deep turns were handed out");
        for conv in ["deep", "light"] {
            let seqs: Vec<i64> = seen.iter().filter(|(c, _)| c == conv).map(|(_, s)| *s).collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{conv} in order: {seqs:?}");
        }
    }

    /// Claims of one take turns: the least recently served conversation goes first.
    #[test]
    fn single_claims_alternate_between_conversations() {
        let db = testing::db();
        let c = &db.conn;
        for i in 0..3 {
            accept_one(c, "a", &format!("a{i}"), &["host-a"]);
        }
        for i in 0..2 {
            accept_one(c, "b", &format!("b{i}"), &["host-a"]);
        }
        let mut order = Vec::new();
        for _ in 0..6 {
            order.extend(claim(c, "host-a", "i", 1, 2).unwrap().into_iter().map(|d| (d.conversation, d.seq)));
        }
        let order: Vec<(&str, i64)> = order.iter().map(|(c, s)| (c.as_str(), *s)).collect();
        assert_eq!(order, [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]);
    }

    /// A conversation that gains work after being idle is served before those that kept busy;
    /// among conversations not yet served, the one waiting longest goes first.
    #[test]
    fn a_conversation_back_from_idle_goes_first() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "b", "b0", &["host-a"]);
        for i in 0..4 {
            accept_one(c, "a", &format!("a{i}"), &["host-a"]);
        }
        // Neither served yet: the one waiting longest (b) first.
        assert_eq!(turns(&claim(c, "host-a", "i", 3, 2).unwrap()), [("b", 1), ("a", 1), ("a", 2)]);
        accept_one(c, "b", "b1", &["host-a"]);
        assert_eq!(turns(&claim(c, "host-a", "i", 1, 3).unwrap()), [("b", 2)]);
    }

    /// The claim carries the producer that wrote the turn.
    #[test]
    fn a_claim_names_the_producer() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let got = claim(&db.conn, "host-a", "i", 10, 2).unwrap();
        assert_eq!(got[0].producer.as_deref(), Some("prod"));
        assert_eq!(holdings(&db.conn, "host-a", "i").unwrap()[0].producer.as_deref(), Some("prod"));
    }

    /// A store written before the queue bookkeeping existed gets it filled by the migration,
    /// and its backlog is claimed in seq order.
    #[test]
    fn an_older_store_gets_its_queue_counts_on_upgrade() {
        use baton_shared::sqlite::{OpenOptions, Synchronous};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        {
            let opts = OpenOptions { synchronous: Synchronous::Normal, ..Default::default() };
            let old = baton_shared::sqlite::open(&path, &crate::store::MIGRATIONS[..1], opts).unwrap();
            old.execute_batch(
                "INSERT INTO hosts (name, enrolled_at) VALUES ('host-a', 1);
                 INSERT INTO host_backlog (host, waiting) VALUES ('host-a', 2);
                 INSERT INTO conversations (name, last_seq) VALUES ('c', 3);
                 INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at)
                 VALUES ('m1', 'c', 1, 'p', 'k1', 'h', '{}', 1), ('m2', 'c', 2, 'p', 'k2', 'h', '{}', 1),
                        ('m3', 'c', 3, 'p', 'k3', 'h', '{}', 1);
                 INSERT INTO message_recipients (message_id, host) VALUES ('m1', 'host-a'), ('m2', 'host-a'), ('m3', 'host-a');
                 INSERT INTO fanout_obligations (message_id, created_at, done_at) VALUES ('m1', 1, 1), ('m2', 1, 1), ('m3', 1, 1);
                 INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
                 VALUES ('d3', 'm3', 'host-a', 'c', 3, 'queued', 1, 1), ('d2', 'm2', 'host-a', 'c', 2, 'queued', 1, 1),
                        ('d1', 'm1', 'host-a', 'c', 1, 'failed', 1, 1);",
            )
            .unwrap();
        }
        let c = crate::store::open_write(&path, Synchronous::Normal).unwrap();
        let queued: i64 = c
            .query_row("SELECT queued FROM conversation_queues WHERE host = 'host-a' AND conversation = 'c'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(queued, 2);
        assert_eq!(turns(&claim(&c, "host-a", "i", 10, 2).unwrap()), [("c", 2), ("c", 3)]);
    }

    /// The per-(host, conversation) queue counts stay equal to the queued deliveries through
    /// every kind of change.
    #[test]
    fn queue_counts_follow_every_transition() {
        let db = testing::db();
        let c = &db.conn;
        let hold = fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("h"), "r", 1).unwrap();
        for i in 0..4 {
            accept_one(c, "h", &format!("h{i}"), &["host-a", "host-b"]);
            accept_one(c, "q", &format!("q{i}"), &["host-a"]);
        }
        claim(c, "host-a", "i", 3, 2).unwrap();
        fence_lift(c, hold, "op", "r", 3).unwrap();
        release(c, Selector::Conversation("h"), "op", "r", 4).unwrap();
        crate::store::lifecycle::operator::retire(c, "host-b", "op", "r", 5).unwrap();
        let mismatched: i64 = c
            .query_row(
                "SELECT count(*) FROM (
                    SELECT host, conversation, count(*) AS n FROM deliveries WHERE state = 'queued' GROUP BY host, conversation
                 ) d FULL JOIN (SELECT host, conversation, queued AS n FROM conversation_queues WHERE queued > 0) q
                   USING (host, conversation)
                 WHERE d.n IS DISTINCT FROM q.n",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(mismatched, 0);
        let total: i64 = c.query_row("SELECT sum(queued) FROM conversation_queues", [], |r| r.get(0)).unwrap();
        // host-a: the 4 of h parked and released, 1 of q left after 3 claims (the hold kept h
        // out of the claim); host-b's 4 of h failed at retire.
        assert_eq!(total, 5);
    }

    /// A claim moves its host's waiting count once for all it hands out, by as many, and
    /// answers each delivery's run and rerun as the record keeps them.
    #[test]
    fn a_claim_moves_its_host_s_waiting_count_once_for_its_batch() {
        let db = testing::db();
        let c = &*db.conn;
        for i in 0..5 {
            accept_one(c, &format!("c{i}"), &format!("k{i}"), &["host-a"]);
        }
        let waiting = || -> i64 {
            c.query_row("SELECT waiting FROM host_backlog WHERE host = 'host-a'", [], |r| r.get(0)).unwrap()
        };
        assert_eq!(waiting(), 5);
        let mut got = Vec::new();
        let writes = testing::row_writes(c, "host_backlog", || got = claim(c, "host-a", "i", 3, 1).unwrap());
        assert_eq!((got.len(), writes, waiting()), (3, 1, 2));
        for d in &got {
            let (attempt, rerun): (u32, Option<String>) = c
                .query_row("SELECT attempt, rerun FROM deliveries WHERE id = $1", [&d.delivery_id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .unwrap();
            assert_eq!((d.attempt, d.rerun.map(|r| r.as_str().to_string())), (attempt, rerun));
        }
        // A claim that finds nothing moves nothing.
        let writes =
            testing::row_writes(c, "host_backlog", || assert!(claim(c, "host-b", "j", 3, 1).unwrap().is_empty()));
        assert_eq!(writes, 0);
        assert!(crate::store::upkeep::verify::check(c).unwrap().is_empty());
    }
}

#[cfg(test)]
#[path = "../tests/pool_claims.rs"]
mod pool_claims;
