"""Requests checked and written, answers read, errors classed: no hub needed."""

from __future__ import annotations

import json
import unittest

import baton_client as b
from baton_client._api import long_poll, segment
from baton_client.errors import api_error
from baton_client.wire import read_batch, read_message, read_submit

from support import DELIVERY_ID, accepted, attempt, delivery, view


class Requests(unittest.TestCase):
    def test_a_submit_is_written_as_the_rust_client_writes_it(self) -> None:
        req = b.message(
            "support",
            b.RawJson(' {"n": 1.50, "big": 12345678901234567890123} \n'),
            to=["host-a", "host-b"],
            idempotency_key="order-42",
            max_attempts=3,
            retry_backoff_ms=100,
            approval="required",
            approval_timeout_ms=60_000,
        )
        self.assertEqual(
            req.body,
            '{"conversation":"support","idempotency_key":"order-42",'
            '"payload":{"n": 1.50, "big": 12345678901234567890123},"to":["host-a","host-b"],'
            '"max_attempts":3,"retry_backoff_ms":100,"approval":"required","approval_timeout_ms":60000}',
        )
        # A Python value is written compactly, its strings as serde_json escapes them.
        req = b.message("c", {"t": 'é"\\\n\x01/'}, idempotency_key="k")
        self.assertEqual(req.body, '{"conversation":"c","idempotency_key":"k","payload":{"t":"é\\"\\\\\\n\\u0001/"}}')

    def test_a_submit_without_a_key_gets_one_and_keeps_it(self) -> None:
        req = b.message("c", {})
        self.assertRegex(req.idempotency_key, r"^[0-9a-f-]{36}$")
        self.assertIn(f'"idempotency_key":"{req.idempotency_key}"', req.body)
        self.assertNotEqual(b.message("c", {}).idempotency_key, req.idempotency_key)

    def test_a_bad_field_is_refused_naming_it(self) -> None:
        cases: list[tuple[dict[str, object], str]] = [
            ({"conversation": "Bad"}, "conversation"),
            ({"conversation": ""}, "conversation"),
            ({"to": ["ok", "NO"]}, "to[1]"),
            ({"to": "host-a"}, "to"),
            ({"idempotency_key": "a b"}, "idempotency_key"),
            ({"idempotency_key": "k" * 129}, "idempotency_key"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"max_attempts": True}, "max_attempts"),
            ({"retry_backoff_ms": -1}, "retry_backoff_ms"),
            ({"approval": "maybe"}, "approval"),
            ({"approval_timeout_ms": 5}, "approval_timeout_ms"),
            ({"payload": b.RawJson('{"a": 1, "\\u0061": 2}')}, "payload"),
            ({"payload": b.RawJson("[1] [2]")}, "payload"),
            ({"payload": b.RawJson('"\\ud800"')}, "payload"),
            ({"payload": b.RawJson("[" * 65 + "]" * 65)}, "payload"),
            ({"payload": float("nan")}, "payload"),
            ({"payload": {"s": "\ud800"}}, "payload"),
        ]
        for change, field in cases:
            args: dict[str, object] = {"conversation": "c", "payload": {}, **change}
            conversation, payload = args.pop("conversation"), args.pop("payload")
            with self.subTest(change=change):
                with self.assertRaises(b.InvalidArgumentError) as caught:
                    b.message(conversation, payload, **args)  # type: ignore[arg-type]
                self.assertEqual(caught.exception.field, field)
                self.assertTrue(str(caught.exception).startswith(field + ": "), str(caught.exception))
                self.assertIsInstance(caught.exception, ValueError)
        # Sixty-four levels are allowed.
        b.message("c", b.RawJson("[" * 64 + "]" * 64))

    def test_a_batch_is_bounded_before_it_is_sent(self) -> None:
        fake_client = b.wire
        with self.assertRaises(b.InvalidArgumentError):
            fake_client.batch_body([])
        many = [b.message("c", {}, idempotency_key=f"k{i}") for i in range(257)]
        with self.assertRaises(b.InvalidArgumentError) as caught:
            fake_client.batch_body(many)
        self.assertIn("256", str(caught.exception))
        big = [b.message("c", "x" * 300_000, idempotency_key=f"k{i}") for i in range(4)]
        with self.assertRaises(b.InvalidArgumentError):
            fake_client.batch_body(big)
        body = fake_client.batch_body(many[:2]).decode()
        self.assertEqual(body, '{"messages":[' + many[0].body + "," + many[1].body + "]}")

    def test_ids_stay_one_path_segment_and_long_polls_are_bounded(self) -> None:
        self.assertEqual(segment("0190-ab_c.d:e"), "0190-ab_c.d:e")
        self.assertEqual(segment("../x y"), "..%2Fx%20y")
        self.assertEqual(segment("é"), "%C3%A9")
        self.assertEqual(long_poll(None)[0], ())
        query, timeout = long_poll(600)
        self.assertEqual(query, (("wait_ms", "30000"),))
        self.assertEqual(timeout, 45.0)


