-- Baton hub store on PostgreSQL, migration 0013: progress of running turns and the producers'
-- event feeds (the same change as the SQLite record's migration 0013; see
-- schema/hub/0013-progress-and-feeds.sql for what each table and column means). Append-only:
-- never edit a shipped migration.
--
-- Feed positions and commit order. Every feed item's position is drawn from the identity
-- sequence of `delivery_events.id` (progress events and outcomes draw it with `nextval`), and a
-- sequence is not commit order (see 0001). Progress events, outcomes and every delivery event
-- whose `from_state` is not 'queued' are written only by transactions that hold the record's
-- write lock exclusively, so when one of them draws a number every transaction that drew a
-- lower one has ended: the highest such number a snapshot sees is a horizon below which no
-- position can still appear. Only claims (which hold the lock shared, and move deliveries
-- only out of 'queued') may commit numbers out of order, above that horizon. A feed answers
-- only positions at or below the horizon; when only claims' events lie above it, the reading
-- hub moves it with a barrier (an exclusive write transaction that draws one number and
-- commits), so every item is answered once, in position order, and none is skipped.
CREATE TABLE progress_events (
    n            BIGINT PRIMARY KEY,
    delivery_id  TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    attempt      BIGINT NOT NULL CHECK (attempt >= 1),
    seq          BIGINT NOT NULL CHECK (seq >= 1),
    at           BIGINT NOT NULL,
    body         TEXT NOT NULL,
    UNIQUE (delivery_id, attempt, seq)
);
CREATE INDEX progress_events_by_delivery ON progress_events (delivery_id, n);

CREATE TABLE turn_progress (
    delivery_id  TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    attempt      BIGINT NOT NULL CHECK (attempt >= 1),
    events       BIGINT NOT NULL CHECK (events >= 0),
    last_seq     BIGINT NOT NULL CHECK (last_seq >= 0),
    last_at      BIGINT,
    node_dropped BIGINT NOT NULL CHECK (node_dropped >= 0),
    hub_dropped  BIGINT NOT NULL CHECK (hub_dropped >= 0),
    PRIMARY KEY (delivery_id, attempt)
);

ALTER TABLE attempts ADD COLUMN event_n BIGINT;
CREATE INDEX attempts_by_event ON attempts (event_n) WHERE event_n IS NOT NULL;

CREATE TABLE feed_removals (
    scope            TEXT PRIMARY KEY,
    removed_through  BIGINT NOT NULL
);

CREATE FUNCTION baton_feed_removal_floor() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    x BIGINT;
BEGIN
    x := GREATEST(coalesce((SELECT max(id) FROM delivery_events WHERE delivery_id = OLD.id), 0),
                  coalesce((SELECT max(n) FROM progress_events WHERE delivery_id = OLD.id), 0),
                  coalesce((SELECT max(event_n) FROM attempts WHERE delivery_id = OLD.id), 0));
    IF x > 0 THEN
        INSERT INTO feed_removals AS f (scope, removed_through) VALUES ('c:' || OLD.conversation, x)
            ON CONFLICT (scope) DO UPDATE SET removed_through = GREATEST(f.removed_through, excluded.removed_through);
        IF EXISTS (SELECT 1 FROM messages WHERE id = OLD.message_id) THEN
            INSERT INTO feed_removals AS f (scope, removed_through) VALUES ('m:' || OLD.message_id, x)
                ON CONFLICT (scope) DO UPDATE SET removed_through = GREATEST(f.removed_through, excluded.removed_through);
        END IF;
    END IF;
    RETURN OLD;
END;
$$;

CREATE FUNCTION baton_feed_removal_message_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM feed_removals WHERE scope = 'm:' || OLD.id;
    RETURN OLD;
END;
$$;

CREATE TRIGGER feed_removal_floor BEFORE DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION baton_feed_removal_floor();
CREATE TRIGGER feed_removal_message_gone BEFORE DELETE ON messages
    FOR EACH ROW EXECUTE FUNCTION baton_feed_removal_message_gone();
