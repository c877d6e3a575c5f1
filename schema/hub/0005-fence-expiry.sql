-- Time-boxed fences: a fence set with `--for DURATION` or `--until TIME` carries its expiry;
-- the hub lifts it at that time (recorded as lifted by `hub`). NULL: until an operator lifts it.
-- Append-only: never edit a shipped migration.
ALTER TABLE fences ADD COLUMN expires_at INTEGER;
CREATE INDEX fences_expiring ON fences (expires_at) WHERE lifted_at IS NULL AND expires_at IS NOT NULL;
