//! Acceptance, fan-out and startup repair (SPEC §3).
//!
//! Acceptance writes the message after the publish-scope check and routes it. The API and the
//! CLI fan it out in the same write job (`accept_and_fan_out`: one writer round trip, one
//! commit): one delivery per recipient, committed with the message, so an accepted message is
//! never seen half routed and a crash inside leaves neither. Its deliveries are then its
//! routing, and it keeps no routing rows and no obligation: they would be written and marked
//! done in the same transaction, protecting nothing. An accept whose fan-out runs in a later
//! transaction (`accept`, `accept_with_retry`) writes the routing (`message_recipients`,
//! `message_pool_recipients`) and a pending fan-out obligation instead; the obligation is the
//! unit of repair: fan-out is idempotent and keyed by it, and startup repair completes every
//! obligation found pending before the hub serves a claim.
//!
//! Routing: the message's `to`, or else the conversation's members at the message's `seq`
//! (`members`). A conversation that has had members accepts in `to` only current members and
//! hosts an operator allowed to be mentioned there (`mentions::allow_mention`); an open one
//! (never had members) accepts any enrolled, unretired host.
//!
//! Invariant: a message row exists iff its deliveries or its routing and obligation exist (same
//! transaction); routing rows exist only with an obligation; an obligation is done iff every
//! routed host and pool has exactly one delivery.
//!
//! A refused accept may have written before it was refused (a family adopting a new
//! conversation; on PostgreSQL the `seq` its first read drew): every caller runs it in a
//! transaction or savepoint that a refusal rolls back (the writer's job, a batch's item, the
//! CLI's transaction), so a refused post leaves no trace, not even a gap in `seq`.
//!
//! Invariant: fan-out never leaves work queued for a retired host: a recipient retired since the
//! accept gets its delivery created and, in the same transaction, failed with `host retired`.
//!
//! A new message's fan-out in the same job takes what its accept just routed and checked
//! (`Routed`: hosts, pools, whether it waits for approval); `fan_out` reads the routing rows,
//! for an obligation left pending. Both make the deliveries through
//! `create_deliveries`, so the two paths cannot drift apart, which is why acceptance and fan-out
//! share this file (about 780 lines of code; the rest is its tests).

use crate::store::By;
use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::dialect;
use crate::store::engine::params;
use crate::store::lifecycle::transition::{self, Change, adjust_backlog, record_event};
use crate::store::{
    Actor, StoreError, StoreResult, new_id, registry::hosts, registry::members, registry::producers::PostingTerms,
    state_column, upkeep::canonical,
};
use baton_shared::crash_point;
use baton_shared::states::DeliveryState::{self, Failed, Held};
use baton_shared::wire::DeliverySummary;
use sha2::{Digest, Sha256};

/// Fan-out obligations startup repair takes per look.
pub const REPAIR_BATCH: usize = 512;

/// The hosts that accepts gave claimable work: those of their queued deliveries (a duplicate
/// gave none).
pub(super) fn gained_hosts<'a>(accepts: impl Iterator<Item = &'a (Accepted, Vec<DeliverySummary>)>) -> Vec<String> {
    accepts
        .filter(|(a, _)| matches!(a, Accepted::New { .. }))
        .flat_map(|(_, ds)| ds.iter().filter(|d| d.state == baton_shared::states::DeliveryState::Queued))
        .filter_map(|d| d.host.clone())
        .collect()
}

impl Store {
    // ---- Startup and housekeeping ----

    /// Completes every fan-out obligation a crash left pending, one message per transaction.
    /// Returns how many it completed.
    pub async fn repair(&self) -> StoreResult<usize> {
        let mut done = 0;
        loop {
            let pending = self.conns.write(|c| pending_obligations(c, REPAIR_BATCH)).await?;
            if pending.is_empty() {
                return Ok(done);
            }
            for id in pending {
                let clock = self.clock.clone();
                self.conns.write(move |c| fan_out(c, &id, clock.now_ms())).await?;
                done += 1;
                crash_point("hub.repair.mid");
            }
        }
    }

    // ---- Producers ----

    /// Accepts a message and fans it out, in one transaction.
    pub async fn submit(
        &self,
        msg: NewMessage,
        retry: RetryPolicy,
        limits: AcceptLimits,
    ) -> StoreResult<(Accepted, Vec<DeliverySummary>)> {
        let clock = self.clock.clone();
        self.conns
            .write_gaining(
                move |c| accept_and_fan_out(c, &msg, retry, limits, clock.now_ms()),
                |r| gained_hosts(std::iter::once(r)),
            )
            .await
    }

    /// The operator's `send`: accepts the message and fans it out, in one transaction, and
    /// records a new message in the audit log with the operator's reason.
    pub async fn send(
        &self,
        msg: NewMessage,
        limits: AcceptLimits,
        by: By,
    ) -> StoreResult<(Accepted, Vec<DeliverySummary>)> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let accepted = accept(c, &msg, limits, clock.now_ms())?;
                let id = match &accepted {
                    Accepted::New { message_id, seq } => {
                        // A message sent by hand is an operator's act: audited, with its
                        // reason, in the accepting transaction. A replay adds nothing.
                        let subject = format!("message {message_id} conversation {} seq {seq}", msg.conversation);
                        crate::store::registry::audit::record_operator_event(
                            c,
                            "send",
                            &subject,
                            &by.operator,
                            Some(&by.reason),
                            clock.now_ms(),
                        )?;
                        message_id.clone()
                    }
                    Accepted::Duplicate { message_id, .. } => message_id.clone(),
                };
                let deliveries = fan_out(c, &id, clock.now_ms())?;
                Ok((accepted, deliveries))
            })
            .await
    }
}

/// A validated submission, ready to be accepted.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The submitting producer (from its certificate, or the operator for `send`).
    pub producer: String,
    /// The conversation.
    pub conversation: String,
    /// The producer's idempotency key.
    pub idempotency_key: String,
    /// The payload's JSON text, exactly as the producer sent it (stored and handed out as is).
    pub payload: String,
    /// The recipient hosts, deduplicated and sorted; empty (with `pools` empty too) for "the
    /// conversation's members at the message's `seq`".
    pub to: Vec<String>,
    /// The W3C `traceparent` kept with the message (version 00, checked by the caller); not
    /// part of its content. `None` only where no trace exists (tests, older callers).
    pub traceparent: Option<String>,
    /// The recipient pools, deduplicated and sorted: one delivery per pool, any member of which
    /// may claim it.
    pub pools: Vec<String>,
}

impl NewMessage {
    /// The content hash that decides "same content" for an idempotent replay. A payload without
    /// a canonical form (duplicate keys, too deep, not JSON) is `StoreError::Invalid`.
    pub fn content_hash(&self) -> StoreResult<String> {
        self.content_hash_with(RetryPolicy::default())
    }

