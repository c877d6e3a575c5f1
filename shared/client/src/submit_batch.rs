//! `Client::submit_batch`: many submits in one request (`POST /v1/batch/messages`), answered
//! per message in request order, each answer exactly what `Client::submit` would have returned
//! for that message alone: its `SubmitResponse` or the hub's refusal of it (`ApiError`, typed by
//! its error code). One refused message changes nothing of the others.
//!
//! A batch is bounded by the hub's fixed limits, `BATCH_ITEMS_MAX` messages and
//! `BATCH_BYTES_MAX` bytes of JSON: `submit_batch` refuses a batch over either before sending
//! it (the hub would refuse it whole), and `batches` splits any number of messages into batches
//! within both.
//!
//! Retried like a single submit: every message carries its idempotency key, so a batch sent
//! again (its answer lost) answers the messages already accepted as replays (`duplicate: true`,
//! the same ids) and accepts the rest.

use crate::client::Client;
use crate::error::{ApiError, ClientError};
use crate::limits::REQUEST_TIMEOUT;
use crate::retry::retrying;
use baton_shared::error::ErrorCode;
use baton_shared::limits::{BATCH_BYTES_MAX, BATCH_ITEMS_MAX};
use baton_shared::wire::{BatchSubmitRequest, BatchSubmitResponse, ItemOutcome, SubmitRequest, SubmitResponse};

/// What one message of a batch came to: the hub's answer (201 new or 200 replay, told apart by
/// `duplicate`) or its refusal of this message alone.
pub type ItemAnswer = Result<SubmitResponse, ApiError>;

/// The JSON around the messages of a batch body: `{"messages":[` and `]}`.
const ENVELOPE_BYTES: usize = r#"{"messages":[]}"#.len();

impl Client {
    /// `POST /v1/batch/messages`: submits `batch.messages` in one request and returns one
    /// answer per message, in the order of the request. `Err` only when the batch as a whole
    /// got no answer or was refused whole (nothing of it was applied then, or, for a lost
    /// answer, perhaps all of it: send it again). A batch with no messages, more than
    /// `BATCH_ITEMS_MAX`, or over `BATCH_BYTES_MAX` bytes is `ClientError::Invalid` and is not
    /// sent. Retried on transient failures, as `submit` is.
    pub async fn submit_batch(&self, batch: &BatchSubmitRequest) -> Result<Vec<ItemAnswer>, ClientError> {
        let body = checked_body(batch)?;
        let url = format!("{}/v1/batch/messages", self.hub_url());
        let answer: BatchSubmitResponse = retrying(self.retry_policy(), || {
            let req = self
                .http()
                .post(&url)
                .timeout(REQUEST_TIMEOUT)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            self.send(req, 0)
        })
        .await?;
        per_message(batch.messages.len(), answer)
    }
}

/// Splits `messages` into batches in their order, each within `BATCH_ITEMS_MAX` messages and
/// `BATCH_BYTES_MAX` bytes of body. A message too big for any batch gets one of its own, which
/// `Client::submit_batch` then refuses unsent (`Client::submit` sends it alone; the hub's
/// payload bound is smaller than a batch, so the hub would refuse it anyway).
pub fn batches(messages: Vec<SubmitRequest>) -> Vec<BatchSubmitRequest> {
    let mut out = Vec::new();
    let mut current: Vec<SubmitRequest> = Vec::new();
    let mut current_bytes = ENVELOPE_BYTES;
    for m in messages {
        // A message that does not serialise is left for `submit_batch` to refuse.
        let bytes = serde_json::to_vec(&m).map_or(0, |b| b.len());
        let separator = usize::from(!current.is_empty());
        let over_bytes = current_bytes + separator + bytes > BATCH_BYTES_MAX as usize;
        if !current.is_empty() && (current.len() == BATCH_ITEMS_MAX || over_bytes) {
            out.push(BatchSubmitRequest { messages: std::mem::take(&mut current) });
            current_bytes = ENVELOPE_BYTES;
        }
        current_bytes += usize::from(!current.is_empty()) + bytes;
        current.push(m);
    }
    if !current.is_empty() {
        out.push(BatchSubmitRequest { messages: current });
    }
    out
}

/// The body of `batch`, when it is within the hub's batch limits.
fn checked_body(batch: &BatchSubmitRequest) -> Result<Vec<u8>, ClientError> {
    let n = batch.messages.len();
    if n == 0 {
        return Err(ClientError::Invalid("messages: a batch needs at least one message".into()));
    }
    if n > BATCH_ITEMS_MAX {
        return Err(ClientError::Invalid(format!(
            "messages: {n} messages are more than one batch may carry ({BATCH_ITEMS_MAX}); split them with `batches`"
        )));
    }
    let body = serde_json::to_vec(batch).map_err(|e| ClientError::Invalid(format!("messages: {e}")))?;
    if body.len() as u64 > BATCH_BYTES_MAX {
        return Err(ClientError::Invalid(format!(
            "messages: the batch is {} bytes, over the {BATCH_BYTES_MAX} one batch may have; split it with `batches`",
            body.len()
        )));
    }
    Ok(body)
}

