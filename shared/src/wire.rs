//! The HTTP API's request and response bodies (SPEC §12). These are the public contract:
//! fields may be added, none renamed. Requests refuse unknown fields so that a typo is an
//! error instead of a silently ignored option.
//!
//! Why one file over 700 lines: it is the whole v1 contract, every body of every endpoint, in
//! one place to read against `docs/openapi.json` (which a test holds to these types); each type
//! is small and stands alone. Where it splits when it grows: producer bodies, node bodies, feeds.

use crate::states::{DeliveryState, Outcome, Rerun};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A message's payload: any JSON value, kept as the exact text the producer sent (numbers of any
/// size or precision, key order, whitespace inside it and escapes unchanged). The hub stores
/// these bytes, returns them in message reads and claims, and the node hands them to the harness
/// on stdin. Leading and trailing whitespace around the value is not part of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(Box<RawValue>);

impl Payload {
    /// Takes JSON text as a payload; refuses text that is not exactly one JSON value.
    pub fn from_text(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(Self)
    }

    /// The payload's exact JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Payload {}

impl From<serde_json::Value> for Payload {
    /// The value's compact text (object keys sorted, numbers as `serde_json` prints them).
    fn from(v: serde_json::Value) -> Self {
        match serde_json::value::to_raw_value(&v) {
            Ok(raw) => Self(raw),
            // A `Value` has string keys only, so it always serialises.
            Err(e) => unreachable!("a serde_json::Value did not serialise: {e}"),
        }
    }
}

/// `POST /v1/messages`: a producer submits a message into a conversation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The conversation the message belongs to.
    pub conversation: String,
    /// The producer-chosen idempotency key.
    pub idempotency_key: String,
    /// Any JSON value, kept exactly as sent (see `Payload`); handed to the harness on stdin.
    pub payload: Payload,
    /// The recipient hosts; when absent or empty, the conversation's members at the message's
    /// `seq` (a conversation without members then refuses the message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<String>>,
    /// The recipient pools: one delivery per pool, which any member host may claim. Beside
    /// `to` (either or both); a message naming neither goes to the conversation's members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<Vec<String>>,
    /// How many attempts each delivery may get when the harness asks for a retry (exit 75).
    /// Default 1 (no retry); bounded by the hub's `max_attempts_max`.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The first retry's backoff; later ones double it, capped by the hub's
    /// `retry_backoff_max` and jittered. Default: the hub's `retry_backoff`.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub retry_backoff_ms: Option<u64>,
    /// `"required"`: the message's deliveries wait held (`approval required`) until an operator,
    /// or a producer with the right to approve in the conversation, approves or rejects it.
    /// Absent or `"none"`: no approval (any other value is refused, naming the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// With `"approval": "required"`: how long the approval may wait undecided before the hub
    /// fails the message's held deliveries, naming the timeout. Bounded by the hub's
    /// `limits.approval_timeout_max`; absent: no timeout. Left out without an approval.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub approval_timeout_ms: Option<u64>,
    /// The longest each turn of the message may run: past it (or past its node's own
    /// `exec_timeout`, whichever is shorter) the node stops the turn's process group and
    /// reports it `failed`, naming the deadline. Bounded by the hub's `limits.deadline_max`;
    /// absent: the node's `exec_timeout` alone.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The longest a running turn may go without writing a progress event (counted from its
    /// start, then from its last line on the progress channel): past it the node stops the
    /// turn's process group and reports it `failed`, naming the stall; with `max_attempts`
    /// left, the hub runs it again (as for exit 75). Bounded by the hub's `limits.stall_max`;
    /// absent: no stall bound.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<u64>,
}

/// `POST /v1/messages/{message_id}/approve` and `/reject`: a producer with the right to approve
/// in the message's conversation decides its approval.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// Why (recorded with the decision, the producer's name and the time).
    pub reason: String,
}

/// The answer to an approve or reject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalResponse {
    /// The message.
    pub message_id: String,
    /// `approved` or `rejected`.
    pub decision: String,
    /// Its deliveries after the decision (approved: queued; rejected: failed).
    pub deliveries: Vec<DeliverySummary>,
}

/// One delivery as summarised in an accept answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliverySummary {
    /// The delivery's id.
    pub delivery_id: String,
    /// The recipient host; for a pool delivery the host whose claim bound it, `None` until one
    /// did.
    pub host: Option<String>,
    /// The recipient pool of a pool delivery (kept for life); absent for a host delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The delivery's state when the answer was made.
    pub state: DeliveryState,
}

