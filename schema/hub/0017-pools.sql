-- Pools: named sets of hosts kept by operators. A message addressed to a pool is one delivery
-- whose `pool` is set and whose `host` stays NULL until a member's claim binds it.
-- Append-only: never edit a shipped migration.
--
-- SQLite cannot relax a NOT NULL or change a UNIQUE constraint in place, so `deliveries` is
-- rebuilt the way SQLite documents (new table, copy, drop, rename, then its indexes and
-- triggers), inside the migration's transaction. The runner applies migrations with foreign
-- key enforcement off and checks every foreign key before it commits (SQLite's procedure):
-- dropping the old table must not cascade into the events, attempts and approvals that name
-- its rows.

CREATE TABLE pools (
    name          TEXT PRIMARY KEY,
    created_at    INTEGER NOT NULL,
    created_by    TEXT NOT NULL
) STRICT;

-- A pool's member hosts. Kept by operators only (`baton-hub pools add/remove`, and retire),
-- every change audited in `operator_events`.
CREATE TABLE pool_members (
    pool          TEXT NOT NULL REFERENCES pools (name),
    host          TEXT NOT NULL REFERENCES hosts (name),
    added_at      INTEGER NOT NULL,
    added_by      TEXT NOT NULL,
    PRIMARY KEY (pool, host)
) STRICT;
CREATE INDEX pool_members_by_host ON pool_members (host, pool);

-- Routing to pools: the recipient pools decided in the acceptance transaction, beside
-- `message_recipients` (hosts), read by fan-out and its startup repair alike.
CREATE TABLE message_pool_recipients (
    message_id    TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    pool          TEXT NOT NULL,
    PRIMARY KEY (message_id, pool)
) STRICT;

CREATE TABLE deliveries_pools (
    n             INTEGER PRIMARY KEY AUTOINCREMENT, -- queue order: oldest first
    id            TEXT NOT NULL UNIQUE,
    message_id    TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    host          TEXT,                         -- NULL for a pool delivery until it is claimed
    conversation  TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'mirrored', 'delivered', 'held', 'failed', 'unknown')),
    instance_id   TEXT,                         -- holder, while claimed/mirrored/delivered
    claim_token   TEXT,
    reason        TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    attempt       INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    rerun         TEXT CHECK (rerun IS NULL OR rerun IN ('retry', 'redrive')),
    rerun_by      TEXT,
    rerun_reason  TEXT,
    not_before    INTEGER,
    started_session INTEGER,
    started_at    INTEGER,
    cancel_requested_at INTEGER,
    cancel_by     TEXT,
    cancel_reason TEXT,
    acked_session INTEGER,
    pool          TEXT,                         -- the recipient pool, for life; NULL for a host delivery
    CHECK (host IS NOT NULL OR pool IS NOT NULL),
    CHECK ((state IN ('claimed', 'mirrored', 'delivered')) = (instance_id IS NOT NULL AND claim_token IS NOT NULL)),
    CHECK (pool IS NULL OR state NOT IN ('claimed', 'mirrored', 'delivered') OR host IS NOT NULL),
    -- A pool delivery waiting in its pool belongs to no host: a requeue or retry returns it.
    CHECK (pool IS NULL OR state NOT IN ('queued', 'held') OR host IS NULL)
) STRICT;

INSERT INTO deliveries_pools (n, id, message_id, host, conversation, seq, state, instance_id, claim_token, reason,
        created_at, updated_at, attempt, rerun, rerun_by, rerun_reason, not_before, started_session, started_at,
        cancel_requested_at, cancel_by, cancel_reason, acked_session, pool)
    SELECT n, id, message_id, host, conversation, seq, state, instance_id, claim_token, reason,
        created_at, updated_at, attempt, rerun, rerun_by, rerun_reason, not_before, started_session, started_at,
        cancel_requested_at, cancel_by, cancel_reason, acked_session, NULL
    FROM deliveries ORDER BY n;

-- The queue position keeps counting from where it was (a purged tail must not be handed out
-- again as positions: cursors resume after one).
UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'deliveries'), 0))
    WHERE name = 'deliveries_pools';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'deliveries_pools', seq FROM sqlite_sequence WHERE name = 'deliveries'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'deliveries_pools');

