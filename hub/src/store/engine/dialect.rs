//! Every statement whose text must differ between SQLite and PostgreSQL: each a named item
//! holding both texts side by side, with the reason they differ.
//!
//! Every other statement of the store is written once, in the syntax both servers accept
//! (`$N` parameters, standard SQL), and runs as it is written on both: nothing rewrites SQL at
//! run time. An operation takes an item's text for its connection with `Both::of` and never asks
//! which backend it runs on. Both texts of an item take the same parameters (each `$N` used at
//! least once in each), so one call site binds either.
//!
//! A statement one backend does not need is `None` on that side; a value the two backends need
//! apart (not a statement) is a `Both` of that value.

use super::{Db, Dialect};

/// One item, as SQLite and as PostgreSQL need it.
#[derive(Debug, Clone, Copy)]
pub struct Both<T> {
    /// SQLite's.
    pub sqlite: T,
    /// PostgreSQL's.
    pub postgres: T,
}

impl<T: Copy> Both<T> {
    /// The item for `conn`'s backend.
    pub fn of(&self, conn: &dyn Db) -> T {
        match conn.dialect() {
            Dialect::Sqlite => self.sqlite,
            Dialect::Postgres => self.postgres,
        }
    }
}

// The record's own facts.

/// The record's schema version. SQLite keeps it in the file's header (`user_version`, which
/// its migration runner sets); PostgreSQL in the one row of `baton_schema`, which its runner
/// writes.
pub const SCHEMA_VERSION: Both<&str> =
    Both { sqlite: "PRAGMA user_version", postgres: "SELECT version FROM baton_schema" };

/// The bytes the record takes, as `limits.store_bytes_max` counts them. On SQLite the file's
/// pages in use (free pages are reused before the file grows, so they do not count), read from
/// its pragmas; on PostgreSQL the database's size on disk, which only the server knows.
pub const STORE_BYTES: Both<&str> = Both {
    sqlite: "SELECT (p.page_count - f.freelist_count) * s.page_size
             FROM pragma_page_count() p, pragma_freelist_count() f, pragma_page_size() s",
    postgres: "SELECT pg_database_size(current_database())",
};

/// The newest event number ever drawn (0 before the first), whether or not that event's row is
/// still kept, as a fence records it (`set_after_event`, `lifted_after_event`): SQLite's
/// `AUTOINCREMENT` counter is a row of `sqlite_sequence`; PostgreSQL's is the identity column's
/// sequence (drawn in commit order there too, since writers take the record's write lock first).
/// Both forms of the two fence statements that record it follow.
///
/// A new fence: `$1` kind, `$2` scope, `$3` target, `$4` set by, `$5` set at, `$6` reason,
/// `$7` expiry; returns its id.
pub const FENCE_INSERT: Both<&str> = Both {
    sqlite: "INSERT INTO fences (kind, scope, target, set_by, set_at, set_after_event, reason, expires_at)
             VALUES ($1, $2, $3, $4, $5,
                     (SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'delivery_events'), $6, $7)
             RETURNING id",
    postgres: "INSERT INTO fences (kind, scope, target, set_by, set_at, set_after_event, reason, expires_at)
               VALUES ($1, $2, $3, $4, $5,
                       (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM delivery_events_id_seq), $6, $7)
               RETURNING id",
};

/// An active fence lifted (see `FENCE_INSERT` for why they differ): `$1` the fence, `$2` lifted
/// at, `$3` lifted by, `$4` the reason.
pub const FENCE_LIFT: Both<&str> = Both {
    sqlite: "UPDATE fences SET lifted_at = $2, lifted_by = $3, lifted_reason = $4,
                    lifted_after_event = (SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'delivery_events')
             WHERE id = $1 AND lifted_at IS NULL",
    postgres: "UPDATE fences SET lifted_at = $2, lifted_by = $3, lifted_reason = $4,
                      lifted_after_event = (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM delivery_events_id_seq)
               WHERE id = $1 AND lifted_at IS NULL",
};

// Claims: on PostgreSQL claims of several hubs run at once and are kept apart by row locks
// (`store::lifecycle::claim`, "claims at once"); on SQLite a claim holds the file's write lock
// and runs alone, so it locks no row (SQLite has no row locks).

/// The claimant host's row: its bound instance and when it was retired (`$1` the host). On
/// PostgreSQL locked shared, so one instance's claims may overlap.
pub const CLAIM_HOST_ROW: Both<&str> = Both {
    sqlite: "SELECT instance_id, retired_at FROM hosts WHERE name = $1",
    postgres: "SELECT instance_id, retired_at FROM hosts WHERE name = $1 FOR SHARE",
};

