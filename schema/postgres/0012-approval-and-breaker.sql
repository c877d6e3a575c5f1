-- Baton hub store on PostgreSQL, migration 0012: approval before a turn runs, and the
-- breaker's counts (the same change as the SQLite record's migration 0012; see
-- schema/hub/0012-approval-and-breaker.sql for what each column means). Append-only: never
-- edit a shipped migration.
ALTER TABLE messages ADD COLUMN approval TEXT NOT NULL DEFAULT 'none' CHECK (approval IN ('none', 'required'));
ALTER TABLE messages ADD COLUMN approval_timeout_ms BIGINT CHECK (approval_timeout_ms IS NULL OR approval_timeout_ms > 0);
ALTER TABLE messages ADD COLUMN approval_expires_at BIGINT;
ALTER TABLE messages ADD COLUMN approval_decision TEXT
    CHECK (approval_decision IS NULL OR approval_decision IN ('approved', 'rejected', 'timed_out'));
ALTER TABLE messages ADD COLUMN approval_decided_at BIGINT;
ALTER TABLE messages ADD COLUMN approval_decided_by TEXT;
ALTER TABLE messages ADD COLUMN approval_reason TEXT;
CREATE INDEX messages_approval_pending ON messages (approval_expires_at)
    WHERE approval = 'required' AND approval_decision IS NULL;
CREATE TABLE producer_approvals (
    producer  TEXT NOT NULL,
    pattern   TEXT NOT NULL,
    set_by    TEXT NOT NULL,
    set_at    BIGINT NOT NULL,
    PRIMARY KEY (producer, pattern)
);
CREATE TABLE breaker_counts (
    conversation  TEXT PRIMARY KEY,
    failures      BIGINT NOT NULL CHECK (failures >= 0),
    updated_at    BIGINT NOT NULL
);
