"""The v1 API's bodies: requests checked and written here, answers read and typed here.

Both clients (``Client`` and ``AsyncClient``) and the spool build every request body with this
module and read every answer with it, so a field is spelled, checked and decoded in one place.

Requests are checked before they are sent, with the hub's grammar and bounds (``docs/api.md``);
a bad value is an ``InvalidArgumentError`` naming the field. A submit body is written in the
Rust client's exact text (its field order, compact, the payload's text embedded as given), so
a message spooled by Python and one spooled by ``baton`` compare byte for byte.

Answers are read strictly: a field missing or of the wrong type is a ``BadAnswerError`` naming
it, never a silent default (fields a hub older than this client may not send default as the
Rust client defaults them).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

# The views live in their own module (see it); they are this module's as before.
from ._views import AttemptView as AttemptView
from ._views import DeliveryView as DeliveryView
from ._views import JsonValue as JsonValue
from ._views import MessageView as MessageView
from ._views import ViewOmitted as ViewOmitted
from .errors import ApiError, BadAnswerError, InvalidArgumentError, error_class
from .limits import (
    BATCH_BYTES_MAX,
    BATCH_ITEMS_MAX,
    FEED_PAGE_LIMIT_MAX,
    KEY_CHARS_MAX,
    NAME_CHARS_MAX,
    PAYLOAD_DEPTH_MAX,
    REASON_CHARS_MAX,
    U32_MAX,
    U64_MAX,
)

_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_KEY = re.compile(r"[A-Za-z0-9._:-]+")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# JSON's whitespace: what may surround a payload's value and is not part of it.
_JSON_WHITESPACE = " \t\n\r"


# Identifiers.


def check_name(field: str, value: object) -> str:
    """A host, conversation or producer name: ``^[a-z][a-z0-9_-]*$``, at most 64 characters."""
    if not isinstance(value, str):
        raise InvalidArgumentError(field, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(field, "must not be empty")
    if len(value) > NAME_CHARS_MAX:
        raise InvalidArgumentError(field, f"is {len(value)} characters long; at most {NAME_CHARS_MAX} are allowed")
    if not _NAME.fullmatch(value):
        raise InvalidArgumentError(field, f"{value[:80]!r} does not match ^[a-z][a-z0-9_-]*$")
    return value


def check_key(field: str, value: object) -> str:
    """An idempotency key: 1–128 characters of ``[A-Za-z0-9._:-]``."""
    if not isinstance(value, str):
        raise InvalidArgumentError(field, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(field, "must not be empty")
    if len(value) > KEY_CHARS_MAX:
        raise InvalidArgumentError(field, f"is {len(value)} characters long; at most {KEY_CHARS_MAX} are allowed")
    if not _KEY.fullmatch(value):
        raise InvalidArgumentError(field, f"{value[:80]!r} does not match [A-Za-z0-9._:-]{{1,128}}")
    return value


def check_id(field: str, value: object) -> str:
    """A message or delivery id: a UUID in its lowercase hyphenated form (the hub refuses any
    other spelling)."""
    if not isinstance(value, str) or not _UUID.fullmatch(value):
        raise InvalidArgumentError(field, f"{str(value)[:80]!r} is not a lowercase hyphenated UUID")
    return value


def check_reason(field: str, value: object) -> str:
    """A cancel, approve or reject reason: 1 to ``REASON_CHARS_MAX`` characters."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(field, "must be a non-empty string")
    if len(value) > REASON_CHARS_MAX:
        raise InvalidArgumentError(field, f"is {len(value)} characters long; at most {REASON_CHARS_MAX} are allowed")
    return value


