-- Baton hub store on PostgreSQL, migration 0015: the breaker's turns per period (the same
-- change as the SQLite record's migration 0015; see schema/hub/0015-breaker-period.sql).
-- Append-only: never edit a shipped migration.
CREATE TABLE breaker_periods (
    conversation  TEXT PRIMARY KEY,
    period_start  BIGINT NOT NULL,
    turns         BIGINT NOT NULL CHECK (turns >= 0)
);