    /// The content hash with the message's retry policy: SHA-256 over the length-prefixed
    /// conversation, the payload's canonical form (`canonical::canonical`: sorted keys, one
    /// string escape form, numbers as written) and the recipients, then, only for a field that
    /// was given, its name and value (so a message without a retry policy hashes exactly as
    /// before the policy existed, and stored keys keep matching).
    pub fn content_hash_with(&self, retry: RetryPolicy) -> StoreResult<String> {
        let payload = canonical::canonical(&self.payload).map_err(|e| StoreError::Invalid(format!("payload: {e}")))?;
        let mut h = Sha256::new();
        for part in [self.conversation.as_str(), payload.as_str()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        for host in &self.to {
            h.update((host.len() as u64).to_le_bytes());
            h.update(host.as_bytes());
        }
        // Only when given: a message without pools hashes exactly as before pools existed.
        for pool in &self.pools {
            let part = format!("pool={pool}");
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let given = [
            retry.max_attempts.map(|n| format!("max_attempts={n}")),
            retry.retry_backoff_ms.map(|ms| format!("retry_backoff_ms={ms}")),
            retry.approval_required.then(|| "approval=required".to_string()),
            retry.approval_timeout_ms.filter(|_| retry.approval_required).map(|ms| format!("approval_timeout_ms={ms}")),
            retry.deadline_ms.map(|ms| format!("deadline_ms={ms}")),
            retry.stall_ms.map(|ms| format!("stall_ms={ms}")),
        ];
        for part in given.into_iter().flatten() {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// A message's turn policy as submitted: its retries and its approval (each field absent, or
/// false, when not given). Validated by the caller against the hub's bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Runs the harness may ask for (default 1).
    pub max_attempts: Option<u32>,
    /// The first retry's backoff (default: the hub's `retry_backoff`).
    pub retry_backoff_ms: Option<u64>,
    /// `"approval": "required"`: its deliveries are parked held until it is approved or
    /// rejected (`approval`).
    pub approval_required: bool,
    /// How long an undecided approval waits before it fails the message (only with
    /// `approval_required`); `None` for no timeout.
    pub approval_timeout_ms: Option<u64>,
    /// The longest each turn may run (`deadline_ms`); `None`: the node's `exec_timeout` alone.
    pub deadline_ms: Option<u64>,
    /// The longest a running turn may go without a progress event (`stall_ms`); `None`: none.
    pub stall_ms: Option<u64>,
}

/// Bounds checked inside the acceptance transaction.
#[derive(Debug, Clone, Copy)]
pub struct AcceptLimits {
    /// Most deliveries waiting (queued or held) per host.
    pub queued_per_host_max: u64,
    /// Most deliveries queued per pool (`limits.queued_per_pool_max`).
    pub queued_per_pool_max: u64,
}

/// What an accept did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// A new message was committed; fan-out must follow.
    New {
        /// Its id.
        message_id: String,
        /// Its sequence number.
        seq: i64,
    },
    /// The same key and content were accepted before; nothing was added.
    Duplicate {
        /// The original message's id.
        message_id: String,
        /// Its sequence number.
        seq: i64,
    },
}

/// The acceptance transaction: scope check, message, routing, obligation. Call inside a write
/// transaction.
pub fn accept(conn: &dyn Db, msg: &NewMessage, limits: AcceptLimits, now_ms: i64) -> StoreResult<Accepted> {
    accept_with_retry(conn, msg, RetryPolicy::default(), limits, now_ms)
}

/// `accept` for a message with a retry policy (stored with the message, and part of its content
/// hash only for the fields given).
pub fn accept_with_retry(
    conn: &dyn Db,
    msg: &NewMessage,
    retry: RetryPolicy,
    limits: AcceptLimits,
    now_ms: i64,
) -> StoreResult<Accepted> {
    let (accepted, routed) = accept_routed(conn, msg, retry, limits, now_ms, &mut PostingTerms::default())?;
    if let (Accepted::New { message_id, .. }, Some(routed)) = (&accepted, routed) {
        // Its fan-out runs in a later transaction: what it owes is written down for it.
        owe_fan_out(conn, message_id, &routed, now_ms)?;
    }
    Ok(accepted)
}

/// Writes a new message's routing (its recipient hosts and pools) and its pending fan-out
/// obligation, for a fan-out that runs after this transaction commits (`fan_out`, or the
/// start-up repair). A message fanned out in its accept's own transaction has neither: its
/// deliveries are its routing, committed with it.
fn owe_fan_out(conn: &dyn Db, message_id: &str, routed: &Routed, now_ms: i64) -> StoreResult<()> {
    let mut route = conn.prepare_cached("INSERT INTO message_recipients (message_id, host) VALUES ($1, $2)")?;
    for host in &routed.hosts {
        route.execute_unread([message_id, host])?;
    }
    let mut route_pools =
        conn.prepare_cached("INSERT INTO message_pool_recipients (message_id, pool) VALUES ($1, $2)")?;
    for pool in &routed.pools {
        route_pools.execute_unread([message_id, pool])?;
    }
    conn.prepare_cached("INSERT INTO fanout_obligations (message_id, created_at) VALUES ($1, $2)")?
        .execute_unread(params![message_id, now_ms])?;
    Ok(())
}

/// What the accept of a new message routed: the deliveries a fan-out in the same transaction
/// makes, or the routing a later fan-out owes (`owe_fan_out`).
struct Routed {
    /// The recipient hosts, each active (`route` checked them), in order, without repeats.
    hosts: Vec<String>,
    /// The recipient pools, in order, without repeats.
    pools: Vec<String>,
    /// Whether its deliveries wait for an approval (held).
    held: bool,
}

/// `accept_with_retry`, and for a new message what it routed.
fn accept_routed(
    conn: &dyn Db,
    msg: &NewMessage,
    retry: RetryPolicy,
    limits: AcceptLimits,
    now_ms: i64,
    terms: &mut PostingTerms,
) -> StoreResult<(Accepted, Option<Routed>)> {
    terms.check_may_post(conn, &msg.producer, &msg.conversation)?;
    let hash = msg.content_hash_with(retry)?;
    // What the accept reads before it writes, in one statement (`dialect::ACCEPT_PRELUDE`): the
    // message already accepted under this key, whether the conversation exists, whether it has
    // members, the first named recipient's standing and waiting count, and on PostgreSQL the
    // new message's `seq`, drawn there when the conversation exists and the key is new.
    let first_to = msg.to.first();
    let p = conn.prepare_cached(dialect::ACCEPT_PRELUDE.of(conn))?.query_row(
        params![msg.producer, msg.idempotency_key, msg.conversation, first_to],
        |r| {
            let read = standing_of(r.get(5)?, r.get(6)?, r.get(7)?);
            Ok(Prelude {
                earlier: (r.get(0)?, r.get(1)?, r.get(2)?),
                conversation: Conversation { known: r.get(3)?, managed: r.get(4)?, first_to: first_to.map(|_| read) },
                drawn_seq: r.get(8)?,
            })
        },
    )?;
    let (id, seq, old_hash) = p.earlier;
    if let (Some(message_id), Some(seq), Some(old_hash)) = (id, seq, old_hash) {
        if old_hash == hash {
            return Ok((Accepted::Duplicate { message_id, seq }, None));
        }
        return Err(StoreError::IdempotencyConflict(format!(
            "idempotency_key {:?} was already used by producer {} for different content (message {message_id})",
            msg.idempotency_key, msg.producer
        )));
    }
    terms.check_quota(conn, &msg.producer, msg.payload.len())?;
    let (recipients, pools) = route(conn, msg, p.conversation)?;
    for (i, pool) in pools.iter().enumerate() {
        if !crate::store::registry::pools::exists(conn, pool)? {
            return Err(StoreError::Invalid(format!(
                "pools[{i}]: no pool {pool:?} (an operator makes one with `baton-hub pools add`)"
            )));
        }
        let queued: i64 = conn
            .prepare_cached("SELECT coalesce(sum(queued), 0) FROM pool_queues WHERE pool = $1")?
            .query_row([pool], |r| r.get(0))?;
        if queued as u64 >= limits.queued_per_pool_max {
            return Err(StoreError::OverCapacity(format!(
                "pool {pool} already has {queued} deliveries queued (queued_per_pool_max = {})",
                limits.queued_per_pool_max
            )));
        }
    }
    for (host, waiting) in &recipients {
        if *waiting as u64 >= limits.queued_per_host_max {
            return Err(StoreError::OverCapacity(format!(
                "host {host} already has {waiting} deliveries waiting (queued_per_host_max = {})",
                limits.queued_per_host_max
            )));
        }
    }
    // A refusal above undoes a `seq` the prelude drew, with the rest of the job or batch item.
    let seq: i64 = match p.drawn_seq {
        Some(seq) => seq,
        None => conn
            .prepare_cached(
                "INSERT INTO conversations (name, last_seq) VALUES ($1, 1)
                 ON CONFLICT (name) DO UPDATE SET last_seq = conversations.last_seq + 1 RETURNING last_seq",
            )?
            .query_row([&msg.conversation], |r| r.get(0))?,
    };
    let message_id = new_id();
    conn.prepare_cached(
        "INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at,
                               max_attempts, retry_backoff_ms, approval, approval_timeout_ms, approval_expires_at,
                               deadline_ms, stall_ms, traceparent)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )?
    .execute_unread(params![
        message_id,
        msg.conversation,
        seq,
        msg.producer,
        msg.idempotency_key,
        hash,
        msg.payload,
        now_ms,
        retry.max_attempts.unwrap_or(1),
        retry.retry_backoff_ms.map(|ms| ms as i64),
        if retry.approval_required { "required" } else { "none" },
        retry.approval_timeout_ms.filter(|_| retry.approval_required).map(|ms| ms as i64),
        retry
            .approval_timeout_ms
            .filter(|_| retry.approval_required)
            .map(|ms| now_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))),
        retry.deadline_ms.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        retry.stall_ms.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        msg.traceparent,
    ])?;
    crash_point("hub.accept.after_message_insert");
    crash_point("hub.accept.before_commit");
    let sorted = |mut v: Vec<String>| {
        v.sort_unstable();
        v.dedup();
        v
    };
    let hosts = recipients.into_iter().map(|(host, _)| host).collect();
    let routed = Routed { hosts: sorted(hosts), pools: sorted(pools), held: retry.approval_required };
    Ok((Accepted::New { message_id, seq }, Some(routed)))
}

