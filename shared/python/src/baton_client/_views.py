"""The views of a message and of a delivery the hub answers with (``GET /v1/messages/{id}``,
``GET /v1/messages/{id}/deliveries/{delivery_id}``): plain values, which ``wire`` reads from an
answer and checks.

They live apart from ``wire`` so that ``errors`` may name them (``WaitTimeoutError.last``)
without depending on the module that raises its errors. ``wire`` exports them as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

#: A JSON value as Python's ``json`` decodes it.
JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]


@dataclass(frozen=True)
class AttemptView:
    """One run of a delivery and its reported outcome."""

    attempt_id: str
    #: The node-scoped report id the outcome arrived with.
    report_id: str
    #: ``succeeded``, ``failed``, ``unknown`` or ``cancelled``.
    outcome: str
    exit_code: int | None
    duration_ms: int | None
    signal: int | None
    #: The harness's stdout, bounded by the node's ``result_bytes_max``.
    result: str | None
    reason: str | None
    reported_at_ms: int
    #: Which run this was (1 for the first).
    attempt: int
    #: True when the harness asked for a retry (exit 75) and the hub requeued the delivery.
    retryable: bool
    #: ``retry`` or ``redrive`` for a run that is not the first.
    rerun: str | None
    #: ``producer:NAME``, ``hub`` or ``operator:NAME``.
    caused_by: str | None
    stderr_tail: str | None
    stderr_dropped_bytes: int | None


@dataclass(frozen=True)
class DeliveryView:
    """One delivery with its attempts, oldest first."""

    delivery_id: str
    #: The host it is for; ``None`` for a pool delivery no member has claimed yet.
    host: str | None
    #: ``queued``, ``held``, ``claimed``, ``mirrored``, ``delivered``, ``failed`` or ``unknown``.
    state: str
    reason: str | None
    updated_at_ms: int
    attempts: tuple[AttemptView, ...]
    #: The current run (1 for the first; a retry or redrive adds one).
    attempt: int
    max_attempts: int
    not_before_ms: int | None
    cancel_requested_at_ms: int | None
    cancel_reason: str | None
    #: The recipient pool, for a pool delivery (kept once a member claims it); ``None`` for a
    #: host's own delivery.
    pool: str | None = None

    def current_attempt(self) -> AttemptView | None:
        """The reported attempt of the current run, or ``None``. A retry or a redrive starts a
        new run: the attempts of earlier runs stay listed and say nothing of this one."""
        for a in reversed(self.attempts):
            if a.attempt == self.attempt:
                return a
        return None

    def ended(self) -> bool | None:
        """How the delivery ended: ``True`` succeeded, ``False`` failed, cancelled or unknown,
        ``None`` not yet (the hub's "settled": failed, unknown, or delivered with an attempt
        of its current run), exactly as ``baton wait`` judges it."""
        if self.state in ("failed", "unknown"):
            return False
        if self.state == "delivered":
            current = self.current_attempt()
            return None if current is None else current.outcome == "succeeded"
        return None


@dataclass(frozen=True)
class ViewOmitted:
    """What a message view left out to stay within the hub's ``message_view_bytes_max``."""

    #: The deliveries whose attempts are not in the view (their ``attempts`` is empty there).
    attempts_of: tuple[str, ...]
    view_bytes_max: int
    #: The path that reads one of them whole, with ``{delivery_id}`` to fill in.
    read_each_at: str


@dataclass(frozen=True)
class MessageView:
    """A message with its deliveries and their attempts (``GET /v1/messages/{id}``)."""

    message_id: str
    conversation: str
    seq: int
    producer: str
    idempotency_key: str
    #: The payload, decoded by Python's ``json``.
    payload: JsonValue
    accepted_at_ms: int
    deliveries: tuple[DeliveryView, ...]
    omitted: ViewOmitted | None
    #: The W3C ``traceparent`` kept with it (the producer's, or one the hub started); ``None``
    #: for a message accepted before traces were kept, or from a hub that predates them.
    traceparent: str | None = None

    @property
    def settled(self) -> bool:
        """Every delivery has ended (``DeliveryView.ended`` is not ``None``)."""
        return all(d.ended() is not None for d in self.deliveries)

    @property
    def succeeded(self) -> bool:
        """Every delivery ended and succeeded."""
        return all(d.ended() is True for d in self.deliveries)
