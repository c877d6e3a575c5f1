"""Against a real hub and node, started by ``tests/it/python_client.rs`` (skipped when run
alone): every producer call, blocking and asyncio, and a spool whose hub answers.

Each test uses conversations of its own, so a slow turn in one holds back no other.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
import unittest
from collections.abc import Callable, Sequence

import baton_client as b

from support import HubEnv, hub_env, needs_hub

#: How long a test waits for its turns to end (a loaded machine is slow; a hang still fails).
WAIT_S = 90.0
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
#: The pause between two reads of a state that no long-poll waits for (a turn handed off).
POLL_S = 0.1


def env() -> HubEnv:
    e = hub_env()
    assert e is not None
    return e


def client() -> b.Client:
    e = env()
    return b.Client(e.url, ca=e.ca, cert=e.cert, key=e.key)


#: What a message whose harness (``e2e_harness.py``) succeeds at once shows in its feed, in
#: order: its delivery's states, the two progress events of its run, the run's outcome.
ONE_RUN = [
    ("state", "queued"),
    ("state", "claimed"),
    ("state", "mirrored"),
    ("state", "delivered"),
    ("progress", "start"),
    ("progress", "done"),
    ("outcome", "succeeded"),
]


def steps(events: Sequence[b.FeedEvent]) -> list[tuple[str, object]]:
    """Each item as its kind and what it says: a state's new state, a progress event's step,
    an outcome."""
    out: list[tuple[str, object]] = []
    for e in events:
        if isinstance(e, b.StateEvent):
            out.append((e.kind, e.to))
        elif isinstance(e, b.ProgressEvent):
            out.append((e.kind, e.progress.get("step")))
        elif isinstance(e, b.OutcomeEvent):
            out.append((e.kind, e.outcome))
    return out


def check_one_run(case: unittest.TestCase, events: Sequence[b.FeedEvent], host: str) -> None:
    """``events`` are one message's whole feed for a run that succeeded at once, typed."""
    case.assertEqual(steps(events), ONE_RUN)
    cursors = [int(e.cursor) for e in events]
    case.assertEqual(cursors, sorted(set(cursors)), "in order, none twice")
    created, delivered = events[0], events[3]
    assert isinstance(created, b.StateEvent) and isinstance(delivered, b.StateEvent)
    case.assertEqual((created.from_, delivered.from_, delivered.actor), (None, "mirrored", f"node:{host}"))
    progress = [e for e in events if isinstance(e, b.ProgressEvent)]
    case.assertEqual([(p.attempt, p.seq) for p in progress], [(1, 1), (1, 2)])
    case.assertEqual(progress[0].progress, {"attempt": 1, "step": "start"})
    outcome = events[-1]
    assert isinstance(outcome, b.OutcomeEvent)
    case.assertEqual(
        (outcome.attempt, outcome.exit_code, outcome.retryable, outcome.progress_events, outcome.progress_dropped),
        (1, 0, False, 2, 0),
    )


def result_of(d: b.DeliveryView) -> dict[str, object]:
    current = d.current_attempt()
    assert current is not None and current.result is not None, d
    value = json.loads(current.result)
    assert isinstance(value, dict)
    return value


