-- Turn control: sessions (a fencing epoch per node process), hub-confirmed starts, cancel that
-- reaches a delivered turn, retries the harness asks for, and operator redrives.
-- Append-only: never edit a shipped migration.

-- A message's retry bound (SPEC §2): a harness exit 75 is retryable while the delivery's run
-- number is below it. `retry_backoff_ms` NULL means the hub's `retry_backoff`.
ALTER TABLE messages ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1);
ALTER TABLE messages ADD COLUMN retry_backoff_ms INTEGER CHECK (retry_backoff_ms IS NULL OR retry_backoff_ms >= 0);

-- The delivery's current run and its control state.
--   attempt          the run number: 1, then +1 for each retry or redrive
--   rerun            why the current run happens when it is not the first: 'retry' (the harness
--                    asked; keeps order) or 'redrive' (an operator; the only out-of-order run)
--   rerun_by         who caused the current run: 'hub' for a retry, the operator for a redrive
--   rerun_reason     why (the operator's reason)
--   not_before       while queued for a retry: not handed out before (unix ms)
--   started_session  the node session whose start of the current run the hub recorded
--   started_at       when (unix ms); NULL while the current run has not started
--   cancel_requested_at / cancel_by / cancel_reason: a cancel asked for (kept after it took
--                    effect, for the record)
ALTER TABLE deliveries ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1);
ALTER TABLE deliveries ADD COLUMN rerun TEXT CHECK (rerun IS NULL OR rerun IN ('retry', 'redrive'));
ALTER TABLE deliveries ADD COLUMN rerun_by TEXT;
ALTER TABLE deliveries ADD COLUMN rerun_reason TEXT;
ALTER TABLE deliveries ADD COLUMN not_before INTEGER;
ALTER TABLE deliveries ADD COLUMN started_session INTEGER;
ALTER TABLE deliveries ADD COLUMN started_at INTEGER;
ALTER TABLE deliveries ADD COLUMN cancel_requested_at INTEGER;
ALTER TABLE deliveries ADD COLUMN cancel_by TEXT;
ALTER TABLE deliveries ADD COLUMN cancel_reason TEXT;

-- Delivered turns whose cancel waits for their node: the claim answer lists them per instance.
CREATE INDEX deliveries_cancel_pending ON deliveries (instance_id)
    WHERE state = 'delivered' AND cancel_requested_at IS NOT NULL;

-- Attempts gain the 'cancelled' outcome, their run number, the signal that ended them, whether
-- the hub requeued after them, and why the run happened. SQLite cannot change a CHECK in place:
-- the table is rebuilt (nothing references it).
CREATE TABLE attempts_v3 (
    id            TEXT PRIMARY KEY,
    delivery_id   TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    host          TEXT NOT NULL,
    instance_id   TEXT NOT NULL,
    report_id     TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    outcome       TEXT NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'unknown', 'cancelled')),
    exit_code     INTEGER,
    duration_ms   INTEGER,
    result        TEXT,
    reason        TEXT,
    reported_at   INTEGER NOT NULL,
    attempt       INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    signal        INTEGER,
    retryable     INTEGER NOT NULL DEFAULT 0 CHECK (retryable IN (0, 1)),
    rerun         TEXT CHECK (rerun IS NULL OR rerun IN ('retry', 'redrive')),
    caused_by     TEXT,
    session       INTEGER,
    UNIQUE (host, report_id)
) STRICT;
INSERT INTO attempts_v3 (id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code,
                         duration_ms, result, reason, reported_at)
    SELECT id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code,
           duration_ms, result, reason, reported_at FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_v3 RENAME TO attempts;
CREATE INDEX attempts_by_delivery ON attempts (delivery_id, reported_at);
-- One outcome per run of a delivery.
CREATE UNIQUE INDEX attempts_one_per_run ON attempts (delivery_id, attempt);

-- Node sessions: each `baton-node` process start registers one (per host, increasing). The
-- host's newest session is the only one whose mirrored/ack/start/report the hub accepts.
-- A session that began while the previous one had not ended cleanly records `took_over`.
CREATE TABLE node_sessions (
    host          TEXT NOT NULL REFERENCES hosts (name),
    session       INTEGER NOT NULL CHECK (session >= 1),
    instance_id   TEXT NOT NULL,
    node_version  TEXT,
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER,
    ended_how     TEXT CHECK (ended_how IS NULL OR ended_how IN ('clean', 'superseded')),
    took_over     INTEGER,
    last_contact_at INTEGER NOT NULL,
    PRIMARY KEY (host, session)
) STRICT;

-- Operator redrive requests, so that repeating one (same request id) does nothing twice.
CREATE TABLE redrive_requests (
    request_id    TEXT PRIMARY KEY,
    operator      TEXT NOT NULL,
    reason        TEXT NOT NULL,
    filter        TEXT NOT NULL,                -- the selection, as JSON
    redriven      INTEGER NOT NULL,
    at            INTEGER NOT NULL
) STRICT;