/// The claimant host's row again, when the claim may change it (bind another instance, fail a
/// retired host's work): on PostgreSQL locked exclusively and read anew under that lock. SQLite
/// reads it once (`CLAIM_HOST_ROW`), under the file's write lock.
pub const CLAIM_HOST_ROW_TO_CHANGE: Both<Option<&str>> =
    Both { sqlite: None, postgres: Some("SELECT instance_id, retired_at FROM hosts WHERE name = $1 FOR UPDATE") };

/// The holder's handoff (`transition::deliver`) with its events, in one statement: the guarded
/// update and, for the row it moved, one event per step from `$4` (claimed: claimed → mirrored
/// → delivered; mirrored: mirrored → delivered), in step order. The rows it answers are the
/// events written: none when the guard did not hold. On SQLite the update and the events are
/// separate statements in the one writer's transaction, at no round trip's cost.
pub const DELIVER_WITH_EVENTS: Both<Option<&str>> = Both {
    sqlite: None,
    postgres: Some(
        "WITH moved AS (
             UPDATE deliveries SET state = 'delivered', reason = NULL, updated_at = $1,
                    acked_session = coalesce($2, acked_session)
             WHERE id = $3 AND state = $4 AND instance_id = $5 AND claim_token = $6 AND host = $7
             RETURNING id)
         INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, instance_id, reason, at)
         SELECT moved.id, s.from_state, s.to_state, $8, $9, $5, NULL, $1
         FROM moved CROSS JOIN (VALUES ('claimed', 'mirrored', 1), ('mirrored', 'delivered', 2)) AS s (from_state, to_state, k)
         WHERE s.k >= CASE WHEN $4 = 'claimed' THEN 1 ELSE 2 END
         ORDER BY s.k",
    ),
};

/// `DELIVER_WITH_EVENTS` for a batch of one holder instance's deliveries
/// (`transition::deliver_many`; `$3` a JSON array of `[delivery id, claim token]` pairs, each
/// delivery once), in one statement: the rows it answers are the ids it moved, and each moved
/// delivery's events are written in the list's order, each in step order. PostgreSQL's alone:
/// on SQLite each delivery's statements cost no round trip.
pub const DELIVER_MANY_WITH_EVENTS: Both<Option<&str>> = Both {
    sqlite: None,
    postgres: Some(
        "WITH j AS (
             SELECT v ->> 0 AS id, v ->> 1 AS token, o AS pos
             FROM jsonb_array_elements($3::text::jsonb) WITH ORDINALITY AS t (v, o)),
         moved AS (
             UPDATE deliveries d SET state = 'delivered', reason = NULL, updated_at = $1,
                    acked_session = coalesce($2, d.acked_session)
             FROM j
             WHERE d.id = j.id AND d.state = $4 AND d.instance_id = $5 AND d.claim_token = j.token AND d.host = $6
             RETURNING d.id, j.pos),
         written AS (
             INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, instance_id, reason, at)
             SELECT moved.id, s.from_state, s.to_state, $7, $8, $5, NULL, $1
             FROM moved CROSS JOIN (VALUES ('claimed', 'mirrored', 1), ('mirrored', 'delivered', 2)) AS s (from_state, to_state, k)
             WHERE s.k >= CASE WHEN $4 = 'claimed' THEN 1 ELSE 2 END
             ORDER BY moved.pos, s.k)
         SELECT id FROM moved",
    ),
};

/// Whether `text` may go in a JSON list that a statement below unpacks (`TURNS_OF`,
/// `REPORTS_OF`, `HANDED_OUT`) and still match the record: PostgreSQL stores a text with NUL or
/// `PG_TEXT_ESCAPE` escaped (and its JSON cannot hold NUL), so such a text is looked up alone,
/// by a parameter of its own. No id or token the hub makes has either.
pub fn listable(text: &str) -> bool {
    !text.contains(['\0', super::PG_TEXT_ESCAPE])
}

/// The columns a turn is read from (`lifecycle::turns`' `Turn`), `d` the delivery: here beside
/// `TURNS_OF`, which reads them, and a macro so that every statement reading them is whole at
/// compile time.
macro_rules! turn_columns {
    () => {
        "d.host, d.state, d.instance_id, d.claim_token, d.attempt, d.started_session,
         d.cancel_requested_at IS NOT NULL,
         (SELECT a.outcome FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt),
         d.acked_session, d.pool"
    };
}
pub(crate) use turn_columns;

/// The columns a report's read is read from (`lifecycle::report`'s `ReportRead`): `e` the
/// attempt under the report id, `d` the delivery, `m` its message; here beside `REPORTS_OF`,
/// which reads them, and a macro so that every statement reading them is whole at compile time.
macro_rules! report_columns {
    () => {
        "e.id, e.request_hash, m.id,
         d.host, d.state, d.instance_id, d.claim_token, d.attempt, d.cancel_requested_at IS NOT NULL,
         m.max_attempts, m.retry_backoff_ms, d.rerun, coalesce(d.rerun_by, 'producer:' || m.producer),
         d.conversation, d.pool,
         (SELECT a.request_hash FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt),
         d.message_id, m.accepted_at"
    };
}
pub(crate) use report_columns;

