"""``Client``, the blocking client of the producer endpoints, and ``Spooler``, its spool.

Every method runs one flow of ``_api`` (shared with ``AsyncClient``) with the blocking driver:
the request is built, checked, retried and decoded there, not here. ``Feed`` iterates a
followed feed (``_api.Pages``) page by page with the same driver.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Generic

import httpx

from ._api import Api, EventPages, Item, ListingPages, Page, Pages
from ._steps import RetryPolicy
from ._transport import SyncDriver, check_hub_url, tls_context
from .errors import InvalidArgumentError
from .limits import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S
from .spool import FlushReport, Spool, SpoolLimits, SpoolSend, SpoolStatus, Spooled, flush_flow, send_flow
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
    submit_request,
)

#: The environment variables ``Client.from_env`` reads: the same as ``baton``'s.
ENV_HUB_URL, ENV_CA_FILE, ENV_CERT_FILE, ENV_KEY_FILE = "BATON_HUB_URL", "BATON_CA_FILE", "BATON_CERT_FILE", "BATON_KEY_FILE"


def connection_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hub URL and the CA, certificate and key files from ``BATON_HUB_URL``,
    ``BATON_CA_FILE``, ``BATON_CERT_FILE`` and ``BATON_KEY_FILE``; a missing one is an
    ``InvalidArgumentError`` naming it."""
    env = os.environ if environ is None else environ
    out = {}
    for arg, var in (("hub_url", ENV_HUB_URL), ("ca", ENV_CA_FILE), ("cert", ENV_CERT_FILE), ("key", ENV_KEY_FILE)):
        value = env.get(var, "")
        if not value:
            raise InvalidArgumentError(var, "is not set")
        out[arg] = value
    return out


