-- Baton hub store on PostgreSQL, migration 0011: the end of a harness's stderr kept with its
-- attempt (the same change as the SQLite record's migration 0011; see
-- schema/hub/0011-stderr-tail.sql for what each column means). Append-only: never edit a
-- shipped migration.
ALTER TABLE attempts ADD COLUMN stderr_tail TEXT;
ALTER TABLE attempts ADD COLUMN stderr_dropped_bytes BIGINT;
ALTER TABLE attempts ADD CONSTRAINT attempts_stderr_tail_check
    CHECK ((stderr_tail IS NULL OR stderr_dropped_bytes IS NOT NULL) AND (stderr_dropped_bytes IS NULL OR stderr_dropped_bytes >= 0));