/// The turns of the deliveries whose ids the JSON array `$1` lists (`lifecycle::turns`' start
/// batch, one statement for the batch), each row the turn's columns and then the id. The list
/// is unpacked by each backend's JSON function: SQLite's `json_each`, PostgreSQL's
/// `jsonb_array_elements_text` (the parameter bound as text).
pub const TURNS_OF: Both<&str> = Both {
    sqlite: concat!(
        "SELECT ",
        turn_columns!(),
        ", d.id FROM deliveries d WHERE d.id IN (SELECT value FROM json_each($1))"
    ),
    postgres: concat!(
        "SELECT ",
        turn_columns!(),
        ", d.id FROM deliveries d WHERE d.id IN (SELECT jsonb_array_elements_text($1::text::jsonb))"
    ),
};

/// What each report of a batch of a host's reads (`lifecycle::report::read_reports`; `$1` the
/// host, `$2` a JSON array of `[delivery id, report id]` pairs), one row per pair: the report's
/// columns and then the pair. Unpacked as `TURNS_OF` is.
pub const REPORTS_OF: Both<&str> = Both {
    sqlite: concat!(
        "SELECT ",
        report_columns!(),
        ", j.d, j.r
         FROM (SELECT json_extract(value, '$[0]') AS d, json_extract(value, '$[1]') AS r FROM json_each($2)) j
         LEFT JOIN attempts e ON e.host = $1 AND e.report_id = j.r
         LEFT JOIN deliveries d ON d.id = j.d
         LEFT JOIN messages m ON m.id = d.message_id"
    ),
    postgres: concat!(
        "SELECT ",
        report_columns!(),
        ", j.d, j.r
         FROM (SELECT v ->> 0 AS d, v ->> 1 AS r FROM jsonb_array_elements($2::text::jsonb) AS v) j
         LEFT JOIN attempts e ON e.host = $1 AND e.report_id = j.r
         LEFT JOIN deliveries d ON d.id = j.d
         LEFT JOIN messages m ON m.id = d.message_id"
    ),
};

/// How many of a claim's hand-outs (`$1` a JSON array of `[delivery id, claim token]` pairs)
/// are claimed by the instance `$2` (`lifecycle::transition::check_handed_out`), one statement
/// for the claim. Unpacked as `TURNS_OF` is; on SQLite `CROSS JOIN` keeps the list the outer
/// loop (its planner would otherwise walk the instance's claimed deliveries, the list for
/// each).
pub const HANDED_OUT: Both<&str> = Both {
    sqlite: "SELECT count(*)
             FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token
                   FROM json_each($1)) j
             CROSS JOIN deliveries d ON d.id = j.id AND d.claim_token = j.token
             WHERE d.state = 'claimed' AND d.instance_id = $2",
    postgres: "SELECT count(*) FROM deliveries d
               JOIN (SELECT v ->> 0 AS id, v ->> 1 AS token
                     FROM jsonb_array_elements($1::text::jsonb) AS v) j ON d.id = j.id AND d.claim_token = j.token
               WHERE d.state = 'claimed' AND d.instance_id = $2",
};

/// What an accept reads before it writes (`lifecycle::accept`; `$1` producer, `$2` idempotency
/// key, `$3` conversation, `$4` the first named recipient host or null), in one row: the
/// message accepted earlier under the key (id, seq, content hash, or nulls), whether the
/// conversation exists, whether it has members, `$4`'s enrolment, retirement and waiting count,
/// and the new message's `seq` or null. PostgreSQL draws that `seq` in the same statement (a
/// data-modifying `WITH`: one round trip fewer per post) when the conversation exists and the
/// key is new; a refusal after it rolls the draw back with the rest of the accept. SQLite,
/// whose statements cost no round trip, answers null and the accept draws it later as before,
/// as PostgreSQL does for a conversation's first post (whose row a family may make first).
pub const ACCEPT_PRELUDE: Both<&str> = Both {
    sqlite: "SELECT m.id, m.seq, m.content_hash,
                    EXISTS (SELECT 1 FROM conversations WHERE name = $3),
                    EXISTS (SELECT 1 FROM memberships WHERE conversation = $3)
                        OR EXISTS (SELECT 1 FROM conversation_pools WHERE conversation = $3),
                    h.name IS NOT NULL, h.retired_at IS NOT NULL, coalesce(b.waiting, 0),
                    NULL
             FROM (SELECT 1 AS one) o
             LEFT JOIN messages m ON m.producer = $1 AND m.idempotency_key = $2
             LEFT JOIN hosts h ON h.name = $4
             LEFT JOIN host_backlog b ON b.host = $4",
    postgres: "WITH earlier AS (
                   SELECT id, seq, content_hash FROM messages WHERE producer = $1 AND idempotency_key = $2),
               drawn AS (
                   UPDATE conversations SET last_seq = last_seq + 1
                   WHERE name = $3 AND NOT EXISTS (SELECT 1 FROM earlier)
                   RETURNING last_seq)
               SELECT m.id, m.seq, m.content_hash,
                      EXISTS (SELECT 1 FROM conversations WHERE name = $3),
                      EXISTS (SELECT 1 FROM memberships WHERE conversation = $3)
                          OR EXISTS (SELECT 1 FROM conversation_pools WHERE conversation = $3),
                      h.name IS NOT NULL, h.retired_at IS NOT NULL, coalesce(b.waiting, 0),
                      (SELECT last_seq FROM drawn)
               FROM (SELECT 1 AS one) o
               LEFT JOIN earlier m ON true
               LEFT JOIN hosts h ON h.name = $4
               LEFT JOIN host_backlog b ON b.host = $4",
};

