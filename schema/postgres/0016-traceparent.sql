-- Baton hub store on PostgreSQL, migration 0016: the W3C trace context each message carries
-- (the same change as the SQLite record's migration 0016; see schema/hub/0016-traceparent.sql
-- for what the column means). Append-only: never edit a shipped migration.
ALTER TABLE messages ADD COLUMN traceparent TEXT;
