"""The producer side of the v1 API as flows (``_steps``): one method per endpoint, shared by
``Client`` and ``AsyncClient``. Each builds its request with ``wire``, names whether it may be
retried, and decodes the answer with ``wire``.

Retried (``retrying``): submit and batch submit (their idempotency keys make a repeat the same
message) and the reads (a read changes nothing). Sent once: cancel, approve and reject (the
caller decides, knowing what a repeat would mean; a repeated approve is refused as decided).

A new endpoint is one method here, returning a flow, and one line in each client that runs it.

Following a feed (``Pages``: ``EventPages`` for the events feeds, ``ListingPages`` for the
replay listing) is a state machine both clients' iterators drive: it names the next page's
flow (a retried read from the last cursor), takes the page, and says when the feed has ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from .errors import BatonError, WaitTimeoutError
from .limits import CLIENT_TIMEOUT_MARGIN_S, FEED_WAIT_S, LONG_POLL_WAIT_MAX_S, REQUEST_TIMEOUT_S, WAIT_RETRY_PACE_S
from ._steps import Call, Flow, RetryPolicy, expect, retrying, sleep
from .wire import (
    ApprovalResponse,
    BatchItem,
    CancelResponse,
    ConversationView,
    DeliveryView,
    EventsPage,
    FeedEvent,
    ListedMessage,
    MessagePage,
    MessageView,
    SubmitRequest,
    SubmitResult,
    batch_body,
    check_id,
    check_key,
    check_name,
    feed_query,
    listing_query,
    read_approval,
    read_batch,
    read_cancel,
    read_conversation,
    read_delivery,
    read_events,
    read_message,
    read_message_page,
    read_submit,
    reason_body,
)

log = logging.getLogger("baton_client")

T_ = TypeVar("T_")
#: A followed feed's page (``EventsPage``, ``MessagePage``) and what it yields (``FeedEvent``,
#: ``ListedMessage``).
Page = TypeVar("Page")
Item = TypeVar("Item")

_SEGMENT_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def segment(value: str) -> str:
    """Keeps an id from changing the path: anything outside ``[A-Za-z0-9._:-]`` is
    percent-encoded, byte by byte."""
    return "".join(c if c in _SEGMENT_SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in value)


def long_poll(wait_s: float | None) -> tuple[tuple[tuple[str, str], ...], float]:
    """The query and request timeout of a read that waits up to ``wait_s`` (``None``: none)."""
    if wait_s is None:
        return (), REQUEST_TIMEOUT_S
    wait_s = min(max(wait_s, 0.0), LONG_POLL_WAIT_MAX_S)
    return (("wait_ms", str(int(wait_s * 1000))),), wait_s + CLIENT_TIMEOUT_MARGIN_S


class Api:
    """The flows of the producer endpoints, with one retry policy for the idempotent ones."""

    def __init__(self, retry: RetryPolicy, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.retry = retry
        self.monotonic = monotonic

    def submit(self, req: SubmitRequest) -> Flow[SubmitResult]:
        """``POST /v1/messages``; retried (the key makes every try the same message)."""
        c = Call("POST", "/v1/messages", body=req.body.encode("utf-8"))
        return retrying(self.retry, lambda: expect(c, lambda s, b: read_submit(s, b, req.idempotency_key)))

    def submit_once(self, req_body: str, key: str) -> Flow[SubmitResult]:
        """``POST /v1/messages`` of exactly ``req_body``, one try (the spool paces its own)."""
        c = Call("POST", "/v1/messages", body=req_body.encode("utf-8"))
        return expect(c, lambda s, b: read_submit(s, b, key))

    def submit_batch(self, requests: Sequence[SubmitRequest]) -> Flow[list[BatchItem]]:
        """``POST /v1/batch/messages``; retried as a whole (items already accepted answer as
        replays)."""
        reqs = list(requests)
        c = Call("POST", "/v1/batch/messages", body=batch_body(reqs))
        return retrying(self.retry, lambda: expect(c, lambda s, b: read_batch(s, b, reqs)))

    def message(self, message_id: str, wait_s: float | None = None, retry: bool = True) -> Flow[MessageView]:
        """``GET /v1/messages/{id}``, long-polling up to ``wait_s`` for a delivery to settle."""
        query, timeout_s = long_poll(wait_s)
        c = Call("GET", f"/v1/messages/{segment(check_id('message_id', message_id))}", query, None, timeout_s)
        return self._read(c, read_message, retry)

    def message_by_key(self, key: str, wait_s: float | None = None, retry: bool = True) -> Flow[MessageView]:
        """``GET /v1/messages?idempotency_key=K``: this producer's message under ``key``."""
        query, timeout_s = long_poll(wait_s)
        c = Call("GET", "/v1/messages", (("idempotency_key", check_key("idempotency_key", key)), *query), None, timeout_s)
        return self._read(c, read_message, retry)

    def delivery(self, message_id: str, delivery_id: str) -> Flow[DeliveryView]:
        """``GET /v1/messages/{id}/deliveries/{delivery_id}``: one delivery with all its
        attempts."""
        path = f"/v1/messages/{segment(check_id('message_id', message_id))}/deliveries/"
        path += segment(check_id("delivery_id", delivery_id))
        return self._read(Call("GET", path), read_delivery, True)

    def conversation(self, name: str) -> Flow[ConversationView]:
        """``GET /v1/conversations/{conversation}``."""
        c = Call("GET", f"/v1/conversations/{segment(check_name('conversation', name))}")
        return self._read(c, read_conversation, True)

    def message_events(
        self, message_id: str, after: str | None = None, wait_s: float | None = None, limit: int | None = None
    ) -> Flow[EventsPage]:
        """``GET /v1/messages/{id}/events``: the message's items after ``after`` (none: from
        the first), at most ``limit``; with ``wait_s``, a long poll answered as soon as there
        is one. Retried (a read)."""
        path = f"/v1/messages/{segment(check_id('message_id', message_id))}/events"
        return self._feed(path, after, wait_s, limit)

    def conversation_events(
        self, conversation: str, after: str | None = None, wait_s: float | None = None, limit: int | None = None
    ) -> Flow[EventsPage]:
        """``GET /v1/conversations/{conversation}/events``: this producer's own messages' items
        in the conversation, as ``message_events``."""
        path = f"/v1/conversations/{segment(check_name('conversation', conversation))}/events"
        return self._feed(path, after, wait_s, limit)

    def _feed(self, path: str, after: str | None, wait_s: float | None, limit: int | None) -> Flow[EventsPage]:
        query = feed_query(after, limit)
        wait, timeout_s = long_poll(wait_s)
        return self._read(Call("GET", path, (*query, *wait), None, timeout_s), read_events, True)

    def list_messages(self, conversation: str, after: str | None = None, limit: int | None = None) -> Flow[MessagePage]:
        """``GET /v1/messages?conversation=C``: one page of this producer's own messages in
        ``conversation``, oldest first, after ``after`` (a ``next_cursor``; none: from the
        oldest kept). Retried (a read)."""
        c = Call("GET", "/v1/messages", listing_query(conversation, after, limit))
        return self._read(c, read_message_page, True)

    def cancel(self, message_id: str, reason: str) -> Flow[CancelResponse]:
        """``POST /v1/messages/{id}/cancel``; sent once."""
        c = Call("POST", f"/v1/messages/{segment(check_id('message_id', message_id))}/cancel", body=reason_body(reason))
        return expect(c, read_cancel)

    def decide(self, message_id: str, verb: str, reason: str) -> Flow[ApprovalResponse]:
        """``POST /v1/messages/{id}/approve`` or ``/reject``; sent once."""
        c = Call("POST", f"/v1/messages/{segment(check_id('message_id', message_id))}/{verb}", body=reason_body(reason))
        return expect(c, read_approval)

    def _read(self, c: Call, decode: Callable[[int, bytes], T_], retry: bool) -> Flow[T_]:
        if retry:
            return retrying(self.retry, lambda: expect(c, decode))
        return expect(c, decode)

    def wait(self, message_id: str | None, key: str | None, timeout_s: float) -> Flow[MessageView]:
        """Reads the message until every delivery has ended (``MessageView.settled``), as
        ``baton wait`` does: one read, then long-polls of what is left of ``timeout_s``; a
        retry or a redrive starts a new run, which is waited for (a delivery has ended only
        when its *current* run has). A transient failure (the hub restarting, unreachable,
        busy) is read again every ``WAIT_RETRY_PACE_S`` until the deadline, logged once.
        Deliveries a bounded view left without attempts are read whole. Raises
        ``WaitTimeoutError`` (with the latest view) when the time runs out first."""
        if (message_id is None) == (key is None):
            raise ValueError("wait: name the message by its id or by its idempotency key, not both")
        if message_id is not None:
            check_id("message_id", message_id)
        else:
            check_key("idempotency_key", key)
        return self._wait(message_id, key, timeout_s)

    def _wait(self, message_id: str | None, key: str | None, timeout_s: float) -> Flow[MessageView]:
        deadline = self.monotonic() + timeout_s

        def read(wait_s: float | None) -> Flow[MessageView]:
            if message_id is not None:
                return self.message(message_id, wait_s, retry=False)
            assert key is not None
            return self.message_by_key(key, wait_s, retry=False)

        view = yield from self._read_until(read, None, deadline)
        while True:
            view = yield from self._complete(view)
            if view.settled:
                return view
            remaining = deadline - self.monotonic()
            if remaining <= 0:
                done = sum(1 for d in view.deliveries if d.ended() is not None)
                raise WaitTimeoutError(
                    f"timed out after {timeout_s} s: {done} of {len(view.deliveries)} deliveries ended", view
                )
            view = yield from self._read_until(read, remaining, deadline)

    def _read_until(
        self, read: Callable[[float | None], Flow[MessageView]], wait_s: float | None, deadline: float
    ) -> Flow[MessageView]:
        said = False
        while True:
            try:
                return (yield from read(wait_s))
            except BatonError as e:
                if not e.transient or self.monotonic() + WAIT_RETRY_PACE_S >= deadline:
                    raise
                if not said:
                    log.warning("%s; reading again until the timeout", e)
                    said = True
                yield from sleep(WAIT_RETRY_PACE_S)
                if wait_s is not None:
                    wait_s = max(deadline - self.monotonic(), 0.0)

    def _complete(self, view: MessageView) -> Flow[MessageView]:
        """``view`` with each delivered delivery whose attempts it left out read whole, so that
        ``ended`` can see its current run."""
        if view.omitted is None:
            return view
        left_out = set(view.omitted.attempts_of)
        deliveries = []
        for d in view.deliveries:
            if d.delivery_id in left_out and d.state == "delivered":
                d = yield from self.delivery(view.message_id, d.delivery_id)
            deliveries.append(d)
        return MessageView(
            view.message_id,
            view.conversation,
            view.seq,
            view.producer,
            view.idempotency_key,
            view.payload,
            view.accepted_at_ms,
            tuple(deliveries),
            view.omitted,
        )