/// Before a message may be settled (`lifecycle::settle`, `$1` the message): on PostgreSQL its row
/// locked, so that of two transactions ending its last two deliveries at once the second waits
/// and then sees the first's commit. SQLite has one writer.
pub const SETTLE_LOCK: Both<Option<&str>> =
    Both { sqlite: None, postgres: Some("SELECT 1 FROM messages WHERE id = $1 FOR UPDATE") };

/// Before a job that shares the record's write lock reads the deliveries whose ids the JSON
/// array `$1` lists (`transition::lock_rows`: a start or report batch): on PostgreSQL their rows
/// locked, in id order, so that the read after it (a fresh snapshot under READ COMMITTED) sees
/// every other hub's change of them committed and none comes in before this job commits.
/// SQLite has one writer.
pub const DELIVERIES_LOCK: Both<Option<&str>> = Both {
    sqlite: None,
    postgres: Some(
        "SELECT 1 FROM deliveries WHERE id IN (SELECT jsonb_array_elements_text($1::text::jsonb)) ORDER BY id
         FOR NO KEY UPDATE",
    ),
};

/// `DELIVERIES_LOCK` for one delivery `$1` (an id that cannot go in a JSON list, `listable`).
pub const DELIVERY_LOCK: Both<Option<&str>> =
    Both { sqlite: None, postgres: Some("SELECT 1 FROM deliveries WHERE id = $1 FOR NO KEY UPDATE") };

/// The host's conversation queues with work, least recently served first, after a position
/// (`$1` host, `$2` served, `$3` since, `$4` conversation, `$5` limit). On PostgreSQL each queue
/// returned is locked until the claim commits, and one another claim of the host holds is
/// skipped, so no two claims look at one conversation's turns at once.
pub const CLAIM_QUEUES: Both<&str> = Both {
    sqlite: "SELECT served, since, conversation FROM conversation_queues
             WHERE host = $1 AND queued > 0 AND (served, since, conversation) > ($2, $3, $4)
             ORDER BY served, since, conversation LIMIT $5",
    postgres: "SELECT served, since, conversation FROM conversation_queues
               WHERE host = $1 AND queued > 0 AND (served, since, conversation) > ($2, $3, $4)
               ORDER BY served, since, conversation LIMIT $5 FOR UPDATE SKIP LOCKED",
};

/// A pool's conversation queues with work that `$6` (the claiming host) may take now, least
/// recently served first, after a position (`$1` pool, `$2` served, `$3` since, `$4`
/// conversation, `$5` limit, `$7` now less the affinity wait): not bound to another host,
/// and not within the affinity wait of another host's last turn while that host is still a
/// member (a host that left the pool or was retired is waited for no longer). On PostgreSQL each returned
/// queue is locked until the claim commits and one another claim (of any member, on any hub)
/// holds is skipped, so no two claims look at one pool conversation's turns at once.
pub const CLAIM_POOL_QUEUES: Both<&str> = Both {
    sqlite: "SELECT served, since, conversation FROM pool_queues
             WHERE pool = $1 AND queued > 0 AND (served, since, conversation) > ($2, $3, $4)
               AND (bound_host IS NULL OR bound_host = $6)
               AND (bound_host IS NOT NULL OR last_host IS NULL OR last_host = $6 OR last_settled_at <= $7
                    OR NOT EXISTS (SELECT 1 FROM pool_members m WHERE m.pool = $1 AND m.host = last_host))
             ORDER BY served, since, conversation LIMIT $5",
    postgres: "SELECT served, since, conversation FROM pool_queues
               WHERE pool = $1 AND queued > 0 AND (served, since, conversation) > ($2, $3, $4)
                 AND (bound_host IS NULL OR bound_host = $6)
                 AND (bound_host IS NOT NULL OR last_host IS NULL OR last_host = $6 OR last_settled_at <= $7
                      OR NOT EXISTS (SELECT 1 FROM pool_members m WHERE m.pool = $1 AND m.host = last_host))
               ORDER BY served, since, conversation LIMIT $5 FOR UPDATE SKIP LOCKED",
};

