-- Baton hub store on PostgreSQL, migration 0003: the settlement check keeps its plan.
--
-- baton_deliveries_final was a LANGUAGE sql function. Called from PL/pgSQL (baton_settle, the
-- fan-out trigger) it is not inlined, and a non-inlined SQL function plans its body again on
-- every call: about half a millisecond of server CPU, twice per delivery. In PL/pgSQL the
-- statement is prepared once per connection and its plan kept. Same result, same arguments.
CREATE OR REPLACE FUNCTION baton_deliveries_final(message TEXT) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT EXISTS (
        SELECT 1 FROM deliveries d WHERE d.message_id = message
          AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
               OR (d.state = 'delivered'
                   AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))));
END;
$$;