/// Accepts a message and fans it out in the same transaction: one writer job for both. A
/// replay (`Accepted::Duplicate`) fans out nothing new and answers the message's deliveries
/// (completing its obligation if one was left pending). Call inside a write transaction.
pub fn accept_and_fan_out(
    conn: &dyn Db,
    msg: &NewMessage,
    retry: RetryPolicy,
    limits: AcceptLimits,
    now_ms: i64,
) -> StoreResult<(Accepted, Vec<DeliverySummary>)> {
    accept_and_fan_out_with(conn, msg, retry, limits, now_ms, &mut PostingTerms::default())
}

/// `accept_and_fan_out` checking the post against `terms`, which a batch of one producer's
/// posts reads once for all of them.
pub fn accept_and_fan_out_with(
    conn: &dyn Db,
    msg: &NewMessage,
    retry: RetryPolicy,
    limits: AcceptLimits,
    now_ms: i64,
    terms: &mut PostingTerms,
) -> StoreResult<(Accepted, Vec<DeliverySummary>)> {
    let (accepted, routed) = accept_routed(conn, msg, retry, limits, now_ms, terms)?;
    let deliveries = match (&accepted, routed) {
        // Just written: no delivery yet, no approval decided, no obligation (this is its fan-out).
        (Accepted::New { message_id, seq }, Some(routed)) => {
            crash_point("hub.fanout.before_first");
            let parked = routed.held.then(|| (Held, APPROVAL_REQUIRED.to_string()));
            let to = Recipients { hosts: &routed.hosts, pools: &routed.pools, in_accept: true };
            // The answer is what was made (the message is new: it has no other delivery).
            create_deliveries(conn, message_id, &msg.conversation, *seq, to, parked.as_ref(), now_ms)?
        }
        (Accepted::New { message_id, .. } | Accepted::Duplicate { message_id, .. }, _) => {
            fan_out(conn, message_id, now_ms)?
        }
    };
    Ok((accepted, deliveries))
}

/// A recipient host and how many deliveries wait for it.
type Waiting = (String, i64);

/// What the accept read of a message's conversation before routing it.
#[derive(Debug, Clone, Copy)]
struct Conversation {
    /// It has a row (a message, a member, a family adopted it).
    known: bool,
    /// It has had members, hosts or pools (`members::has_membership`).
    managed: bool,
    /// The standing and waiting count of `to[0]`, when the message names hosts.
    first_to: Option<(hosts::Standing, i64)>,
}

/// What `dialect::ACCEPT_PRELUDE` answers.
struct Prelude {
    /// The message accepted earlier under the key: its id, `seq` and content hash.
    earlier: (Option<String>, Option<i64>, Option<String>),
    conversation: Conversation,
    /// The new message's `seq`, when the statement drew it (PostgreSQL, an existing
    /// conversation, a new key).
    drawn_seq: Option<i64>,
}

/// A host's standing from whether it is enrolled and retired, with its waiting count.
fn standing_of(enrolled: bool, retired: bool, waiting: i64) -> (hosts::Standing, i64) {
    let standing = match (enrolled, retired) {
        (false, _) => hosts::Standing::NotEnrolled,
        (true, true) => hosts::Standing::Retired,
        (true, false) => hosts::Standing::Active,
    };
    (standing, waiting)
}

