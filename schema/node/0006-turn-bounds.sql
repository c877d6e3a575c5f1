-- A delivered turn's bounds, from its message (the claim's `deadline_ms` and `stall_ms`): the
-- longest it may run (with the node's own `exec_timeout`, whichever is shorter) and the longest
-- it may go without a progress event. NULL: none named (or a hub that predates them).
-- Append-only: never edit a shipped migration.
ALTER TABLE deliveries ADD COLUMN deadline_ms INTEGER CHECK (deadline_ms IS NULL OR deadline_ms > 0);
ALTER TABLE deliveries ADD COLUMN stall_ms INTEGER CHECK (stall_ms IS NULL OR stall_ms > 0);
