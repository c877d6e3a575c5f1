-- The W3C trace context each message carries from its producer to the harness. Append-only:
-- never edit a shipped migration.

-- traceparent: the producer's `traceparent` header as the hub accepted it (version 00), or the
-- one the hub started for a message that came without one. NULL for messages accepted before
-- this column existed. Not part of the content hash: a replay with another trace is the same
-- message.
ALTER TABLE messages ADD COLUMN traceparent TEXT;