/// The recipients of a new message, hosts and pools: its `to`, checked, and its `pools`; or,
/// when it names neither, the conversation's current members (the members at the `seq` this
/// transaction is about to give it, retired hosts left out) and its current member pools. Each
/// host comes with its waiting count, read with its standing.
fn route(conn: &dyn Db, msg: &NewMessage, conversation: Conversation) -> StoreResult<(Vec<Waiting>, Vec<String>)> {
    // A conversation first posted to now joins the families that cover it, from its first post
    // (and then has members it did not have when read).
    let adopted =
        !conversation.known && crate::store::registry::families::adopt_families_of_new(conn, &msg.conversation)?;
    if msg.to.is_empty() && !msg.pools.is_empty() {
        // Addressed to pools alone: no host by name, and not the members.
        return Ok((Vec::new(), msg.pools.clone()));
    }
    let managed = if adopted { members::has_membership(conn, &msg.conversation)? } else { conversation.managed };
    if msg.to.is_empty() {
        let mut current = Vec::new();
        for host in crate::store::registry::roster::current_members(conn, &msg.conversation)? {
            if let (hosts::Standing::Active, waiting) = standing_and_waiting(conn, &host)? {
                current.push((host, waiting));
            }
        }
        let pools = crate::store::registry::member_pools::current(conn, &msg.conversation)?;
        if current.is_empty() && pools.is_empty() {
            let why = if managed { "has no current members" } else { "has no members" };
            return Err(StoreError::NoRecipients(format!(
                "to: the message names no recipient hosts and conversation {:?} {why} \
                 (give \"to\": [\"host\", …] or \"pools\", or make hosts or pools members of the conversation)",
                msg.conversation
            )));
        }
        return Ok((current, pools));
    }
    let current =
        if managed { crate::store::registry::roster::current_members(conn, &msg.conversation)? } else { Vec::new() };
    let mut checked = Vec::with_capacity(msg.to.len());
    for (i, host) in msg.to.iter().enumerate() {
        let read = if i == 0 { conversation.first_to } else { None };
        checked.push((host.clone(), check_recipient(conn, i, host, read)?));
        if managed
            && current.binary_search(host).is_err()
            && !crate::store::registry::mentions::mention_allowed(conn, &msg.conversation, host)?
        {
            return Err(StoreError::Invalid(format!(
                "to[{i}]: host {host:?} is not a member of conversation {:?}, and no operator allowed it to be \
                 mentioned there (`baton-hub members allow-mention`)",
                msg.conversation
            )));
        }
    }
    Ok((checked, msg.pools.clone()))
}

/// Refuses `to[index]` when its host is not enrolled or is retired (as
/// `hosts::require_active`); else its waiting count. `read` is its standing and waiting count
/// when already read in this transaction (the prelude reads `to[0]`'s).
fn check_recipient(conn: &dyn Db, index: usize, host: &str, read: Option<(hosts::Standing, i64)>) -> StoreResult<i64> {
    let read = match read {
        Some(read) => read,
        None => standing_and_waiting(conn, host)?,
    };
    match read {
        (hosts::Standing::NotEnrolled, _) => {
            Err(StoreError::Invalid(format!("to[{index}]: host {host:?} is not enrolled")))
        }
        (hosts::Standing::Retired, _) => Err(StoreError::Invalid(format!("to[{index}]: host {host:?} is retired"))),
        (hosts::Standing::Active, waiting) => Ok(waiting),
    }
}