/// Whether an earlier message of a conversation routed to a pool is still owed its fan-out
/// (`$1` conversation, `$2` seq, `$3` pool); as `EARLIER_NOT_FANNED_OUT` for hosts.
pub const EARLIER_NOT_FANNED_OUT_TO_POOL: Both<&str> = Both {
    sqlite: "SELECT EXISTS (
                 SELECT 1 FROM fanout_obligations o CROSS JOIN messages m ON m.id = o.message_id
                 WHERE o.done_at IS NULL AND m.conversation = $1 AND m.seq < $2
                   AND EXISTS (SELECT 1 FROM message_pool_recipients r WHERE r.message_id = o.message_id AND r.pool = $3))",
    postgres:
        "SELECT EXISTS (
                   SELECT 1 FROM fanout_obligations o JOIN messages m ON m.id = o.message_id
                   WHERE o.done_at IS NULL AND m.conversation = $1 AND m.seq < $2
                     AND EXISTS (SELECT 1 FROM message_pool_recipients r WHERE r.message_id = o.message_id AND r.pool = $3))",
};

/// Queues a claim reads beyond as many as it still needs (some may turn out blocked). None on
/// PostgreSQL: a queue read is locked for the claim (`CLAIM_QUEUES`), and one read and not
/// turned to would keep another claim of the host from it.
pub const CLAIM_QUEUES_SPARE: Both<i64> = Both { sqlite: 8, postgres: 0 };

/// Whether an earlier message of a conversation routed to the host is still owed its fan-out
/// (`$1` conversation, `$2` seq, `$3` host). SQLite's `CROSS JOIN` keeps the (tiny) pending set
/// as the outer loop, which its planner would not choose itself; PostgreSQL plans the join
/// order from its statistics and has no such hint (a `CROSS JOIN ... ON` is an inner join).
pub const EARLIER_NOT_FANNED_OUT: Both<&str> = Both {
    sqlite: "SELECT EXISTS (
                 SELECT 1 FROM fanout_obligations o CROSS JOIN messages m ON m.id = o.message_id
                 WHERE o.done_at IS NULL AND m.conversation = $1 AND m.seq < $2
                   AND EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = o.message_id AND r.host = $3))",
    postgres:
        "SELECT EXISTS (
                   SELECT 1 FROM fanout_obligations o JOIN messages m ON m.id = o.message_id
                   WHERE o.done_at IS NULL AND m.conversation = $1 AND m.seq < $2
                     AND EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = o.message_id AND r.host = $3))",
};

/// The delivered turns an instance holds whose cancel was asked for and whose current run has
/// no outcome yet (`$1` instance, `$2` host): every claim asks. SQLite is told to read them
/// through the partial index of pending cancels (`INDEXED BY`), so its planner never walks the
/// instance's whole delivered history instead; PostgreSQL has no index hints and picks the
/// partial index from its statistics.
pub const CANCELS_PENDING: Both<&str> = Both {
    sqlite:
        "SELECT d.id, d.attempt, coalesce(d.cancel_reason, '') FROM deliveries d INDEXED BY deliveries_cancel_pending
             WHERE d.instance_id = $1 AND d.host = $2 AND d.state = 'delivered' AND d.cancel_requested_at IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
             ORDER BY d.n",
    postgres: "SELECT d.id, d.attempt, coalesce(d.cancel_reason, '') FROM deliveries d
               WHERE d.instance_id = $1 AND d.host = $2 AND d.state = 'delivered' AND d.cancel_requested_at IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
               ORDER BY d.n",
};

// The larger of two values: SQLite's scalar `max(a, b)` is PostgreSQL's `GREATEST(a, b)`
// (`max` there is only the aggregate). They differ on NULL (GREATEST skips it, SQLite's `max`
// returns NULL); the statements below pass them none.

/// The waiting count of a delivery's host moved by `$2` (`$1` the delivery). A pool delivery
/// counts in no host's backlog: while it waits it has no host and is in its pool's queue.
pub const BACKLOG_OF_DELIVERY: Both<&str> = Both {
    sqlite: "INSERT INTO host_backlog (host, waiting) SELECT host, max($2, 0) FROM deliveries
             WHERE id = $1 AND host IS NOT NULL AND pool IS NULL
             ON CONFLICT (host) DO UPDATE SET waiting = host_backlog.waiting + $2",
    postgres: "INSERT INTO host_backlog (host, waiting) SELECT host, GREATEST($2, 0) FROM deliveries
               WHERE id = $1 AND host IS NOT NULL AND pool IS NULL
               ON CONFLICT (host) DO UPDATE SET waiting = host_backlog.waiting + $2",
};

