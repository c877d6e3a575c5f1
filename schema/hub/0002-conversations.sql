-- Conversations as first-class things: the membership registry, producers' publish scopes,
-- and the per-(host, conversation) queue bookkeeping the claim uses for order and fairness.
-- Append-only: never edit a shipped migration.

-- Membership intervals (SPEC §6). A host is a member of a conversation for the posts whose seq
-- lies in (join_seq, leave_seq], or (join_seq, ∞) while leave_seq is NULL. Both cursors are the
-- conversation's last_seq read in the transaction that made the change, so posts and membership
-- changes order deterministically. A rejoin is a new row; a closed row is never reopened.
CREATE TABLE memberships (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation  TEXT NOT NULL REFERENCES conversations (name),
    host          TEXT NOT NULL REFERENCES hosts (name),
    join_seq      INTEGER NOT NULL CHECK (join_seq >= 0),
    joined_at     INTEGER NOT NULL,
    joined_by     TEXT NOT NULL,
    join_reason   TEXT NOT NULL,
    leave_seq     INTEGER,
    left_at       INTEGER,
    left_by       TEXT,
    leave_reason  TEXT,
    CHECK (leave_seq IS NULL OR leave_seq >= join_seq),
    CHECK ((leave_seq IS NULL) = (left_at IS NULL) AND (left_at IS NULL) = (left_by IS NULL)
           AND (left_by IS NULL) = (leave_reason IS NULL))
) STRICT;
-- At most one open interval per (conversation, host).
CREATE UNIQUE INDEX memberships_open ON memberships (conversation, host) WHERE leave_seq IS NULL;
CREATE INDEX memberships_by_conversation ON memberships (conversation, host, join_seq);

-- Publish scope: the conversation patterns a producer may post into (an exact name, or a prefix
-- followed by `*`). A producer without rows may post into every conversation (the default `*`).
CREATE TABLE producer_scopes (
    producer      TEXT NOT NULL,
    pattern       TEXT NOT NULL,
    set_by        TEXT NOT NULL,
    set_at        INTEGER NOT NULL,
    PRIMARY KEY (producer, pattern)
) STRICT;

-- The queued and the held deliveries of one (host, conversation) in seq order: the claim finds a
-- conversation's next turn, and whether an earlier one is held, with one lookup in each.
CREATE INDEX deliveries_queued_turns ON deliveries (host, conversation, seq) WHERE state = 'queued';
CREATE INDEX deliveries_held_turns ON deliveries (host, conversation, seq) WHERE state = 'held';

-- Per (host, conversation): how many deliveries are queued, when the claim last turned to it
-- (`served`, a per-host tick; 0 when it (re)gained work after being idle), and since when it has
-- had queued work (`since`, the queue position `deliveries.n` of the delivery that brought it).
-- The claim takes turns round-robin over the rows with queued work, least recently served first
-- and, among those never served since they gained work, the one waiting longest first. Kept in
-- step with `deliveries.state` by the triggers below, so every path that changes a state (the
-- guarded transition, creation at fan-out, retention) keeps it true.
CREATE TABLE conversation_queues (
    host          TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    queued        INTEGER NOT NULL CHECK (queued >= 0),
    served        INTEGER NOT NULL DEFAULT 0,
    since         INTEGER NOT NULL,
    PRIMARY KEY (host, conversation)
) STRICT;
CREATE INDEX conversation_queues_turns ON conversation_queues (host, served, since, conversation) WHERE queued > 0;

INSERT INTO conversation_queues (host, conversation, queued, since)
    SELECT host, conversation, count(*), min(n) FROM deliveries WHERE state = 'queued' GROUP BY host, conversation;

CREATE TRIGGER deliveries_queue_created AFTER INSERT ON deliveries WHEN NEW.state = 'queued'
BEGIN
    INSERT INTO conversation_queues (host, conversation, queued, since) VALUES (NEW.host, NEW.conversation, 1, NEW.n)
        ON CONFLICT (host, conversation) DO UPDATE
        SET served = CASE WHEN queued = 0 THEN 0 ELSE served END,
            since = CASE WHEN queued = 0 THEN excluded.since ELSE since END,
            queued = queued + 1;
END;

CREATE TRIGGER deliveries_queue_entered AFTER UPDATE OF state ON deliveries
    WHEN NEW.state = 'queued' AND OLD.state <> 'queued'
BEGIN
    INSERT INTO conversation_queues (host, conversation, queued, since) VALUES (NEW.host, NEW.conversation, 1, NEW.n)
        ON CONFLICT (host, conversation) DO UPDATE
        SET served = CASE WHEN queued = 0 THEN 0 ELSE served END,
            since = CASE WHEN queued = 0 THEN excluded.since ELSE since END,
            queued = queued + 1;
END;

CREATE TRIGGER deliveries_queue_left AFTER UPDATE OF state ON deliveries
    WHEN OLD.state = 'queued' AND NEW.state <> 'queued'
BEGIN
    UPDATE conversation_queues SET queued = queued - 1 WHERE host = OLD.host AND conversation = OLD.conversation;
END;

CREATE TRIGGER deliveries_queue_removed AFTER DELETE ON deliveries WHEN OLD.state = 'queued'
BEGIN
    UPDATE conversation_queues SET queued = queued - 1 WHERE host = OLD.host AND conversation = OLD.conversation;
END;
