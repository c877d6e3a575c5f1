-- A message's deadline and stall bound: how long each of its turns may run, and may go without
-- a progress event, before its node stops it (`failed`, naming the bound). Append-only: never
-- edit a shipped migration.

-- deadline_ms: the longest a turn of the message may run (the node stops it at the smaller of
-- this and its own `exec_timeout`); NULL: only `exec_timeout`. stall_ms: the longest a running
-- turn may go without writing on its progress channel (counted from its start, then from its
-- last line); NULL: no stall bound. Both as the producer sent them, within the hub's
-- `limits.deadline_max` and `limits.stall_max` at acceptance.
ALTER TABLE messages ADD COLUMN deadline_ms INTEGER CHECK (deadline_ms IS NULL OR deadline_ms > 0);
ALTER TABLE messages ADD COLUMN stall_ms INTEGER CHECK (stall_ms IS NULL OR stall_ms > 0);
