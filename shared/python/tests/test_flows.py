"""The flows both clients run (retries, ``wait``, failure classes), against a fake hub."""

from __future__ import annotations

import asyncio
import unittest

import httpx

import baton_client as b
from baton_client._api import Api
from baton_client._steps import RetryPolicy
from baton_client._transport import AsyncDriver, check_hub_url, transport_error

from support import DELIVERY_ID, FAST, MESSAGE_ID, Fake, accepted, answer, attempt, delivery, scripted, view

LOST = httpx.ReadTimeout("timed out")
REFUSED = httpx.ConnectError("connection refused")


class Retries(unittest.TestCase):
    def test_a_submit_is_retried_with_the_same_body_until_it_is_accepted(self) -> None:
        fake = Fake(scripted(LOST, answer(503, {"code": "storage_unavailable", "message": "m"}), answer(200, accepted(duplicate=True))))
        req = b.message("c", {"n": 1}, idempotency_key="k-1")
        result = fake.run(fake.api.submit(req))
        assert isinstance(result, b.SubmitResult)
        self.assertEqual((result.duplicate, result.status, result.idempotency_key), (True, 200, "k-1"))
        self.assertEqual(len(fake.requests), 3)
        self.assertEqual({r.content for r in fake.requests}, {req.body.encode()}, "every try sends the same bytes")
        self.assertEqual(fake.requests[0].headers["content-type"], "application/json")

    def test_retries_stop_at_the_bound_and_raise_the_last_failure(self) -> None:
        fake = Fake(scripted(REFUSED))
        with self.assertRaises(b.TransportError) as caught:
            fake.run(fake.api.submit(b.message("c", {})))
        self.assertFalse(caught.exception.maybe_sent, "a refused connection never reached the hub")
        self.assertEqual(len(fake.requests), FAST.attempts_max)
        once = Fake(scripted(REFUSED), retry=RetryPolicy.once())
        with self.assertRaises(b.TransportError):
            once.run(once.api.submit(b.message("c", {})))
        self.assertEqual(len(once.requests), 1)

    def test_refusals_are_not_retried(self) -> None:
        for status, code in ((409, "idempotency_conflict"), (401, "certificate_revoked"), (400, "invalid_field")):
            fake = Fake(scripted(answer(status, {"code": code, "message": "m"})))
            with self.assertRaises(b.RefusedError) as caught:
                fake.run(fake.api.submit(b.message("c", {})))
            self.assertEqual((caught.exception.status, caught.exception.code), (status, code))
            self.assertEqual(len(fake.requests), 1)

    def test_cancel_and_decisions_are_sent_once(self) -> None:
        for verb in ("cancel", "approve"):
            fake = Fake(scripted(LOST))
            with self.assertRaises(b.TransportError) as caught:
                fake.run(fake.api.cancel(MESSAGE_ID, "r") if verb == "cancel" else fake.api.decide(MESSAGE_ID, verb, "r"))
            self.assertTrue(caught.exception.maybe_sent)
            self.assertEqual(len(fake.requests), 1)

    def test_reads_are_retried(self) -> None:
        fake = Fake(scripted(REFUSED, answer(200, view(delivery("queued")))))
        v = fake.run(fake.api.message(MESSAGE_ID))
        assert isinstance(v, b.MessageView)
        self.assertEqual(v.payload, {"x": 1})
        self.assertEqual(len(fake.requests), 2)

    def test_pauses_grow_and_stay_under_the_cap(self) -> None:
        p = RetryPolicy()
        for failures in range(1, 30):
            self.assertLessEqual(p.pause_s(failures), p.backoff_max_s)
        self.assertTrue(p.backoff_base_s / 2 <= p.pause_s(1) <= p.backoff_base_s)
        self.assertGreaterEqual(p.pause_s(40), p.backoff_max_s / 2)