/// The answer to `POST /v1/messages` (201 new, 200 replay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// The hub-assigned message id.
    pub message_id: String,
    /// The message's sequence number in its conversation.
    pub seq: i64,
    /// True when this answer is a replay of an earlier accept with the same key and content.
    pub duplicate: bool,
    /// One delivery per recipient host.
    pub deliveries: Vec<DeliverySummary>,
}

/// One attempt (an execution and its reported outcome).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptView {
    /// The hub-assigned attempt id.
    pub attempt_id: String,
    /// The node-scoped report id the outcome arrived with.
    pub report_id: String,
    /// How the turn ended.
    pub outcome: Outcome,
    /// The harness's exit status, when it exited.
    pub exit_code: Option<i32>,
    /// How long the turn ran.
    pub duration_ms: Option<u64>,
    /// The signal that ended the harness, when one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// The bounded result body (the harness's stdout).
    pub result: Option<String>,
    /// Why the outcome is what it is (timeout, shutdown, crash), when the node said.
    pub reason: Option<String>,
    /// When the hub recorded it (unix milliseconds).
    pub reported_at_ms: i64,
    /// Which run of the delivery this was (1 for the first).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// True when the harness asked for a retry (exit 75) and the message's `max_attempts`
    /// left room, so the hub requeued the delivery.
    #[serde(default)]
    pub retryable: bool,
    /// Why this run happened, when it is not the first.
    #[serde(default)]
    pub rerun: Option<Rerun>,
    /// Who caused this run: `producer:NAME` for the first, `hub` for a retry the harness asked
    /// for, `operator:NAME` for a redrive.
    #[serde(default)]
    pub caused_by: Option<String>,
    /// The end of the harness's stderr as the hub kept it (its last bytes, at most the hub's
    /// `limits.stderr_tail_bytes_max`, starting on a character boundary), when the node sent one.
    #[serde(default)]
    pub stderr_tail: Option<String>,
    /// How many bytes of the harness's stderr came before `stderr_tail` and are not in it
    /// (dropped by the node, or cut by the hub); set whenever `stderr_tail` is (and alone when
    /// the node sent only the count).
    #[serde(default)]
    pub stderr_dropped_bytes: Option<u64>,
}

fn first_attempt() -> u32 {
    1
}

/// One delivery with its attempts, as a producer or operator reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryView {
    /// The delivery's id.
    pub delivery_id: String,
    /// The recipient host; for a pool delivery the host whose claim bound it, `None` until one
    /// did.
    pub host: Option<String>,
    /// The recipient pool of a pool delivery (kept for life); absent for a host delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Its current state.
    pub state: DeliveryState,
    /// Why it is failed, unknown or held, when it is.
    pub reason: Option<String>,
    /// When its state last changed (unix milliseconds).
    pub updated_at_ms: i64,
    /// Its attempts, oldest first.
    pub attempts: Vec<AttemptView>,
    /// The current run (1 for the first; a retry or redrive adds one).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The message's bound on runs the harness may ask for.
    #[serde(default = "first_attempt")]
    pub max_attempts: u32,
    /// While queued for a retry: not handed out before this time (unix milliseconds).
    #[serde(default)]
    pub not_before_ms: Option<i64>,
    /// When a cancel was asked for, while it waits for the node to confirm it (delivered), or
    /// after it took effect.
    #[serde(default)]
    pub cancel_requested_at_ms: Option<i64>,
    /// Why it was cancelled, when it was.
    #[serde(default)]
    pub cancel_reason: Option<String>,
}

/// `GET /v1/messages/{id}`: a message with its deliveries and their attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageView {
    /// The hub-assigned message id.
    pub message_id: String,
    /// The conversation.
    pub conversation: String,
    /// The sequence number in the conversation.
    pub seq: i64,
    /// The producer that submitted it.
    pub producer: String,
    /// The producer's idempotency key.
    pub idempotency_key: String,
    /// The payload, byte for byte as submitted.
    pub payload: Payload,
    /// When it was accepted (unix milliseconds).
    pub accepted_at_ms: i64,
    /// The W3C `traceparent` kept with the message: the producer's (its submission's
    /// `traceparent` header) or the one the hub started for it. Absent for a message accepted
    /// before traces were kept, and from a hub that predates the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its deliveries.
    pub deliveries: Vec<DeliveryView>,
    /// What this view left out to stay within the hub's `limits.message_view_bytes_max`, and
    /// where to read it; `null` when nothing was. A hub that predates the bound sends none.
    #[serde(default)]
    pub omitted: Option<ViewOmitted>,
}

