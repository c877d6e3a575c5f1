-- The producer that submitted each mirrored delivery's message, handed to the harness as
-- BATON_PRODUCER so it can tell who wrote the turn. NULL for deliveries mirrored before this
-- column existed, or from a hub that does not send it: the harness then gets an empty value.
ALTER TABLE deliveries ADD COLUMN producer TEXT;