-- The legacy rename leaves the triggers of other tables that read `deliveries` (settling a
-- message) as they are: they name the table, which exists again once the rename is done.
DROP TABLE deliveries;
PRAGMA legacy_alter_table = ON;
ALTER TABLE deliveries_pools RENAME TO deliveries;
PRAGMA legacy_alter_table = OFF;

-- One delivery per (message, host) among host deliveries, and per (message, pool) among pool
-- deliveries: a pool delivery claimed by a host that is also a named recipient is a second one.
CREATE UNIQUE INDEX deliveries_per_host ON deliveries (message_id, host) WHERE pool IS NULL;
CREATE UNIQUE INDEX deliveries_per_pool ON deliveries (message_id, pool) WHERE pool IS NOT NULL;
-- A message's deliveries, whatever their kind: the two partial indexes above serve neither a
-- lookup by message alone (fan-out, settlement, the cascades) nor each other's rows.
CREATE INDEX deliveries_by_message ON deliveries (message_id);
CREATE INDEX deliveries_claimable ON deliveries (host, state, n);
CREATE INDEX deliveries_by_instance ON deliveries (instance_id, state) WHERE instance_id IS NOT NULL;
CREATE INDEX deliveries_by_conversation ON deliveries (conversation, state);
CREATE INDEX deliveries_by_state ON deliveries (state, n);
CREATE INDEX deliveries_queued_turns ON deliveries (host, conversation, seq) WHERE state = 'queued';
CREATE INDEX deliveries_held_turns ON deliveries (host, conversation, seq) WHERE state = 'held';
CREATE INDEX deliveries_cancel_pending ON deliveries (instance_id)
    WHERE state = 'delivered' AND cancel_requested_at IS NOT NULL;