/// The waiting count of host `$1` moved by `$2`.
pub const BACKLOG_OF_HOST: Both<&str> = Both {
    sqlite: "INSERT INTO host_backlog (host, waiting) VALUES ($1, max($2, 0))
             ON CONFLICT (host) DO UPDATE SET waiting = host_backlog.waiting + $2",
    postgres: "INSERT INTO host_backlog (host, waiting) VALUES ($1, GREATEST($2, 0))
               ON CONFLICT (host) DO UPDATE SET waiting = host_backlog.waiting + $2",
};

/// A session's last contact moved to `$3` unless it is already later (`$1` host, `$2` session).
pub const SESSION_CONTACT: Both<&str> = Both {
    sqlite: "UPDATE node_sessions SET last_contact_at = max(last_contact_at, $3) WHERE host = $1 AND session = $2",
    postgres: "UPDATE node_sessions SET last_contact_at = GREATEST(last_contact_at, $3) WHERE host = $1 AND session = $2",
};

/// What one request adds to a run's progress counts (`$1` delivery, `$2` attempt, `$3` events
/// kept, `$4` newest seq, `$5` when the newest was kept, `$6` the node's drops so far, `$7` the
/// hub's drops).
pub const TURN_PROGRESS_ADD: Both<&str> = Both {
    sqlite:
        "INSERT INTO turn_progress AS t (delivery_id, attempt, events, last_seq, last_at, node_dropped, hub_dropped)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (delivery_id, attempt) DO UPDATE SET
                 events = t.events + excluded.events,
                 last_seq = max(t.last_seq, excluded.last_seq),
                 last_at = coalesce(excluded.last_at, t.last_at),
                 node_dropped = max(t.node_dropped, excluded.node_dropped),
                 hub_dropped = t.hub_dropped + excluded.hub_dropped",
    postgres:
        "INSERT INTO turn_progress AS t (delivery_id, attempt, events, last_seq, last_at, node_dropped, hub_dropped)
               VALUES ($1, $2, $3, $4, $5, $6, $7)
               ON CONFLICT (delivery_id, attempt) DO UPDATE SET
                   events = t.events + excluded.events,
                   last_seq = GREATEST(t.last_seq, excluded.last_seq),
                   last_at = coalesce(excluded.last_at, t.last_at),
                   node_dropped = GREATEST(t.node_dropped, excluded.node_dropped),
                   hub_dropped = t.hub_dropped + excluded.hub_dropped",
};

// Matching a prefix of a delivery id. The parameter is the prefix followed by `*`: SQLite's
// indexed prefix match is `GLOB 'p*'`, and its planner uses the index only when the pattern is
// the parameter itself; PostgreSQL has no GLOB and matches from a range start with
// `starts_with`, on the prefix without its `*` (a prefix never holds one).

/// How many deliveries have an id matching `$1` (0, 1, or 2 meaning "several").
pub const DELIVERY_PREFIX_COUNT: Both<&str> = Both {
    sqlite: "SELECT count(*) FROM (SELECT 1 FROM deliveries WHERE id GLOB $1 LIMIT 2)",
    postgres: "SELECT count(*) FROM (
                   SELECT 1 FROM deliveries WHERE id >= rtrim($1, '*') AND starts_with(id, rtrim($1, '*')) LIMIT 2
               ) AS m",
};

/// The ids of deliveries matching `$1`, in id order, at most `$2`.
pub const DELIVERY_PREFIX_MATCHES: Both<&str> = Both {
    sqlite: "SELECT id FROM deliveries WHERE id GLOB $1 ORDER BY id LIMIT $2",
    postgres: "SELECT id FROM deliveries WHERE id >= rtrim($1, '*') AND starts_with(id, rtrim($1, '*'))
               ORDER BY id LIMIT $2",
};

// The offline check and moving a record between backends.

/// Rows whose foreign key points nowhere, as (subject, detail). SQLite checks foreign keys here
/// (`pragma_foreign_key_check`: a file written with them off may hold such rows); PostgreSQL
/// enforces them at every write, so it needs no check.
pub const FOREIGN_KEY_CHECK: Both<Option<&str>> = Both {
    sqlite: Some(
        "SELECT \"table\" || ' row ' || rowid, 'refers to a missing ' || parent || ' row' FROM pragma_foreign_key_check",
    ),
    postgres: None,
};

/// A table's column names in their order (`$1` the table): each server's own catalogue.
pub const TABLE_COLUMNS: Both<&str> = Both {
    sqlite: "SELECT name FROM pragma_table_info($1) ORDER BY cid",
    postgres: "SELECT column_name::text FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
};

/// The newest number drawn for a table's key counter, 0 when none was (`$1` the table, `$2`
/// its key column). SQLite keeps one counter per `AUTOINCREMENT` table, a row of
/// `sqlite_sequence` once a number was drawn (the column is the table's key, `pk` in its table
/// info); PostgreSQL a sequence behind the identity column (none drawn: no last value).
pub const COUNTER_DRAWN: Both<&str> = Both {
    sqlite: "SELECT coalesce(max(seq), 0) FROM sqlite_sequence
             WHERE name = $1 AND $2 IN (SELECT name FROM pragma_table_info($1) WHERE pk > 0)",
    postgres: "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, $2)), 0)",
};

