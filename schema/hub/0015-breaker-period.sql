-- The breaker's second trigger: a conversation that runs more turns within a period than
-- `limits.breaker_turns` allows (a loop that keeps a conversation busy, each turn succeeding,
-- burns as much as one that keeps failing). Append-only: never edit a shipped migration.

-- Per conversation, the current period (a fixed window starting at its first counted turn) and
-- the turns whose outcome was reported in it. Written only while `limits.breaker_turns` is set;
-- the row goes when the breaker trips, so the next period starts with the next turn.
CREATE TABLE breaker_periods (
    conversation  TEXT PRIMARY KEY,
    period_start  INTEGER NOT NULL,
    turns         INTEGER NOT NULL CHECK (turns >= 0)
) STRICT;
