-- A record of the schema before the settlement migration (17 on both backends), holding work in
-- every state, for hosts and for a pool: queued, queued for a retry (with a failed attempt),
-- held, claimed, mirrored, delivered with and without an outcome, failed and unknown; a pool's
-- delivery waiting in the pool, one held there, one its member claimed, one delivered with an
-- outcome; and one message whose fan-out has not run. The deliveries are made queued and then
-- moved on, the attempts written last, so the schema's own triggers keep the queue counts and
-- `settled_at` as the hub would have. Plain statements both backends run as written.
INSERT INTO hosts (name, enrolled_at, instance_id, instance_since) VALUES ('host-a', 1, 'i-a', 2), ('host-b', 1, 'i-b', 2);
INSERT INTO pools (name, created_at, created_by) VALUES ('p1', 3, 'op');
INSERT INTO pool_members (pool, host, added_at, added_by) VALUES ('p1', 'host-a', 3, 'op'), ('p1', 'host-b', 3, 'op');
INSERT INTO conversations (name, last_seq) VALUES ('c1', 14);
INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at)
    VALUES ('m1', 'c1', 1, 'p', 'k1', 'h1', '{"n":1}', 10), ('m2', 'c1', 2, 'p', 'k2', 'h2', '{"n":2}', 11),
           ('m3', 'c1', 3, 'p', 'k3', 'h3', '{"n":3}', 12), ('m4', 'c1', 4, 'p', 'k4', 'h4', '{"n":4}', 13),
           ('m5', 'c1', 5, 'p', 'k5', 'h5', '{"n":5}', 14), ('m6', 'c1', 6, 'p', 'k6', 'h6', '{"n":6}', 15),
           ('m7', 'c1', 7, 'p', 'k7', 'h7', '{"n":7}', 16), ('m8', 'c1', 8, 'p', 'k8', 'h8', '{"n":8}', 17),
           ('m9', 'c1', 9, 'p', 'k9', 'h9', '{"n":9}', 18), ('m10', 'c1', 10, 'p', 'k10', 'h10', '{"n":10}', 19),
           ('m11', 'c1', 11, 'p', 'k11', 'h11', '{"n":11}', 20), ('m12', 'c1', 12, 'p', 'k12', 'h12', '{"n":12}', 21),
           ('m13', 'c1', 13, 'p', 'k13', 'h13', '{"n":13}', 22), ('m14', 'c1', 14, 'p', 'k14', 'h14', '{"n":14}', 23);
INSERT INTO message_recipients (message_id, host)
    VALUES ('m1', 'host-a'), ('m2', 'host-a'), ('m3', 'host-a'), ('m4', 'host-a'), ('m5', 'host-a'),
           ('m6', 'host-a'), ('m7', 'host-a'), ('m8', 'host-a'), ('m9', 'host-b'), ('m10', 'host-b');
INSERT INTO message_pool_recipients (message_id, pool)
    VALUES ('m11', 'p1'), ('m12', 'p1'), ('m13', 'p1'), ('m14', 'p1');
INSERT INTO fanout_obligations (message_id, created_at, done_at)
    VALUES ('m1', 10, NULL), ('m2', 11, NULL), ('m3', 12, NULL), ('m4', 13, NULL), ('m5', 14, NULL),
           ('m6', 15, NULL), ('m7', 16, NULL), ('m8', 17, NULL), ('m9', 18, NULL), ('m10', 19, NULL),
           ('m11', 20, NULL), ('m12', 21, NULL), ('m13', 22, NULL), ('m14', 23, NULL);
INSERT INTO deliveries (n, id, message_id, host, pool, conversation, seq, state, created_at, updated_at)
    VALUES (1, 'd1', 'm1', 'host-a', NULL, 'c1', 1, 'queued', 10, 10),
           (2, 'd2', 'm2', 'host-a', NULL, 'c1', 2, 'queued', 11, 11),
           (3, 'd3', 'm3', 'host-a', NULL, 'c1', 3, 'queued', 12, 12),
           (4, 'd4', 'm4', 'host-a', NULL, 'c1', 4, 'queued', 13, 13),
           (5, 'd5', 'm5', 'host-a', NULL, 'c1', 5, 'queued', 14, 14),
           (6, 'd6', 'm6', 'host-a', NULL, 'c1', 6, 'queued', 15, 15),
           (7, 'd7', 'm7', 'host-a', NULL, 'c1', 7, 'queued', 16, 16),
           (8, 'd8', 'm8', 'host-a', NULL, 'c1', 8, 'queued', 17, 17),
           (9, 'd9', 'm9', 'host-b', NULL, 'c1', 9, 'queued', 18, 18),
           (11, 'd11', 'm11', NULL, 'p1', 'c1', 11, 'queued', 20, 20),
           (12, 'd12', 'm12', NULL, 'p1', 'c1', 12, 'queued', 21, 21),
           (13, 'd13', 'm13', NULL, 'p1', 'c1', 13, 'queued', 22, 22),
           (14, 'd14', 'm14', NULL, 'p1', 'c1', 14, 'queued', 23, 23);
UPDATE fanout_obligations SET done_at = created_at WHERE message_id <> 'm10';
UPDATE deliveries SET state = 'delivered', instance_id = 'i-a', claim_token = 't1', started_session = 1,
    started_at = 25, updated_at = 30 WHERE id = 'd1';