/// `GET /v1/messages?conversation=C[&after=CURSOR][&limit=N]`: one page of the producer's
/// own messages in a conversation, oldest first (`seq` order), from a cursor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePage {
    /// The conversation listed.
    pub conversation: String,
    /// The producer's messages after the cursor, in `seq` order: at most the `limit` asked for
    /// (capped by the hub's `limits.message_page_max`) and the hub's
    /// `limits.message_view_bytes_max` bytes of JSON. Fewer, even none, while `more` is true:
    /// the page covers a bounded stretch of the conversation, whose other messages are other
    /// producers'.
    pub messages: Vec<ListedMessage>,
    /// Where the next page starts (`after=`): past the last message of this page, or past the
    /// stretch it looked through. Opaque; valid for this producer and conversation only. Always
    /// set, so a caller that has seen everything asks again from here for what comes next.
    pub next_cursor: String,
    /// True while messages past `next_cursor` exist now (ask again at once); false when the
    /// page reached the conversation's last message.
    pub more: bool,
}

/// One message of a `MessagePage`: the message and its deliveries' states (its attempts and
/// results are read with `GET /v1/messages/{message_id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedMessage {
    /// The hub-assigned message id.
    pub message_id: String,
    /// The sequence number in the conversation.
    pub seq: i64,
    /// The producer's idempotency key.
    pub idempotency_key: String,
    /// The payload, byte for byte as submitted.
    pub payload: Payload,
    /// When it was accepted (unix milliseconds).
    pub accepted_at_ms: i64,
    /// The W3C `traceparent` kept with it; absent for a message accepted before traces were
    /// kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its deliveries, by host.
    pub deliveries: Vec<DeliverySummary>,
}

/// What a message view left out: the attempts of some deliveries, whose `attempts` is then
/// empty in that view. Each is read whole by `GET
/// /v1/messages/{message_id}/deliveries/{delivery_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewOmitted {
    /// The deliveries whose attempts are not in the view, in the view's order.
    pub attempts_of: Vec<String>,
    /// The bound the view kept to (bytes of its JSON).
    pub view_bytes_max: u64,
    /// The path that reads one of them whole, with `{delivery_id}` to fill in.
    pub read_each_at: String,
}

/// `POST /v1/claims`: a node asks for work.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The claiming node instance.
    pub instance_id: String,
    /// At most this many deliveries (bounded by the hub's batch limit).
    #[serde(default, deserialize_with = "crate::json_int::optional")]
    pub max: Option<u32>,
    /// Wait up to this long for claimable work (bounded by the hub's long-poll limit).
    #[serde(default, deserialize_with = "crate::json_int::optional")]
    pub wait_ms: Option<u64>,
}

/// A delivery handed to a node, by a claim or in its holdings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedDelivery {
    /// The delivery's id.
    pub delivery_id: String,
    /// The message's id.
    pub message_id: String,
    /// The conversation.
    pub conversation: String,
    /// The message's sequence number in the conversation.
    pub seq: i64,
    /// The payload, byte for byte as submitted.
    pub payload: Payload,
    /// The token that binds this claim to the claiming instance.
    pub claim_token: String,
    /// The delivery's state on the hub (claimed in a claim answer).
    pub state: DeliveryState,
    /// The producer that submitted the message (so a harness can tell who wrote the turn).
    /// Always sent by this hub; absent (None) only from a hub that predates the field.
    #[serde(default)]
    pub producer: Option<String>,
    /// Which run of the delivery this claim is for (1 for the first).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// The message's bound on runs (a harness exit 75 is retryable while `attempt` is below it).
    #[serde(default = "first_attempt")]
    pub max_attempts: u32,
    /// Why this run happens, when it is not the first.
    #[serde(default)]
    pub rerun: Option<Rerun>,
    /// True when a cancel was asked for: the node never starts it, and stops it if it runs.
    #[serde(default)]
    pub cancel_requested: bool,
    /// The message's `deadline_ms`: the node stops the turn at the shorter of it and its own
    /// `exec_timeout`. Absent from a hub that predates it, or when the message names none.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// The message's `stall_ms`: the node stops the turn when it wrote no progress event for
    /// this long. Absent from a hub that predates it, or when the message names none.
    #[serde(default)]
    pub stall_ms: Option<u64>,
    /// The message's W3C `traceparent` (`baton_shared::traceparent`): the node records its
    /// spans of this delivery in that trace and gives it to the harness as `TRACEPARENT`.
    /// Left out when the message has none (accepted before traces were kept); a node that
    /// predates the field ignores it, and a hub that predates it sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// The answer to `POST /v1/claims`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimResponse {
    /// The claimed deliveries, oldest first. Empty when the wait elapsed.
    pub deliveries: Vec<ClaimedDelivery>,
    /// Delivered turns this instance holds whose cancel was asked for and whose outcome the hub
    /// does not have yet. A claim that waits is answered at once when one appears.
    #[serde(default)]
    pub cancels: Vec<CancelNotice>,
}

