-- Baton hub store on PostgreSQL, migration 0010: the W3C trace context each message carries
-- (the same change as the SQLite record's migration 0013; see schema/hub/0013-traceparent.sql
-- for what the column means). Append-only: never edit a shipped migration.
ALTER TABLE messages ADD COLUMN traceparent TEXT;