class Client:
    """The producer's blocking client of one hub, over mTLS: the hub CA in ``ca`` is the only
    trusted root, and ``cert`` with ``key`` is this producer's identity (``baton-hub enroll
    producer NAME``). Use it as a context manager, or ``close`` it."""

    def __init__(
        self,
        hub_url: str,
        *,
        ca: str | os.PathLike[str],
        cert: str | os.PathLike[str],
        key: str | os.PathLike[str],
        retry: RetryPolicy = RetryPolicy(),
    ) -> None:
        base = check_hub_url(hub_url)
        self.hub_url = base
        http = httpx.Client(
            base_url=base,
            verify=tls_context(ca, cert, key),
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            trust_env=False,
        )
        self._driver = SyncDriver(http)
        self._api = Api(retry)

    @classmethod
    def from_env(cls, retry: RetryPolicy = RetryPolicy()) -> Client:
        """A client configured as ``baton`` is by its environment (``connection_from_env``)."""
        return cls(**connection_from_env(), retry=retry)

    def close(self) -> None:
        """Closes the connections."""
        self._driver.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        conversation: str,
        payload: object,
        *,
        to: Sequence[str] | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        retry_backoff_ms: int | None = None,
        approval: str | None = None,
        approval_timeout_ms: int | None = None,
    ) -> SubmitResult:
        """``POST /v1/messages``: submits ``payload`` (a Python value, or ``RawJson`` text sent
        exactly) into ``conversation``, to the hosts ``to`` (default: its members). Without
        ``idempotency_key`` one is made; the result carries it. Retried on transient failures:
        the same key and content answer with the original message (``duplicate``)."""
        req = submit_request(
            conversation,
            payload,
            to=to,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            retry_backoff_ms=retry_backoff_ms,
            approval=approval,
            approval_timeout_ms=approval_timeout_ms,
        )
        return self.submit_request(req)

    def submit_request(self, req: SubmitRequest) -> SubmitResult:
        """``submit`` of a request made with ``baton_client.message``."""
        return self._driver.run(self._api.submit(req))

    def submit_batch(self, requests: Sequence[SubmitRequest]) -> list[BatchItem]:
        """``POST /v1/batch/messages``: one answer per message, in order: its ``SubmitResult``,
        or the hub's refusal of that message alone (an ``ApiError``, not raised). Raised: a
        failure of the whole batch. Retried as ``submit`` is."""
        return self._driver.run(self._api.submit_batch(requests))

    def get(self, message_id: str, *, wait_s: float | None = None) -> MessageView:
        """``GET /v1/messages/{id}``; with ``wait_s``, a long-poll answered as soon as a
        delivery settles that had not when it began."""
        return self._driver.run(self._api.message(message_id, wait_s))

    def get_by_key(self, idempotency_key: str, *, wait_s: float | None = None) -> MessageView:
        """``GET /v1/messages?idempotency_key=K``: this producer's message under the key."""
        return self._driver.run(self._api.message_by_key(idempotency_key, wait_s))

    def delivery(self, message_id: str, delivery_id: str) -> DeliveryView:
        """``GET /v1/messages/{id}/deliveries/{delivery_id}``: one delivery, all its attempts."""
        return self._driver.run(self._api.delivery(message_id, delivery_id))

    def wait(
        self, message_id: str | None = None, *, idempotency_key: str | None = None, timeout_s: float
    ) -> MessageView:
        """Waits until every delivery of the message has ended, through retries and redrives,
        as ``baton wait`` does; raises ``WaitTimeoutError`` when ``timeout_s`` runs out."""
        return self._driver.run(self._api.wait(message_id, idempotency_key, timeout_s))

    def cancel(self, message_id: str, reason: str) -> CancelResponse:
        """``POST /v1/messages/{id}/cancel``; sent once."""
        return self._driver.run(self._api.cancel(message_id, reason))

    def approve(self, message_id: str, reason: str) -> ApprovalResponse:
        """``POST /v1/messages/{id}/approve`` (needs the right to approve); sent once."""
        return self._driver.run(self._api.decide(message_id, "approve", reason))

    def reject(self, message_id: str, reason: str) -> ApprovalResponse:
        """``POST /v1/messages/{id}/reject`` (needs the right to approve); sent once."""
        return self._driver.run(self._api.decide(message_id, "reject", reason))

    def conversation(self, name: str) -> ConversationView:
        """``GET /v1/conversations/{name}``: its position and membership registry."""
        return self._driver.run(self._api.conversation(name))

    def message_events(
        self, message_id: str, *, after: str | None = None, wait_s: float | None = None, limit: int | None = None
    ) -> EventsPage:
        """``GET /v1/messages/{id}/events``: one page of the message's events feed (its
        deliveries' state changes, its turns' progress, its runs' outcomes) after ``after`` (an
        item's ``cursor`` or a page's ``next_cursor``; none: from the first), at most
        ``limit``; with ``wait_s``, a long poll answered as soon as there is an item. A cursor
        the hub did not give is ``BadCursorError``, one below removed items
        ``CursorExpiredError``."""
        return self._driver.run(self._api.message_events(message_id, after, wait_s, limit))

    def conversation_events(
        self, conversation: str, *, after: str | None = None, wait_s: float | None = None, limit: int | None = None
    ) -> EventsPage:
        """``GET /v1/conversations/{conversation}/events``: one page of this producer's own
        messages' events in the conversation (``DeniedError`` outside its publish scope), as
        ``message_events``."""
        return self._driver.run(self._api.conversation_events(conversation, after, wait_s, limit))

    def watch(
        self, message_id: str, *, after: str | None = None, timeout_s: float | None = None, limit: int | None = None
    ) -> Feed[EventsPage, FeedEvent]:
        """Follows the message's events feed from ``after`` with long polls, as ``baton watch``
        does: iterating yields each item once, in order, and ends once the message settled and
        every item was yielded (``settled`` is then true), or when ``timeout_s`` ran out first.
        Transient failures are retried from the last cursor as reads are; ``cursor`` is where
        to read on."""
        return Feed(self, EventPages(self._api, message_id, None, after, timeout_s, limit))

    def follow(
        self, conversation: str, *, after: str | None = None, timeout_s: float | None = None, limit: int | None = None
    ) -> Feed[EventsPage, FeedEvent]:
        """Follows this producer's events feed of ``conversation`` from ``after``, as ``baton
        follow`` does: until ``timeout_s`` ran out (none: for as long as it is iterated)."""
        return Feed(self, EventPages(self._api, None, conversation, after, timeout_s, limit))

    def list_messages(self, conversation: str, *, after: str | None = None, limit: int | None = None) -> MessagePage:
        """``GET /v1/messages?conversation=C``: one page of this producer's own messages in
        ``conversation``, oldest first, after ``after`` (a page's ``next_cursor``; none: from
        the oldest kept), at most ``limit`` (capped by the hub's ``limits.message_page_max``).
        Read on from ``next_cursor`` while ``more``."""
        return self._driver.run(self._api.list_messages(conversation, after, limit))

    def iter_messages(
        self, conversation: str, *, after: str | None = None, limit: int | None = None
    ) -> Feed[MessagePage, ListedMessage]:
        """Every one of this producer's messages in ``conversation`` after ``after``, oldest
        first, page by page (``limit`` each) while ``more``; at the end ``cursor`` is where a
        later listing gives what came since."""
        return Feed(self, ListingPages(self._api, conversation, after, limit))

    def spooler(self, directory: str | os.PathLike[str], limits: SpoolLimits = SpoolLimits()) -> Spooler:
        """The spool in ``directory`` (``DIR/spool.db``, created when missing), delivered
        through this client."""
        return Spooler(self, Spool(directory, limits))


