-- The W3C trace context of each mirrored delivery's message (the claim's `traceparent`): the
-- node records its spans of the delivery in that trace and gives it to the harness as
-- TRACEPARENT. NULL for deliveries mirrored before this column existed, or from a hub that
-- does not send it: the harness then gets no TRACEPARENT. Append-only: never edit a shipped
-- migration.
ALTER TABLE deliveries ADD COLUMN traceparent TEXT;
