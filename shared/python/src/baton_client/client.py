"""``Client``, the blocking client of the producer endpoints, and ``Spooler``, its spool.

Every method runs one flow of ``_api`` (shared with ``AsyncClient``) with the blocking driver:
the request is built, checked, retried and decoded there, not here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import httpx

from ._api import Api
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

    def spooler(self, directory: str | os.PathLike[str], limits: SpoolLimits = SpoolLimits()) -> Spooler:
        """The spool in ``directory`` (``DIR/spool.db``, created when missing), delivered
        through this client."""
        return Spooler(self, Spool(directory, limits))


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
