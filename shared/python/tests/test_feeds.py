"""The events feeds and the replay listing against a fake hub: pages decoded into typed items,
a feed followed to its end from the last cursor through transient failures, a listing
followed while ``more``, and the cursor refusals' classes."""

from __future__ import annotations

import asyncio
import unittest
import urllib.parse

import httpx

import baton_client as b
from baton_client._api import Api, EventPages
from baton_client._transport import AsyncDriver
from baton_client.aio import AsyncFeed
from baton_client.client import Feed

from support import DELIVERY_ID, FAST, MESSAGE_ID, Fake, answer, scripted

REFUSED = httpx.ConnectError("connection refused")


def item(cursor: int, kind: str, **fields: object) -> dict[str, object]:
    return {
        "cursor": str(cursor),
        "kind": kind,
        "at_ms": 1000 + cursor,
        "message_id": MESSAGE_ID,
        "delivery_id": DELIVERY_ID,
        "host": "host-a",
        **fields,
    }


STATE = item(1, "state", to="queued", actor="hub")
PROGRESS = item(2, "progress", attempt=1, seq=1, progress={"step": "search", "done": 3})
OUTCOME = item(
    3,
    "outcome",
    attempt=1,
    outcome="succeeded",
    exit_code=0,
    duration_ms=12,
    retryable=False,
    progress_events=1,
    progress_dropped=0,
)


def page(*items: dict[str, object], next_cursor: str | None = None, settled: bool | None = None) -> httpx.Response:
    body: dict[str, object] = {"events": list(items), "next_cursor": next_cursor or (str(items[-1]["cursor"]) if items else "0")}
    if settled is not None:
        body["settled"] = settled
    return answer(200, body)


def listed(seq: int) -> dict[str, object]:
    return {
        "message_id": MESSAGE_ID,
        "seq": seq,
        "idempotency_key": f"k{seq}",
        "payload": {"n": seq},
        "accepted_at_ms": 1,
        "deliveries": [{"delivery_id": DELIVERY_ID, "host": "host-a", "state": "queued"}],
    }


def query(r: httpx.Request) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(r.url.query.decode()))


class FakeClient(b.Client):
    """A ``Client`` whose HTTP goes to a ``Fake``."""

    def __init__(self, fake: Fake) -> None:
        self._driver = fake.driver
        self._api = fake.api


class Pages(unittest.TestCase):
    def test_a_page_types_each_item_by_its_kind(self) -> None:
        fake = Fake(scripted(page(STATE, PROGRESS, OUTCOME, settled=True)))
        p = fake.run(fake.api.message_events(MESSAGE_ID, "0", 2.0, 10))
        assert isinstance(p, b.EventsPage)
        state, progress, outcome = p.events
        assert isinstance(state, b.StateEvent) and isinstance(progress, b.ProgressEvent)
        assert isinstance(outcome, b.OutcomeEvent)
        self.assertEqual((state.from_, state.to, state.actor, state.reason), (None, "queued", "hub", None))
        self.assertEqual((progress.attempt, progress.seq, progress.progress), (1, 1, {"step": "search", "done": 3}))
        self.assertEqual((outcome.outcome, outcome.exit_code, outcome.signal, outcome.progress_events), ("succeeded", 0, None, 1))
        self.assertEqual((p.next_cursor, p.settled), ("3", True))
        r = fake.requests[0]
        self.assertEqual(r.url.path, f"/v1/messages/{MESSAGE_ID}/events")
        self.assertEqual(query(r), {"after": "0", "wait_ms": "2000", "limit": "10"})

    def test_an_unknown_kind_or_a_progress_that_is_no_object_is_a_bad_answer(self) -> None:
        for bad in (item(1, "gossip"), item(1, "progress", attempt=1, seq=1, progress=[1])):
            fake = Fake(scripted(page(bad)), retry=b.RetryPolicy.once())
            with self.assertRaises(b.BadAnswerError) as caught:
                fake.run(fake.api.conversation_events("c"))
            self.assertIn("events[0]", str(caught.exception))

    def test_cursor_refusals_have_their_classes_and_arguments_are_checked(self) -> None:
        fake = Fake(scripted(answer(400, {"code": "bad_cursor", "message": "after: not a cursor"})))
        with self.assertRaises(b.BadCursorError) as caught:
            fake.run(fake.api.conversation_events("c", after="x1"))
        self.assertIsInstance(caught.exception, b.InvalidRequestError)
        self.assertEqual((caught.exception.status, caught.exception.code), (400, "bad_cursor"))
        fake = Fake(scripted(answer(410, {"code": "cursor_expired", "message": "m"})))
        with self.assertRaises(b.CursorExpiredError) as gone:
            fake.run(fake.api.list_messages("c", after="7.x"))
        self.assertEqual((gone.exception.code, len(fake.requests)), ("cursor_expired", 1))
        for call, field in (
            (lambda: fake.api.message_events(MESSAGE_ID, limit=0), "limit"),
            (lambda: fake.api.message_events(MESSAGE_ID, limit=10_001), "limit"),
            (lambda: fake.api.conversation_events("c", after=""), "after"),
            (lambda: fake.api.list_messages("Bad"), "conversation"),
            (lambda: fake.api.list_messages("c", limit=0), "limit"),
        ):
            with self.assertRaises(b.InvalidArgumentError) as bad:
                fake.run(call())
            self.assertEqual(bad.exception.field, field)

    def test_a_listing_page_is_read(self) -> None:
        fake = Fake(scripted(answer(200, {"conversation": "c", "messages": [listed(7)], "next_cursor": "7.ab", "more": False})))
        p = fake.run(fake.api.list_messages("c", after="3.ab", limit=5))
        assert isinstance(p, b.MessagePage)
        self.assertEqual((p.next_cursor, p.more, p.messages[0].payload, p.messages[0].traceparent), ("7.ab", False, {"n": 7}, None))
        self.assertEqual(p.messages[0].deliveries[0].state, "queued")
        self.assertEqual(query(fake.requests[0]), {"conversation": "c", "after": "3.ab", "limit": "5"})


