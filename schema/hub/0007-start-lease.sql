-- The start lease: a node session may start a delivered turn on its own (while the hub cannot
-- be reached) only within a lease the hub granted it, and the hub does not let a newer session
-- of the host start a run an older session acked until that older session's lease has run out.
-- So a node cut off from the hub, whose data directory was copied and started meanwhile, never
-- runs what the copy runs. Append-only: never edit a shipped migration.

-- start_lease_ms: the lease's length granted to this session when it registered (the hub's
-- `start_lease` then); every renewal is for this length, so what the node was told stays true
-- when the hub's configuration changes. start_lease_until: until when (unix ms, the hub's
-- clock) the session may start turns on its own; NULL once it ended cleanly, or never granted.
ALTER TABLE node_sessions ADD COLUMN start_lease_ms INTEGER CHECK (start_lease_ms IS NULL OR start_lease_ms > 0);
ALTER TABLE node_sessions ADD COLUMN start_lease_until INTEGER;

-- acked_session: the node session whose ack made the current run `delivered` (NULL for a run
-- acked before this migration, or not yet acked). Written by the ack; cleared with the holder
-- when the run goes back to the queue.
ALTER TABLE deliveries ADD COLUMN acked_session INTEGER;
