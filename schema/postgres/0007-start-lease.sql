-- Baton hub store on PostgreSQL, migration 0007: the start lease (the same change as the SQLite
-- record's migration 0007; see schema/hub/0007-start-lease.sql for what each column means).
ALTER TABLE node_sessions ADD COLUMN start_lease_ms BIGINT CHECK (start_lease_ms IS NULL OR start_lease_ms > 0);
ALTER TABLE node_sessions ADD COLUMN start_lease_until BIGINT;
ALTER TABLE deliveries ADD COLUMN acked_session BIGINT;