CREATE INDEX deliveries_retry_wait ON deliveries (host, not_before) WHERE state = 'queued' AND not_before IS NOT NULL;
-- A pool's queued and held deliveries of one conversation in seq order (the claim's order
-- checks), and its retries waiting for their not-before time (when a member's claim wakes).
CREATE INDEX deliveries_pool_queued ON deliveries (pool, conversation, seq) WHERE state = 'queued' AND pool IS NOT NULL;
CREATE INDEX deliveries_pool_held ON deliveries (pool, conversation, seq) WHERE state = 'held' AND pool IS NOT NULL;
CREATE INDEX deliveries_pool_retry_wait ON deliveries (pool, not_before)
    WHERE state = 'queued' AND not_before IS NOT NULL AND pool IS NOT NULL;

-- Per (pool, conversation), as `conversation_queues` per (host, conversation): how many pool
-- deliveries are queued, when the claim last turned to it (`served`) and since when it has had
-- queued work (`since`), kept in step by the triggers below. Beside them the affinity state the
-- claim and every end of a turn keep (`lifecycle::pool_flight`): how many pool deliveries of the
-- conversation are in flight (claimed, mirrored, or delivered without an outcome of their
-- current run) and the host they are all on (`bound_host`, set exactly while `in_flight > 0`),
-- and the host whose turn left flight last and when (`last_host`, `last_settled_at`;
-- `limits.pool_affinity_wait`).
CREATE TABLE pool_queues (
    pool          TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    queued        INTEGER NOT NULL CHECK (queued >= 0),
    served        INTEGER NOT NULL DEFAULT 0,
    since         INTEGER NOT NULL,
    in_flight     INTEGER NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    bound_host    TEXT,
    last_host     TEXT,
    last_settled_at INTEGER,
    PRIMARY KEY (pool, conversation),
    CHECK ((in_flight > 0) = (bound_host IS NOT NULL))
) STRICT;
CREATE INDEX pool_queues_turns ON pool_queues (pool, served, since, conversation) WHERE queued > 0;
CREATE INDEX pool_queues_bound ON pool_queues (bound_host) WHERE bound_host IS NOT NULL;

-- The triggers the rebuild dropped, as they were for host deliveries (now only those), and
-- their pool counterparts.
CREATE TRIGGER deliveries_queue_created AFTER INSERT ON deliveries WHEN NEW.state = 'queued' AND NEW.pool IS NULL
BEGIN
    INSERT INTO conversation_queues (host, conversation, queued, since) VALUES (NEW.host, NEW.conversation, 1, NEW.n)
        ON CONFLICT (host, conversation) DO UPDATE
        SET served = CASE WHEN queued = 0 THEN 0 ELSE served END,
            since = CASE WHEN queued = 0 THEN excluded.since ELSE since END,
            queued = queued + 1;
END;
CREATE TRIGGER deliveries_queue_entered AFTER UPDATE OF state ON deliveries
    WHEN NEW.state = 'queued' AND OLD.state <> 'queued' AND NEW.pool IS NULL
BEGIN
    INSERT INTO conversation_queues (host, conversation, queued, since) VALUES (NEW.host, NEW.conversation, 1, NEW.n)
        ON CONFLICT (host, conversation) DO UPDATE
        SET served = CASE WHEN queued = 0 THEN 0 ELSE served END,
            since = CASE WHEN queued = 0 THEN excluded.since ELSE since END,
            queued = queued + 1;
END;
CREATE TRIGGER deliveries_queue_left AFTER UPDATE OF state ON deliveries
    WHEN OLD.state = 'queued' AND NEW.state <> 'queued' AND OLD.pool IS NULL
BEGIN
    UPDATE conversation_queues SET queued = queued - 1 WHERE host = OLD.host AND conversation = OLD.conversation;
END;
CREATE TRIGGER deliveries_queue_removed AFTER DELETE ON deliveries WHEN OLD.state = 'queued' AND OLD.pool IS NULL
BEGIN
    UPDATE conversation_queues SET queued = queued - 1 WHERE host = OLD.host AND conversation = OLD.conversation;
END;
CREATE TRIGGER deliveries_pool_queue_created AFTER INSERT ON deliveries WHEN NEW.state = 'queued' AND NEW.pool IS NOT NULL
BEGIN
    INSERT INTO pool_queues (pool, conversation, queued, since) VALUES (NEW.pool, NEW.conversation, 1, NEW.n)
        ON CONFLICT (pool, conversation) DO UPDATE
        SET served = CASE WHEN queued = 0 THEN 0 ELSE served END,
            since = CASE WHEN queued = 0 THEN excluded.since ELSE since END,
            queued = queued + 1;
END;
CREATE TRIGGER deliveries_pool_queue_entered AFTER UPDATE OF state ON deliveries
    WHEN NEW.state = 'queued' AND OLD.state <> 'queued' AND NEW.pool IS NOT NULL
BEGIN
    INSERT INTO pool_queues (pool, conversation, queued, since) VALUES (NEW.pool, NEW.conversation, 1, NEW.n)
        ON CONFLICT (pool, conversation) DO UPDATE
        SET served = CASE WHEN queued = 0 THEN 0 ELSE served END,
            since = CASE WHEN queued = 0 THEN excluded.since ELSE since END,
            queued = queued + 1;
END;
CREATE TRIGGER deliveries_pool_queue_left AFTER UPDATE OF state ON deliveries
    WHEN OLD.state = 'queued' AND NEW.state <> 'queued' AND OLD.pool IS NOT NULL
BEGIN
    UPDATE pool_queues SET queued = queued - 1 WHERE pool = OLD.pool AND conversation = OLD.conversation;
END;
CREATE TRIGGER deliveries_pool_queue_removed AFTER DELETE ON deliveries WHEN OLD.state = 'queued' AND OLD.pool IS NOT NULL
BEGIN
    UPDATE pool_queues SET queued = queued - 1 WHERE pool = OLD.pool AND conversation = OLD.conversation;
END;
CREATE TRIGGER messages_unsettled_by_state AFTER UPDATE OF state ON deliveries
    WHEN NEW.state IN ('queued', 'held', 'claimed', 'mirrored', 'delivered')
BEGIN
    UPDATE messages SET settled_at = NULL WHERE id = NEW.message_id AND settled_at IS NOT NULL;
END;
CREATE TRIGGER messages_unsettled_by_delivery AFTER INSERT ON deliveries
BEGIN
    UPDATE messages SET settled_at = NULL WHERE id = NEW.message_id AND settled_at IS NOT NULL;
END;
CREATE TRIGGER messages_settled_by_state AFTER UPDATE OF state ON deliveries
    WHEN NEW.state IN ('failed', 'unknown')
BEGIN
    UPDATE messages SET settled_at = NEW.updated_at
    WHERE id = NEW.message_id AND settled_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = NEW.message_id AND o.done_at IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM deliveries d WHERE d.message_id = NEW.message_id
            AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                 OR (d.state = 'delivered'
                     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))));
