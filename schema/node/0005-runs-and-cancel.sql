-- Runs and cancel: a delivery can come back for run 2, 3, … (a retry the harness asked for,
-- or an operator's redrive); each run has its own execution and its own attempt (its own
-- report id). An attempt may now be `cancelled`, may end without ever starting (a cancel
-- before the start, or a turn this data directory never had: reported, never run), and
-- records the signal that ended its harness. Append-only: never edit a shipped migration.

-- The delivery's current run (from the claim) and why it happens when it is not the first.
ALTER TABLE deliveries ADD COLUMN run INTEGER NOT NULL DEFAULT 1 CHECK (run >= 1);
ALTER TABLE deliveries ADD COLUMN rerun TEXT CHECK (rerun IS NULL OR rerun IN ('retry', 'redrive'));

-- One execution per run (it was one per delivery). Nothing references this table.
CREATE TABLE executions_v5 (
    delivery_id   TEXT NOT NULL REFERENCES deliveries(delivery_id),
    run           INTEGER NOT NULL DEFAULT 1 CHECK (run >= 1),
    conversation  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('queued', 'started', 'ended', 'cancelled')),
    queued_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (delivery_id, run)
) STRICT;
INSERT INTO executions_v5 (delivery_id, run, conversation, seq, state, queued_at_ms)
    SELECT delivery_id, 1, conversation, seq, state, queued_at_ms FROM executions;
DROP TABLE executions;
ALTER TABLE executions_v5 RENAME TO executions;
CREATE INDEX executions_by_turn ON executions(state, conversation, seq);

-- Attempts gain their run, the `cancelled` outcome, the signal that ended the harness, and may
-- have no start marker (started_at_ms NULL: ended without running, so nothing is left to
-- stop). The outbox references attempts, so both are rebuilt: the new outbox references the
-- new attempts table, and the old pair is dropped child first.
CREATE TABLE attempts_v5 (
    attempt_id    TEXT PRIMARY KEY,
    delivery_id   TEXT NOT NULL REFERENCES deliveries(delivery_id),
    run           INTEGER NOT NULL DEFAULT 1 CHECK (run >= 1),
    started_at_ms INTEGER,
    ended_at_ms   INTEGER,
    outcome       TEXT CHECK (outcome IN ('succeeded', 'failed', 'unknown', 'cancelled')),
    exit_code     INTEGER,
    signal        INTEGER,
    duration_ms   INTEGER,
    result        TEXT,
    reason        TEXT,
    pgid          INTEGER CHECK (pgid IS NULL OR pgid > 0),
    proc_start_ticks INTEGER CHECK (proc_start_ticks IS NULL OR proc_start_ticks >= 0),
    boot_id       TEXT,
    CHECK ((ended_at_ms IS NULL) = (outcome IS NULL)),
    CHECK (started_at_ms IS NOT NULL OR ended_at_ms IS NOT NULL)
) STRICT;
INSERT INTO attempts_v5 (attempt_id, delivery_id, run, started_at_ms, ended_at_ms, outcome, exit_code, duration_ms,
                         result, reason, pgid, proc_start_ticks, boot_id)
    SELECT attempt_id, delivery_id, 1, started_at_ms, ended_at_ms, outcome, exit_code, duration_ms,
           result, reason, pgid, proc_start_ticks, boot_id FROM attempts;

CREATE TABLE outbox_v5 (
    report_id       TEXT PRIMARY KEY REFERENCES attempts_v5(attempt_id),
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
INSERT INTO outbox_v5 SELECT report_id, delivery_id, body, created_at_ms, tries, last_try_at_ms, last_error,
                             confirmed_at_ms, dead_at_ms, dead_reason FROM outbox;
DROP TABLE outbox;
DROP TABLE attempts;
ALTER TABLE attempts_v5 RENAME TO attempts;
ALTER TABLE outbox_v5 RENAME TO outbox;
CREATE INDEX attempts_by_delivery ON attempts(delivery_id, run);
CREATE INDEX outbox_waiting ON outbox(created_at_ms, report_id) WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL;

-- The session this process registered with the hub lives in `meta` (keys `session`,
-- `session_started_at_ms`, `session_took_over`, `session_ended`): `baton-node status` shows it.
