//! A producer's replay feed (`GET /v1/messages?conversation=C&after=CURSOR`): its own
//! messages of one conversation, in `seq` order, one bounded page at a time from a position.
//!
//! The position is a `seq` of the conversation. Why it is a stable cursor on both backends: a
//! message's `seq` is drawn by the accepting transaction's update of its conversation's row
//! (`conversations.last_seq`), which that transaction holds locked until it commits, so the
//! next `seq` of the conversation is drawn only after the previous one committed (on SQLite,
//! by its one writer; on PostgreSQL, by the row lock the `INSERT … ON CONFLICT DO UPDATE`
//! takes). A reader that sees `seq` N therefore sees every `seq` below N that was not removed:
//! unlike the ids of a PostgreSQL sequence (the long comment at the top of
//! `schema/postgres/0001-create-hub-store.sql`), a conversation's `seq`s commit in order.
//!
//! Those `seq`s are dense: the accepting transaction draws one and inserts its message, or
//! rolls both back. So a `seq` missing between a position and the page's end was removed
//! (retention, a purge), and the page is `Replay::Expired`: the feed can no longer give
//! everything after that position, and since the hub keeps nothing of a removed message it
//! cannot tell whether it was this producer's, so any removal after the position counts. A
//! position past the conversation's last `seq` was never given out (`Replay::Ahead`).
//!
//! Invariant: a page reads at most `MESSAGE_PAGE_SCAN_SEQS_MAX` of the conversation's `seq`s,
//! so another producer's long stretch in the conversation costs a page bounded work.

use crate::store::engine::Db;
use crate::store::engine::{OptionalExtension, params};
use crate::store::{Store, StoreResult, json_column, state_column};
use baton_shared::limits::MESSAGE_PAGE_SCAN_SEQS_MAX;
use baton_shared::wire::{DeliverySummary, ListedMessage};

impl Store {
    /// One page of `producer`'s messages in `conversation` after position `after` (0: from the
    /// start), at most `limit`.
    pub async fn message_page(
        &self,
        producer: String,
        conversation: String,
        after: i64,
        limit: u32,
    ) -> StoreResult<Replay> {
        self.conns
            .read(move |c| message_page(c, &producer, &conversation, after, limit, MESSAGE_PAGE_SCAN_SEQS_MAX))
            .await
    }
}

/// What one look at the feed found.
#[derive(Debug, Clone, PartialEq)]
pub enum Replay {
    /// A page: the producer's messages after the position, in `seq` order.
    Page {
        /// At most the `limit` asked for.
        messages: Vec<ListedMessage>,
        /// The position the page ends at: the last message's `seq` when the page is full, else
        /// the end of the stretch it looked through (the conversation's last `seq` at most).
        end: i64,
        /// The conversation's last `seq` when it was read: more follows while `end` is below.
        last_seq: i64,
    },
    /// Messages after the position were removed: the feed cannot give everything after it.
    Expired {
        /// How many of the conversation's messages between the position and the page's end
        /// are gone.
        removed: i64,
    },
    /// The position is past the conversation's last `seq`: no page ever ended there.
    Ahead {
        /// The conversation's last `seq`.
        last_seq: i64,
    },
}