END;
CREATE TRIGGER feed_removal_floor BEFORE DELETE ON deliveries
BEGIN
    INSERT INTO feed_removals (scope, removed_through)
        SELECT scope, x FROM (
            SELECT 'c:' || OLD.conversation AS scope,
                   max(coalesce((SELECT max(id) FROM delivery_events WHERE delivery_id = OLD.id), 0),
                       coalesce((SELECT max(n) FROM progress_events WHERE delivery_id = OLD.id), 0),
                       coalesce((SELECT max(event_n) FROM attempts WHERE delivery_id = OLD.id), 0)) AS x
            UNION ALL
            SELECT 'm:' || OLD.message_id,
                   max(coalesce((SELECT max(id) FROM delivery_events WHERE delivery_id = OLD.id), 0),
                       coalesce((SELECT max(n) FROM progress_events WHERE delivery_id = OLD.id), 0),
                       coalesce((SELECT max(event_n) FROM attempts WHERE delivery_id = OLD.id), 0))
            WHERE EXISTS (SELECT 1 FROM messages WHERE id = OLD.message_id))
        WHERE x > 0
        ON CONFLICT (scope) DO UPDATE SET removed_through = max(removed_through, excluded.removed_through);
END;

-- Fences take a pool as their scope (`fence --pool NAME`): the scope's CHECK changes, which
-- SQLite cannot do in place, so `fences` is rebuilt as `deliveries` was above.
CREATE TABLE fences_pools (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT NOT NULL CHECK (kind IN ('pause', 'hold', 'block')),
    scope         TEXT NOT NULL CHECK (scope IN ('conversation', 'host', 'pool', 'all')),
    target        TEXT,                         -- conversation, host or pool name; NULL for all
    set_by        TEXT NOT NULL,
    set_at        INTEGER NOT NULL,
    set_after_event INTEGER NOT NULL,
    reason        TEXT NOT NULL,
    lifted_at     INTEGER,
    lifted_after_event INTEGER,
    lifted_by     TEXT,
    lifted_reason TEXT,
    expires_at    INTEGER,
    CHECK ((scope = 'all') = (target IS NULL))
) STRICT;
INSERT INTO fences_pools (id, kind, scope, target, set_by, set_at, set_after_event, reason, lifted_at,
        lifted_after_event, lifted_by, lifted_reason, expires_at)
    SELECT id, kind, scope, target, set_by, set_at, set_after_event, reason, lifted_at,
        lifted_after_event, lifted_by, lifted_reason, expires_at
    FROM fences ORDER BY id;
UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'fences'), 0))
    WHERE name = 'fences_pools';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'fences_pools', seq FROM sqlite_sequence WHERE name = 'fences'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'fences_pools');
DROP TABLE fences;
PRAGMA legacy_alter_table = ON;
ALTER TABLE fences_pools RENAME TO fences;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX fences_active ON fences (scope, target) WHERE lifted_at IS NULL;
CREATE INDEX fences_expiring ON fences (expires_at) WHERE lifted_at IS NULL AND expires_at IS NOT NULL;

-- Pools as members of a conversation (`members add --conversation C --pool NAME`): a post
-- without `to` or `pools` reaches one host of each current member pool as well as the member
-- hosts. Intervals as `memberships` has them for hosts: member for posts after `join_seq` up to
-- and including `leave_seq`.
CREATE TABLE conversation_pools (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation  TEXT NOT NULL REFERENCES conversations (name),
    pool          TEXT NOT NULL REFERENCES pools (name),
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
CREATE UNIQUE INDEX conversation_pools_open ON conversation_pools (conversation, pool) WHERE leave_seq IS NULL;
CREATE INDEX conversation_pools_by_conversation ON conversation_pools (conversation, pool, join_seq);