class Wait(unittest.TestCase):
    def run_wait(self, *answers: httpx.Response | Exception, timeout_s: float = 30.0) -> tuple[Fake, object]:
        fake = Fake(scripted(*answers))
        return fake, fake.run(fake.api.wait(MESSAGE_ID, None, timeout_s))

    def test_wait_follows_a_retry_to_the_current_runs_end(self) -> None:
        fake, v = self.run_wait(
            answer(200, view(delivery("delivered", 1, []))),
            answer(200, view(delivery("queued", 2, [attempt(1, "failed")]))),
            answer(200, view(delivery("delivered", 2, [attempt(1, "failed")]))),
            answer(200, view(delivery("delivered", 2, [attempt(1, "failed"), attempt(2, "succeeded")]))),
        )
        assert isinstance(v, b.MessageView)
        self.assertTrue(v.settled and v.succeeded)
        self.assertEqual(len(fake.requests), 4)
        self.assertNotIn("wait_ms", str(fake.requests[0].url), "the first read does not wait")
        self.assertIn("wait_ms=", str(fake.requests[1].url), "later reads long-poll")

    def test_wait_reads_a_delivery_the_view_left_out_whole(self) -> None:
        omitted = {"attempts_of": [DELIVERY_ID], "view_bytes_max": 4096, "read_each_at": "/x/{delivery_id}"}
        fake, v = self.run_wait(
            answer(200, view(delivery("delivered", 1, []), omitted=omitted)),
            answer(200, delivery("delivered", 1, [attempt(1, "succeeded")])),
        )
        assert isinstance(v, b.MessageView)
        self.assertTrue(v.succeeded)
        self.assertTrue(str(fake.requests[1].url).endswith(f"/v1/messages/{MESSAGE_ID}/deliveries/{DELIVERY_ID}"))

    def test_wait_reads_again_through_an_outage_and_times_out_with_the_last_view(self) -> None:
        fake, v = self.run_wait(REFUSED, answer(200, view(delivery("failed"))))
        assert isinstance(v, b.MessageView)
        self.assertTrue(v.settled and not v.succeeded)
        fake = Fake(scripted(answer(200, view(delivery("queued")))))
        with self.assertRaises(b.WaitTimeoutError) as caught:
            fake.run(fake.api.wait(MESSAGE_ID, None, 0.0))
        self.assertIsInstance(caught.exception, TimeoutError)
        self.assertEqual(caught.exception.last.deliveries[0].state, "queued")
        with self.assertRaises(ValueError):
            fake.run(fake.api.wait(MESSAGE_ID, "k", 1.0))


class Transport(unittest.TestCase):
    def test_failures_are_classed_by_whether_the_hub_may_have_acted(self) -> None:
        e = transport_error(httpx.ConnectError("[Errno 111] Connection refused"))
        self.assertIsInstance(e, b.TransportError)
        assert isinstance(e, b.TransportError)
        self.assertFalse(e.maybe_sent)
        e = transport_error(httpx.ReadError("connection reset"))
        assert isinstance(e, b.TransportError)
        self.assertTrue(e.maybe_sent)
        e = transport_error(httpx.ReadError("[SSL: SSLV3_ALERT_CERTIFICATE_REVOKED] sslv3 alert certificate revoked"))
        self.assertIsInstance(e, b.CertificateRevokedError)
        self.assertFalse(e.transient)
        e = transport_error(httpx.ConnectError("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca"))
        self.assertIn("refused our client certificate", str(e))

    def test_hub_urls_are_https_without_a_path(self) -> None:
        self.assertEqual(check_hub_url("https://hub.example:8443/"), "https://hub.example:8443")
        for bad, says in (
            ("http://hub:1", "https://"),
            ("hub:1", "https://"),
            ("https://hub:1/v1", "without a path"),
            ("https://", "no host"),
            ("https://hub:port", "port"),
        ):
            with self.subTest(bad=bad):
                with self.assertRaises(b.InvalidArgumentError) as caught:
                    check_hub_url(bad)
                self.assertEqual(caught.exception.field, "hub_url")
                self.assertIn(says, str(caught.exception))

    def test_the_async_driver_runs_the_same_flows(self) -> None:
        answers = scripted(LOST, answer(201, accepted()))
        seen: list[httpx.Request] = []

        def handle(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return answers(request)

        async def go() -> b.SubmitResult:
            http = httpx.AsyncClient(base_url="https://hub.test", transport=httpx.MockTransport(handle))
            try:
                return await AsyncDriver(http).run(Api(FAST).submit(b.message("c", {}, idempotency_key="k")))
            finally:
                await http.aclose()

        result = asyncio.run(go())
        self.assertEqual((result.status, result.idempotency_key, len(seen)), (201, "k", 2))


if __name__ == "__main__":
    unittest.main()