def check_uint(field: str, value: object, maximum: int, minimum: int = 0) -> int:
    """An integer field within ``minimum..=maximum`` (a bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(field, f"must be an integer, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidArgumentError(field, f"{value} is out of range {minimum}..={maximum}")
    return value


def check_cursor(field: str, value: object) -> str:
    """A feed's or a listing's cursor, as the hub gave it: a non-empty string (its meaning is
    the hub's, which refuses one it did not give out as ``bad_cursor``)."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(field, f"{str(value)[:80]!r} is not a cursor (a non-empty string the hub gave)")
    return value


def feed_query(after: str | None, limit: int | None) -> tuple[tuple[str, str], ...]:
    """The ``after`` and ``limit`` of an events feed read, checked (``limit``: 1 to
    ``FEED_PAGE_LIMIT_MAX``)."""
    query: list[tuple[str, str]] = []
    if after is not None:
        query.append(("after", check_cursor("after", after)))
    if limit is not None:
        query.append(("limit", str(check_uint("limit", limit, FEED_PAGE_LIMIT_MAX, minimum=1))))
    return tuple(query)


def listing_query(conversation: str, after: str | None, limit: int | None) -> tuple[tuple[str, str], ...]:
    """The query of a listing page, checked (``limit``: at least 1; the hub caps a larger one
    by its ``limits.message_page_max``)."""
    query = [("conversation", check_name("conversation", conversation))]
    if after is not None:
        query.append(("after", check_cursor("after", after)))
    if limit is not None:
        query.append(("limit", str(check_uint("limit", limit, U32_MAX, minimum=1))))
    return tuple(query)


def new_idempotency_key() -> str:
    """A fresh idempotency key (a random UUID), for a submit whose caller gave none."""
    return str(uuid.uuid4())


# Payloads.


@dataclass(frozen=True)
class RawJson:
    """A payload given as JSON text, sent exactly as written (numbers of any size or spelling,
    key order, escapes): the hub stores and hands the harness these bytes. Surrounding
    whitespace is not part of it."""

    #: The payload's JSON text: exactly one JSON value.
    text: str


def payload_text(payload: object) -> str:
    """The JSON text of ``payload`` (a ``RawJson``'s own text, or a Python value written
    compactly), checked as the hub checks it: one JSON value, no key twice in an object, at
    most ``PAYLOAD_DEPTH_MAX`` levels, no lone surrogate."""
    if isinstance(payload, RawJson):
        text = payload.text.strip(_JSON_WHITESPACE)
    else:
        try:
            text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError("payload", f"cannot be written as JSON: {e}") from None
    check_payload_text(text)
    return text


def check_payload_text(text: str) -> None:
    """Refuses JSON text the hub would refuse as a payload (``payload_text``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("payload", "holds a lone surrogate, which is not UTF-8") from None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                raise InvalidArgumentError("payload", f"an object names the key {k[:80]!r} twice")
            seen[k] = v
        return seen

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise InvalidArgumentError("payload", f"nests deeper than {PAYLOAD_DEPTH_MAX} objects and arrays") from None
    except ValueError as e:
        if isinstance(e, InvalidArgumentError):
            raise
        raise InvalidArgumentError("payload", f"is not one JSON value: {e}") from None
    _check_depth_and_strings(value)


def _check_depth_and_strings(value: object) -> None:
    """Walks a decoded payload (without recursion): depth and lone surrogates from escapes."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            _check_utf8(v)
        elif isinstance(v, (dict, list)):
            if depth + 1 > PAYLOAD_DEPTH_MAX:
                raise InvalidArgumentError("payload", f"nests deeper than {PAYLOAD_DEPTH_MAX} objects and arrays")
            if isinstance(v, dict):
                for k, item in v.items():
                    _check_utf8(k)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in v)