/// A delivered turn to stop: never start it; if it runs, SIGTERM its process group, SIGKILL
/// after `cancel_grace`, and report the attempt `cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelNotice {
    /// The delivery.
    pub delivery_id: String,
    /// The run the cancel is for.
    pub attempt: u32,
    /// Why.
    pub reason: String,
}

/// The request header every node request carries after `POST /v1/sessions`: the node's current
/// session number. The hub answers 409 `session_superseded` to a request whose session is older
/// than the host's newest one.
pub const SESSION_HEADER: &str = "baton-session";

/// `POST /v1/sessions`: a node process registers a fresh session when it starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The node instance (the data directory's id).
    pub instance_id: String,
    /// The node's version, shown to operators.
    #[serde(default)]
    pub node_version: Option<String>,
}

/// The answer to `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionResponse {
    /// The new session number (per host, increasing); sent in `baton-session` from now on.
    pub session: u64,
    /// The session this one replaced without that one having ended cleanly (a crash, or a
    /// copy of the data directory still running), when there was one.
    #[serde(default)]
    pub took_over: Option<u64>,
    /// The start lease granted to this session, in milliseconds: each accepted `POST
    /// /v1/starts` of the session (one with no items too) renews it for this long from when the
    /// hub records it. Within it, and only within it, the node may start a turn its own ack
    /// made `delivered` without asking the hub (the hub cannot be reached); a newer session of
    /// the instance is not granted the start of such a run until the lease ran out. Absent from
    /// a hub that grants none: the node then starts nothing on its own.
    #[serde(default)]
    pub start_lease_ms: Option<u64>,
}

/// `POST /v1/sessions/end`: a node process ends its session cleanly (on shutdown).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionEndRequest {
    /// The node instance.
    pub instance_id: String,
    /// The session that ends.
    #[serde(deserialize_with = "crate::json_int::integer")]
    pub session: u64,
}

/// `POST /v1/starts`: the node asks, once per scheduler pass, to start delivered turns. A turn
/// runs only if the hub records its start here for the current session: never twice, never
/// after a cancel.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The holding instance.
    pub instance_id: String,
    /// The turns to start (bounded by the hub's `claim_batch_max`).
    pub starts: Vec<StartItem>,
}

/// One turn the node wants to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartItem {
    /// The delivery.
    pub delivery_id: String,
    /// The claim token of the current run's claim.
    pub claim_token: String,
    /// The run (from the claim).
    #[serde(deserialize_with = "crate::json_int::integer")]
    pub attempt: u32,
}

/// The answer to `POST /v1/starts`: one result per item, in request order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartResponse {
    /// Per-item results.
    pub results: Vec<StartResult>,
}

/// Whether one turn may start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartResult {
    /// The delivery.
    pub delivery_id: String,
    /// True: the start is recorded for this session (again true when repeated by it); run it.
    pub start: bool,
    /// Why not, when not: `cancelled`, `started_elsewhere` (another session already started
    /// this run: report it `unknown`), `start_lease_pending` (an older session of this instance acked
    /// this run and may still start it within its start lease: ask again after `retry_after_ms`),
    /// `stale_claim`, `not_found`.
    #[serde(default)]
    pub code: Option<String>,
    /// What went wrong, for a human.
    #[serde(default)]
    pub message: Option<String>,
    /// With `start_lease_pending`: in how many milliseconds the start may be asked again (when
    /// the older session's lease runs out).
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
}