@needs_hub
class Producer(unittest.TestCase):
    def setUp(self) -> None:
        self.c = client()
        self.addCleanup(self.c.close)
        self.host = env().host

    def test_submit_replay_read_and_conflict(self) -> None:
        sent = self.c.submit("py-basic", {"text": "hello", "n": 1}, to=[self.host], idempotency_key="py-basic-1")
        self.assertEqual((sent.status, sent.duplicate, sent.idempotency_key), (201, False, "py-basic-1"))
        self.assertEqual([d.host for d in sent.deliveries], [self.host])
        done = self.c.wait(sent.message_id, timeout_s=WAIT_S)
        self.assertTrue(done.succeeded, done)
        seen = result_of(done.deliveries[0])
        self.assertEqual(seen["payload"], {"text": "hello", "n": 1})
        self.assertEqual(seen["message_id"], sent.message_id)
        self.assertEqual(seen["producer"], done.producer)
        self.assertEqual((seen["seq"], seen["attempt"], seen["rerun"]), (sent.seq, 1, None))

        again = self.c.submit("py-basic", {"text": "hello", "n": 1}, to=[self.host], idempotency_key="py-basic-1")
        self.assertEqual((again.status, again.duplicate, again.message_id, again.seq), (200, True, sent.message_id, sent.seq))
        with self.assertRaises(b.ConflictError) as caught:
            self.c.submit("py-basic", {"text": "other"}, to=[self.host], idempotency_key="py-basic-1")
        self.assertEqual((caught.exception.status, caught.exception.code), (409, "idempotency_conflict"))

        by_id = self.c.get(sent.message_id)
        by_key = self.c.get_by_key("py-basic-1")
        self.assertEqual((by_id.message_id, by_key.message_id), (sent.message_id, sent.message_id))
        self.assertEqual((by_key.conversation, by_key.idempotency_key, by_key.payload), ("py-basic", "py-basic-1", {"text": "hello", "n": 1}))
        one = self.c.delivery(sent.message_id, sent.deliveries[0].delivery_id)
        self.assertEqual(one, by_id.deliveries[0])
        # The hub started a trace for a message sent without one, and keeps it with the message.
        self.assertIsNotNone(by_id.traceparent)
        self.assertRegex(by_id.traceparent or "", r"^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$")

    def test_a_submit_without_a_key_gets_one_and_can_be_read_by_it(self) -> None:
        sent = self.c.submit("py-keyless", b.RawJson('{"exact": 1.50}'), to=[self.host])
        self.assertTrue(sent.idempotency_key)
        self.assertEqual(self.c.get_by_key(sent.idempotency_key).message_id, sent.message_id)
        done = self.c.wait(idempotency_key=sent.idempotency_key, timeout_s=WAIT_S)
        self.assertTrue(done.succeeded, done)

    def test_a_batch_answers_each_message_and_one_bad_item_spoils_no_other(self) -> None:
        items = [
            b.message("py-batch", {"i": 0}, to=[self.host], idempotency_key="py-batch-0"),
            b.message("py-batch", {"i": 1}, to=["py-no-such-host"], idempotency_key="py-batch-1"),
            b.message("py-batch", {"i": 2}, to=[self.host], idempotency_key="py-batch-2"),
        ]
        results = self.c.submit_batch(items)
        self.assertEqual(len(results), 3)
        first, bad, last = results
        assert isinstance(first, b.SubmitResult) and isinstance(last, b.SubmitResult), results
        self.assertEqual((first.status, last.status), (201, 201))
        self.assertLess(first.seq, last.seq)
        self.assertIsInstance(bad, b.InvalidRequestError)
        assert isinstance(bad, b.ApiError)
        self.assertEqual((bad.status, bad.code), (400, "invalid_field"))
        self.assertIn("to[0]", bad.message)
        replay = self.c.submit_batch([items[0], items[2]])
        self.assertTrue(all(isinstance(r, b.SubmitResult) and r.duplicate for r in replay), replay)
        for r in (first, last):
            self.assertTrue(self.c.wait(r.message_id, timeout_s=WAIT_S).succeeded)

    def test_wait_follows_a_retry_the_harness_asked_for(self) -> None:
        sent = self.c.submit(
            "py-retry", {"do": "retry-once"}, to=[self.host], max_attempts=3, retry_backoff_ms=100, idempotency_key="py-retry-1"
        )
        done = self.c.wait(sent.message_id, timeout_s=WAIT_S)
        self.assertTrue(done.succeeded, done)
        d = done.deliveries[0]
        self.assertEqual(d.attempt, 2)
        self.assertEqual([(a.attempt, a.outcome, a.exit_code) for a in d.attempts], [(1, "failed", 75), (2, "succeeded", 0)])
        self.assertTrue(d.attempts[0].retryable)
        self.assertEqual(d.attempts[1].rerun, "retry")
        seen = result_of(d)
        self.assertEqual((seen["attempt"], seen["rerun"]), (2, "retry"))

    def test_cancel_stops_a_running_turn_and_wait_sees_it_end(self) -> None:
        sent = self.c.submit("py-cancel", {"do": "sleep", "seconds": 120}, to=[self.host], idempotency_key="py-cancel-1")
        # Once the turn runs (handed off: delivered, no outcome yet), the cancel reaches the node.
        deadline = time.monotonic() + WAIT_S
        while self.c.get(sent.message_id).deliveries[0].state != "delivered":
            self.assertLess(time.monotonic(), deadline, "the turn was never handed off")
            time.sleep(POLL_S)
        r = self.c.cancel(sent.message_id, "no longer needed")
        self.assertEqual((r.message_id, r.deliveries[0].effect), (sent.message_id, "requested"))
        done = self.c.wait(sent.message_id, timeout_s=WAIT_S)
        self.assertFalse(done.succeeded)
        d = done.deliveries[0]
        self.assertIs(d.ended(), False)
        current = d.current_attempt()
        assert current is not None
        self.assertEqual((current.outcome, d.cancel_reason), ("cancelled", "no longer needed"))
        # Repeated once the run has its outcome: nothing left to cancel.
        self.assertEqual(self.c.cancel(sent.message_id, "again").deliveries[0].effect, "final")
        # A message cancelled before it runs fails at once.
        queued = self.c.submit("py-cancel", {}, to=[self.host], approval="required", idempotency_key="py-cancel-2")
        r = self.c.cancel(queued.message_id, "not needed either")
        self.assertEqual([(x.effect, x.state) for x in r.deliveries], [("cancelled", "failed")])
        self.assertEqual(self.c.cancel(queued.message_id, "again").deliveries, r.deliveries)

    def test_refusals_carry_the_apis_code_and_status(self) -> None:
        cases: list[tuple[Callable[[], object], type[b.ApiError], int, str]] = [
            (lambda: self.c.get(UNKNOWN_ID), b.NotFoundError, 404, "not_found"),
            (lambda: self.c.cancel(UNKNOWN_ID, "why"), b.NotFoundError, 404, "not_found"),
            (lambda: self.c.conversation("py-never-used"), b.NotFoundError, 404, "not_found"),
            (lambda: self.c.get_by_key("py-never-sent"), b.NotFoundError, 404, "not_found"),
            (lambda: self.c.submit("py-errors", {}), b.InvalidRequestError, 400, "no_recipients"),
        ]
        for call, cls, status, code in cases:
            with self.subTest(code=code, cls=cls):
                with self.assertRaises(cls) as caught:
                    call()
                self.assertEqual((caught.exception.status, caught.exception.code), (status, code))
                self.assertTrue(caught.exception.message)

    def test_approve_and_reject(self) -> None:
        held = self.c.submit("py-approve", {"n": 1}, to=[self.host], approval="required", idempotency_key="py-approve-1")
        self.assertEqual([d.state for d in held.deliveries], ["held"])
        decided = self.c.approve(held.message_id, "looks right")
        self.assertEqual((decided.decision, [d.state for d in decided.deliveries]), ("approved", ["queued"]))
        self.assertTrue(self.c.wait(held.message_id, timeout_s=WAIT_S).succeeded)
        with self.assertRaises(b.ConflictError) as caught:
            self.c.approve(held.message_id, "twice")
        self.assertEqual(caught.exception.code, "invalid_transition")
        other = self.c.submit("py-approve", {"n": 2}, to=[self.host], approval="required", idempotency_key="py-approve-2")
        refused = self.c.reject(other.message_id, "not this one")
        self.assertEqual((refused.decision, [d.state for d in refused.deliveries]), ("rejected", ["failed"]))
        view = self.c.conversation("py-approve")
        self.assertEqual((view.conversation, view.last_seq, view.open), ("py-approve", 2, True))

    def test_a_feed_is_followed_to_its_outcome_and_a_conversation_and_listing_paged(self) -> None:
        sent = self.c.submit("py-feed", {"n": 1}, to=[self.host], idempotency_key="py-feed-1")
        feed = self.c.watch(sent.message_id, timeout_s=WAIT_S)
        events = list(feed)
        self.assertTrue(feed.settled, events)
        check_one_run(self, events, self.host)
        assert feed.cursor is not None
        self.assertGreaterEqual(int(feed.cursor), int(events[-1].cursor))
        whole = self.c.message_events(sent.message_id)
        self.assertEqual((whole.events, whole.settled), (tuple(events), True))

        # The conversation's feed, two items a page: the run's items, then the held message's
        # (created, then held).
        held = self.c.submit("py-feed", {"n": 2}, to=[self.host], approval="required", idempotency_key="py-feed-2")
        paged: list[b.FeedEvent] = []
        after = None
        while True:
            p = self.c.conversation_events("py-feed", after=after, limit=2)
            self.assertLessEqual(len(p.events), 2)
            self.assertIsNone(p.settled)
            if not p.events:
                break
            paged.extend(p.events)
            after = p.next_cursor
        self.assertEqual(paged[: len(events)], events)
        self.assertEqual({e.message_id for e in paged[len(events) :]}, {held.message_id})
        last = paged[-1]
        assert isinstance(last, b.StateEvent)
        self.assertEqual(last.to, "held")
        followed = self.c.follow("py-feed", limit=3)
        self.assertEqual(list(itertools.islice(followed, len(paged))), paged)
        self.assertEqual(followed.cursor, last.cursor)
        self.assertEqual(list(self.c.follow("py-feed", after=followed.cursor, timeout_s=0.5)), [])

        # The listing, one message a page.
        first = self.c.list_messages("py-feed", limit=1)
        self.assertEqual(([m.message_id for m in first.messages], first.more), ([sent.message_id], True))
        listing = self.c.iter_messages("py-feed", limit=1)
        listed = list(listing)
        self.assertEqual(
            [(m.message_id, m.seq, m.idempotency_key, m.payload) for m in listed],
            [(sent.message_id, sent.seq, "py-feed-1", {"n": 1}), (held.message_id, held.seq, "py-feed-2", {"n": 2})],
        )
        self.assertEqual([[d.state for d in m.deliveries] for m in listed], [["delivered"], ["held"]])
        self.assertTrue(listed[0].traceparent)
        assert listing.cursor is not None
        after_all = self.c.list_messages("py-feed", after=listing.cursor)
        self.assertEqual((after_all.messages, after_all.more), ((), False))

        # Cursors this hub never gave out.
        refusals: list[Callable[[], object]] = [
            lambda: self.c.message_events(sent.message_id, after="x1"),
            lambda: list(self.c.watch(sent.message_id, after="9000000000000")),
            lambda: self.c.conversation_events("py-feed", after="x1"),
            lambda: self.c.list_messages("py-feed", after="x1"),
        ]
        for refused in refusals:
            with self.assertRaises(b.BadCursorError) as caught:
                refused()
            self.assertEqual((caught.exception.status, caught.exception.code), (400, "bad_cursor"))
        self.c.cancel(held.message_id, "the feed test is done with it")

    def test_a_spool_whose_hub_answers_delivers_at_once(self) -> None:
        with tempfile.TemporaryDirectory() as d, self.c.spooler(os.path.join(d, "spool")) as spool:
            sent = spool.send("py-spool-up", {"n": 1}, to=[self.host], idempotency_key="py-spool-up-1")
            self.assertFalse(sent.waiting)
            assert sent.accepted is not None
            self.assertEqual(sent.accepted.idempotency_key, "py-spool-up-1")
            self.assertEqual(spool.status().waiting, 0)


