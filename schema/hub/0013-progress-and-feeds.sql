-- Progress of running turns, and the producers' event feeds (a message's, a conversation's).
-- Append-only: never edit a shipped migration.
--
-- Feed positions. Every item a feed carries (a delivery's state change, a progress event, an
-- attempt's outcome) has a position drawn from one counter: the one `delivery_events.id` is
-- drawn from (here its `sqlite_sequence` row, which the store also advances by hand for the
-- other two kinds; on PostgreSQL its identity sequence). A feed reads its items in position
-- order after a cursor (the last position it answered), so one number resumes all three kinds.
-- Commit order: on SQLite one writer draws and commits in order. On PostgreSQL see
-- `schema/postgres/0010-progress-and-feeds.sql`.

-- A running turn's progress events: what its harness wrote, one JSON object a line, on the
-- channel its node gave it, as the node forwarded them. Kept with the delivery (removed with
-- it by retention and purge, as its attempts are).
--   n        the feed position (drawn from delivery_events' counter, see above)
--   attempt  the run of the delivery it belongs to
--   seq      the node's number for it within the run, from 1, without gaps for what it sent
--   at       when the hub recorded it (unix ms)
--   body     the JSON object, exactly as the harness wrote it
CREATE TABLE progress_events (
    n            INTEGER PRIMARY KEY,
    delivery_id  TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    at           INTEGER NOT NULL,
    body         TEXT NOT NULL,
    UNIQUE (delivery_id, attempt, seq)
) STRICT;
CREATE INDEX progress_events_by_delivery ON progress_events (delivery_id, n);

-- Per run of a delivery that sent progress: how many events the hub kept, the last one's seq
-- and time, and how many were dropped: by the node (its bounds on size, count and rate, its
-- buffer while the hub did not answer), as the node last counted them, and by the hub (its
-- `limits.progress_event_bytes_max` and `limits.progress_events_per_turn_max`, or an event
-- that came after the run's outcome). A run without progress has no row.
CREATE TABLE turn_progress (
    delivery_id  TEXT NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    events       INTEGER NOT NULL CHECK (events >= 0),
    last_seq     INTEGER NOT NULL CHECK (last_seq >= 0),
    last_at      INTEGER,
    node_dropped INTEGER NOT NULL CHECK (node_dropped >= 0),
    hub_dropped  INTEGER NOT NULL CHECK (hub_dropped >= 0),
    PRIMARY KEY (delivery_id, attempt)
) STRICT;

-- An attempt's feed position (drawn as above when the outcome is recorded); NULL for an
-- attempt recorded before this migration, which no feed carries.
ALTER TABLE attempts ADD COLUMN event_n INTEGER;
CREATE INDEX attempts_by_event ON attempts (event_n) WHERE event_n IS NOT NULL;

-- What retention and purge removed from a feed: the highest position of a removed item, per
-- conversation (`c:NAME`) and, for a message whose deliveries were removed while it stayed
-- (`purge --host`), per message (`m:ID`). A cursor below it would skip what was removed: the
-- feed answers 410 `cursor_expired` instead. Written only by the triggers below.
CREATE TABLE feed_removals (
    scope            TEXT PRIMARY KEY,
    removed_through  INTEGER NOT NULL
) STRICT;

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

-- A message removed whole takes its own floor with it (its feed answers 404 from then on).
CREATE TRIGGER feed_removal_message_gone BEFORE DELETE ON messages
BEGIN
    DELETE FROM feed_removals WHERE scope = 'm:' || OLD.id;
END;
