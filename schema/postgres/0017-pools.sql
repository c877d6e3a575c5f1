-- Baton hub store on PostgreSQL, migration 0017: pools (the same change as the SQLite record's
-- migration 0017; see schema/hub/0017-pools.sql for what each table and column means).
-- PostgreSQL relaxes `deliveries.host` and swaps its uniqueness in place: no rebuild.
-- Append-only: never edit a shipped migration.
CREATE TABLE pools (
    name          TEXT PRIMARY KEY,
    created_at    BIGINT NOT NULL,
    created_by    TEXT NOT NULL
);
CREATE TABLE pool_members (
    pool          TEXT NOT NULL REFERENCES pools (name),
    host          TEXT NOT NULL REFERENCES hosts (name),
    added_at      BIGINT NOT NULL,
    added_by      TEXT NOT NULL,
    PRIMARY KEY (pool, host)
);
CREATE INDEX pool_members_by_host ON pool_members (host, pool);
CREATE TABLE message_pool_recipients (
    message_id    TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    pool          TEXT NOT NULL,
    PRIMARY KEY (message_id, pool)
);

ALTER TABLE deliveries ALTER COLUMN host DROP NOT NULL;
ALTER TABLE deliveries ADD COLUMN pool TEXT;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_host_or_pool CHECK (host IS NOT NULL OR pool IS NOT NULL);
ALTER TABLE deliveries ADD CONSTRAINT deliveries_pool_held_by_host
    CHECK (pool IS NULL OR state NOT IN ('claimed', 'mirrored', 'delivered') OR host IS NOT NULL);
ALTER TABLE deliveries ADD CONSTRAINT deliveries_pool_waits_unheld
    CHECK (pool IS NULL OR state NOT IN ('queued', 'held') OR host IS NULL);
ALTER TABLE deliveries DROP CONSTRAINT deliveries_message_id_host_key;
CREATE UNIQUE INDEX deliveries_per_host ON deliveries (message_id, host) WHERE pool IS NULL;
CREATE UNIQUE INDEX deliveries_per_pool ON deliveries (message_id, pool) WHERE pool IS NOT NULL;
-- A message's deliveries, whatever their kind (the unique constraint dropped above served that).
CREATE INDEX deliveries_by_message ON deliveries (message_id);
CREATE INDEX deliveries_pool_queued ON deliveries (pool, conversation, seq) WHERE state = 'queued' AND pool IS NOT NULL;
CREATE INDEX deliveries_pool_held ON deliveries (pool, conversation, seq) WHERE state = 'held' AND pool IS NOT NULL;
CREATE INDEX deliveries_pool_retry_wait ON deliveries (pool, not_before)
    WHERE state = 'queued' AND not_before IS NOT NULL AND pool IS NOT NULL;

CREATE TABLE pool_queues (
    pool          TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    queued        BIGINT NOT NULL CHECK (queued >= 0),
    served        BIGINT NOT NULL DEFAULT 0,
    since         BIGINT NOT NULL,
    in_flight     BIGINT NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
    bound_host    TEXT,
    last_host     TEXT,
    last_settled_at BIGINT,
    PRIMARY KEY (pool, conversation),
    CHECK ((in_flight > 0) = (bound_host IS NOT NULL))
);
CREATE INDEX pool_queues_turns ON pool_queues (pool, served, since, conversation) WHERE queued > 0;
CREATE INDEX pool_queues_bound ON pool_queues (bound_host) WHERE bound_host IS NOT NULL;

-- Host queues count host deliveries only; pool deliveries count in their pool's queue.
DROP TRIGGER deliveries_queue_created ON deliveries;
DROP TRIGGER deliveries_queue_entered ON deliveries;
DROP TRIGGER deliveries_queue_left ON deliveries;
DROP TRIGGER deliveries_queue_removed ON deliveries;
CREATE TRIGGER deliveries_queue_created AFTER INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.pool IS NULL) EXECUTE FUNCTION baton_queue_entered();
CREATE TRIGGER deliveries_queue_entered AFTER UPDATE OF state ON deliveries
    FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued' AND NEW.pool IS NULL)
    EXECUTE FUNCTION baton_queue_entered();