/// A recipient host's standing (`hosts::standing`) and its waiting count (`host_backlog`; 0
/// without a row), in one read.
fn standing_and_waiting(conn: &dyn Db, host: &str) -> StoreResult<(hosts::Standing, i64)> {
    let (enrolled, retired, waiting): (bool, bool, i64) = conn
        .prepare_cached(
            "SELECT h.name IS NOT NULL, h.retired_at IS NOT NULL, coalesce(b.waiting, 0)
             FROM (SELECT 1 AS one) o
             LEFT JOIN hosts h ON h.name = $1
             LEFT JOIN host_backlog b ON b.host = $1",
        )?
        .query_row([host], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(standing_of(enrolled, retired, waiting))
}

/// Fan-out for one message: one queued delivery per routed host that has none yet, then the
/// obligation is marked done. A host retired since the accept gets its delivery failed with
/// `host retired` in the same transaction, so no queued work is left that no node will claim.
/// Idempotent. Returns the message's deliveries.
pub fn fan_out(conn: &dyn Db, message_id: &str, now_ms: i64) -> StoreResult<Vec<DeliverySummary>> {
    let pending: Option<Option<i64>> = conn
        .prepare_cached("SELECT done_at FROM fanout_obligations WHERE message_id = $1")?
        .query_row([message_id], |r| r.get(0))
        .optional()?;
    if let Some(None) = pending {
        crash_point("hub.fanout.before_first");
        let (conversation, seq): (String, i64) = conn
            .prepare_cached("SELECT conversation, seq FROM messages WHERE id = $1")?
            .query_row([message_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let missing: Vec<String> = conn
            .prepare_cached(
                "SELECT r.host FROM message_recipients r
                 WHERE r.message_id = $1
                   AND NOT EXISTS (SELECT 1 FROM deliveries d
                                   WHERE d.message_id = r.message_id AND d.host = r.host AND d.pool IS NULL)
                 ORDER BY r.host",
            )?
            .query_map([message_id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let missing_pools: Vec<String> = conn
            .prepare_cached(
                "SELECT r.pool FROM message_pool_recipients r
                 WHERE r.message_id = $1
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = r.message_id AND d.pool = r.pool)
                 ORDER BY r.pool",
            )?
            .query_map([message_id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        // Read once per message: every delivery of it is parked the same way.
        let parked = if missing.is_empty() && missing_pools.is_empty() { None } else { parking(conn, message_id)? };
        let to = Recipients { hosts: &missing, pools: &missing_pools, in_accept: false };
        create_deliveries(conn, message_id, &conversation, seq, to, parked.as_ref(), now_ms)?;
    }
    // A repair may have made some of them: all of the message's, read.
    deliveries_of(conn, message_id)
}

/// The recipients a fan-out makes deliveries for (each has none yet).
struct Recipients<'a> {
    hosts: &'a [String],
    pools: &'a [String],
    /// Whether the fan-out runs in its message's accept transaction: every host is then known
    /// to be active (the routing checked them), and the message owes no obligation to mark
    /// done (it has none: its deliveries are its routing).
    in_accept: bool,
}

/// Makes one delivery per recipient of `to`, each queued and then parked as `parked` says (a
/// host retired since the accept fails its delivery instead), and marks the message's fan-out
/// done; a message whose deliveries are then all final settles (`settle`). Returns the
/// deliveries made, as `deliveries_of` orders them when `to`'s hosts and pools are sorted.
fn create_deliveries(
    conn: &dyn Db,
    message_id: &str,
    conversation: &str,
    seq: i64,
    to: Recipients<'_>,
    parked: Option<&(DeliveryState, String)>,
    now_ms: i64,
) -> StoreResult<Vec<DeliverySummary>> {
    let hub = Actor::hub();
    let mut made = Vec::with_capacity(to.hosts.len() + to.pools.len());
    let mut made_pools = Vec::with_capacity(to.pools.len());
    let summary = |delivery_id: String, host: Option<&String>, pool: Option<&String>, state: DeliveryState| {
        DeliverySummary { delivery_id, host: host.cloned(), pool: pool.cloned(), state }
    };
    // Whether a delivery made here is left queued or held: then the message cannot settle.
    // Each is, but for one failed for a retired host or by a refused approval.
    let parked_open = !matches!(parked, Some((Failed, _)));
    let mut any_open = false;
    // A new delivery moved on from queued at once: parked, or failed for a retired host.
    let park = |id: &str, to: DeliveryState, why: &str| {
        let change = Change {
            delivery_id: id,
            from: DeliveryState::Queued,
            to,
            expect_holder: None,
            new_holder: None,
            reason: Some(why),
        };
        transition::apply(conn, change, &hub, now_ms)
    };
    for pool in to.pools {
        // Its host stays unset until a member's claim binds it; it waits in the pool's
        // queue, not a host's backlog.
        let id = new_id();
        conn.prepare_cached(
            "INSERT INTO deliveries (id, message_id, pool, conversation, seq, state, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, 'queued', $6, $6)",
        )?
        .execute_unread(params![id, message_id, pool, conversation, seq, now_ms])?;
        record_event(conn, &id, None, DeliveryState::Queued, &hub, None, Some("fan-out"), now_ms)?;
        let mut state = DeliveryState::Queued;
        if let Some((to, why)) = parked {
            park(&id, *to, why)?;
            state = *to;
        }
        any_open |= parked_open;
        made_pools.push(summary(id, None, Some(pool), state));
        crash_point("hub.fanout.after_k");
    }
    for host in to.hosts {
        let id = new_id();
        conn.prepare_cached(
            "INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, 'queued', $6, $6)",
        )?
        .execute_unread(params![id, message_id, host, conversation, seq, now_ms])?;
        record_event(conn, &id, None, DeliveryState::Queued, &hub, None, Some("fan-out"), now_ms)?;
        adjust_backlog(conn, host, 1)?;
        let mut state = DeliveryState::Queued;
        if !to.in_accept && host_retired(conn, host)? {
            park(&id, DeliveryState::Failed, HOST_RETIRED)?;
            state = DeliveryState::Failed;
        } else {
            if let Some((to, why)) = parked {
                park(&id, *to, why)?;
                state = *to;
            }
            any_open |= parked_open;
        }
        made.push(summary(id, Some(host), None, state));
        crash_point("hub.fanout.after_k");
    }
    made.append(&mut made_pools);
    crash_point("hub.fanout.before_mark_done");
    if !to.in_accept {
        conn.prepare_cached("UPDATE fanout_obligations SET done_at = $2 WHERE message_id = $1 AND done_at IS NULL")?
            .execute_unread(params![message_id, now_ms])?;
    }
    // Every delivery made here final (each recipient retired, or the approval refused), or none
    // made (a repair that found them all): the message may be settled now.
    if !any_open {
        crate::store::lifecycle::settle::message(conn, message_id, now_ms)?;
    }
    Ok(made)
}

/// The reason a delivery awaiting approval is held with.
pub const APPROVAL_REQUIRED: &str = "approval required";

/// How fan-out parks a new delivery of `message_id`: held awaiting approval, failed when the
/// approval was already refused, or `None` (queued) when the message needs none or was approved.
fn parking(conn: &dyn Db, message_id: &str) -> StoreResult<Option<(DeliveryState, String)>> {
    let row: Option<(String, Option<String>, Option<String>)> = conn
        .prepare_cached("SELECT approval, approval_decision, approval_reason FROM messages WHERE id = $1")?
        .query_row([message_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(match row {
        Some((a, None, _)) if a == "required" => Some((Held, APPROVAL_REQUIRED.to_string())),
        Some((_, Some(d), why)) if d != "approved" => Some((Failed, why.unwrap_or(d))),
        _ => None,
    })
}

/// The reason a delivery for a retired host carries.
pub const HOST_RETIRED: &str = "host retired";

/// Whether `host` is retired (an unknown host counts as retired: no node can claim for it).
fn host_retired(conn: &dyn Db, host: &str) -> StoreResult<bool> {
    Ok(hosts::standing(conn, host)? != hosts::Standing::Active)
}

/// The deliveries of one message: its host deliveries by host, then its pool deliveries by pool.
pub fn deliveries_of(conn: &dyn Db, message_id: &str) -> StoreResult<Vec<DeliverySummary>> {
    let rows = conn
        .prepare_cached(
            "SELECT id, host, state, pool FROM deliveries WHERE message_id = $1
             ORDER BY pool IS NOT NULL, pool, host",
        )?
        .query_map([message_id], |r| {
            let delivery_id: String = r.get(0)?;
            Ok(DeliverySummary {
                state: state_column(r, 2, "deliveries", &delivery_id)?,
                delivery_id,
                host: r.get(1)?,
                pool: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Message ids whose fan-out a crash left pending, oldest first.
pub fn pending_obligations(conn: &dyn Db, limit: usize) -> StoreResult<Vec<String>> {
    let ids = conn
        .prepare_cached(
            "SELECT o.message_id FROM fanout_obligations o JOIN messages m ON m.id = o.message_id
             WHERE o.done_at IS NULL ORDER BY m.accepted_at, m.id LIMIT $1",
        )?
        .query_map([limit as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(ids)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Accepts and fans out one message, returning its id.
    pub(crate) fn accept_one(conn: &dyn Db, conversation: &str, key: &str, to: &[&str]) -> String {
        let message_id = accept_only(conn, conversation, key, to);
        fan_out(conn, &message_id, 1).unwrap();
        message_id
    }

    /// Accepts one message without fanning it out (its obligation stays pending), returning its
    /// id. An empty `to` routes to the conversation's members.
    pub(crate) fn accept_only(conn: &dyn Db, conversation: &str, key: &str, to: &[&str]) -> String {
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: conversation.into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: to.iter().map(|s| s.to_string()).collect(),
            pools: Vec::new(),
        };
        let Accepted::New { message_id, .. } =
            accept(conn, &msg, AcceptLimits { queued_per_host_max: 1 << 40, queued_per_pool_max: 1 << 40 }, 1).unwrap()
        else {
            panic!("duplicate")
        };
        message_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    fn msg(key: &str, payload: &str, to: &[&str]) -> NewMessage {
        NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "c1".into(),
            idempotency_key: key.into(),
            payload: payload.into(),
            to: to.iter().map(|s| s.to_string()).collect(),
            pools: Vec::new(),
        }
    }
    const BIG: AcceptLimits = AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 };

    /// Each recipient's standing and waiting count are read together: an unknown or retired
    /// host in `to` is refused by its place, a full host is over capacity, and a retired member
    /// is left out of a post to the members.
    #[test]
    fn recipients_are_checked_for_standing_and_room() {
        let db = testing::db();
        let c = &*db.conn;
        let one = AcceptLimits { queued_per_host_max: 1, queued_per_pool_max: 1000 };
        let post = |m: &NewMessage| accept_and_fan_out(c, m, RetryPolicy::default(), one, 1).map(|(a, _)| a);
        let refused = |m: &NewMessage| match post(m) {
            Err(StoreError::Invalid(e)) => e,
            other => panic!("not refused as invalid: {other:?}"),
        };
        assert_eq!(refused(&msg("k1", "{}", &["host-a", "nope"])), "to[1]: host \"nope\" is not enrolled");
        let both = ["host-b".to_string(), "host-c".to_string()];
        crate::store::registry::members::add(c, "c2", &both, "op", "r", 1).unwrap();
        crate::store::lifecycle::operator::retire(c, "host-c", "op", "r", 1).unwrap();
        assert_eq!(refused(&msg("k2", "{}", &["host-c"])), "to[0]: host \"host-c\" is retired");
        assert!(matches!(post(&msg("k3", "{}", &["host-a"])).unwrap(), Accepted::New { .. }));
        match post(&msg("k4", "{}", &["host-b", "host-a"])) {
            Err(StoreError::OverCapacity(e)) => {
                assert_eq!(e, "host host-a already has 1 deliveries waiting (queued_per_host_max = 1)")
            }
            other => panic!("not over capacity: {other:?}"),
        }
        // To the members: the retired one gets nothing.
        let members = NewMessage { conversation: "c2".into(), ..msg("k5", "{}", &[]) };
        let (_, made) = accept_and_fan_out(c, &members, RetryPolicy::default(), one, 3).unwrap();
        let hosts: Vec<&str> = made.iter().filter_map(|d| d.host.as_deref()).collect();
        assert_eq!(hosts, ["host-b"]);
    }

    /// A message without a retry policy hashes as before the policy existed (stored keys keep
    /// matching their replays); a policy is part of the content once given, and stored.
    #[test]
    fn the_retry_policy_is_content_only_when_given() {
        let m = msg("k", "1", &["host-a"]);
        // Computed from the encoding before the policy existed.
        let before = {
            let mut h = Sha256::new();
            for part in ["c1", "1", "host-a"] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
            h.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        assert_eq!(m.content_hash().unwrap(), before);
        assert_eq!(m.content_hash_with(RetryPolicy::default()).unwrap(), before);
        let three = RetryPolicy { max_attempts: Some(3), retry_backoff_ms: None, ..RetryPolicy::default() };
        assert_ne!(m.content_hash_with(three).unwrap(), before);
        let db = testing::db();
        let Accepted::New { message_id, .. } = accept_with_retry(&db.conn, &m, three, BIG, 1).unwrap() else {
            panic!()
        };
        assert!(matches!(accept_with_retry(&db.conn, &m, three, BIG, 2).unwrap(), Accepted::Duplicate { .. }));
        assert!(matches!(accept(&db.conn, &m, BIG, 2), Err(StoreError::IdempotencyConflict(_))));
        let stored: (u32, Option<i64>) = db
            .conn
            .query_row("SELECT max_attempts, retry_backoff_ms FROM messages WHERE id = $1", [&message_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(stored, (3, None));
    }

    #[test]
    fn accept_then_fan_out_creates_one_delivery_per_host() {
        let db = testing::db();
        let Accepted::New { message_id, seq } =
            accept(&db.conn, &msg("k", "1", &["host-a", "host-b"]), BIG, 5).unwrap()
        else {
            panic!()
        };
        assert_eq!(seq, 1);
        assert!(deliveries_of(&db.conn, &message_id).unwrap().is_empty());
        assert_eq!(pending_obligations(&db.conn, 10).unwrap(), vec![message_id.clone()]);
        let d = fan_out(&db.conn, &message_id, 6).unwrap();
        assert_eq!(d.len(), 2);
        assert!(d.iter().all(|d| d.state == DeliveryState::Queued));
        // Repair is idempotent: a second fan-out adds nothing.
        assert_eq!(fan_out(&db.conn, &message_id, 7).unwrap(), d);
        assert!(pending_obligations(&db.conn, 10).unwrap().is_empty());
    }

    #[test]
    fn accept_and_fan_out_completes_the_obligation_in_the_same_transaction() {
        let db = testing::db();
        let c = &db.conn;
        let limits = AcceptLimits { queued_per_host_max: 10, queued_per_pool_max: 10 };
        let m = msg("k", "{}", &["host-a", "host-b"]);
        let (accepted, deliveries) = accept_and_fan_out(c, &m, RetryPolicy::default(), limits, 1).unwrap();
        assert!(matches!(accepted, Accepted::New { .. }));
        let hosts: Vec<&str> = deliveries.iter().filter_map(|d| d.host.as_deref()).collect();
        assert_eq!(hosts, ["host-a", "host-b"]);
        // Made in the accept's own transaction, its deliveries are its routing: no obligation
        // and no routing rows were written for it.
        let count = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(count("SELECT count(*) FROM fanout_obligations"), 0);
        assert_eq!(count("SELECT count(*) FROM message_recipients"), 0);
        assert_eq!(count("SELECT count(*) FROM message_pool_recipients"), 0);
        assert_eq!(crate::store::upkeep::verify::check(c).unwrap(), Vec::new());
        // A replay answers the same deliveries and adds none.
        let (again, same) = accept_and_fan_out(c, &m, RetryPolicy::default(), limits, 2).unwrap();
        assert!(matches!(again, Accepted::Duplicate { .. }));
        assert_eq!(same, deliveries);
        // A replay of a message whose obligation was left pending completes it.
        let left = super::testing::accept_only(c, "c", "left", &["host-a"]);
        assert_eq!(pending_obligations(c, 10).unwrap(), vec![left.clone()]);
        let replay = NewMessage { conversation: "c".into(), ..msg("left", "{}", &["host-a"]) };
        let (_, fanned) = accept_and_fan_out(c, &replay, RetryPolicy::default(), limits, 3).unwrap();
        assert_eq!(fanned.len(), 1);
        assert!(pending_obligations(c, 10).unwrap().is_empty());
    }

    #[test]
    fn replay_and_conflict() {
        let db = testing::db();
        let first = accept(&db.conn, &msg("k", "1", &["host-a"]), BIG, 5).unwrap();
        let Accepted::New { message_id, seq } = first else { panic!() };
        assert_eq!(
            accept(&db.conn, &msg("k", "1", &["host-a"]), BIG, 6).unwrap(),
            Accepted::Duplicate { message_id, seq }
        );
        assert!(matches!(
            accept(&db.conn, &msg("k", "2", &["host-a"]), BIG, 6),
            Err(StoreError::IdempotencyConflict(_))
        ));
        assert!(matches!(
            accept(&db.conn, &msg("k", "1", &["host-b"]), BIG, 6),
            Err(StoreError::IdempotencyConflict(_))
        ));
        let n: i64 = db.conn.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        // A replay and a conflict draw no `seq` (nothing rolls them back: they write nothing).
        let last: i64 = db
            .conn
            .query_row("SELECT c.last_seq FROM conversations c JOIN messages m ON m.conversation = c.name", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(last, seq);
        let Accepted::New { seq: next, .. } = accept(&db.conn, &msg("k2", "1", &["host-a"]), BIG, 7).unwrap() else {
            panic!("a new key is a new message")
        };
        assert_eq!(next, seq + 1);
    }

    #[test]
    fn unknown_host_is_named_and_capacity_is_bounded() {
        let db = testing::db();
        let e = accept(&db.conn, &msg("k", "1", &["host-a", "nope"]), BIG, 5).unwrap_err();
        assert!(e.to_string().contains("to[1]") && e.to_string().contains("nope"), "{e}");
        let small = AcceptLimits { queued_per_host_max: 1, queued_per_pool_max: 1 };
        let Accepted::New { message_id, .. } = accept(&db.conn, &msg("k1", "1", &["host-a"]), small, 5).unwrap() else {
            panic!()
        };
        fan_out(&db.conn, &message_id, 5).unwrap();
        assert!(matches!(accept(&db.conn, &msg("k2", "1", &["host-a"]), small, 5), Err(StoreError::OverCapacity(_))));
    }

    /// A recipient retired between the accept and the fan-out (or the repair) gets its delivery
    /// created and failed with `host retired` in the same transaction: never queued work that
    /// no node will claim.
    #[test]
    fn fan_out_to_a_host_retired_meanwhile_fails_its_delivery() {
        let db = testing::db();
        let Accepted::New { message_id, .. } = accept(&db.conn, &msg("k", "1", &["host-a", "host-b"]), BIG, 5).unwrap()
        else {
            panic!()
        };
        crate::store::lifecycle::operator::retire(&db.conn, "host-b", "op", "gone", 6).unwrap();
        let d = fan_out(&db.conn, &message_id, 7).unwrap();
        let states: Vec<(&str, DeliveryState)> =
            d.iter().map(|d| (d.host.as_deref().unwrap_or("-"), d.state)).collect();
        assert_eq!(states, [("host-a", DeliveryState::Queued), ("host-b", DeliveryState::Failed)]);
        let (reason, waiting): (String, i64) = db
            .conn
            .query_row(
                "SELECT d.reason, b.waiting FROM deliveries d JOIN host_backlog b ON b.host = d.host WHERE d.host = 'host-b'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((reason.as_str(), waiting), (HOST_RETIRED, 0));
        assert!(pending_obligations(&db.conn, 10).unwrap().is_empty());
        assert_eq!(crate::store::upkeep::verify::check(&db.conn).unwrap(), Vec::new(), "a history verify accepts");
        // A message for the retired host alone: its only delivery is final at once, so the
        // fan-out settles it (host-a's message above stays unsettled).
        let Accepted::New { message_id: lone, .. } = accept(&db.conn, &msg("k2", "2", &["host-a"]), BIG, 8).unwrap()
        else {
            panic!()
        };
        db.conn.execute("UPDATE message_recipients SET host = 'host-b' WHERE message_id = $1", [&lone]).unwrap();
        fan_out(&db.conn, &lone, 9).unwrap();
        let settled = |id: &str| -> Option<i64> {
            db.conn.query_row("SELECT settled_at FROM messages WHERE id = $1", [id], |r| r.get(0)).unwrap()
        };
        assert_eq!((settled(&message_id), settled(&lone)), (None, Some(9)));
        assert_eq!(crate::store::upkeep::verify::check(&db.conn).unwrap(), Vec::new());
    }

    #[test]
    fn sequence_numbers_are_per_conversation() {
        let db = testing::db();
        let mut m = msg("a", "1", &["host-a"]);
        let Accepted::New { seq: s1, .. } = accept(&db.conn, &m, BIG, 1).unwrap() else { panic!() };
        m.idempotency_key = "b".into();
        let Accepted::New { seq: s2, .. } = accept(&db.conn, &m, BIG, 1).unwrap() else { panic!() };
        m.idempotency_key = "c".into();
        m.conversation = "other".into();
        let Accepted::New { seq: s3, .. } = accept(&db.conn, &m, BIG, 1).unwrap() else { panic!() };
        assert_eq!((s1, s2, s3), (1, 2, 1));
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;
    use crate::store::testing;

    const BIG: AcceptLimits = AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 };

    fn msg(key: &str, to: &[&str], pools: &[&str]) -> NewMessage {
        NewMessage {
            producer: "prod".into(),
            conversation: "c1".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: to.iter().map(|s| s.to_string()).collect(),
            pools: pools.iter().map(|s| s.to_string()).collect(),
            traceparent: None,
        }
    }

    fn gpu(c: &dyn Db) {
        crate::store::registry::pools::add(c, "gpu", &["host-a".into(), "host-b".into()], "op", "r", 1).unwrap();
    }

    fn one(c: &dyn Db, sql: &str, arg: &str) -> i64 {
        c.query_row(sql, [arg], |r| r.get(0)).unwrap()
    }

    /// A message to a pool is one queued delivery with no host and the pool set, counted in
    /// the pool's queue and no host's backlog; beside `to`, one delivery per host as well.
    #[test]
    fn a_pool_recipient_is_one_delivery_with_no_host_in_the_pool_s_queue() {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        let (accepted, ds) =
            accept_and_fan_out(c, &msg("k1", &["host-c"], &["gpu"]), RetryPolicy::default(), BIG, 5).unwrap();
        assert!(matches!(accepted, Accepted::New { .. }));
        assert_eq!(ds.len(), 2, "{ds:?}");
        assert_eq!((ds[0].host.as_deref(), ds[0].pool.as_deref()), (Some("host-c"), None));
        assert_eq!((ds[1].host.as_deref(), ds[1].pool.as_deref()), (None, Some("gpu")));
        assert_eq!(ds[1].state, DeliveryState::Queued);
        assert_eq!(one(c, "SELECT queued FROM pool_queues WHERE pool = $1", "gpu"), 1);
        assert_eq!(one(c, "SELECT coalesce(sum(waiting), 0) FROM host_backlog WHERE host <> $1", "host-c"), 0);
        assert_eq!(gained_hosts(std::iter::once(&(accepted, ds))), vec!["host-c".to_string()]);
        // Pools alone: not the conversation's members.
        crate::store::registry::members::add(c, "c2", &["host-a".into()], "op", "r", 1).unwrap();
        let m = NewMessage { conversation: "c2".into(), ..msg("k2", &[], &["gpu"]) };
        let (_, ds) = accept_and_fan_out(c, &m, RetryPolicy::default(), BIG, 6).unwrap();
        assert_eq!(ds.len(), 1, "{ds:?}");
        assert_eq!(ds[0].pool.as_deref(), Some("gpu"));
        assert!(crate::store::upkeep::verify::check(c).unwrap().is_empty());
    }

    /// A new message fanned out in its accept's job, from what the accept wrote, gets the same
    /// deliveries, events and queue counts as one whose fan-out reads its routing back (the
    /// repair's way), with and without an approval, hosts and a pool alike; and its answer,
    /// built from what it made, is the record's deliveries in the record's order.
    #[test]
    fn a_fan_out_from_the_accept_matches_one_that_reads_the_routing_back() {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        type Shape = (Option<String>, Option<String>, DeliveryState, i64);
        let shape = |message_id: &str| -> Vec<Shape> {
            deliveries_of(c, message_id)
                .unwrap()
                .into_iter()
                .map(|d| {
                    let events = one(c, "SELECT count(*) FROM delivery_events WHERE delivery_id = $1", &d.delivery_id);
                    (d.host, d.pool, d.state, events)
                })
                .collect()
        };
        let queues = |conversation: &str| -> Vec<(String, i64)> {
            c.prepare(
                "SELECT host, queued FROM conversation_queues WHERE conversation = $1
                 UNION ALL SELECT pool, queued FROM pool_queues WHERE conversation = $1 ORDER BY 1",
            )
            .unwrap()
            .query_map([conversation], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
        };
        let held = RetryPolicy { approval_required: true, ..RetryPolicy::default() };
        for (name, policy) in [("plain", RetryPolicy::default()), ("held", held)] {
            let to = |way: &str| NewMessage {
                conversation: format!("{way}-{name}"),
                ..msg(&format!("{way}-{name}"), &["host-c", "host-a"], &["gpu"])
            };
            let (Accepted::New { message_id: fast, .. }, answered) =
                accept_and_fan_out(c, &to("fast"), policy, BIG, 5).unwrap()
            else {
                panic!("duplicate")
            };
            // The answer is built from what was made, and is what the record reads.
            assert_eq!(answered, deliveries_of(c, &fast).unwrap(), "{name}");
            let Accepted::New { message_id: read_back, .. } =
                accept_with_retry(c, &to("read"), policy, BIG, 5).unwrap()
            else {
                panic!("duplicate")
            };
            fan_out(c, &read_back, 5).unwrap();
            let made = shape(&fast);
            assert_eq!(made.len(), 3, "{made:?}");
            assert_eq!(made, shape(&read_back), "{name}");
            assert_eq!(queues(&format!("fast-{name}")), queues(&format!("read-{name}")), "{name}");
        }
        for host in ["host-a", "host-c"] {
            assert_eq!(one(c, "SELECT waiting FROM host_backlog WHERE host = $1", host), 4, "{host}");
        }
        assert!(crate::store::upkeep::verify::check(c).unwrap().is_empty());
    }

    /// A pool delivery no member claimed yet reads everywhere a delivery is shown: the
    /// message view (host null, pool set), the producers' feed, and the operators' listings.
    #[test]
    fn an_unclaimed_pool_delivery_reads_in_every_view() {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        let (Accepted::New { message_id, .. }, _) =
            accept_and_fan_out(c, &msg("k", &[], &["gpu"]), RetryPolicy::default(), BIG, 5).unwrap()
        else {
            panic!("duplicate")
        };
        let view = crate::store::views::read::message_view(c, &message_id).unwrap();
        assert_eq!((view.deliveries[0].host.as_deref(), view.deliveries[0].pool.as_deref()), (None, Some("gpu")));
        let scope = crate::store::views::feed::FeedScope::Message { message_id, producer: "prod".into() };
        let bounds = crate::store::views::feed::PageBounds { limit: 100, bytes_max: 1 << 20 };
        let feed = crate::store::views::feed::page(c, &scope, None, 0, bounds).unwrap();
        assert!(!feed.events.is_empty());
        let q = crate::store::views::listing::ListQuery {
            state: None,
            outcome: None,
            host: None,
            conversation: None,
            since_ms: None,
            until_ms: None,
            newest: false,
            after: None,
            limit: 10,
        };
        assert_eq!(crate::store::views::listing::page(c, &q).unwrap().rows.len(), 1);
    }

    /// Its producer cancels a message whose pool delivery waits: it fails, leaves the pool's
    /// queue, and no host's backlog moves; the record verifies.
    #[test]
    fn a_waiting_pool_delivery_is_cancelled_out_of_its_pool_s_queue() {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        let (Accepted::New { message_id, .. }, _) =
            accept_and_fan_out(c, &msg("k", &[], &["gpu"]), RetryPolicy::default(), BIG, 5).unwrap()
        else {
            panic!("duplicate")
        };
        let out = crate::store::lifecycle::turns::cancel_message(c, &message_id, "prod", "not needed", 6).unwrap();
        assert_eq!((out[0].host.as_deref(), out[0].pool.as_deref()), (None, Some("gpu")));
        assert_eq!(out[0].state, DeliveryState::Failed);
        assert_eq!(one(c, "SELECT queued FROM pool_queues WHERE pool = $1", "gpu"), 0);
        assert_eq!(one(c, "SELECT count(*) FROM host_backlog WHERE host <> $1", "-"), 0);
        assert!(crate::store::upkeep::verify::check(c).unwrap().is_empty());
    }

    /// An unknown pool is refused naming it and its place, before anything is written.
    #[test]
    fn an_unknown_pool_is_refused_naming_it() {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        let e = accept(c, &msg("k", &[], &["gpu", "nope"]), BIG, 1).unwrap_err();
        assert!(matches!(&e, StoreError::Invalid(m) if m.contains("pools[1]") && m.contains("nope")), "{e:?}");
        assert_eq!(one(c, "SELECT count(*) FROM messages WHERE producer = $1", "prod"), 0);
        let full = AcceptLimits { queued_per_host_max: 1, queued_per_pool_max: 1 };
        accept_and_fan_out(c, &msg("k1", &[], &["gpu"]), RetryPolicy::default(), full, 1).unwrap();
        let e = accept(c, &msg("k2", &[], &["gpu"]), full, 2).unwrap_err();
        assert!(matches!(&e, StoreError::OverCapacity(m) if m.contains("pool gpu")), "{e:?}");
    }

    /// Pools are part of the content only when given: a message without them hashes as before
    /// pools existed, and another pool under the same key is a conflict.
    #[test]
    fn pools_are_part_of_the_content_only_when_given() {
        let without = msg("k", &["host-a"], &[]);
        let legacy = {
            let payload = canonical::canonical("{}").unwrap();
            let mut h = Sha256::new();
            for part in ["c1", payload.as_str(), "host-a"] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
            h.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        assert_eq!(without.content_hash().unwrap(), legacy);
        assert_ne!(msg("k", &["host-a"], &["gpu"]).content_hash().unwrap(), legacy);
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        crate::store::registry::pools::add(c, "cpu", &["host-c".into()], "op", "r", 1).unwrap();
        accept(c, &msg("k", &[], &["gpu"]), BIG, 1).unwrap();
        assert!(matches!(accept(c, &msg("k", &[], &["gpu"]), BIG, 2).unwrap(), Accepted::Duplicate { .. }));
        assert!(matches!(accept(c, &msg("k", &[], &["cpu"]), BIG, 2), Err(StoreError::IdempotencyConflict(_))));
    }

    /// A crash between the accept and the fan-out loses no pool delivery: the repair (fan-out
    /// of the pending obligation) makes it, once, as for a host.
    #[test]
    fn the_repair_fills_pool_deliveries_a_crash_left_out() {
        let db = testing::db();
        let c = &*db.conn;
        gpu(c);
        let Accepted::New { message_id, .. } = accept(c, &msg("k", &["host-c"], &["gpu"]), BIG, 1).unwrap() else {
            panic!("duplicate")
        };
        assert_eq!(pending_obligations(c, 10).unwrap(), vec![message_id.clone()]);
        let problems = crate::store::upkeep::verify::check(c).unwrap();
        assert!(problems.is_empty(), "a pending obligation is not a problem: {problems:?}");
        let ds = fan_out(c, &message_id, 2).unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(fan_out(c, &message_id, 3).unwrap(), ds, "idempotent");
        assert!(pending_obligations(c, 10).unwrap().is_empty());
        c.execute("DELETE FROM deliveries WHERE pool = $1", ["gpu"]).unwrap();
        let problems = crate::store::upkeep::verify::check(c).unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.kind == crate::store::upkeep::verify::ProblemKind::FanOut && p.detail.contains("pool gpu")),
            "{problems:?}"
        );
    }
}
