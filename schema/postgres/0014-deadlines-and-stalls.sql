-- Baton hub store on PostgreSQL, migration 0014: a message's deadline and stall bound (the same
-- change as the SQLite record's migration 0014; see schema/hub/0014-deadlines-and-stalls.sql).
-- Append-only: never edit a shipped migration.
ALTER TABLE messages ADD COLUMN deadline_ms BIGINT CHECK (deadline_ms IS NULL OR deadline_ms > 0);
ALTER TABLE messages ADD COLUMN stall_ms BIGINT CHECK (stall_ms IS NULL OR stall_ms > 0);
