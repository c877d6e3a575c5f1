-- The producer's spool (`baton send --spool DIR`, `DIR/spool.db`): messages committed here
-- before any hub saw them, kept until the hub confirms each one.
-- Append-only: later changes go in 0002-*.sql and onwards, never here.

-- One row per spooled message not yet confirmed by the hub.
-- position: the spool order (AUTOINCREMENT: never reused, so a later message always has a
--           higher position, even after the newest one was removed).
-- request:  the exact `POST /v1/messages` body (a `SubmitRequest`), sent unchanged on every try.
-- bytes:    the length of `request`, counted against the spool's byte bound.
-- state:    waiting (to be sent, oldest first)
--           failed  (the hub refused it for good: kept for inspection with the hub's answer;
--                    later messages of its conversation wait behind it)
CREATE TABLE spool (
    position        INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    conversation    TEXT NOT NULL,
    request         TEXT NOT NULL,
    bytes           INTEGER NOT NULL CHECK (bytes > 0),
    spooled_at_ms   INTEGER NOT NULL,
    state           TEXT NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'failed')),
    tries           INTEGER NOT NULL DEFAULT 0,
    last_try_at_ms  INTEGER,
    last_error      TEXT,
    failed_status   INTEGER,
    failed_code     TEXT,
    CHECK ((state = 'failed') = (failed_status IS NOT NULL))
) STRICT;

-- The order within one conversation, for "is a failed message ahead of this one".
CREATE INDEX spool_by_conversation ON spool (conversation, position);