UPDATE deliveries SET state = 'delivered', instance_id = 'i-a', claim_token = 't2', started_session = 1,
    started_at = 26, updated_at = 31 WHERE id = 'd2';
UPDATE deliveries SET state = 'mirrored', instance_id = 'i-a', claim_token = 't3', updated_at = 32 WHERE id = 'd3';
UPDATE deliveries SET state = 'claimed', instance_id = 'i-a', claim_token = 't4', updated_at = 33 WHERE id = 'd4';
UPDATE deliveries SET attempt = 2, rerun = 'retry', rerun_by = 'hub', not_before = 99000, updated_at = 34
    WHERE id = 'd5';
UPDATE deliveries SET state = 'held', reason = 'hold fence 1', updated_at = 36 WHERE id = 'd7';
UPDATE deliveries SET state = 'failed', reason = 'blocked by fence 2', updated_at = 37 WHERE id = 'd8';
UPDATE deliveries SET state = 'unknown', reason = 'host retired while mirrored', updated_at = 38 WHERE id = 'd9';
UPDATE deliveries SET state = 'claimed', host = 'host-b', instance_id = 'i-b', claim_token = 't12', updated_at = 39
    WHERE id = 'd12';
UPDATE deliveries SET state = 'delivered', host = 'host-a', instance_id = 'i-a', claim_token = 't13',
    started_session = 1, started_at = 40, updated_at = 41 WHERE id = 'd13';
UPDATE deliveries SET state = 'held', reason = 'approval required', updated_at = 42 WHERE id = 'd14';
-- Host-a's backlog: d5, d6 and d7 wait (queued or held).
INSERT INTO host_backlog (host, waiting) VALUES ('host-a', 3), ('host-b', 0);
UPDATE pool_queues SET in_flight = 1, bound_host = 'host-b', served = 1 WHERE pool = 'p1' AND conversation = 'c1';
INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, at)
    VALUES ('d1', NULL, 'queued', 'hub', 'hub', 10),
           ('d1', 'queued', 'claimed', 'node', 'host-a', 20),
           ('d1', 'claimed', 'mirrored', 'node', 'host-a', 21),
           ('d1', 'mirrored', 'delivered', 'node', 'host-a', 30),
           ('d2', NULL, 'queued', 'hub', 'hub', 11),
           ('d2', 'queued', 'claimed', 'node', 'host-a', 22),
           ('d2', 'claimed', 'mirrored', 'node', 'host-a', 23),
           ('d2', 'mirrored', 'delivered', 'node', 'host-a', 31),
           ('d3', NULL, 'queued', 'hub', 'hub', 12),
           ('d3', 'queued', 'claimed', 'node', 'host-a', 24),
           ('d3', 'claimed', 'mirrored', 'node', 'host-a', 32),
           ('d4', NULL, 'queued', 'hub', 'hub', 13),
           ('d4', 'queued', 'claimed', 'node', 'host-a', 33),
           ('d5', NULL, 'queued', 'hub', 'hub', 14),
           ('d5', 'queued', 'claimed', 'node', 'host-a', 25),
           ('d5', 'claimed', 'mirrored', 'node', 'host-a', 26),
           ('d5', 'mirrored', 'delivered', 'node', 'host-a', 27),
           ('d5', 'delivered', 'queued', 'hub', 'hub', 34),
           ('d6', NULL, 'queued', 'hub', 'hub', 15),
           ('d7', NULL, 'queued', 'hub', 'hub', 16),
           ('d7', 'queued', 'held', 'hub', 'hub', 36),
           ('d8', NULL, 'queued', 'hub', 'hub', 17),
           ('d8', 'queued', 'failed', 'hub', 'hub', 37),
           ('d9', NULL, 'queued', 'hub', 'hub', 18),
           ('d9', 'queued', 'claimed', 'node', 'host-b', 28),
           ('d9', 'claimed', 'mirrored', 'node', 'host-b', 29),
           ('d9', 'mirrored', 'unknown', 'operator', 'op', 38),
           ('d11', NULL, 'queued', 'hub', 'hub', 20),
           ('d12', NULL, 'queued', 'hub', 'hub', 21),
           ('d12', 'queued', 'claimed', 'node', 'host-b', 39),
           ('d13', NULL, 'queued', 'hub', 'hub', 22),
           ('d13', 'queued', 'claimed', 'node', 'host-a', 35),
           ('d13', 'claimed', 'mirrored', 'node', 'host-a', 36),
           ('d13', 'mirrored', 'delivered', 'node', 'host-a', 41),
           ('d14', NULL, 'queued', 'hub', 'hub', 23),
           ('d14', 'queued', 'held', 'hub', 'hub', 42);
INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code, reported_at,
        attempt, retryable)
    VALUES ('a1', 'd1', 'host-a', 'i-a', 'r1', 'q1', 'succeeded', 0, 40, 1, 0),
           ('a5', 'd5', 'host-a', 'i-a', 'r5', 'q5', 'failed', 75, 34, 1, 1),
           ('a13', 'd13', 'host-a', 'i-a', 'r13', 'q13', 'succeeded', 0, 43, 1, 0);
