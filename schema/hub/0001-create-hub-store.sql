-- The hub's record: certificates, hosts, conversations, messages with their routing and
-- fan-out obligations, deliveries with their event log, attempts, and fences.
-- Timestamps are unix milliseconds (wall clock). Append-only: never edit a shipped migration.

CREATE TABLE certificates (
    serial        TEXT PRIMARY KEY,             -- lowercase hex
    role          TEXT NOT NULL CHECK (role IN ('node', 'producer')),
    name          TEXT NOT NULL,
    issued_at     INTEGER NOT NULL,
    not_after     INTEGER NOT NULL,             -- unix seconds
    revoked_at    INTEGER,
    revoked_by    TEXT,
    revoked_reason TEXT
) STRICT;
CREATE INDEX certificates_by_name ON certificates (role, name);

CREATE TABLE hosts (
    name          TEXT PRIMARY KEY,
    enrolled_at   INTEGER NOT NULL,
    retired_at    INTEGER,
    retired_by    TEXT,
    retired_reason TEXT,
    instance_id   TEXT,                         -- the bound (active) node instance, if any
    instance_since INTEGER
) STRICT;

CREATE TABLE conversations (
    name          TEXT PRIMARY KEY,
    last_seq      INTEGER NOT NULL
) STRICT;

CREATE TABLE messages (
    id            TEXT PRIMARY KEY,
    conversation  TEXT NOT NULL REFERENCES conversations (name),
    seq           INTEGER NOT NULL,
    producer      TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    content_hash  TEXT NOT NULL,                -- sha256 over conversation, payload and recipients
    payload       TEXT NOT NULL,                -- JSON text
    accepted_at   INTEGER NOT NULL,
    UNIQUE (producer, idempotency_key),
    UNIQUE (conversation, seq)
) STRICT;
CREATE INDEX messages_by_accepted ON messages (accepted_at);

-- Routing: the recipient hosts decided in the acceptance transaction.
CREATE TABLE message_recipients (
    message_id    TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    host          TEXT NOT NULL,
    PRIMARY KEY (message_id, host)
) STRICT;

-- A durable promise to create one delivery per recipient; done_at is set when fan-out completes.
CREATE TABLE fanout_obligations (
    message_id    TEXT PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    created_at    INTEGER NOT NULL,
    done_at       INTEGER
) STRICT;
CREATE INDEX fanout_pending ON fanout_obligations (message_id) WHERE done_at IS NULL;

CREATE TABLE deliveries (
    n             INTEGER PRIMARY KEY AUTOINCREMENT, -- queue order: oldest first
    id            TEXT NOT NULL UNIQUE,
    message_id    TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    host          TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'mirrored', 'delivered', 'held', 'failed', 'unknown')),
    instance_id   TEXT,                         -- holder, while claimed/mirrored/delivered
    claim_token   TEXT,
    reason        TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    UNIQUE (message_id, host),
    CHECK ((state IN ('claimed', 'mirrored', 'delivered')) = (instance_id IS NOT NULL AND claim_token IS NOT NULL))
) STRICT;
CREATE INDEX deliveries_claimable ON deliveries (host, state, n);
CREATE INDEX deliveries_by_instance ON deliveries (instance_id, state) WHERE instance_id IS NOT NULL;
CREATE INDEX deliveries_by_conversation ON deliveries (conversation, state);
CREATE INDEX deliveries_by_state ON deliveries (state, n);

-- How many deliveries wait (queued or held) per host, kept in step by every transition, so the
-- capacity check at accept costs one lookup however long the backlog is.
CREATE TABLE host_backlog (
    host          TEXT PRIMARY KEY,
    waiting       INTEGER NOT NULL CHECK (waiting >= 0)
) STRICT;

-- Every transition, written in the same transaction as the change it records.
CREATE TABLE delivery_events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT, -- total commit order
    delivery_id   TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    from_state    TEXT,                         -- NULL for creation
    to_state      TEXT NOT NULL,
    actor_kind    TEXT NOT NULL CHECK (actor_kind IN ('hub', 'node', 'operator')),
    actor         TEXT NOT NULL,
    instance_id   TEXT,
    reason        TEXT,
    at            INTEGER NOT NULL
) STRICT;
CREATE INDEX delivery_events_by_delivery ON delivery_events (delivery_id, id);

CREATE TABLE attempts (
    id            TEXT PRIMARY KEY,
    delivery_id   TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    host          TEXT NOT NULL,
    instance_id   TEXT NOT NULL,
    report_id     TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    outcome       TEXT NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'unknown')),
    exit_code     INTEGER,
    duration_ms   INTEGER,
    result        TEXT,
    reason        TEXT,
    reported_at   INTEGER NOT NULL,
    UNIQUE (host, report_id)
) STRICT;
CREATE INDEX attempts_by_delivery ON attempts (delivery_id, reported_at);

CREATE TABLE fences (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL CHECK (kind IN ('pause', 'hold', 'block')),
    scope         TEXT NOT NULL CHECK (scope IN ('conversation', 'host', 'all')),
    target        TEXT,                         -- conversation or host name; NULL for all
    set_by        TEXT NOT NULL,
    set_at        INTEGER NOT NULL,
    set_after_event INTEGER NOT NULL,           -- last delivery_events.id committed before the fence
    reason        TEXT NOT NULL,
    lifted_at     INTEGER,
    lifted_after_event INTEGER,                 -- last delivery_events.id committed before the lift
    lifted_by     TEXT,
    lifted_reason TEXT,
    CHECK ((scope = 'all') = (target IS NULL))
) STRICT;
CREATE INDEX fences_active ON fences (scope, target) WHERE lifted_at IS NULL;

-- Operator actions that are not delivery transitions (certificates, hosts, fences).
CREATE TABLE operator_events (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    action        TEXT NOT NULL,
    subject       TEXT NOT NULL,
    operator      TEXT NOT NULL,
    reason        TEXT,
    at            INTEGER NOT NULL
) STRICT;
