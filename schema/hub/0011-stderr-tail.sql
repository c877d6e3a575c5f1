-- The end of a harness's stderr, kept with its attempt: what a failed turn said about why it
-- failed, which its exit status alone does not. Append-only: never edit a shipped migration.

-- stderr_tail: the last bytes the harness wrote to stderr, as the node sent them (its
-- `stderr_tail_bytes`) and the hub kept them (at most `limits.stderr_tail_bytes_max`, the last
-- ones, from a character boundary); NULL when the node sent none (nothing written, an attempt
-- that never ran, a node from before the field, or one that keeps none).
-- stderr_dropped_bytes: how many bytes of that stderr came before the tail and are not in it,
-- dropped by the node or cut by the hub; set whenever stderr_tail is, and alone when a node
-- sent only the count.
ALTER TABLE attempts ADD COLUMN stderr_tail TEXT;
ALTER TABLE attempts ADD COLUMN stderr_dropped_bytes INTEGER
    CHECK ((stderr_tail IS NULL OR stderr_dropped_bytes IS NOT NULL) AND (stderr_dropped_bytes IS NULL OR stderr_dropped_bytes >= 0));
