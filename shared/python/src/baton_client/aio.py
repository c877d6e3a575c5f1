"""``AsyncClient``, the asyncio client of the producer endpoints, and ``AsyncSpooler``.

The same flows as ``Client`` (``_api``, ``spool``), run by the asyncio driver: the requests,
checks, retries, decoding and loops are the blocking client's, only the waiting differs. The
spool's SQLite work runs on a worker thread, never on the event loop. ``AsyncFeed`` is
``Feed`` as an async iterator.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import AsyncIterator, Sequence
from typing import Generic

import httpx

from ._api import Api, EventPages, Item, ListingPages, Page, Pages
from ._steps import RetryPolicy
from ._transport import AsyncDriver, check_hub_url, tls_context
from .client import connection_from_env
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


class AsyncClient:
    """The producer's asyncio client of one hub, over mTLS (as ``Client``). Use it as an async
    context manager, or ``await aclose()``."""

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
        http = httpx.AsyncClient(
            base_url=base,
            verify=tls_context(ca, cert, key),
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            trust_env=False,
        )
        self._driver = AsyncDriver(http)
        self._api = Api(retry)

    @classmethod
    def from_env(cls, retry: RetryPolicy = RetryPolicy()) -> AsyncClient:
        """A client configured as ``baton`` is by its environment."""
        return cls(**connection_from_env(), retry=retry)

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._driver.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def submit(
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
        """``Client.submit``."""
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
        return await self.submit_request(req)

    async def submit_request(self, req: SubmitRequest) -> SubmitResult:
        """``Client.submit_request``."""
        return await self._driver.run(self._api.submit(req))

    async def submit_batch(self, requests: Sequence[SubmitRequest]) -> list[BatchItem]:
        """``Client.submit_batch``."""
        return await self._driver.run(self._api.submit_batch(requests))

    async def get(self, message_id: str, *, wait_s: float | None = None) -> MessageView:
        """``Client.get``."""
        return await self._driver.run(self._api.message(message_id, wait_s))

    async def get_by_key(self, idempotency_key: str, *, wait_s: float | None = None) -> MessageView:
        """``Client.get_by_key``."""
        return await self._driver.run(self._api.message_by_key(idempotency_key, wait_s))

    async def delivery(self, message_id: str, delivery_id: str) -> DeliveryView:
        """``Client.delivery``."""
        return await self._driver.run(self._api.delivery(message_id, delivery_id))

    async def wait(
        self, message_id: str | None = None, *, idempotency_key: str | None = None, timeout_s: float
    ) -> MessageView:
        """``Client.wait``."""
        return await self._driver.run(self._api.wait(message_id, idempotency_key, timeout_s))

    async def cancel(self, message_id: str, reason: str) -> CancelResponse:
        """``Client.cancel``."""
        return await self._driver.run(self._api.cancel(message_id, reason))

    async def approve(self, message_id: str, reason: str) -> ApprovalResponse:
        """``Client.approve``."""
        return await self._driver.run(self._api.decide(message_id, "approve", reason))

    async def reject(self, message_id: str, reason: str) -> ApprovalResponse:
        """``Client.reject``."""
        return await self._driver.run(self._api.decide(message_id, "reject", reason))

    async def conversation(self, name: str) -> ConversationView:
        """``Client.conversation``."""
        return await self._driver.run(self._api.conversation(name))

    async def message_events(
        self, message_id: str, *, after: str | None = None, wait_s: float | None = None, limit: int | None = None
    ) -> EventsPage:
        """``Client.message_events``."""
        return await self._driver.run(self._api.message_events(message_id, after, wait_s, limit))

    async def conversation_events(
        self, conversation: str, *, after: str | None = None, wait_s: float | None = None, limit: int | None = None
    ) -> EventsPage:
        """``Client.conversation_events``."""
        return await self._driver.run(self._api.conversation_events(conversation, after, wait_s, limit))

    def watch(
        self, message_id: str, *, after: str | None = None, timeout_s: float | None = None, limit: int | None = None
    ) -> AsyncFeed[EventsPage, FeedEvent]:
        """``Client.watch``, iterated with ``async for``."""
        return AsyncFeed(self, EventPages(self._api, message_id, None, after, timeout_s, limit))

    def follow(
        self, conversation: str, *, after: str | None = None, timeout_s: float | None = None, limit: int | None = None
    ) -> AsyncFeed[EventsPage, FeedEvent]:
        """``Client.follow``, iterated with ``async for``."""
        return AsyncFeed(self, EventPages(self._api, None, conversation, after, timeout_s, limit))

    async def list_messages(
        self, conversation: str, *, after: str | None = None, limit: int | None = None
    ) -> MessagePage:
        """``Client.list_messages``."""
        return await self._driver.run(self._api.list_messages(conversation, after, limit))

    def iter_messages(
        self, conversation: str, *, after: str | None = None, limit: int | None = None
    ) -> AsyncFeed[MessagePage, ListedMessage]:
        """``Client.iter_messages``, iterated with ``async for``."""
        return AsyncFeed(self, ListingPages(self._api, conversation, after, limit))

    def spooler(self, directory: str | os.PathLike[str], limits: SpoolLimits = SpoolLimits()) -> AsyncSpooler:
        """The spool in ``directory``, delivered through this client (opened here, in place:
        a few local reads and writes)."""
        return AsyncSpooler(self, Spool(directory, limits))


class AsyncFeed(AsyncIterator[Item], Generic[Page, Item]):
    """``Feed`` for an ``AsyncClient``: an async iterator of a followed feed's items."""

    def __init__(self, client: AsyncClient, pages: Pages[Page, Item]) -> None:
        self._client = client
        self._pages = pages
        self._buffer: collections.deque[Item] = collections.deque()
        self._cursor = pages.after

    @property
    def cursor(self) -> str | None:
        """``Feed.cursor``."""
        return self._cursor

    @property
    def settled(self) -> bool:
        """``Feed.settled``."""
        return isinstance(self._pages, EventPages) and self._pages.settled and not self._buffer

    def __aiter__(self) -> AsyncFeed[Page, Item]:
        return self

    async def __anext__(self) -> Item:
        while not self._buffer:
            self._cursor = self._pages.after
            flow = self._pages.read()
            if flow is None:
                raise StopAsyncIteration
            self._buffer.extend(self._pages.take(await self._client._driver.run(flow)))
        item = self._buffer.popleft()
        self._cursor = self._pages.cursor_of(item) or self._cursor
        return item


