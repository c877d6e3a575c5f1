-- A record of the schema before pools (migration 16 on both backends) holding work in every state:
-- queued, queued for a retry (with a failed attempt), held, claimed, mirrored, delivered with
-- and without an outcome, failed and unknown, with their events and attempts, and one message
-- whose fan-out has not run. Plain statements both backends run as written.
INSERT INTO hosts (name, enrolled_at, instance_id, instance_since) VALUES ('host-a', 1, 'i-a', 2);
INSERT INTO hosts (name, enrolled_at) VALUES ('host-b', 1);
INSERT INTO conversations (name, last_seq) VALUES ('c1', 10);
INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at)
    VALUES ('m1', 'c1', 1, 'p', 'k1', 'h1', '{"n":1}', 10), ('m2', 'c1', 2, 'p', 'k2', 'h2', '{"n":2}', 11),
           ('m3', 'c1', 3, 'p', 'k3', 'h3', '{"n":3}', 12), ('m4', 'c1', 4, 'p', 'k4', 'h4', '{"n":4}', 13),
           ('m5', 'c1', 5, 'p', 'k5', 'h5', '{"n":5}', 14), ('m6', 'c1', 6, 'p', 'k6', 'h6', '{"n":6}', 15),
           ('m7', 'c1', 7, 'p', 'k7', 'h7', '{"n":7}', 16), ('m8', 'c1', 8, 'p', 'k8', 'h8', '{"n":8}', 17),
           ('m9', 'c1', 9, 'p', 'k9', 'h9', '{"n":9}', 18), ('m10', 'c1', 10, 'p', 'k10', 'h10', '{"n":10}', 19);
INSERT INTO message_recipients (message_id, host)
    VALUES ('m1', 'host-a'), ('m2', 'host-a'), ('m3', 'host-a'), ('m4', 'host-a'), ('m5', 'host-a'),
           ('m6', 'host-a'), ('m7', 'host-a'), ('m8', 'host-a'), ('m9', 'host-b'), ('m10', 'host-b');
INSERT INTO fanout_obligations (message_id, created_at, done_at)
    VALUES ('m1', 10, 10), ('m2', 11, 11), ('m3', 12, 12), ('m4', 13, 13), ('m5', 14, 14),
           ('m6', 15, 15), ('m7', 16, 16), ('m8', 17, 17), ('m9', 18, 18), ('m10', 19, NULL);
INSERT INTO deliveries (n, id, message_id, host, conversation, seq, state, instance_id, claim_token, reason,
        created_at, updated_at, attempt, rerun, not_before, started_session, started_at)
    VALUES (1, 'd1', 'm1', 'host-a', 'c1', 1, 'delivered', 'i-a', 't1', NULL, 10, 30, 1, NULL, NULL, 1, 25),
           (2, 'd2', 'm2', 'host-a', 'c1', 2, 'delivered', 'i-a', 't2', NULL, 11, 31, 1, NULL, NULL, 1, 26),
           (3, 'd3', 'm3', 'host-a', 'c1', 3, 'mirrored', 'i-a', 't3', NULL, 12, 32, 1, NULL, NULL, NULL, NULL),
           (4, 'd4', 'm4', 'host-a', 'c1', 4, 'claimed', 'i-a', 't4', NULL, 13, 33, 1, NULL, NULL, NULL, NULL),
           (5, 'd5', 'm5', 'host-a', 'c1', 5, 'queued', NULL, NULL, NULL, 14, 34, 2, 'retry', 99000, NULL, NULL),
           (6, 'd6', 'm6', 'host-a', 'c1', 6, 'queued', NULL, NULL, NULL, 15, 15, 1, NULL, NULL, NULL, NULL),
           (7, 'd7', 'm7', 'host-a', 'c1', 7, 'held', NULL, NULL, 'hold fence 1', 16, 36, 1, NULL, NULL, NULL, NULL),
           (8, 'd8', 'm8', 'host-a', 'c1', 8, 'failed', NULL, NULL, 'blocked by fence 2', 17, 37, 1, NULL, NULL, NULL, NULL),
           (9, 'd9', 'm9', 'host-b', 'c1', 9, 'unknown', NULL, NULL, 'host retired while mirrored', 18, 38, 1, NULL, NULL, NULL, NULL);
INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, at)
    VALUES ('d1', NULL, 'queued', 'hub', 'hub', 10), ('d1', 'queued', 'claimed', 'node', 'host-a', 20),
           ('d2', NULL, 'queued', 'hub', 'hub', 11), ('d3', NULL, 'queued', 'hub', 'hub', 12),
           ('d4', NULL, 'queued', 'hub', 'hub', 13), ('d5', NULL, 'queued', 'hub', 'hub', 14),
           ('d6', NULL, 'queued', 'hub', 'hub', 15), ('d7', 'queued', 'held', 'hub', 'hub', 36),
           ('d8', 'queued', 'failed', 'hub', 'hub', 37), ('d9', 'mirrored', 'unknown', 'operator', 'op', 38);
INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code, reported_at,
        attempt, retryable)
    VALUES ('a1', 'd1', 'host-a', 'i-a', 'r1', 'q1', 'succeeded', 0, 40, 1, 0),
           ('a5', 'd5', 'host-a', 'i-a', 'r5', 'q5', 'failed', 75, 34, 1, 1);
