-- The node's local store (SPEC §4): its identity, the mirrored deliveries, the execution
-- queue, the attempts with their durable start and end markers, and the report outbox.
-- Append-only: later changes go in 0002-*.sql and onwards, never here.

-- One row per setting; `instance_id` is written once, on first start.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- The local copy of each delivery this instance took.
-- state: mirrored (local copy committed; hub ack not yet confirmed)
--        acked    (hub confirmed delivered: the execution gate is open)
--        done     (its attempt's report was confirmed, or is dead)
--        dropped  (the hub said it is not ours any more; never run)
CREATE TABLE deliveries (
    delivery_id   TEXT PRIMARY KEY,
    message_id    TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    payload       TEXT NOT NULL,
    claim_token   TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('mirrored', 'acked', 'done', 'dropped')),
    reason        TEXT,
    mirrored_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
) STRICT;

-- The execution queue: one row per mirrored delivery, written in the mirror transaction.
-- state: queued (waiting for the gate and its turn), started (start marker written),
--        ended (end marker written), cancelled (dropped before it ran).
CREATE TABLE executions (
    delivery_id   TEXT PRIMARY KEY REFERENCES deliveries(delivery_id),
    conversation  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('queued', 'started', 'ended', 'cancelled')),
    queued_at_ms  INTEGER NOT NULL
) STRICT;

CREATE INDEX executions_by_turn ON executions(state, conversation, seq);

-- One row per execution attempt. started_at_ms is the durable start marker; ended_at_ms
-- (with the outcome) is the durable end marker.
CREATE TABLE attempts (
    attempt_id    TEXT PRIMARY KEY,
    delivery_id   TEXT NOT NULL REFERENCES deliveries(delivery_id),
    started_at_ms INTEGER NOT NULL,
    ended_at_ms   INTEGER,
    outcome       TEXT CHECK (outcome IN ('succeeded', 'failed', 'unknown')),
    exit_code     INTEGER,
    duration_ms   INTEGER,
    result        TEXT,
    reason        TEXT,
    CHECK ((ended_at_ms IS NULL) = (outcome IS NULL))
) STRICT;

CREATE INDEX attempts_by_delivery ON attempts(delivery_id);

-- Reports waiting for the hub's confirmation. report_id is the attempt id; body is the
-- exact JSON sent, so a retry sends the same bytes.
CREATE TABLE outbox (
    report_id       TEXT PRIMARY KEY REFERENCES attempts(attempt_id),
    delivery_id     TEXT NOT NULL REFERENCES deliveries(delivery_id),
    body            TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    tries           INTEGER NOT NULL DEFAULT 0,
    last_try_at_ms  INTEGER,
    last_error      TEXT,
    confirmed_at_ms INTEGER,
    dead_at_ms      INTEGER,
    dead_reason     TEXT
) STRICT;
-- The outbox sender reads only what still waits, oldest first.
CREATE INDEX outbox_waiting ON outbox(created_at_ms, report_id) WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL;
