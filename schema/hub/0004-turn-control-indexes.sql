-- Look-ups the turn control makes on every claim, kept cheap however long the history is.
-- Append-only: never edit a shipped migration.

-- The retry barrier: earlier messages of a conversation that may be retried (max_attempts > 1).
-- Most messages have max_attempts = 1, so this index stays small.
CREATE INDEX messages_retryable ON messages (conversation, seq) WHERE max_attempts > 1;

-- Queued deliveries waiting for a retry's not-before time: a claim skips them, and a waiting
-- claim wakes when the earliest one of its host passes.
CREATE INDEX deliveries_retry_wait ON deliveries (host, not_before) WHERE state = 'queued' AND not_before IS NOT NULL;
