-- Baton hub store on PostgreSQL, migration 0008: per-producer quotas (the same change as the
-- SQLite record's migration 0008; see schema/hub/0008-producer-quotas.sql for what each column
-- means). Append-only: never edit a shipped migration.
CREATE TABLE producer_quotas (
    producer             TEXT PRIMARY KEY,
    unsettled_max        BIGINT CHECK (unsettled_max IS NULL OR unsettled_max > 0),
    unsettled_bytes_max  BIGINT CHECK (unsettled_bytes_max IS NULL OR unsettled_bytes_max > 0),
    set_by               TEXT NOT NULL,
    set_at               BIGINT NOT NULL
);
CREATE INDEX messages_unsettled_by_producer ON messages (producer) WHERE settled_at IS NULL;