class Following(unittest.TestCase):
    def test_a_message_feed_is_followed_to_its_end_through_failures_from_the_last_cursor(self) -> None:
        fake = Fake(
            scripted(
                page(STATE, settled=False),
                REFUSED,
                page(PROGRESS, settled=False),
                page(next_cursor="2", settled=False),
                page(OUTCOME, settled=True),
                page(next_cursor="3", settled=True),
            )
        )
        feed = FakeClient(fake).watch(MESSAGE_ID, limit=100)
        self.assertIsNone(feed.cursor)
        seen = []
        for e in feed:
            seen.append(e)
            self.assertEqual(feed.cursor, e.cursor)
        self.assertEqual([e.kind for e in seen], ["state", "progress", "outcome"])
        self.assertTrue(feed.settled)
        self.assertEqual(feed.cursor, "3")
        afters = [query(r).get("after") for r in fake.requests]
        self.assertEqual(afters, [None, "1", "1", "2", "2", "3"], "each read, retries included, from the last cursor")
        waits = [query(r).get("wait_ms") for r in fake.requests]
        self.assertEqual(waits[:5], ["25000"] * 5, "long polls while the message has not settled")
        self.assertIsNone(waits[5], "after a settled answer the last read does not wait")

    def test_a_failure_past_the_retries_is_raised_and_iterating_again_reads_on(self) -> None:
        fake = Fake(scripted(page(STATE), REFUSED, REFUSED, REFUSED, page(PROGRESS)))
        feed = FakeClient(fake).follow("c")
        self.assertEqual(next(feed).cursor, "1")
        with self.assertRaises(b.TransportError):
            next(feed)
        self.assertEqual(feed.cursor, "1")
        self.assertEqual(next(feed).cursor, "2")
        self.assertEqual(len(fake.requests), 2 + FAST.attempts_max)
        self.assertFalse(feed.settled)

    def test_a_deadline_ends_a_feed_unsettled(self) -> None:
        fake = Fake(scripted(page(STATE, settled=False)))
        clock = [0.0]
        fake.api = Api(FAST, monotonic=lambda: clock[0])
        feed = Feed(FakeClient(fake), EventPages(fake.api, MESSAGE_ID, None, None, 10.0, None))
        self.assertEqual(next(feed).kind, "state")
        clock[0] = 4.0
        self.assertEqual(next(feed).kind, "state")
        self.assertEqual(query(fake.requests[1]).get("wait_ms"), "6000", "the last wait is what is left")
        clock[0] = 10.0
        self.assertEqual(list(feed), [])
        self.assertFalse(feed.settled)

    def test_a_listing_is_followed_while_more(self) -> None:
        fake = Fake(
            scripted(
                answer(200, {"conversation": "c", "messages": [listed(1), listed(2)], "next_cursor": "2.a", "more": True}),
                answer(200, {"conversation": "c", "messages": [], "next_cursor": "9.a", "more": True}),
                answer(200, {"conversation": "c", "messages": [listed(10)], "next_cursor": "10.a", "more": False}),
            )
        )
        listing = FakeClient(fake).iter_messages("c", limit=2)
        self.assertEqual([m.seq for m in listing], [1, 2, 10])
        self.assertEqual(listing.cursor, "10.a")
        self.assertEqual([query(r).get("after") for r in fake.requests], [None, "2.a", "9.a"])

    def test_the_async_iterators_follow_the_same_way(self) -> None:
        answers = scripted(page(STATE, settled=False), REFUSED, page(OUTCOME, settled=True), page(next_cursor="3", settled=True))
        seen: list[httpx.Request] = []

        def handle(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return answers(request)

        async def go() -> tuple[list[str], bool, str | None]:
            async with b.AsyncClient.__new__(b.AsyncClient) as c:
                c._driver = AsyncDriver(httpx.AsyncClient(base_url="https://hub.test", transport=httpx.MockTransport(handle)))
                c._api = Api(FAST)
                feed = c.watch(MESSAGE_ID)
                self.assertIsInstance(feed, AsyncFeed)
                kinds = [e.kind async for e in feed]
                return kinds, feed.settled, feed.cursor

        kinds, settled, cursor = asyncio.run(go())
        self.assertEqual((kinds, settled, cursor), (["state", "outcome"], True, "3"))
        self.assertEqual([query(r).get("after") for r in seen], [None, "1", "1", "3"])


if __name__ == "__main__":
    unittest.main()
