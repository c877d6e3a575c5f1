-- Retention counts from when a message settled, not from when it was accepted: a message
-- accepted long ago whose last delivery ends now keeps its idempotency key for the whole
-- retention window from now, so a producer's retry right after still answers `duplicate`.
-- Append-only: never edit a shipped migration.

-- settled_at: when the message's last delivery reached a final outcome (failed, unknown, or
-- delivered with an outcome of its current run) and its fan-out was done, in unix ms; NULL
-- while anything of it is unfinished. A retry or redrive reopens it (NULL again) and the next
-- final outcome settles it anew. Written only by the triggers below, in the transaction of the
-- change that settles or reopens it, stamped with that change's own time (the injected clock's
-- `now_ms` the change stored), so every path that ends a delivery keeps it true.
ALTER TABLE messages ADD COLUMN settled_at INTEGER;

-- Existing settled messages: the latest change of any of their deliveries or attempts.
UPDATE messages SET settled_at = max(
        coalesce((SELECT max(d.updated_at) FROM deliveries d WHERE d.message_id = messages.id), accepted_at),
        coalesce((SELECT max(a.reported_at) FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
                  WHERE d.message_id = messages.id), accepted_at))
    WHERE NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = messages.id AND o.done_at IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM deliveries d WHERE d.message_id = messages.id
            AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                 OR (d.state = 'delivered'
                     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))));

CREATE INDEX messages_by_settled ON messages (settled_at) WHERE settled_at IS NOT NULL;

-- A delivery that enters a state that is not final (a claim, an ack, a retry or a redrive)
-- leaves its message unsettled. `delivered` is entered only by an ack, before its run has an
-- outcome.
CREATE TRIGGER messages_unsettled_by_state AFTER UPDATE OF state ON deliveries
    WHEN NEW.state IN ('queued', 'held', 'claimed', 'mirrored', 'delivered')
BEGIN
    UPDATE messages SET settled_at = NULL WHERE id = NEW.message_id AND settled_at IS NOT NULL;
END;

CREATE TRIGGER messages_unsettled_by_delivery AFTER INSERT ON deliveries
BEGIN
    UPDATE messages SET settled_at = NULL WHERE id = NEW.message_id AND settled_at IS NOT NULL;
END;

-- A delivery that fails or ends unknown may settle its message.
CREATE TRIGGER messages_settled_by_state AFTER UPDATE OF state ON deliveries
    WHEN NEW.state IN ('failed', 'unknown')
BEGIN
    UPDATE messages SET settled_at = NEW.updated_at
    WHERE id = NEW.message_id AND settled_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = NEW.message_id AND o.done_at IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM deliveries d WHERE d.message_id = NEW.message_id
            AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                 OR (d.state = 'delivered'
                     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))));
END;

-- An outcome of a delivered run may settle its message.
CREATE TRIGGER messages_settled_by_attempt AFTER INSERT ON attempts
BEGIN
    UPDATE messages SET settled_at = NEW.reported_at
    WHERE id = (SELECT message_id FROM deliveries WHERE id = NEW.delivery_id) AND settled_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = messages.id AND o.done_at IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM deliveries d WHERE d.message_id = messages.id
            AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                 OR (d.state = 'delivered'
                     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))));
END;

-- A fan-out that completes with every delivery already final (each recipient retired) settles it.
CREATE TRIGGER messages_settled_by_fan_out AFTER UPDATE OF done_at ON fanout_obligations
    WHEN NEW.done_at IS NOT NULL
BEGIN
    UPDATE messages SET settled_at = NEW.done_at
    WHERE id = NEW.message_id AND settled_at IS NULL
      AND EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = NEW.message_id)
      AND NOT EXISTS (
          SELECT 1 FROM deliveries d WHERE d.message_id = NEW.message_id
            AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                 OR (d.state = 'delivered'
                     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))));
END;

-- The audit log's own retention window reads it by time.
CREATE INDEX operator_events_by_at ON operator_events (at);