def _check_utf8(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("payload", "holds a lone surrogate escape, which is not UTF-8 text") from None


# Requests.


@dataclass(frozen=True)
class SubmitRequest:
    """One ``POST /v1/messages`` body, checked (``submit_request``). ``body`` is its exact text,
    the same for every try and the same as the Rust client writes."""

    conversation: str
    idempotency_key: str
    #: The payload's JSON text.
    payload: str
    to: tuple[str, ...] | None = None
    max_attempts: int | None = None
    retry_backoff_ms: int | None = None
    approval: str | None = None
    approval_timeout_ms: int | None = None

    @property
    def body(self) -> str:
        """The request's JSON text, in the Rust client's field order, compact."""
        parts = [
            f'"conversation":{_string(self.conversation)}',
            f'"idempotency_key":{_string(self.idempotency_key)}',
            f'"payload":{self.payload}',
        ]
        if self.to is not None:
            parts.append('"to":[' + ",".join(_string(h) for h in self.to) + "]")
        for name in ("max_attempts", "retry_backoff_ms", "approval", "approval_timeout_ms"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f'"{name}":{_string(value) if isinstance(value, str) else value}')
        return "{" + ",".join(parts) + "}"


def _string(s: str) -> str:
    # serde_json's escapes: '"', '\\', \b \f \n \r \t, other controls as \u00xx, the rest as is.
    return json.dumps(s, ensure_ascii=False)


def submit_request(
    conversation: str,
    payload: object,
    *,
    to: Sequence[str] | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    retry_backoff_ms: int | None = None,
    approval: str | None = None,
    approval_timeout_ms: int | None = None,
) -> SubmitRequest:
    """A checked submit. Without ``idempotency_key`` one is made (``new_idempotency_key``): a
    submit always carries its key, so every retry of it is the same message."""
    check_name("conversation", conversation)
    hosts: tuple[str, ...] | None = None
    if to is not None:
        if isinstance(to, str):
            raise InvalidArgumentError("to", "must be a list of host names, not one string")
        hosts = tuple(check_name(f"to[{i}]", h) for i, h in enumerate(to))
    key = check_key("idempotency_key", idempotency_key) if idempotency_key is not None else new_idempotency_key()
    if max_attempts is not None:
        check_uint("max_attempts", max_attempts, U32_MAX, minimum=1)
    if retry_backoff_ms is not None:
        check_uint("retry_backoff_ms", retry_backoff_ms, U64_MAX)
    if approval is not None and approval not in ("required", "none"):
        raise InvalidArgumentError("approval", f'{str(approval)[:80]!r} is neither "required" nor "none"')
    if approval_timeout_ms is not None:
        if approval != "required":
            raise InvalidArgumentError("approval_timeout_ms", 'needs approval="required"')
        check_uint("approval_timeout_ms", approval_timeout_ms, U64_MAX, minimum=1)
    return SubmitRequest(
        conversation=conversation,
        idempotency_key=key,
        payload=payload_text(payload),
        to=hosts,
        max_attempts=max_attempts,
        retry_backoff_ms=retry_backoff_ms,
        approval=approval,
        approval_timeout_ms=approval_timeout_ms,
    )


def batch_body(requests: Sequence[SubmitRequest]) -> bytes:
    """The body of ``POST /v1/batch/messages``, when it is within the hub's fixed bounds."""
    n = len(requests)
    if n == 0:
        raise InvalidArgumentError("messages", "a batch needs at least one message")
    if n > BATCH_ITEMS_MAX:
        raise InvalidArgumentError("messages", f"{n} messages are more than one batch may carry ({BATCH_ITEMS_MAX})")
    body = ('{"messages":[' + ",".join(r.body for r in requests) + "]}").encode("utf-8")
    if len(body) > BATCH_BYTES_MAX:
        raise InvalidArgumentError(
            "messages", f"the batch is {len(body)} bytes, over the {BATCH_BYTES_MAX} one batch may have"
        )
    return body


def reason_body(reason: str) -> bytes:
    """``{"reason": …}``, the body of a cancel, approve or reject."""
    return json.dumps({"reason": check_reason("reason", reason)}, ensure_ascii=False).encode("utf-8")


# Answers.


class _Fields:
    """Typed access to one JSON object of an answer; a missing or mistyped field is a
    ``BadAnswerError`` naming its path."""

    def __init__(self, value: object, path: str, status: int) -> None:
        if not isinstance(value, dict):
            raise BadAnswerError(status, f"{path or 'the answer'}: expected an object, got {type(value).__name__}")
        self.d: dict[str, Any] = value
        self.path = path
        self.status = status

    def _bad(self, name: str, want: str) -> BadAnswerError:
        got = type(self.d.get(name)).__name__ if name in self.d else "nothing"
        return BadAnswerError(self.status, f"{self.path}{'.' if self.path else ''}{name}: expected {want}, got {got}")

    def text(self, name: str) -> str:
        v = self.d.get(name)
        if not isinstance(v, str):
            raise self._bad(name, "a string")
        return v

    def opt_text(self, name: str) -> str | None:
        v = self.d.get(name)
        if v is not None and not isinstance(v, str):
            raise self._bad(name, "a string or null")
        return v

    def integer(self, name: str, default: int | None = None) -> int:
        v = self.d.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(name, "an integer")
        return v

    def opt_integer(self, name: str) -> int | None:
        v = self.d.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise self._bad(name, "an integer or null")
        return v

    def flag(self, name: str, default: bool | None = None) -> bool:
        v = self.d.get(name, default)
        if not isinstance(v, bool):
            raise self._bad(name, "true or false")
        return v

    def obj(self, name: str) -> dict[str, JsonValue]:
        v = self.d.get(name)
        if not isinstance(v, dict):
            raise self._bad(name, "an object")
        return v

    def items(self, name: str) -> list[Any]:
        v = self.d.get(name)
        if not isinstance(v, list):
            raise self._bad(name, "a list")
        return v

    def at(self, name: str, i: int | None = None) -> str:
        """The path of a nested value, for its own ``_Fields``."""
        base = f"{self.path}.{name}" if self.path else name
        return base if i is None else f"{base}[{i}]"


def decode_json(status: int, body: bytes) -> object:
    """The answer's JSON (an empty body reads as ``null``)."""
    if not body:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadAnswerError(status, f"not JSON: {e}") from None


@dataclass(frozen=True)
class DeliverySummary:
    """One delivery as an accept, approve or reject answer summarises it."""

    delivery_id: str
    #: The recipient host; ``None`` for a pool delivery no member has claimed yet (then
    #: ``pool`` names the pool).
    host: str | None
    #: Its state when the answer was made (``queued``, ``held`` …).
    state: str
    #: The recipient pool, for a pool delivery (kept once a member claims it); ``None`` for a
    #: host's own delivery.
    pool: str | None = None

    @staticmethod
    def read(f: _Fields) -> DeliverySummary:
        return DeliverySummary(f.text("delivery_id"), f.opt_text("host"), f.text("state"), f.opt_text("pool"))


def _summaries(f: _Fields, name: str = "deliveries") -> tuple[DeliverySummary, ...]:
    return tuple(DeliverySummary.read(_Fields(d, f.at(name, i), f.status)) for i, d in enumerate(f.items(name)))


@dataclass(frozen=True)
class SubmitResult:
    """The hub's answer to a submit: 201 new, or 200 a replay of the same key and content
    (``duplicate``, the original ids)."""

    message_id: str
    #: The message's sequence number in its conversation.
    seq: int
    #: True when the hub had accepted this key and content before.
    duplicate: bool
    deliveries: tuple[DeliverySummary, ...]
    #: The idempotency key sent (the caller's, or the one made for it).
    idempotency_key: str
    #: The HTTP status (201 or 200).
    status: int

    @staticmethod
    def read(value: object, status: int, key: str, path: str = "") -> SubmitResult:
        f = _Fields(value, path, status)
        return SubmitResult(f.text("message_id"), f.integer("seq"), f.flag("duplicate"), _summaries(f), key, status)


def read_submit(status: int, body: bytes, key: str) -> SubmitResult:
    return SubmitResult.read(decode_json(status, body), status, key)


#: One message's answer in a batch: its ``SubmitResult``, or the hub's refusal of it alone.
BatchItem = Union[SubmitResult, ApiError]


def read_batch(status: int, body: bytes, requests: Sequence[SubmitRequest]) -> list[BatchItem]:
    """One ``BatchItem`` per message, in request order, when the answer is the documented one."""
    f = _Fields(decode_json(status, body), "", status)
    results = f.items("results")
    if len(results) != len(requests):
        raise BadAnswerError(status, f"{len(results)} results for a batch of {len(requests)} messages")
    out: list[BatchItem] = []
    for i, (item, req) in enumerate(zip(results, requests)):
        r = _Fields(item, f.at("results", i), status)
        item_status = r.integer("status")
        if 200 <= item_status < 300 and "ok" in r.d:
            out.append(SubmitResult.read(r.d["ok"], item_status, req.idempotency_key, r.at("ok")))
        elif item_status >= 400 and "error" in r.d:
            e = _Fields(r.d["error"], r.at("error"), status)
            code = e.text("code")
            out.append(error_class(item_status, code)(item_status, code, e.text("message")))
        else:
            raise BadAnswerError(status, f"results[{i}]: status {item_status} does not fit its outcome")
    return out


def _read_attempt(f: _Fields) -> AttemptView:
    return AttemptView(
        attempt_id=f.text("attempt_id"),
        report_id=f.text("report_id"),
        outcome=f.text("outcome"),
        exit_code=f.opt_integer("exit_code"),
        duration_ms=f.opt_integer("duration_ms"),
        signal=f.opt_integer("signal"),
        result=f.opt_text("result"),
        reason=f.opt_text("reason"),
        reported_at_ms=f.integer("reported_at_ms"),
        attempt=f.integer("attempt", 1),
        retryable=f.flag("retryable", False),
        rerun=f.opt_text("rerun"),
        caused_by=f.opt_text("caused_by"),
        stderr_tail=f.opt_text("stderr_tail"),
        stderr_dropped_bytes=f.opt_integer("stderr_dropped_bytes"),
    )


def _read_delivery_view(f: _Fields) -> DeliveryView:
    attempts = tuple(
        _read_attempt(_Fields(a, f.at("attempts", i), f.status)) for i, a in enumerate(f.items("attempts"))
    )
    return DeliveryView(
        delivery_id=f.text("delivery_id"),
        host=f.opt_text("host"),
        state=f.text("state"),
        reason=f.opt_text("reason"),
        updated_at_ms=f.integer("updated_at_ms"),
        attempts=attempts,
        attempt=f.integer("attempt", 1),
        max_attempts=f.integer("max_attempts", 1),
        not_before_ms=f.opt_integer("not_before_ms"),
        cancel_requested_at_ms=f.opt_integer("cancel_requested_at_ms"),
        cancel_reason=f.opt_text("cancel_reason"),
        pool=f.opt_text("pool"),
    )


def read_delivery(status: int, body: bytes) -> DeliveryView:
    return _read_delivery_view(_Fields(decode_json(status, body), "", status))


def read_message(status: int, body: bytes) -> MessageView:
    f = _Fields(decode_json(status, body), "", status)
    deliveries = tuple(
        _read_delivery_view(_Fields(d, f.at("deliveries", i), status)) for i, d in enumerate(f.items("deliveries"))
    )
    omitted = None
    if f.d.get("omitted") is not None:
        o = _Fields(f.d["omitted"], "omitted", status)
        attempts_of = tuple(str(x) for x in o.items("attempts_of"))
        omitted = ViewOmitted(attempts_of, o.integer("view_bytes_max"), o.text("read_each_at"))
    if "payload" not in f.d:
        raise BadAnswerError(status, "payload: expected a JSON value, got nothing")
    return MessageView(
        message_id=f.text("message_id"),
        conversation=f.text("conversation"),
        seq=f.integer("seq"),
        producer=f.text("producer"),
        idempotency_key=f.text("idempotency_key"),
        payload=f.d["payload"],
        accepted_at_ms=f.integer("accepted_at_ms"),
        deliveries=deliveries,
        omitted=omitted,
        traceparent=f.opt_text("traceparent"),
    )


@dataclass(frozen=True)
class CancelResult:
    """What a cancel did to one delivery."""

    delivery_id: str
    host: str
    #: ``cancelled`` (it never ran), ``requested`` (its node stops it) or ``final`` (it had
    #: ended; nothing changed).
    effect: str
    state: str


@dataclass(frozen=True)
class CancelResponse:
    """The answer to a cancel: what happened to each delivery."""

    message_id: str
    deliveries: tuple[CancelResult, ...]


def read_cancel(status: int, body: bytes) -> CancelResponse:
    f = _Fields(decode_json(status, body), "", status)
    items = []
    for i, d in enumerate(f.items("deliveries")):
        g = _Fields(d, f.at("deliveries", i), status)
        items.append(CancelResult(g.text("delivery_id"), g.text("host"), g.text("effect"), g.text("state")))
    return CancelResponse(f.text("message_id"), tuple(items))


@dataclass(frozen=True)
class ApprovalResponse:
    """The answer to an approve or reject."""

    message_id: str
    #: ``approved`` or ``rejected``.
    decision: str
    #: Its deliveries after the decision (approved: queued; rejected: failed).
    deliveries: tuple[DeliverySummary, ...]


def read_approval(status: int, body: bytes) -> ApprovalResponse:
    f = _Fields(decode_json(status, body), "", status)
    return ApprovalResponse(f.text("message_id"), f.text("decision"), _summaries(f))


@dataclass(frozen=True)
class MembershipInterval:
    """The host receives the posts with ``join_seq < seq <= leave_seq`` (no upper bound while
    ``leave_seq`` is ``None``)."""

    join_seq: int
    joined_at_ms: int
    leave_seq: int | None
    left_at_ms: int | None


@dataclass(frozen=True)
class MemberView:
    """One host's membership of a conversation."""

    host: str
    #: True while its latest interval is open.
    current: bool
    intervals: tuple[MembershipInterval, ...]


@dataclass(frozen=True)
class ConversationView:
    """A conversation's position and membership registry."""

    conversation: str
    #: The highest ``seq`` given so far (0 before the first message).
    last_seq: int
    #: True while the conversation never had a member.
    open: bool
    members: tuple[MemberView, ...]


def read_conversation(status: int, body: bytes) -> ConversationView:
    f = _Fields(decode_json(status, body), "", status)
    members = []
    for i, m in enumerate(f.items("members")):
        g = _Fields(m, f.at("members", i), status)
        intervals = []
        for j, iv in enumerate(g.items("intervals")):
            h = _Fields(iv, g.at("intervals", j), status)
            intervals.append(
                MembershipInterval(h.integer("join_seq"), h.integer("joined_at_ms"), h.opt_integer("leave_seq"), h.opt_integer("left_at_ms"))
            )
        members.append(MemberView(g.text("host"), g.flag("current"), tuple(intervals)))
    return ConversationView(f.text("conversation"), f.integer("last_seq"), f.flag("open"), tuple(members))


# Events feeds and the replay listing.


@dataclass(frozen=True)
class FeedEvent:
    """One item of an events feed (``GET /v1/messages/{id}/events``, ``GET
    /v1/conversations/{conversation}/events``): a ``StateEvent``, a ``ProgressEvent`` or an
    ``OutcomeEvent``, each with these fields and its own."""

    #: This item's position: pass it as ``after`` to read on from just after it. Opaque,
    #: increasing along the feed.
    cursor: str
    #: ``state``, ``progress`` or ``outcome``.
    kind: str
    #: When the hub recorded it (unix milliseconds).
    at_ms: int
    message_id: str
    delivery_id: str
    #: The delivery's host.
    host: str


@dataclass(frozen=True)
class StateEvent(FeedEvent):
    """A delivery's state changed."""

    #: The state before; ``None`` when the delivery was created (the API's ``from``).
    from_: str | None
    #: The state after.
    to: str
    #: Who changed it: ``hub``, ``node:HOST`` or ``operator:NAME`` (a producer's cancel or
    #: decision is ``operator:producer:NAME``).
    actor: str
    reason: str | None


@dataclass(frozen=True)
class ProgressEvent(FeedEvent):
    """A running turn's harness wrote a progress event."""

    #: The run of the delivery (1 for the first).
    attempt: int
    #: Its number within the run, from 1, in the order the harness wrote them (a gap means
    #: events were dropped: the run's ``OutcomeEvent.progress_dropped`` counts them).
    seq: int
    #: The JSON object the harness wrote, decoded by Python's ``json``.
    progress: dict[str, JsonValue]


@dataclass(frozen=True)
class OutcomeEvent(FeedEvent):
    """A run's outcome was recorded (its result body is not in the feed: ``Client.get`` reads
    it)."""

    #: The run (1 for the first).
    attempt: int
    #: ``succeeded``, ``failed``, ``unknown`` or ``cancelled``.
    outcome: str
    exit_code: int | None
    signal: int | None
    duration_ms: int | None
    reason: str | None
    #: True when the hub requeued the delivery for another run.
    retryable: bool
    #: The run's progress events the hub kept.
    progress_events: int
    #: The run's progress events dropped, by its node and by the hub.
    progress_dropped: int


def read_feed_event(f: _Fields) -> FeedEvent:
    """One feed item, typed by its ``kind``; an unknown kind is a ``BadAnswerError``."""
    common = (f.text("cursor"), f.text("kind"), f.integer("at_ms"), f.text("message_id"), f.text("delivery_id"), f.text("host"))
    kind = common[1]
    if kind == "state":
        return StateEvent(*common, f.opt_text("from"), f.text("to"), f.text("actor"), f.opt_text("reason"))
    if kind == "progress":
        return ProgressEvent(*common, f.integer("attempt"), f.integer("seq"), f.obj("progress"))
    if kind == "outcome":
        return OutcomeEvent(
            *common,
            attempt=f.integer("attempt"),
            outcome=f.text("outcome"),
            exit_code=f.opt_integer("exit_code"),
            signal=f.opt_integer("signal"),
            duration_ms=f.opt_integer("duration_ms"),
            reason=f.opt_text("reason"),
            retryable=f.flag("retryable"),
            progress_events=f.integer("progress_events"),
            progress_dropped=f.integer("progress_dropped"),
        )
    raise BadAnswerError(f.status, f"{f.path}.kind: expected state, progress or outcome, got {kind[:80]!r}")


@dataclass(frozen=True)
class EventsPage:
    """One answer of an events feed: the items after the cursor, in order, and where to read
    on."""

    events: tuple[FeedEvent, ...]
    #: Pass it as ``after`` to read on: every item up to it has been answered (it may lie past
    #: the last item, when the hub looked further and found nothing more for this feed).
    next_cursor: str
    #: A message's feed: ``True`` once every delivery has its final outcome (then only an
    #: operator's redrive adds items); ``None`` for a conversation's feed.
    settled: bool | None


def read_events(status: int, body: bytes) -> EventsPage:
    f = _Fields(decode_json(status, body), "", status)
    events = tuple(read_feed_event(_Fields(e, f.at("events", i), status)) for i, e in enumerate(f.items("events")))
    settled = None if f.d.get("settled") is None else f.flag("settled")
    return EventsPage(events, f.text("next_cursor"), settled)


@dataclass(frozen=True)
class ListedMessage:
    """One message of a ``MessagePage``: the message and its deliveries' states (its attempts
    and results: ``Client.get``)."""

    message_id: str
    #: Its sequence number in the conversation.
    seq: int
    idempotency_key: str
    #: The payload, decoded by Python's ``json``.
    payload: JsonValue
    accepted_at_ms: int
    #: The W3C ``traceparent`` kept with it; ``None`` for a message accepted before traces were
    #: kept.
    traceparent: str | None
    deliveries: tuple[DeliverySummary, ...]


@dataclass(frozen=True)
class MessagePage:
    """One page of the producer's own messages in a conversation, oldest first (``GET
    /v1/messages?conversation=C``)."""

    conversation: str
    messages: tuple[ListedMessage, ...]
    #: Where the next page starts (``after``); opaque, for this producer and conversation only.
    #: At the end, the same cursor later gives what came since.
    next_cursor: str
    #: True while messages past ``next_cursor`` exist now (read on at once).
    more: bool


def read_message_page(status: int, body: bytes) -> MessagePage:
    f = _Fields(decode_json(status, body), "", status)
    messages = []
    for i, m in enumerate(f.items("messages")):
        g = _Fields(m, f.at("messages", i), status)
        if "payload" not in g.d:
            raise BadAnswerError(status, f"{g.path}.payload: expected a JSON value, got nothing")
        messages.append(
            ListedMessage(
                message_id=g.text("message_id"),
                seq=g.integer("seq"),
                idempotency_key=g.text("idempotency_key"),
                payload=g.d["payload"],
                accepted_at_ms=g.integer("accepted_at_ms"),
                traceparent=g.opt_text("traceparent"),
                deliveries=_summaries(g),
            )
        )
    return MessagePage(f.text("conversation"), tuple(messages), f.text("next_cursor"), f.flag("more"))