class AsyncSpooler:
    """``Spooler`` for an ``AsyncClient``."""

    def __init__(self, client: AsyncClient, spool: Spool) -> None:
        self.client = client
        self.spool = spool
        self._api = Api(RetryPolicy.once())

    def close(self) -> None:
        self.spool.close()

    async def __aenter__(self) -> AsyncSpooler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def send(
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
        """``Spooler.send``."""
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
        return await self.send_request(req, wait_s=wait_s)

    async def send_request(self, req: SubmitRequest, *, wait_s: float = 0.0) -> SpoolSend:
        """``Spooler.send_request``."""
        return await self.client._driver.run(send_flow(self.spool, self._api, req, wait_s))

    async def push(self, req: SubmitRequest) -> Spooled:
        """``Spooler.push``, on a worker thread."""
        return await asyncio.to_thread(self.spool.push, req)

    async def flush(self, *, wait_s: float = 0.0) -> FlushReport:
        """``Spooler.flush``."""
        return await self.client._driver.run(flush_flow(self.spool, self._api, wait_s))

    async def status(self) -> SpoolStatus:
        """``Spooler.status``, on a worker thread."""
        return await asyncio.to_thread(self.spool.status)

    async def discard(self, position: int) -> None:
        """``Spooler.discard``, on a worker thread."""
        await asyncio.to_thread(self.spool.discard, position)

    async def retry(self, position: int) -> None:
        """``Spooler.retry``, on a worker thread."""
        await asyncio.to_thread(self.spool.retry, position)