/// `POST /v1/messages/{id}/cancel` (producer) and the operator's cancel: why.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Why the message is cancelled (recorded, shown to operators).
    pub reason: String,
}

/// The answer to a cancel: what happened to each delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelResponse {
    /// The message.
    pub message_id: String,
    /// One entry per delivery of the message.
    pub deliveries: Vec<CancelResult>,
}

/// What a cancel did to one delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelResult {
    /// The delivery.
    pub delivery_id: String,
    /// The host; for a pool delivery the host whose claim bound it, `None` until one did.
    pub host: Option<String>,
    /// The recipient pool of a pool delivery; absent for a host delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// `cancelled` (done in the hub: it never ran), `requested` (delivered: its node stops
    /// it and reports the attempt), or `final` (it had already ended; nothing changed).
    pub effect: String,
    /// Its state after the call.
    pub state: DeliveryState,
}

/// The answer to `GET /v1/holdings`: claimed, mirrored, or delivered without an outcome, one
/// page at a time (at most the hub's `limits.holdings_page_max`, or the `limit` asked for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoldingsResponse {
    /// What the instance holds, oldest first, from the page's cursor on.
    pub deliveries: Vec<ClaimedDelivery>,
    /// Where the next page starts (`?cursor=`), while more may follow; `null` on the last page.
    /// Opaque to the node (a position in the hub's queue order). A hub that predates pages sends
    /// none: its one answer is everything.
    #[serde(default)]
    pub next_cursor: Option<i64>,
}

/// `POST /v1/deliveries/{id}/mirrored` and `/ack`: the holder moves its delivery on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderRequest {
    /// The holding instance.
    pub instance_id: String,
    /// The claim token from the claim.
    pub claim_token: String,
}

/// `POST /v1/deliveries/{id}/reject`: the holder refuses a delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// The holding instance.
    pub instance_id: String,
    /// The claim token from the claim.
    pub claim_token: String,
    /// Why the node refuses it.
    pub reason: String,
}

/// The answer to mirrored, ack and reject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransitionResponse {
    /// The delivery's id.
    pub delivery_id: String,
    /// Its state after the call.
    pub state: DeliveryState,
    /// False when the call repeated a transition already made (nothing changed).
    pub changed: bool,
}

/// `POST /delivery-report`: the outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    /// The delivery the attempt ran.
    pub delivery_id: String,
    /// The holding instance.
    pub instance_id: String,
    /// The claim token from the claim.
    pub claim_token: String,
    /// Node-scoped idempotency key: the same id again is counted once.
    pub report_id: String,
    /// How the turn ended.
    pub outcome: Outcome,
    /// The harness's exit status, when it exited.
    #[serde(default, deserialize_with = "crate::json_int::optional")]
    pub exit_code: Option<i32>,
    /// How long the turn ran.
    #[serde(default, deserialize_with = "crate::json_int::optional")]
    pub duration_ms: Option<u64>,
    /// The bounded result body.
    #[serde(default)]
    pub result: Option<String>,
    /// Why the outcome is what it is (timeout, shutdown, crash).
    #[serde(default)]
    pub reason: Option<String>,
    /// The run this report is for (from the claim); absent means the delivery's current run.
    #[serde(default, deserialize_with = "crate::json_int::optional")]
    pub attempt: Option<u32>,
    /// The signal that ended the harness, when one did.
    #[serde(default, deserialize_with = "crate::json_int::optional")]
    pub signal: Option<i32>,
    /// The end of what the harness wrote to stderr: its last bytes (at most the node's
    /// `stderr_tail_bytes`), starting on a UTF-8 character boundary. Absent when it wrote
    /// nothing there. The hub keeps at most its `limits.stderr_tail_bytes_max` of it, the last
    /// ones, and counts what it cut in `stderr_dropped_bytes`. Left out of the JSON when absent,
    /// so a report without it reads as it did before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// How many bytes the harness wrote to stderr before `stderr_tail` that it does not hold
    /// (0: the tail is all of it); without `stderr_tail`, how many it wrote, none of them sent.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub stderr_dropped_bytes: Option<u64>,
    /// Which of the message's bounds stopped the turn, when one did: `deadline` (its
    /// `deadline_ms`, or the node's `exec_timeout` when shorter) or `stall` (its `stall_ms`).
    /// A stalled run is retryable as exit 75 is (the hub requeues it while `max_attempts`
    /// leaves room); one past its deadline is not. Left out of the JSON when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
}

