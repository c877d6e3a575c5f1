-- Membership families: a host made a member of every conversation whose name matches a pattern
-- (a prefix and `*`, the publish scopes' grammar), those that exist and those first posted to
-- later. Append-only: never edit a shipped migration.

-- One family row per (pattern, host) while it is open. Its per-conversation intervals are
-- ordinary `memberships` rows marked with `family`: written at the join for the conversations
-- that exist (join_seq = their last_seq), when a matching conversation is created (join_seq =
-- 0), and closed at the leave (leave_seq = each one's last_seq); so routing and the claim's
-- re-check read one table, and a leave ends the family for every conversation it matched.
CREATE TABLE member_families (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    pattern       TEXT NOT NULL CHECK (pattern LIKE '%*'),
    host          TEXT NOT NULL REFERENCES hosts (name),
    joined_at     INTEGER NOT NULL,
    joined_by     TEXT NOT NULL,
    join_reason   TEXT NOT NULL,
    left_at       INTEGER,
    left_by       TEXT,
    leave_reason  TEXT,
    CHECK ((left_at IS NULL) = (left_by IS NULL) AND (left_by IS NULL) = (leave_reason IS NULL))
) STRICT;
CREATE UNIQUE INDEX member_families_open ON member_families (pattern, host) WHERE left_at IS NULL;

-- The family an interval belongs to; NULL for an exact membership (`members add` of a name).
ALTER TABLE memberships ADD COLUMN family INTEGER REFERENCES member_families (id);

-- At most one open interval per (conversation, host) and row: the exact one, and one per
-- family. A host so matched more than once still gets one delivery per post.
DROP INDEX memberships_open;
CREATE UNIQUE INDEX memberships_open ON memberships (conversation, host, coalesce(family, 0)) WHERE leave_seq IS NULL;
