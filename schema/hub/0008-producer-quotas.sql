-- Per-producer quotas: how much one producer may have unsettled at once, so one runaway
-- producer cannot fill every host's queue (`queued_per_host_max`) for all the others.
-- Append-only: never edit a shipped migration.

-- A producer without a row has no quota (unlimited, `producers::QUOTA_DEFAULT`). A NULL limit
-- is unlimited for that measure. unsettled_max: most messages not yet settled
-- (`messages.settled_at IS NULL`); unsettled_bytes_max: most payload bytes (UTF-8) of them.
CREATE TABLE producer_quotas (
    producer             TEXT PRIMARY KEY,
    unsettled_max        INTEGER CHECK (unsettled_max IS NULL OR unsettled_max > 0),
    unsettled_bytes_max  INTEGER CHECK (unsettled_bytes_max IS NULL OR unsettled_bytes_max > 0),
    set_by               TEXT NOT NULL,
    set_at               INTEGER NOT NULL
) STRICT;

-- The accept counts a quota'd producer's unsettled messages through this index, at most as
-- many as its quota allows.
CREATE INDEX messages_unsettled_by_producer ON messages (producer) WHERE settled_at IS NULL;
