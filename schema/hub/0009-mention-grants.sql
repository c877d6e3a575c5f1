-- Mention authorizations: an operator may allow `to` to name a host that is not a member of a
-- conversation that has members (otherwise refused). Audited, with who and why, and re-checked
-- by the claim as membership is. Append-only: never edit a shipped migration.

-- Like a membership interval, a grant holds the posts whose seq lies in (grant_seq,
-- revoke_seq], or (grant_seq, ∞) while revoke_seq is NULL, both cursors the conversation's
-- last_seq read in the transaction that made the change. A grant lets `to` name the host; it
-- does not make the host a recipient of posts without `to`. A re-grant is a new row.
CREATE TABLE mention_grants (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation   TEXT NOT NULL REFERENCES conversations (name),
    host           TEXT NOT NULL REFERENCES hosts (name),
    grant_seq      INTEGER NOT NULL CHECK (grant_seq >= 0),
    granted_at     INTEGER NOT NULL,
    granted_by     TEXT NOT NULL,
    grant_reason   TEXT NOT NULL,
    revoke_seq     INTEGER,
    revoked_at     INTEGER,
    revoked_by     TEXT,
    revoke_reason  TEXT,
    CHECK (revoke_seq IS NULL OR revoke_seq >= grant_seq),
    CHECK ((revoke_seq IS NULL) = (revoked_at IS NULL) AND (revoked_at IS NULL) = (revoked_by IS NULL)
           AND (revoked_by IS NULL) = (revoke_reason IS NULL))
) STRICT;
-- At most one open grant per (conversation, host).
CREATE UNIQUE INDEX mention_grants_open ON mention_grants (conversation, host) WHERE revoke_seq IS NULL;
CREATE INDEX mention_grants_by_conversation ON mention_grants (conversation, host, grant_seq);