class Answers(unittest.TestCase):
    def test_errors_are_classed_by_status_and_carry_the_code(self) -> None:
        cases = [
            (400, "invalid_field", b.InvalidRequestError, False),
            (401, "certificate_revoked", b.DeniedError, False),
            (403, "forbidden", b.DeniedError, False),
            (404, "not_found", b.NotFoundError, False),
            (409, "idempotency_conflict", b.ConflictError, False),
            (413, "too_large", b.RefusedError, False),
            (408, "request_timeout", b.HubUnavailableError, True),
            (429, "over_capacity", b.HubUnavailableError, True),
            (500, "internal", b.HubUnavailableError, True),
            (503, "storage_unavailable", b.HubUnavailableError, True),
            (507, "store_full", b.HubUnavailableError, True),
        ]
        for status, code, cls, transient in cases:
            with self.subTest(status=status):
                e = api_error(status, json.dumps({"code": code, "message": "m"}).encode())
                self.assertIs(type(e), cls)
                self.assertIsInstance(e, b.ApiError)
                self.assertIsInstance(e, b.BatonError)
                self.assertEqual((e.status, e.code, e.message, e.transient), (status, code, "m", transient))
                self.assertEqual(isinstance(e, b.UnavailableError), transient)
                self.assertEqual(isinstance(e, b.RefusedError), not transient)
        self.assertEqual(str(api_error(404, b'{"code":"not_found","message":"m"}')), "the hub refused the request (404 not_found): m")
        # Another shape (a proxy's page) is quoted, bounded, with no code.
        e = api_error(502, b"x" * 1000)
        self.assertEqual((e.code, len(e.message)), ("", 200))
        self.assertTrue(b.TransportError("reset", maybe_sent=True).transient)
        self.assertTrue(str(b.TransportError("reset", maybe_sent=True)).startswith("hub unreachable: "))

    def test_a_delivery_has_ended_when_its_current_run_has(self) -> None:
        def ended(state: str, run: int, outcomes: list[tuple[int, str]]) -> bool | None:
            v = read_message(200, json.dumps(view(delivery(state, run, [attempt(n, o) for n, o in outcomes]))).encode())
            return v.deliveries[0].ended()

        self.assertIsNone(ended("queued", 1, []))
        self.assertIsNone(ended("delivered", 1, []))
        self.assertIs(ended("delivered", 1, [(1, "succeeded")]), True)
        self.assertIs(ended("delivered", 1, [(1, "cancelled")]), False)
        self.assertIs(ended("delivered", 1, [(1, "unknown")]), False)
        # A retry runs: the earlier run's outcome is not this run's.
        self.assertIsNone(ended("delivered", 2, [(1, "failed")]))
        self.assertIsNone(ended("queued", 2, [(1, "failed")]))
        self.assertIs(ended("delivered", 2, [(1, "failed"), (2, "succeeded")]), True)
        self.assertIs(ended("failed", 1, []), False)
        self.assertIs(ended("unknown", 1, []), False)

    def test_an_answer_that_is_not_the_documented_one_names_the_field(self) -> None:
        bad = view({**delivery("queued"), "attempt": "one"})
        with self.assertRaises(b.BadAnswerError) as caught:
            read_message(200, json.dumps(bad).encode())
        self.assertIn("deliveries[0].attempt", str(caught.exception))
        self.assertTrue(caught.exception.transient)
        # Fields a hub older than the client does not send take the Rust client's defaults.
        d = delivery("queued")
        del d["attempt"]
        old = view(d)
        self.assertEqual(read_message(200, json.dumps(old).encode()).deliveries[0].attempt, 1)

    def test_a_pool_delivery_has_no_host_until_a_member_claims_it(self) -> None:
        waiting = {"delivery_id": DELIVERY_ID, "host": None, "pool": "gpu", "state": "queued"}
        sent = read_submit(201, json.dumps({**accepted(), "deliveries": [waiting]}).encode(), "k")
        host: str | None = sent.deliveries[0].host
        self.assertEqual((host, sent.deliveries[0].pool), (None, "gpu"))
        self.assertIsNone(read_submit(201, json.dumps(accepted()).encode(), "k").deliveries[0].pool, "a host's own")
        claimed = view({**delivery("claimed"), "host": "host-b", "pool": "gpu"})
        d = read_message(200, json.dumps(claimed).encode()).deliveries[0]
        self.assertEqual((d.host, d.pool), ("host-b", "gpu"))
        queued = read_message(200, json.dumps(view({**delivery("queued"), "host": None, "pool": "gpu"})).encode())
        self.assertIsNone(queued.deliveries[0].host)
        with self.assertRaises(b.BadAnswerError) as caught:
            read_submit(201, json.dumps({**accepted(), "deliveries": [{**waiting, "pool": 7}]}).encode(), "k")
        self.assertIn("deliveries[0].pool", str(caught.exception))

    def test_a_batch_answer_is_one_result_per_message(self) -> None:
        reqs = [b.message("c", {}, idempotency_key=k) for k in ("a", "b")]
        body = {
            "results": [
                {"status": 201, "ok": accepted()},
                {"status": 409, "error": {"code": "idempotency_conflict", "message": "m"}},
            ]
        }
        items = read_batch(200, json.dumps(body).encode(), reqs)
        self.assertIsInstance(items[0], b.SubmitResult)
        assert isinstance(items[0], b.SubmitResult)
        self.assertEqual((items[0].status, items[0].idempotency_key), (201, "a"))
        self.assertIsInstance(items[1], b.ConflictError)
        for wrong in ({"results": body["results"][:1]}, {"results": [{"status": 200, "error": {"code": "x", "message": "m"}}] * 2}):
            with self.assertRaises(b.BadAnswerError):
                read_batch(200, json.dumps(wrong).encode(), reqs)


if __name__ == "__main__":
    unittest.main()