/// The hub's answer as one `ItemAnswer` per message of a batch of `n`, when it is the documented
/// answer: one result per message, a body with a 2xx status or an error with an error status.
fn per_message(n: usize, answer: BatchSubmitResponse) -> Result<Vec<ItemAnswer>, ClientError> {
    let bad = |detail: String| ClientError::BadAnswer { status: 200, detail };
    if answer.results.len() != n {
        return Err(bad(format!("{} results for a batch of {n} messages", answer.results.len())));
    }
    let mut out = Vec::with_capacity(n);
    for (i, item) in answer.results.into_iter().enumerate() {
        let status = item.status;
        match item.outcome {
            ItemOutcome::Ok(body) if (200..300).contains(&status) => out.push(Ok(body)),
            ItemOutcome::Error(e) if status >= 400 => out.push(Err(ApiError {
                status,
                code: ErrorCode::parse(&e.code),
                code_text: e.code,
                message: e.message,
            })),
            _ => return Err(bad(format!("results[{i}]: status {status} does not fit its outcome"))),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_shared::wire::{ErrorBody, ItemResult, Payload};

    fn message(key: &str, payload_bytes: usize) -> SubmitRequest {
        SubmitRequest {
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: Payload::from_text(format!("\"{}\"", "x".repeat(payload_bytes))).unwrap(),
            to: None,
            pools: None,
            max_attempts: None,
            retry_backoff_ms: None,
            approval: None,
            approval_timeout_ms: None,
            deadline_ms: None,
            stall_ms: None,
        }
    }

    fn many(n: usize, payload_bytes: usize) -> Vec<SubmitRequest> {
        (0..n).map(|i| message(&format!("k{i}"), payload_bytes)).collect()
    }

    #[test]
    fn the_envelope_is_what_a_batch_adds_around_its_messages() {
        let batch = BatchSubmitRequest { messages: many(3, 10) };
        let items: usize = batch.messages.iter().map(|m| serde_json::to_vec(m).unwrap().len()).sum();
        assert_eq!(serde_json::to_vec(&batch).unwrap().len(), ENVELOPE_BYTES + items + 2);
    }

    #[test]
    fn batches_keep_order_and_stay_within_both_limits() {
        let check = |n: usize, payload_bytes: usize, expected_sizes: &[usize]| {
            let split = batches(many(n, payload_bytes));
            let sizes: Vec<usize> = split.iter().map(|b| b.messages.len()).collect();
            assert_eq!(sizes, expected_sizes, "{n} messages of {payload_bytes} bytes");
            let keys: Vec<String> =
                split.iter().flat_map(|b| b.messages.iter().map(|m| m.idempotency_key.clone())).collect();
            assert_eq!(keys, (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>());
            for b in &split {
                assert!(checked_body(b).is_ok(), "a batch of {} is over a limit", b.messages.len());
            }
        };
        check(0, 1, &[]);
        check(1, 1, &[1]);
        check(BATCH_ITEMS_MAX, 1, &[BATCH_ITEMS_MAX]);
        check(BATCH_ITEMS_MAX + 1, 1, &[BATCH_ITEMS_MAX, 1]);
        // About 200 KiB each: five fit in 1 MiB, not six.
        check(11, 200 * 1024, &[5, 5, 1]);
    }

    #[test]
    fn batches_over_a_limit_are_refused_unsent() {
        let refused = |messages: Vec<SubmitRequest>| match checked_body(&BatchSubmitRequest { messages }) {
            Err(ClientError::Invalid(e)) => e,
            other => panic!("not refused: {other:?}"),
        };
        assert!(refused(Vec::new()).contains("at least one"));
        assert!(refused(many(BATCH_ITEMS_MAX + 1, 1)).contains("more than one batch may carry"));
        assert!(refused(many(6, 200 * 1024)).contains("bytes, over"));
        assert!(checked_body(&BatchSubmitRequest { messages: many(BATCH_ITEMS_MAX, 1) }).is_ok());
    }

    fn accepted(id: &str, duplicate: bool) -> ItemResult<SubmitResponse> {
        let body = SubmitResponse { message_id: id.into(), seq: 1, duplicate, deliveries: Vec::new() };
        ItemResult { status: if duplicate { 200 } else { 201 }, outcome: ItemOutcome::Ok(body) }
    }

    fn refused(status: u16, code: &str) -> ItemResult<SubmitResponse> {
        ItemResult { status, outcome: ItemOutcome::Error(ErrorBody { code: code.into(), message: "m".into() }) }
    }

    #[test]
    fn each_message_gets_its_own_typed_answer_in_order() {
        let answer = BatchSubmitResponse {
            results: vec![accepted("a", false), refused(409, "idempotency_conflict"), accepted("b", true)],
        };
        let answers = per_message(3, answer).unwrap();
        assert_eq!(answers[0].as_ref().map(|r| (r.message_id.as_str(), r.duplicate)), Ok(("a", false)));
        let e = answers[1].as_ref().unwrap_err();
        assert_eq!((e.status, e.code), (409, Some(ErrorCode::IdempotencyConflict)));
        assert_eq!(answers[2].as_ref().map(|r| (r.message_id.as_str(), r.duplicate)), Ok(("b", true)));
        // A code this client does not know is kept as sent.
        let answers = per_message(1, BatchSubmitResponse { results: vec![refused(400, "a_future_code")] }).unwrap();
        let e = answers[0].as_ref().unwrap_err();
        assert_eq!((e.code, e.code_text.as_str()), (None, "a_future_code"));
    }

    #[test]
    fn an_answer_that_does_not_fit_the_batch_is_a_bad_answer() {
        let short = BatchSubmitResponse { results: vec![accepted("a", false)] };
        assert!(matches!(per_message(2, short), Err(ClientError::BadAnswer { .. })));
        let mixed = BatchSubmitResponse { results: vec![refused(201, "odd")] };
        assert!(matches!(per_message(1, mixed), Err(ClientError::BadAnswer { .. })));
        let mut ok_as_error = accepted("a", false);
        ok_as_error.status = 409;
        let answer = BatchSubmitResponse { results: vec![ok_as_error] };
        assert!(matches!(per_message(1, answer), Err(ClientError::BadAnswer { .. })));
    }
}