/// The answer to `POST /delivery-report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportResponse {
    /// The recorded attempt.
    pub attempt: AttemptView,
    /// The delivery it belongs to.
    pub delivery_id: String,
    /// True when this report id was already recorded (nothing was added).
    pub duplicate: bool,
    /// When the attempt was retryable and the hub requeued the delivery: not handed out again
    /// before this time (unix milliseconds).
    #[serde(default)]
    pub retry_at_ms: Option<i64>,
}

/// `GET /v1/conversations/{conversation}`: a conversation's position and its membership registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationView {
    /// The conversation's name.
    pub conversation: String,
    /// The highest `seq` given to a message so far (0 before the first).
    pub last_seq: i64,
    /// True while the conversation never had a member: any enrolled host may be named in `to`,
    /// and a message must name its recipients.
    pub open: bool,
    /// Every host that is or was a member, by name, each with its intervals.
    pub members: Vec<MemberView>,
    /// The pools that are members now, by name: a post without `to` or `pools` reaches one host
    /// of each (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
}

/// One host's membership of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberView {
    /// The host.
    pub host: String,
    /// True while its latest interval is open (it receives posts without `to`).
    pub current: bool,
    /// Its intervals, oldest first.
    pub intervals: Vec<MembershipInterval>,
}

/// One membership interval: the host receives the posts with `join_seq < seq <= leave_seq`
/// (no upper bound while `leave_seq` is absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MembershipInterval {
    /// The conversation's `last_seq` when the host joined.
    pub join_seq: i64,
    /// When it joined (unix milliseconds).
    pub joined_at_ms: i64,
    /// The conversation's `last_seq` when the host left; absent while it is a member.
    pub leave_seq: Option<i64>,
    /// When it left (unix milliseconds); absent while it is a member.
    pub left_at_ms: Option<i64>,
}

/// Every error answer: a stable code and a human message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable, machine-readable code (see `ErrorCode`).
    pub code: String,
    /// What went wrong, for a human; never contains internals.
    pub message: String,
}

// Batches (`POST /v1/batch/...`): many items of one kind in one request, applied in one writer
// job. Each item is exactly the body of its single endpoint (or, for deliveries, that body with
// the delivery id the single endpoint takes in its path), and each answer item is exactly what
// the single endpoint would answer for it: its status and its body or error. Answers keep the
// order of the request. A batch is bounded by `limits::BATCH_ITEMS_MAX` items and
// `limits::BATCH_BYTES_MAX` bytes; a batch over either is refused whole and nothing is applied.

/// What one item of a batch came to: the status the single endpoint would have answered, and
/// its body (`ok`) or its error (`error`). Serialised as `{"status": 201, "ok": {…}}` or
/// `{"status": 409, "error": {"code": "…", "message": "…"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemResult<T> {
    /// The HTTP status the single endpoint would have answered for this item.
    pub status: u16,
    /// Its body or its error.
    #[serde(flatten)]
    pub outcome: ItemOutcome<T>,
}

/// The body or the error of one batch item (see `ItemResult`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemOutcome<T> {
    /// The item succeeded: the single endpoint's answer body.
    Ok(T),
    /// The item was refused: the single endpoint's error body.
    Error(ErrorBody),
}

impl<T> ItemResult<T> {
    /// The item's body, or its error.
    pub fn into_result(self) -> Result<T, ErrorBody> {
        match self.outcome {
            ItemOutcome::Ok(body) => Ok(body),
            ItemOutcome::Error(e) => Err(e),
        }
    }

    /// The item's error code, when it was refused.
    pub fn error_code(&self) -> Option<&str> {
        match &self.outcome {
            ItemOutcome::Ok(_) => None,
            ItemOutcome::Error(e) => Some(e.code.as_str()),
        }
    }
}

/// `POST /v1/batch/messages`: a producer submits many messages in one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSubmitRequest {
    /// The messages, each exactly a `POST /v1/messages` body (1 to `BATCH_ITEMS_MAX`).
    pub messages: Vec<SubmitRequest>,
}

/// The answer to `POST /v1/batch/messages` (status 200 whenever the batch itself was taken):
/// one result per message, in request order; each is 201 (new) or 200 (replay) with a
/// `SubmitResponse`, or the error the single endpoint would answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSubmitResponse {
    /// Per-message results, in request order.
    pub results: Vec<ItemResult<SubmitResponse>>,
}

