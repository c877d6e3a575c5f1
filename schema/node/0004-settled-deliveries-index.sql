-- Settled deliveries (done or dropped) by the time they settled, for the sweep that removes
-- what is older than `local_retention`.
CREATE INDEX deliveries_settled ON deliveries(updated_at_ms) WHERE state IN ('done', 'dropped');
