-- Approval before a turn runs, and the breaker for a conversation whose turns keep failing.
-- Append-only: never edit a shipped migration.

-- approval: 'required' when the producer asked for it (`"approval": "required"`), else 'none'.
-- A required message's deliveries are parked held (`approval required`) at fan-out until it
-- is decided. approval_expires_at: when an undecided approval times out (accepted_at +
-- `approval_timeout_ms`), NULL for none. approval_decision: 'approved', 'rejected' or
-- 'timed_out', NULL while undecided (and always for 'none'); approval_decided_at/_by/_reason:
-- when, who (`operator:NAME`, `producer:NAME` or `hub`) and why.
ALTER TABLE messages ADD COLUMN approval TEXT NOT NULL DEFAULT 'none' CHECK (approval IN ('none', 'required'));
ALTER TABLE messages ADD COLUMN approval_timeout_ms INTEGER CHECK (approval_timeout_ms IS NULL OR approval_timeout_ms > 0);
ALTER TABLE messages ADD COLUMN approval_expires_at INTEGER;
ALTER TABLE messages ADD COLUMN approval_decision TEXT
    CHECK (approval_decision IS NULL OR approval_decision IN ('approved', 'rejected', 'timed_out'));
ALTER TABLE messages ADD COLUMN approval_decided_at INTEGER;
ALTER TABLE messages ADD COLUMN approval_decided_by TEXT;
ALTER TABLE messages ADD COLUMN approval_reason TEXT;

-- The undecided approvals, by when they time out: what the hub's housekeeping reads.
CREATE INDEX messages_approval_pending ON messages (approval_expires_at)
    WHERE approval = 'required' AND approval_decision IS NULL;

-- The conversations a producer may approve or reject messages in: the publish scopes'
-- patterns (an exact name, or a prefix and `*`). No row: no right to approve anywhere.
CREATE TABLE producer_approvals (
    producer  TEXT NOT NULL,
    pattern   TEXT NOT NULL,
    set_by    TEXT NOT NULL,
    set_at    INTEGER NOT NULL,
    PRIMARY KEY (producer, pattern)
) STRICT;

-- The breaker's count: the failed outcomes in a row of a conversation's turns (any host),
-- reset by a succeeded outcome and when the breaker trips (`limits.breaker_failures`).
CREATE TABLE breaker_counts (
    conversation  TEXT PRIMARY KEY,
    failures      INTEGER NOT NULL CHECK (failures >= 0),
    updated_at    INTEGER NOT NULL
) STRICT;