/// One delivery of a batch `mirrored` or `ack`: the delivery and the token of its claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderItem {
    /// The delivery (the path id of the single endpoint).
    pub delivery_id: String,
    /// The claim token from the claim.
    pub claim_token: String,
}

/// `POST /v1/batch/mirrored` and `POST /v1/batch/ack`: the holder moves many deliveries on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchHolderRequest {
    /// The holding instance (one instance per request, as every item is the same node's).
    pub instance_id: String,
    /// The deliveries (1 to `BATCH_ITEMS_MAX`).
    pub deliveries: Vec<HolderItem>,
}

/// One delivery of a batch reject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectItem {
    /// The delivery (the path id of the single endpoint).
    pub delivery_id: String,
    /// The claim token from the claim.
    pub claim_token: String,
    /// Why the node refuses it.
    pub reason: String,
}

/// `POST /v1/batch/reject`: the holder refuses many deliveries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRejectRequest {
    /// The holding instance.
    pub instance_id: String,
    /// The deliveries (1 to `BATCH_ITEMS_MAX`).
    pub deliveries: Vec<RejectItem>,
}

/// The answer to a batch `mirrored`, `ack` or reject (status 200 whenever the batch itself was
/// taken): one result per delivery, in request order; each is 200 with a `TransitionResponse`,
/// or the error the single endpoint would answer (`stale_claim`, `not_found`, `not_yours`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchTransitionResponse {
    /// Per-delivery results, in request order.
    pub results: Vec<ItemResult<TransitionResponse>>,
}

/// `POST /v1/batch/reports`: attempt reports for many deliveries in one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchReportRequest {
    /// The reports, each exactly a `POST /delivery-report` body (1 to `BATCH_ITEMS_MAX`).
    pub reports: Vec<ReportRequest>,
}

/// The answer to `POST /v1/batch/reports` (status 200 whenever the batch itself was taken):
/// one result per report, in request order; each is 201 (recorded) or 200 (a replay of the same
/// `report_id`) with a `ReportResponse`, or the error the single endpoint would answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchReportResponse {
    /// Per-report results, in request order.
    pub results: Vec<ItemResult<ReportResponse>>,
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use crate::states::DeliveryState;

    #[test]
    fn an_item_result_is_its_status_and_its_body_or_error() {
        let ok = ItemResult {
            status: 200,
            outcome: ItemOutcome::Ok(TransitionResponse {
                delivery_id: "d".into(),
                state: DeliveryState::Mirrored,
                changed: true,
            }),
        };
        let text = serde_json::to_string(&ok).unwrap();
        assert_eq!(text, r#"{"status":200,"ok":{"delivery_id":"d","state":"mirrored","changed":true}}"#);
        assert_eq!(serde_json::from_str::<ItemResult<TransitionResponse>>(&text).unwrap(), ok);
        let err: ItemResult<TransitionResponse> = ItemResult {
            status: 409,
            outcome: ItemOutcome::Error(ErrorBody { code: "stale_claim".into(), message: "m".into() }),
        };
        let text = serde_json::to_string(&err).unwrap();
        assert_eq!(text, r#"{"status":409,"error":{"code":"stale_claim","message":"m"}}"#);
        let back = serde_json::from_str::<ItemResult<TransitionResponse>>(&text).unwrap();
        assert_eq!(back.error_code(), Some("stale_claim"));
        assert_eq!(back, err);
    }
}

/// What an events feed item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedEventKind {
    /// A delivery's state changed (`from` → `to`, by `actor`, with `reason`); a delivery's
    /// creation has no `from`.
    State,
    /// A running turn's harness wrote a progress event (`attempt`, `seq`, `progress`).
    Progress,
    /// A run's outcome was recorded (`attempt`, `outcome`, ...): the same attempt a message read
    /// shows, without its result body (read that with `GET /v1/messages/{message_id}`).
    Outcome,
}