class Feed(Iterator[Item], Generic[Page, Item]):
    """A followed feed (``Client.watch``, ``Client.follow``, ``Client.iter_messages``): an
    iterator of its items, read a page at a time. A failure that outlasts the retries is
    raised from the iteration; iterating again reads on from ``cursor``, repeating and losing
    nothing."""

    def __init__(self, client: Client, pages: Pages[Page, Item]) -> None:
        self._client = client
        self._pages = pages
        self._buffer: collections.deque[Item] = collections.deque()
        self._cursor = pages.after

    @property
    def cursor(self) -> str | None:
        """Where to read on (``after``) to get exactly the items not yielded yet: the last
        yielded event's ``cursor``, or the ``next_cursor`` of the last page whose items were
        all yielded. ``None`` before anything was read from a feed started at its
        beginning."""
        return self._cursor

    @property
    def settled(self) -> bool:
        """A message's feed (``watch``): true when it ended because every delivery has its
        final outcome and every item was yielded."""
        return isinstance(self._pages, EventPages) and self._pages.settled and not self._buffer

    def __iter__(self) -> Feed[Page, Item]:
        return self

    def __next__(self) -> Item:
        while not self._buffer:
            self._cursor = self._pages.after
            flow = self._pages.read()
            if flow is None:
                raise StopIteration
            self._buffer.extend(self._pages.take(self._client._driver.run(flow)))
        item = self._buffer.popleft()
        self._cursor = self._pages.cursor_of(item) or self._cursor
        return item


class Spooler:
    """A spool delivered through a ``Client``: ``send`` commits a message and then delivers
    what waits; ``flush`` delivers on demand. Close it when done."""

    def __init__(self, client: Client, spool: Spool) -> None:
        self.client = client
        self.spool = spool
        # The flush paces its own tries: each send is one request.
        self._api = Api(RetryPolicy.once())

    def close(self) -> None:
        """Closes the spool file."""
        self.spool.close()

    def __enter__(self) -> Spooler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        conversation: str,
        payload: object,
        *,
        to: Sequence[str] | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        retry_backoff_ms: int | None = None,
        approval: str | None = None,
        approval_timeout_ms: int | None = None,
        wait_s: float = 0.0,
    ) -> SpoolSend:
        """Commits the message to the spool (durable before anything is sent), then delivers
        everything waiting, oldest first, trying a hub that does not answer for ``wait_s``
        (default: once). ``SpoolSend`` says whether this message was accepted, refused (kept,
        failed) or still waits."""
        req = submit_request(
            conversation,
            payload,
            to=to,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            retry_backoff_ms=retry_backoff_ms,
            approval=approval,
            approval_timeout_ms=approval_timeout_ms,
        )
        return self.send_request(req, wait_s=wait_s)

    def send_request(self, req: SubmitRequest, *, wait_s: float = 0.0) -> SpoolSend:
        """``send`` of a request made with ``baton_client.message``."""
        return self.client._driver.run(send_flow(self.spool, self._api, req, wait_s))

    def push(self, req: SubmitRequest) -> Spooled:
        """Commits ``req`` to the spool without delivering anything."""
        return self.spool.push(req)

    def flush(self, *, wait_s: float = 0.0) -> FlushReport:
        """Delivers every waiting message, oldest ready first, each once."""
        return self.client._driver.run(flush_flow(self.spool, self._api, wait_s))

    def status(self) -> SpoolStatus:
        """What the spool holds."""
        return self.spool.status()

    def discard(self, position: int) -> None:
        """Removes a failed message for good."""
        self.spool.discard(position)

    def retry(self, position: int) -> None:
        """Makes a failed message wait again, in its place."""
        self.spool.retry(position)
