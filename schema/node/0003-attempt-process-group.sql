-- Which process group each attempt's harness ran in, written with the start marker and before
-- the harness is released from `exec`'s gate, so that after a crash the node can stop what is
-- left of it before it reports the attempt `unknown`. All three are set together, or none: a
-- turn of the no-op harness, one whose program could not be started, or one started before
-- this migration.
--   pgid             the process group id (= the harness's pid)
--   proc_start_ticks the harness's start time, field 22 of /proc/PID/stat (clock ticks since boot)
--   boot_id          /proc/sys/kernel/random/boot_id when it ran: start times restart each boot
ALTER TABLE attempts ADD COLUMN pgid INTEGER CHECK (pgid IS NULL OR pgid > 0);
ALTER TABLE attempts ADD COLUMN proc_start_ticks INTEGER CHECK (proc_start_ticks IS NULL OR proc_start_ticks >= 0);
ALTER TABLE attempts ADD COLUMN boot_id TEXT;