/// Sets a table's key counter so the next number drawn is `$3 + 1` (`$1` the table, `$2` its key
/// column), each statement in turn. SQLite's counter is a row of `sqlite_sequence`, which has no
/// key to upsert on: the row is updated, and made when there is none and a number was drawn
/// (a counter at 0 draws 1 next, as one without a row does). PostgreSQL's is `setval` on the
/// sequence (not called: the next is 1).
pub const COUNTER_SET: Both<&[&str]> = Both {
    sqlite: &[
        "UPDATE sqlite_sequence SET seq = $3
         WHERE name = $1 AND $2 IN (SELECT name FROM pragma_table_info($1) WHERE pk > 0)",
        "INSERT INTO sqlite_sequence (name, seq) SELECT $1, $3
         WHERE $3 > 0 AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = $1)
           AND $2 IN (SELECT name FROM pragma_table_info($1) WHERE pk > 0)",
    ],
    postgres: &[
        "SELECT setval(pg_get_serial_sequence($1, $2), GREATEST(CAST($3 AS BIGINT), 1), CAST($3 AS BIGINT) > 0)",
    ],
};

/// Lifts the bound on how long the open transaction may sit idle: each side of a copy sits idle
/// while the other reads or writes a whole table, longer than a serving hub's transactions may
/// (`PG_WRITE_IDLE_MAX`). Only PostgreSQL ends an idle transaction; SQLite has no such bound.
pub const IDLE_UNBOUNDED: Both<Option<&str>> =
    Both { sqlite: None, postgres: Some("SET LOCAL idle_in_transaction_session_timeout = 0") };

// The producers' feeds (`store::views::feed`): their positions are drawn from the counter
// `delivery_events.id` is drawn from, which each server keeps where `COUNTER_DRAWN` says.

/// Draws `$1` consecutive feed positions and returns the last. SQLite's counter is a row of
/// `sqlite_sequence`, which exists only once a delivery event was written: before that this
/// returns no row and `FEED_DRAW_FIRST` makes it. PostgreSQL's is the identity column's
/// sequence, moved on by `$1` numbers at once.
pub const FEED_DRAW: Both<&str> = Both {
    sqlite: "UPDATE sqlite_sequence SET seq = seq + $1 WHERE name = 'delivery_events' RETURNING seq",
    postgres: "SELECT setval(pg_get_serial_sequence('delivery_events', 'id'),
                             nextval(pg_get_serial_sequence('delivery_events', 'id')) + $1 - 1)",
};

/// SQLite's feed counter made at `$1`, when `FEED_DRAW` found no row; PostgreSQL's sequence
/// always exists.
pub const FEED_DRAW_FIRST: Both<Option<&str>> =
    Both { sqlite: Some("INSERT INTO sqlite_sequence (name, seq) VALUES ('delivery_events', $1)"), postgres: None };

/// The highest feed position drawn so far, 0 before the first.
pub const FEED_DRAWN: Both<&str> = Both {
    sqlite: "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'delivery_events'), 0)",
    postgres: "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('delivery_events', 'id')::regclass), 0)",
};

/// A run's outcome (`attempts`), `$21` its feed position. SQLite's is drawn before
/// (`feed::draw`); PostgreSQL draws it in the statement when `$21` is null, the identity
/// sequence's next number (what `feed::draw(1)` returns), without a round trip of its own.
pub const ATTEMPT_INSERT: Both<&str> = Both {
    sqlite: "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code,
                                   duration_ms, result, reason, reported_at, attempt, signal, retryable, rerun,
                                   caused_by, session, stderr_tail, stderr_dropped_bytes, event_n)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                     $19, $20, $21)",
    postgres: "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code,
                                     duration_ms, result, reason, reported_at, attempt, signal, retryable, rerun,
                                     caused_by, session, stderr_tail, stderr_dropped_bytes, event_n)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                       $19, $20, coalesce($21, nextval(pg_get_serial_sequence('delivery_events', 'id'))))",
};

/// Whether `ATTEMPT_INSERT` draws its own feed position when given none.
pub const ATTEMPT_DRAWS_ITS_POSITION: Both<bool> = Both { sqlite: false, postgres: true };

/// Whether feed positions are drawn out of commit order. On SQLite the one writer draws and
/// commits in order. A PostgreSQL sequence is not commit order: a claim (which runs beside other
/// claims) may commit a lower position after a higher one, so a feed reads only up to
/// `FEED_HORIZON` and moves it with a barrier (see `store::views::feed`).
pub const FEED_DRAWN_OUT_OF_COMMIT_ORDER: Both<bool> = Both { sqlite: false, postgres: true };