/// One item of an events feed (`GET /v1/messages/{message_id}/events`,
/// `GET /v1/conversations/{conversation}/events`): a delivery's state change, a progress
/// event of a running turn, or a run's outcome. The fields each kind carries are listed on
/// them; the others are left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedEvent {
    /// This item's position: pass it as `after` to read on from just after it. Opaque (today
    /// a decimal number), increasing along the feed.
    pub cursor: String,
    /// What the item is.
    pub kind: FeedEventKind,
    /// When the hub recorded it (unix milliseconds).
    pub at_ms: i64,
    /// The message.
    pub message_id: String,
    /// The delivery.
    pub delivery_id: String,
    /// The delivery's host.
    pub host: String,
    /// `state`: the state before (absent when the delivery was created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DeliveryState>,
    /// `state`: the state after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DeliveryState>,
    /// `state`: who made the change: `hub`, `node:HOST` or `operator:NAME` (a producer's cancel
    /// or decision is `operator:producer:NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// `state`: why, when a reason was recorded; `outcome`: why the outcome is what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `progress`, `outcome`: the run of the delivery (1 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// `progress`: the event's number within its run, from 1, in the order the harness wrote
    /// them (without gaps unless events were dropped: see `progress_dropped` on the outcome).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// `progress`: the JSON object the harness wrote, exactly as it wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Payload>,
    /// `outcome`: how the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// `outcome`: the harness's exit status, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `outcome`: the signal that ended the harness, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// `outcome`: how long the run took, as its node measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// `outcome`: true when the hub requeued the delivery for another run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// `outcome`: how many progress events of the run the hub kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_events: Option<u64>,
    /// `outcome`: how many progress events of the run were dropped, by its node (size, count,
    /// rate, a full buffer while the hub did not answer) and by the hub (its bounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_dropped: Option<u64>,
}

/// One answer of an events feed: the items after the cursor, in order, and where to read on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsPage {
    /// The items, in feed order (at most the request's `limit`, and the hub's
    /// `limits.feed_page_max` and `limits.feed_page_bytes_max`). Empty when the wait elapsed.
    pub events: Vec<FeedEvent>,
    /// Pass it as `after` to read on: every item up to it has been answered, in this page or
    /// an earlier one. Equal to the last item's `cursor`, or past it when the hub scanned
    /// further and found nothing more for this feed.
    pub next_cursor: String,
    /// Message feeds only: true when every delivery of the message has its final outcome (only
    /// an operator's redrive adds items after that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<bool>,
}

/// `POST /v1/running`: the node says which turns run now, and forwards their harnesses'
/// progress events, in one request per pass for all of them. A node sends it at least every
/// `renew_interval` while a turn runs: the hub shows a host that stops sending as silent with
/// its running turns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningRequest {
    /// The holding instance.
    pub instance_id: String,
    /// The turns running now (and those that ended and still have events to send), at most
    /// `BATCH_ITEMS_MAX`.
    pub turns: Vec<RunningTurnItem>,
}

/// One running turn and its progress events since the last request the hub answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningTurnItem {
    /// The delivery.
    pub delivery_id: String,
    /// The claim token of the run's claim.
    pub claim_token: String,
    /// The run.
    #[serde(deserialize_with = "crate::json_int::integer")]
    pub attempt: u32,
    /// Progress events, in the order the harness wrote them; a resent event (same `seq`) is
    /// kept once. At most `PROGRESS_EVENTS_PER_REQUEST_MAX` in one request, all turns
    /// together.
    #[serde(default)]
    pub events: Vec<ProgressItem>,
    /// How many progress events of the run the node dropped so far (its bounds, its buffer),
    /// when that changed since the hub last answered.
    #[serde(default, deserialize_with = "crate::json_int::optional", skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

/// One progress event as the node forwards it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressItem {
    /// Its number within the run, from 1, increasing.
    #[serde(deserialize_with = "crate::json_int::integer")]
    pub seq: u64,
    /// The JSON object the harness wrote, exactly as it wrote it.
    pub progress: Payload,
}

/// The answer to `POST /v1/running`: one result per turn, in request order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningResponse {
    /// Per-turn results.
    pub turns: Vec<RunningTurnResult>,
}

/// What the hub made of one turn of a `POST /v1/running`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningTurnResult {
    /// The delivery.
    pub delivery_id: String,
    /// False when the hub no longer takes progress for this run (its outcome is recorded, or
    /// the claim is no longer this instance's): the node forwards nothing more of it.
    pub running: bool,
    /// How many of the request's events the hub kept (a resent one counts once, when first kept).
    pub kept: u64,
    /// How many it dropped (over `limits.progress_event_bytes_max` or
    /// `limits.progress_events_per_turn_max`, not a JSON object, or for a run no longer
    /// running).
    pub dropped: u64,
}
