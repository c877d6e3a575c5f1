//! The producer's replay feed, `GET /v1/messages?conversation=C[&after=CURSOR][&limit=N]`: its
//! own messages of one conversation, oldest first, a bounded page at a time (`store::replay`).
//!
//! Who may see what: a producer lists only the messages it submitted itself, the same right as
//! reading one by id (`GET /v1/messages/{id}` answers 403 `not_yours` for another's). Another
//! producer's messages in the same conversation are never in a page, whatever the publish
//! scopes, so a listing tells nothing a producer could not read already; following everything
//! said in a conversation is the operators' view.
//!
//! The cursor is opaque to the producer: the position (a `seq` of the conversation) and a tag,
//! a hash of the producer, the conversation and the position, so a cursor is taken back only
//! for the listing that gave it (another conversation's or producer's, or a mangled one, is 400
//! `bad_cursor`). A position the hub no longer keeps whole is 410 `cursor_expired`.

use super::ApiError;
use crate::runtime::AppState;
use crate::store::views::replay::Replay;
use baton_shared::error::ErrorCode;
use baton_shared::wire::MessagePage;
use sha2::{Digest, Sha256};

/// Hex digits of the tag a cursor carries.
const CURSOR_TAG_CHARS: usize = 16;

/// The cursor of position `seq` in `producer`'s listing of `conversation`: `SEQ.TAG`.
pub(super) fn cursor(producer: &str, conversation: &str, seq: i64) -> String {
    format!("{seq}.{}", tag(producer, conversation, seq))
}

fn tag(producer: &str, conversation: &str, seq: i64) -> String {
    let mut h = Sha256::new();
    for part in ["baton message cursor v1", producer, conversation] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update(seq.to_le_bytes());
    h.finalize().iter().take(CURSOR_TAG_CHARS / 2).map(|b| format!("{b:02x}")).collect()
}

/// The position a cursor names, when it is one this listing gave.
pub(super) fn position(producer: &str, conversation: &str, text: &str) -> Result<i64, ApiError> {
    let invalid = || {
        ApiError::new(
            ErrorCode::BadCursor,
            "after: not a cursor of this listing (give a next_cursor this conversation's listing answered, or none \
             to start from the beginning)",
        )
    };
    let (seq, given) = text.split_once('.').ok_or_else(invalid)?;
    let seq: i64 = seq.parse().ok().filter(|s| *s >= 0).ok_or_else(invalid)?;
    if given != tag(producer, conversation, seq) {
        return Err(invalid());
    }
    Ok(seq)
}

/// One page of the feed for `producer`, within `limits.message_page_max` messages (a larger
/// `limit` is capped) and `limits.message_view_bytes_max` bytes (always at least one message).
pub(super) async fn page(
    state: &AppState,
    producer: &str,
    conversation: String,
    after: Option<&str>,
    limit: Option<u32>,
) -> Result<MessagePage, ApiError> {
    let after_seq = match after {
        Some(text) => position(producer, &conversation, text)?,
        None => 0,
    };
    let limit = match limit {
        Some(0) => return Err(ApiError::new(ErrorCode::InvalidField, "limit: must be at least 1")),
        Some(n) => n.min(state.limits.message_page_max),
        None => state.limits.message_page_max,
    };
    let found = state.store.message_page(producer.to_string(), conversation.clone(), after_seq, limit).await?;
    let (mut messages, mut end, last_seq) = match found {
        Replay::Page { messages, end, last_seq } => (messages, end, last_seq),
        Replay::Expired { removed } => {
            return Err(ApiError::new(
                ErrorCode::CursorExpired,
                format!(
                    "after: {removed} message(s) of {conversation:?} after this cursor were removed (retention or a \
                     purge), so the listing cannot go on from it; list again without after to start from what is kept"
                ),
            ));
        }
        Replay::Ahead { last_seq } => {
            return Err(ApiError::new(
                ErrorCode::BadCursor,
                format!(
                    "after: past the end of {conversation:?} (its last seq is {last_seq}): not a cursor the hub gave"
                ),
            ));
        }
    };
    // The bytes bound: whole messages while they fit, at least one; the page then ends at the
    // last one kept.
    let max = state.limits.message_view_bytes_max;
    let mut used = json_len(&MessagePage {
        conversation: conversation.clone(),
        messages: Vec::new(),
        next_cursor: cursor(producer, &conversation, i64::MAX),
        more: true,
    });
    let mut kept = 0;
    for m in &messages {
        let adds = json_len(m).saturating_add(1);
        if kept > 0 && used.saturating_add(adds) > max {
            break;
        }
        used = used.saturating_add(adds);
        kept += 1;
    }
    if kept < messages.len() {
        messages.truncate(kept);
        end = messages.last().map_or(end, |m| m.seq);
    }
    Ok(MessagePage { next_cursor: cursor(producer, &conversation, end), more: end < last_seq, conversation, messages })
}

/// Bytes of JSON `v` takes.
fn json_len<T: serde::Serialize>(v: &T) -> u64 {
    serde_json::to_vec(v).map_or(u64::MAX, |b| b.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cursor is taken back by the listing that gave it only: another producer's or
    /// conversation's, a mangled one, a negative position are refused as `bad_cursor`.
    #[test]
    fn a_cursor_belongs_to_its_listing() {
        let c = cursor("prod", "talk", 42);
        assert!(c.starts_with("42."), "{c}");
        assert_eq!(position("prod", "talk", &c).unwrap(), 42);
        assert_eq!(position("prod", "talk", &cursor("prod", "talk", 0)).unwrap(), 0);
        for bad in [
            cursor("other", "talk", 42),
            cursor("prod", "elsewhere", 42),
            c.replace("42.", "43."),
            "42".to_string(),
            "x.y".to_string(),
            format!("-1.{}", tag("prod", "talk", -1)),
            String::new(),
        ] {
            let e = position("prod", "talk", &bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadCursor, "{bad}");
            assert!(e.message.starts_with("after:"), "{}", e.message);
        }
    }
}