/// The feed's horizon in this snapshot: no position at or below it can still be committed
/// later. On SQLite every position drawn (`FEED_DRAWN`); on PostgreSQL the highest position seen
/// among progress events and the delivery events written only under the record's exclusive
/// write lock: all but a claim's (out of `queued`), a holder's handoff steps (claimed or
/// mirrored → mirrored or delivered) and a report's retry (delivered → queued), which share it.
/// Outcomes are left out whole: reports share it.
pub const FEED_HORIZON: Both<&str> = Both {
    sqlite: "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'delivery_events'), 0)",
    postgres: "SELECT GREATEST(
                   coalesce((SELECT max(id) FROM delivery_events
                             WHERE from_state IS NULL
                                OR NOT (from_state = 'queued'
                                        OR (from_state IN ('claimed', 'mirrored')
                                            AND to_state IN ('mirrored', 'delivered'))
                                        OR (from_state = 'delivered' AND to_state = 'queued'))), 0),
                   coalesce((SELECT max(n) FROM progress_events), 0))",
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The `$N` a statement names.
    fn parameters(sql: &str) -> BTreeSet<u32> {
        sql.split('$')
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .collect()
    }

    /// Both texts of every pair name the same parameters, `$1` to `$N` without a gap, so one
    /// call site binds either (each backend refuses a parameter its statement does not name).
    #[test]
    fn both_texts_of_a_pair_name_the_same_parameters() {
        let pairs: &[(&str, Both<&str>)] = &[
            ("SCHEMA_VERSION", SCHEMA_VERSION),
            ("STORE_BYTES", STORE_BYTES),
            ("FENCE_INSERT", FENCE_INSERT),
            ("FENCE_LIFT", FENCE_LIFT),
            ("CLAIM_HOST_ROW", CLAIM_HOST_ROW),
            ("CLAIM_QUEUES", CLAIM_QUEUES),
            ("CLAIM_POOL_QUEUES", CLAIM_POOL_QUEUES),
            ("EARLIER_NOT_FANNED_OUT", EARLIER_NOT_FANNED_OUT),
            ("EARLIER_NOT_FANNED_OUT_TO_POOL", EARLIER_NOT_FANNED_OUT_TO_POOL),
            ("CANCELS_PENDING", CANCELS_PENDING),
            ("BACKLOG_OF_DELIVERY", BACKLOG_OF_DELIVERY),
            ("BACKLOG_OF_HOST", BACKLOG_OF_HOST),
            ("SESSION_CONTACT", SESSION_CONTACT),
            ("TURN_PROGRESS_ADD", TURN_PROGRESS_ADD),
            ("DELIVERY_PREFIX_COUNT", DELIVERY_PREFIX_COUNT),
            ("DELIVERY_PREFIX_MATCHES", DELIVERY_PREFIX_MATCHES),
            ("TABLE_COLUMNS", TABLE_COLUMNS),
            ("COUNTER_DRAWN", COUNTER_DRAWN),
            ("FEED_DRAW", FEED_DRAW),
            ("FEED_DRAWN", FEED_DRAWN),
            ("ATTEMPT_INSERT", ATTEMPT_INSERT),
            ("FEED_HORIZON", FEED_HORIZON),
            ("TURNS_OF", TURNS_OF),
            ("ACCEPT_PRELUDE", ACCEPT_PRELUDE),
            ("REPORTS_OF", REPORTS_OF),
            ("HANDED_OUT", HANDED_OUT),
        ];
        let gapless = |p: &BTreeSet<u32>| p.iter().copied().eq(1..=p.len() as u32);
        for (name, pair) in pairs {
            let (sqlite, postgres) = (parameters(pair.sqlite), parameters(pair.postgres));
            assert_eq!(sqlite, postgres, "{name}");
            assert!(gapless(&sqlite), "{name}: {sqlite:?}");
        }
        // A lone statement names only what the pair it stands in for would.
        let host_row = parameters(CLAIM_HOST_ROW.sqlite);
        assert_eq!(CLAIM_HOST_ROW_TO_CHANGE.postgres.map(parameters), Some(host_row));
        assert_eq!(FEED_DRAW_FIRST.sqlite.map(parameters), Some(parameters(FEED_DRAW.sqlite)));
        assert_eq!(DELIVER_WITH_EVENTS.postgres.map(parameters), Some((1..=9).collect()));
        assert_eq!(DELIVER_MANY_WITH_EVENTS.postgres.map(parameters), Some((1..=8).collect()));
        // Each statement of a sequence names every parameter of the sequence.
        for sql in COUNTER_SET.sqlite.iter().chain(COUNTER_SET.postgres) {
            assert_eq!(parameters(sql), BTreeSet::from([1, 2, 3]), "{sql}");
        }
        assert!(parameters(SCHEMA_VERSION.sqlite).is_empty());
        assert_eq!(parameters("a = $12 AND b = $1 OR $12"), BTreeSet::from([1, 12]));
    }
}
