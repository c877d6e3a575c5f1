-- Settlement by the hub's own statement: fewer trigger firings per delivery, for the same
-- promises and the same answers.
--
-- The hub settles a message in the transaction that records its last outcome or
-- completes its fan-out with every delivery final (`lifecycle::settle`), instead of a trigger
-- on every attempt and every completed fan-out. A delivery that fails or ends unknown still
-- settles it by trigger (`messages_settled_by_state`, unchanged).
DROP TRIGGER messages_settled_by_attempt;
DROP TRIGGER messages_settled_by_fan_out;
-- A new delivery needs no unsettling: deliveries are made only while their message's fan-out is
-- pending, and such a message is never settled.
DROP TRIGGER messages_unsettled_by_delivery;
-- Only a delivery that leaves a final state (a retry after an outcome, a redrive) can unsettle
-- its message; one that moves between states that are not final never had a settled message.
DROP TRIGGER messages_unsettled_by_state;
CREATE TRIGGER messages_unsettled_by_state AFTER UPDATE OF state ON deliveries
    WHEN NEW.state IN ('queued', 'held', 'claimed', 'mirrored', 'delivered')
     AND OLD.state IN ('delivered', 'failed', 'unknown')
BEGIN
    UPDATE messages SET settled_at = NULL WHERE id = NEW.message_id AND settled_at IS NOT NULL;
END;