class Pages(Generic[Page, Item]):
    """Following a paged feed from a cursor: ``read`` names the next page's flow (``None``
    once the feed has ended), ``take`` takes its answer and gives its items. The clients'
    iterators drive it; each page is a read retried by the client's ``RetryPolicy``, always
    from the cursor of the last page taken, so a failure repeats or loses nothing."""

    def __init__(self, after: str | None) -> None:
        #: Where the next page starts: the ``next_cursor`` of the last page taken.
        self.after = after
        #: True once the feed has ended (no more ``read``).
        self.ended = False

    def read(self) -> Flow[Page] | None:
        """The next page's flow, or ``None`` when the feed has ended."""
        raise NotImplementedError

    def take(self, page: Page) -> Sequence[Item]:
        """The page's items, in order; moves ``after`` past them."""
        raise NotImplementedError

    def cursor_of(self, item: Item) -> str | None:
        """The cursor to read on from just after ``item``, when items carry one."""
        return None


class EventPages(Pages[EventsPage, FeedEvent]):
    """Follows an events feed with long polls of ``FEED_WAIT_S``. A message's feed
    (``message_id``) ends when an answer is empty and ``settled``: after a settled answer the
    next read does not wait, as only the items already recorded can follow. A conversation's
    feed ends only when ``timeout_s`` (if any) has run out; so does a message's that has not
    settled by then (``settled`` stays false)."""

    def __init__(
        self,
        api: Api,
        message_id: str | None,
        conversation: str | None,
        after: str | None,
        timeout_s: float | None,
        limit: int | None,
    ) -> None:
        super().__init__(after)
        if (message_id is None) == (conversation is None):
            raise ValueError("follow a message's feed or a conversation's, not both")
        # Checked here, so a bad argument is raised by the call, not by the first iteration.
        feed_query(after, limit)
        if message_id is not None:
            check_id("message_id", message_id)
        if conversation is not None:
            check_name("conversation", conversation)
        self.api = api
        self.message_id = message_id
        self.conversation = conversation
        self.limit = limit
        self.deadline = None if timeout_s is None else api.monotonic() + timeout_s
        #: A message's feed: true when it ended because every delivery has its final outcome.
        self.settled = False
        self._last_settled = False

    def read(self) -> Flow[EventsPage] | None:
        if self.ended:
            return None
        wait_s: float | None = None if self._last_settled else FEED_WAIT_S
        if self.deadline is not None:
            left = self.deadline - self.api.monotonic()
            if left <= 0:
                self.ended = True
                return None
            wait_s = None if wait_s is None else min(wait_s, left)
        if self.message_id is not None:
            return self.api.message_events(self.message_id, self.after, wait_s, self.limit)
        return self.api.conversation_events(self.conversation or "", self.after, wait_s, self.limit)

    def take(self, page: EventsPage) -> Sequence[FeedEvent]:
        self.after = page.next_cursor
        self._last_settled = page.settled is True
        if self._last_settled and not page.events:
            self.ended = self.settled = True
        return page.events

    def cursor_of(self, item: FeedEvent) -> str | None:
        return item.cursor


class ListingPages(Pages[MessagePage, ListedMessage]):
    """Follows the replay listing's ``next_cursor`` while ``more``; ends at the page that says
    no more (its ``next_cursor`` later gives what came since)."""

    def __init__(self, api: Api, conversation: str, after: str | None, limit: int | None) -> None:
        super().__init__(after)
        listing_query(conversation, after, limit)
        self.api = api
        self.conversation = conversation
        self.limit = limit

    def read(self) -> Flow[MessagePage] | None:
        if self.ended:
            return None
        return self.api.list_messages(self.conversation, self.after, self.limit)

    def take(self, page: MessagePage) -> Sequence[ListedMessage]:
        self.after = page.next_cursor
        self.ended = not page.more
        return page.messages