/// See `Store::message_page`; a page looks through at most `scan` `seq`s
/// (`MESSAGE_PAGE_SCAN_SEQS_MAX`).
pub fn message_page(
    conn: &dyn Db,
    producer: &str,
    conversation: &str,
    after: i64,
    limit: u32,
    scan: i64,
) -> StoreResult<Replay> {
    let last_seq: i64 = conn
        .prepare_cached("SELECT last_seq FROM conversations WHERE name = $1")?
        .query_row([conversation], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    if after > last_seq {
        return Ok(Replay::Ahead { last_seq });
    }
    // The stretch this page looks through, never past what was read as the last `seq`: a
    // message committed after that read waits for the next page.
    let until = after.saturating_add(scan).min(last_seq);
    let mut messages: Vec<ListedMessage> = conn
        .prepare_cached(
            "SELECT id, seq, idempotency_key, payload, accepted_at, traceparent FROM messages
             WHERE conversation = $1 AND seq > $2 AND seq <= $3 AND producer = $4
             ORDER BY seq LIMIT $5",
        )?
        .query_map(params![conversation, after, until, producer, i64::from(limit)], |r| {
            let id: String = r.get(0)?;
            Ok(ListedMessage {
                seq: r.get(1)?,
                idempotency_key: r.get(2)?,
                payload: json_column(r, 3, "messages", &id)?,
                accepted_at_ms: r.get(4)?,
                traceparent: r.get(5)?,
                deliveries: Vec::new(),
                message_id: id,
            })
        })?
        .collect::<Result<_, _>>()?;
    let full = messages.len() >= limit as usize;
    let end = match messages.last() {
        Some(m) if full => m.seq,
        _ => until,
    };
    // Every `seq` from the position to the page's end must still be there (at most
    // `MESSAGE_PAGE_SCAN_SEQS_MAX` index entries counted). From the start (no position) the
    // feed begins at what is kept.
    if after > 0 {
        let kept: i64 = conn
            .prepare_cached("SELECT count(*) FROM messages WHERE conversation = $1 AND seq > $2 AND seq <= $3")?
            .query_row(params![conversation, after, end], |r| r.get(0))?;
        if kept < end - after {
            return Ok(Replay::Expired { removed: end - after - kept });
        }
    }
    for m in &mut messages {
        m.deliveries = conn
            .prepare_cached(
                "SELECT id, host, state, pool FROM deliveries WHERE message_id = $1 ORDER BY pool IS NOT NULL, pool, host",
            )?
            .query_map([&m.message_id], |r| {
                let id: String = r.get(0)?;
                Ok(DeliverySummary {
                    host: r.get(1)?,
                    pool: r.get(3)?,
                    state: state_column(r, 2, "deliveries", &id)?,
                    delivery_id: id,
                })
            })?
            .collect::<Result<_, _>>()?;
    }
    debug_assert!(after <= end && end <= last_seq, "a page ends within the conversation");
    Ok(Replay::Page { messages, end, last_seq })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::{AcceptLimits, Accepted, NewMessage, accept, fan_out};
    use crate::store::testing;

    fn post(conn: &dyn Db, producer: &str, conversation: &str, key: &str) -> (String, i64) {
        let msg = NewMessage {
            producer: producer.into(),
            conversation: conversation.into(),
            idempotency_key: key.into(),
            payload: format!("{{\"k\":\"{key}\"}}"),
            to: vec!["host-a".into()],
            pools: Vec::new(),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let Accepted::New { message_id, seq } =
            accept(conn, &msg, AcceptLimits { queued_per_host_max: 1 << 40, queued_per_pool_max: 1 << 40 }, 1)
                .unwrap_or_else(|e| panic!("{producer} {key}: {e}"))
        else {
            panic!("duplicate")
        };
        fan_out(conn, &message_id, 1).unwrap();
        (message_id, seq)
    }

    /// The scan of these tests' pages: wide enough for every conversation here but the one that
    /// tests the scan.
    const SCAN: i64 = 100;

    fn page(conn: &dyn Db, producer: &str, conversation: &str, after: i64, limit: u32) -> (Vec<i64>, i64, i64) {
        match message_page(conn, producer, conversation, after, limit, SCAN).unwrap() {
            Replay::Page { messages, end, last_seq } => (messages.iter().map(|m| m.seq).collect(), end, last_seq),
            other => panic!("not a page: {other:?}"),
        }
    }

    /// The producer's own messages, in `seq` order, pages ending at their last message or at
    /// the conversation's end; another producer's never appear; a later message comes on the
    /// page after the end.
    #[test]
    fn pages_follow_the_producer_s_own_messages_in_seq_order() {
        let db = testing::db();
        let c = &*db.conn;
        let mut mine = Vec::new();
        for i in 0..5 {
            mine.push(post(c, "prod", "talk", &format!("a{i}")));
            post(c, "other", "talk", &format!("b{i}"));
        }
        post(c, "prod", "elsewhere", "x");
        let seqs: Vec<i64> = mine.iter().map(|(_, s)| *s).collect();
        assert_eq!(seqs, [1, 3, 5, 7, 9]);
        assert_eq!(page(c, "prod", "talk", 0, 2), (vec![1, 3], 3, 10));
        assert_eq!(page(c, "prod", "talk", 3, 2), (vec![5, 7], 7, 10));
        assert_eq!(page(c, "prod", "talk", 7, 2), (vec![9], 10, 10), "the last page ends at the conversation's end");
        assert_eq!(page(c, "prod", "talk", 10, 2), (vec![], 10, 10), "nothing new: the same position");
        let (id, seq) = post(c, "prod", "talk", "a5");
        assert_eq!(page(c, "prod", "talk", 10, 2), (vec![seq], 11, 11));
        assert_eq!(page(c, "nobody", "talk", 0, 100), (vec![], 11, 11), "another producer's are never listed");
        assert_eq!(page(c, "prod", "never-posted", 0, 10), (vec![], 0, 0));
        let Replay::Page { messages, .. } = message_page(c, "prod", "talk", 10, 1, SCAN).unwrap() else { panic!() };
        let m = &messages[0];
        assert_eq!(
            (m.message_id.as_str(), m.idempotency_key.as_str(), m.payload.as_str()),
            (id.as_str(), "a5", r#"{"k":"a5"}"#)
        );
        assert_eq!(m.traceparent.as_deref(), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!(m.deliveries.iter().filter_map(|d| d.host.as_deref()).collect::<Vec<_>>(), ["host-a"]);
    }

    /// A page reads a bounded stretch of the conversation: past a long run of other producers'
    /// messages it ends early, empty, its position at the stretch's end, and says more follows.
    #[test]
    fn a_long_stretch_of_other_producers_messages_ends_a_page_early() {
        let db = testing::db();
        let c = &*db.conn;
        post(c, "prod", "talk", "first");
        for i in 0..5 {
            post(c, "other", "talk", &format!("o{i}"));
        }
        let (_, late) = post(c, "prod", "talk", "late");
        let scan = |after| match message_page(c, "prod", "talk", after, 10, 3).unwrap() {
            Replay::Page { messages, end, last_seq } => {
                (messages.iter().map(|m| m.seq).collect::<Vec<_>>(), end, last_seq)
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(scan(0), (vec![1], 3, late), "the stretch 1..=3 read");
        assert_eq!(scan(3), (vec![], 6, late), "a stretch of others' only: empty, and on");
        assert_eq!(scan(6), (vec![late], late, late));
    }

    /// A position after which messages were removed is expired (from the old end or the
    /// middle, anyone's); one past the conversation's end is ahead; the start (0) and a
    /// position after every removal are neither.
    #[test]
    fn a_position_before_what_is_kept_is_expired_and_one_past_the_end_is_ahead() {
        let db = testing::db();
        let c = &*db.conn;
        let posted: Vec<(String, i64)> = (0..4).map(|i| post(c, "prod", "talk", &format!("k{i}"))).collect();
        assert_eq!(message_page(c, "prod", "talk", 5, 10, SCAN).unwrap(), Replay::Ahead { last_seq: 4 });
        // Retention removes the two oldest, as its sweep does (their deliveries go with them).
        for (id, _) in &posted[..2] {
            c.execute("DELETE FROM messages WHERE id = $1", [id]).unwrap();
        }
        assert_eq!(message_page(c, "prod", "talk", 1, 10, SCAN).unwrap(), Replay::Expired { removed: 1 });
        assert_eq!(page(c, "prod", "talk", 2, 10), (vec![3, 4], 4, 4), "nothing after 2 was removed");
        assert_eq!(page(c, "prod", "talk", 0, 10), (vec![3, 4], 4, 4), "from the start: what is kept");
        for (id, _) in &posted[2..] {
            c.execute("DELETE FROM messages WHERE id = $1", [id]).unwrap();
        }
        assert_eq!(message_page(c, "prod", "talk", 3, 10, SCAN).unwrap(), Replay::Expired { removed: 1 });
        assert_eq!(page(c, "prod", "talk", 4, 10), (vec![], 4, 4), "at the end, nothing was missed");
        // A message removed in the middle expires the positions before it, whoever sent it.
        let (_, five) = post(c, "other", "talk", "five");
        let (_, six) = post(c, "prod", "talk", "six");
        let seven = post(c, "prod", "talk", "seven");
        c.execute("DELETE FROM messages WHERE seq = $1 AND conversation = 'talk'", [six]).unwrap();
        assert_eq!(message_page(c, "prod", "talk", five, 10, SCAN).unwrap(), Replay::Expired { removed: 1 });
        assert_eq!(page(c, "prod", "talk", six, 10), (vec![seven.1], seven.1, seven.1));
    }
}