@needs_hub
class Async(unittest.IsolatedAsyncioTestCase):
    async def test_the_async_client_submits_waits_batches_and_spools(self) -> None:
        e = env()
        async with b.AsyncClient(e.url, ca=e.ca, cert=e.cert, key=e.key) as c:
            sent = await c.submit("py-async", {"n": 1}, to=[e.host], idempotency_key="py-async-1", max_attempts=2)
            again = await c.submit("py-async", {"n": 1}, to=[e.host], idempotency_key="py-async-1", max_attempts=2)
            self.assertTrue(again.duplicate)
            done = await c.wait(sent.message_id, timeout_s=WAIT_S)
            self.assertTrue(done.succeeded, done)
            self.assertEqual((await c.get_by_key("py-async-1")).message_id, sent.message_id)
            results = await c.submit_batch(
                [b.message("py-async", {"n": i}, to=[e.host], idempotency_key=f"py-async-b{i}") for i in range(3)]
            )
            self.assertEqual([r.status for r in results if isinstance(r, b.SubmitResult)], [201, 201, 201])
            with self.assertRaises(b.NotFoundError):
                await c.get(UNKNOWN_ID)
            with tempfile.TemporaryDirectory() as d:
                async with c.spooler(os.path.join(d, "spool")) as spooler:
                    spooled = await spooler.send("py-async", {"n": 9}, to=[e.host], idempotency_key="py-async-s")
                    self.assertIsNotNone(spooled.accepted)
                    self.assertEqual((await spooler.status()).waiting, 0)
            view = await c.conversation("py-async")
            self.assertEqual(view.last_seq, 5)

    async def test_the_async_client_follows_feeds_and_lists(self) -> None:
        e = env()
        async with b.AsyncClient(e.url, ca=e.ca, cert=e.cert, key=e.key) as c:
            sent = await c.submit("py-afeed", {"n": 1}, to=[e.host], idempotency_key="py-afeed-1")
            feed = c.watch(sent.message_id, timeout_s=WAIT_S)
            events = [ev async for ev in feed]
            self.assertTrue(feed.settled, events)
            check_one_run(self, events, e.host)
            paged: list[b.FeedEvent] = []
            page = await c.conversation_events("py-afeed", limit=3)
            while page.events:
                self.assertLessEqual(len(page.events), 3)
                paged.extend(page.events)
                page = await c.conversation_events("py-afeed", after=page.next_cursor, limit=3)
            self.assertEqual(paged, events)
            followed = c.follow("py-afeed", limit=2)
            self.assertEqual([await followed.__anext__() for _ in events], events)
            listed = [m async for m in c.iter_messages("py-afeed", limit=1)]
            self.assertEqual([(m.message_id, m.idempotency_key) for m in listed], [(sent.message_id, "py-afeed-1")])
            self.assertFalse((await c.list_messages("py-afeed")).more)
            with self.assertRaises(b.BadCursorError) as caught:
                await c.message_events(sent.message_id, after="x1")
            self.assertEqual(caught.exception.code, "bad_cursor")


if __name__ == "__main__":
    unittest.main()