CREATE TRIGGER deliveries_queue_left AFTER UPDATE OF state ON deliveries
    FOR EACH ROW WHEN (OLD.state = 'queued' AND NEW.state <> 'queued' AND OLD.pool IS NULL)
    EXECUTE FUNCTION baton_queue_left();
CREATE TRIGGER deliveries_queue_removed AFTER DELETE ON deliveries
    FOR EACH ROW WHEN (OLD.state = 'queued' AND OLD.pool IS NULL) EXECUTE FUNCTION baton_queue_left();

CREATE FUNCTION baton_pool_queue_entered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pool_queues AS q (pool, conversation, queued, since)
        VALUES (NEW.pool, NEW.conversation, 1, NEW.n)
        ON CONFLICT (pool, conversation) DO UPDATE
        SET served = CASE WHEN q.queued = 0 THEN 0 ELSE q.served END,
            since = CASE WHEN q.queued = 0 THEN excluded.since ELSE q.since END,
            queued = q.queued + 1;
    RETURN NULL;
END;
$$;
CREATE FUNCTION baton_pool_queue_left() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pool_queues SET queued = queued - 1
        WHERE pool = OLD.pool AND conversation = OLD.conversation;
    RETURN NULL;
END;
$$;
CREATE TRIGGER deliveries_pool_queue_created AFTER INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.pool IS NOT NULL) EXECUTE FUNCTION baton_pool_queue_entered();
CREATE TRIGGER deliveries_pool_queue_entered AFTER UPDATE OF state ON deliveries
    FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued' AND NEW.pool IS NOT NULL)
    EXECUTE FUNCTION baton_pool_queue_entered();
CREATE TRIGGER deliveries_pool_queue_left AFTER UPDATE OF state ON deliveries
    FOR EACH ROW WHEN (OLD.state = 'queued' AND NEW.state <> 'queued' AND OLD.pool IS NOT NULL)
    EXECUTE FUNCTION baton_pool_queue_left();
CREATE TRIGGER deliveries_pool_queue_removed AFTER DELETE ON deliveries
    FOR EACH ROW WHEN (OLD.state = 'queued' AND OLD.pool IS NOT NULL) EXECUTE FUNCTION baton_pool_queue_left();

-- Fences take a pool as their scope (`fence --pool NAME`).
ALTER TABLE fences DROP CONSTRAINT fences_scope_check;
ALTER TABLE fences ADD CONSTRAINT fences_scope_check CHECK (scope IN ('conversation', 'host', 'pool', 'all'));

-- Pools as members of a conversation (`members add --conversation C --pool NAME`): a post
-- without `to` or `pools` reaches one host of each current member pool as well as the member
-- hosts. Intervals as `memberships` has them for hosts: member for posts after `join_seq` up to
-- and including `leave_seq`.
CREATE TABLE conversation_pools (
    id            BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    conversation  TEXT NOT NULL REFERENCES conversations (name),
    pool          TEXT NOT NULL REFERENCES pools (name),
    join_seq      BIGINT NOT NULL CHECK (join_seq >= 0),
    joined_at     BIGINT NOT NULL,
    joined_by     TEXT NOT NULL,
    join_reason   TEXT NOT NULL,
    leave_seq     BIGINT,
    left_at       BIGINT,
    left_by       TEXT,
    leave_reason  TEXT,
    CHECK (leave_seq IS NULL OR leave_seq >= join_seq),
    CHECK ((leave_seq IS NULL) = (left_at IS NULL) AND (left_at IS NULL) = (left_by IS NULL)
           AND (left_by IS NULL) = (leave_reason IS NULL))
);
CREATE UNIQUE INDEX conversation_pools_open ON conversation_pools (conversation, pool) WHERE leave_seq IS NULL;
CREATE INDEX conversation_pools_by_conversation ON conversation_pools (conversation, pool, join_seq);
