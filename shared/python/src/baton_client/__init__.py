"""``baton_client``: the Python client of Baton's v1 HTTP API over mTLS, for producers
(``Client``, ``AsyncClient``), with a durable local outbox of sends (``Spooler``, the same spool
file as ``baton send --spool``) and helpers for a node's harness (``baton_client.harness``).

Layout:

- ``client``: ``Client`` (blocking), ``Feed`` (a followed feed's iterator) and ``Spooler``;
  ``aio``: ``AsyncClient``, ``AsyncFeed`` and ``AsyncSpooler``. Both run the same flows;
  neither builds a request or decodes an answer.
- ``_api``: one flow per endpoint (request, retry rule, decoding; ``wait``'s loop), and
  ``Pages``, how a feed is followed from a cursor (events feeds, the replay listing).
- ``_steps``: what a flow is (the steps it yields), ``RetryPolicy``, ``retrying``, ``Backoff``.
- ``_transport``: the two drivers over httpx, the mTLS context, failure classification.
- ``wire``: requests checked and written, answers read into typed dataclasses.
- ``errors``: ``BatonError`` and one subclass per family.
- ``spool``: the spool file (``Spool``) and its delivering loop.
- ``harness``: read the turn, report progress, ask for a retry.
- ``limits``: every bound, named once.

Invariant: only idempotent calls are retried (submit and batch submit, which always carry their
idempotency keys, and reads); a spooled message leaves the spool only after the hub confirmed it.
"""

from ._steps import RetryPolicy
from .aio import AsyncClient, AsyncFeed, AsyncSpooler
from .client import Client, Feed, Spooler
from .errors import (
    ApiError,
    BadAnswerError,
    BadCursorError,
    BatonError,
    CertificateRevokedError,
    ConflictError,
    CursorExpiredError,
    DeniedError,
    HubUnavailableError,
    InvalidArgumentError,
    InvalidRequestError,
    NotFoundError,
    RefusedError,
    SpoolError,
    SpoolFullError,
    SpoolKeyConflictError,
    SpoolNotFailedError,
    SpoolRefusedError,
    TransportError,
    UnavailableError,
    WaitTimeoutError,
)
from .spool import Accepted, FlushReport, Refused, Spool, SpoolLimits, SpoolSend, SpoolStatus, Spooled
from .wire import (
    ApprovalResponse,
    AttemptView,
    BatchItem,
    CancelResponse,
    ConversationView,
    DeliverySummary,
    DeliveryView,
    EventsPage,
    FeedEvent,
    ListedMessage,
    MessagePage,
    MessageView,
    OutcomeEvent,
    ProgressEvent,
    RawJson,
    StateEvent,
    SubmitRequest,
    SubmitResult,
)
from .wire import submit_request as message

__version__ = "0.1.0"

__all__ = [
    "Accepted",
    "ApiError",
    "ApprovalResponse",
    "AsyncClient",
    "AsyncFeed",
    "AsyncSpooler",
    "AttemptView",
    "BadAnswerError",
    "BadCursorError",
    "BatchItem",
    "BatonError",
    "CancelResponse",
    "CertificateRevokedError",
    "Client",
    "ConflictError",
    "ConversationView",
    "CursorExpiredError",
    "DeliverySummary",
    "DeliveryView",
    "DeniedError",
    "EventsPage",
    "Feed",
    "FeedEvent",
    "FlushReport",
    "HubUnavailableError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "ListedMessage",
    "MessagePage",
    "MessageView",
    "NotFoundError",
    "OutcomeEvent",
    "ProgressEvent",
    "RawJson",
    "Refused",
    "RefusedError",
    "RetryPolicy",
    "Spool",
    "SpoolError",
    "SpoolFullError",
    "SpoolKeyConflictError",
    "SpoolLimits",
    "SpoolNotFailedError",
    "SpoolRefusedError",
    "SpoolSend",
    "SpoolStatus",
    "Spooled",
    "Spooler",
    "StateEvent",
    "SubmitRequest",
    "SubmitResult",
    "TransportError",
    "UnavailableError",
    "WaitTimeoutError",
    "message",
]
