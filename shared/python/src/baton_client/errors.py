"""What a call can end with besides its answer.

One base class, ``BatonError``, and one subclass per family, so that a caller catches what it
can act on:

- ``RefusedError`` (an ``ApiError``): the hub decided. Any 4xx but 408 and 429; sending the same
  request again gets the same answer. Subclasses by status: ``InvalidRequestError`` (400),
  ``DeniedError`` (401, 403), ``NotFoundError`` (404), ``ConflictError`` (409).
- ``UnavailableError``: try later. ``HubUnavailableError`` (an ``ApiError``: 408, 429, 5xx) or
  ``TransportError`` (no answer at all; ``maybe_sent`` says whether the hub may have acted).
- ``BadAnswerError``: the hub answered 2xx with a body that is not the documented answer.
- ``CertificateRevokedError``: the TLS handshake ended with the hub's alert that this client's
  certificate is revoked.
- ``InvalidArgumentError`` (also a ``ValueError``): refused here, before anything was sent; the
  message names the field.
- ``WaitTimeoutError`` (also a ``TimeoutError``): ``wait`` ran out of time; ``last`` is the
  latest view.
- ``SpoolError`` and its subclasses: the local spool could not do what was asked.

``transient`` is true for the errors an idempotent call is retried on (as the Rust client's
``ClientError::is_transient``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .limits import ERROR_QUOTE_BYTES_MAX

if TYPE_CHECKING:
    from ._views import MessageView


class BatonError(Exception):
    """Every error this package raises."""

    #: The HTTP status the hub answered with, when it answered.
    status: int | None = None
    #: The API's stable error code (``idempotency_conflict``, ``not_found`` …); empty when the
    #: hub sent none (no answer, or an answer that is not the hub's error body).
    code: str = ""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        #: What went wrong, for a human.
        self.message = message

    @property
    def transient(self) -> bool:
        """Whether sending the same request again later may succeed."""
        return False


class ApiError(BatonError):
    """The hub answered with an error: its HTTP status and ``{code, message}`` body."""

    status: int

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def __str__(self) -> str:
        if self.code:
            return f"the hub refused the request ({self.status} {self.code}): {self.message}"
        return f"the hub refused the request ({self.status}): {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class RefusedError(ApiError):
    """The hub refused the request for good (a 4xx but 408 and 429): the same request again gets
    the same answer."""


class InvalidRequestError(RefusedError):
    """400: the body or a field is invalid (``invalid_json``, ``invalid_field``,
    ``no_recipients``); the message names the field."""


class BadCursorError(InvalidRequestError):
    """400 ``bad_cursor``: a feed's or a listing's ``after`` is not a cursor that feed or
    listing gave out (mangled, another producer's or conversation's, or of another record)."""


class CursorExpiredError(RefusedError):
    """410 ``cursor_expired``: items after the cursor were removed (retention or a purge), so
    reading on from it would skip them; read again without ``after``."""


class DeniedError(RefusedError):
    """401 or 403: the certificate is unknown or revoked, or this producer may not do this
    (``forbidden``, ``not_yours``, ``approval_forbidden``, ``wrong_role``)."""


class NotFoundError(RefusedError):
    """404: no such message, delivery, conversation or endpoint."""


class ConflictError(RefusedError):
    """409: the idempotency key was used for other content (``idempotency_conflict``), or the
    message is not in a state that allows the step (``invalid_transition``)."""


class UnavailableError(BatonError):
    """The hub could not take the request now: try again later (an idempotent call is retried
    by the client itself)."""

    @property
    def transient(self) -> bool:
        return True


class HubUnavailableError(ApiError, UnavailableError):
    """The hub answered that it cannot take the request now: 408 ``request_timeout``, 429
    (``over_capacity``, a quota), 503 ``storage_unavailable``, 507 ``store_full``, or another
    5xx."""


class TransportError(UnavailableError):
    """No answer arrived: the hub is down or unreachable, the connection was lost, or the
    request timed out."""

    def __init__(self, detail: str, *, maybe_sent: bool) -> None:
        super().__init__(detail)
        #: True when the request may have reached the hub (a timeout, a connection lost after
        #: sending), so its effect may have happened; false when it certainly did not (no
        #: connection).
        self.maybe_sent = maybe_sent

    def __str__(self) -> str:
        return f"hub unreachable: {self.message}"


class BadAnswerError(BatonError):
    """The hub answered 2xx with a body that is not the documented answer (a proxy in the way,
    or a hub of another version)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status

    def __str__(self) -> str:
        return f"the hub sent an unexpected answer ({self.status}): {self.message}"

    @property
    def transient(self) -> bool:
        return True


class CertificateRevokedError(BatonError):
    """The TLS handshake ended with the hub's alert that this client's certificate is revoked.
    Under TLS 1.3 a refused certificate may instead look like a lost connection
    (``TransportError``); the hub's log says why."""

    code = "certificate_revoked"

    def __str__(self) -> str:
        return f"the hub refused our client certificate as revoked in the TLS handshake: {self.message}"


class InvalidArgumentError(BatonError, ValueError):
    """An argument refused before anything was sent; the message starts with the field's
    name."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        #: The field (``conversation``, ``to[1]``, ``payload`` …).
        self.field = field


class WaitTimeoutError(BatonError, TimeoutError):
    """``wait`` ran out of time before every delivery ended."""

    def __init__(self, message: str, last: MessageView) -> None:
        super().__init__(message)
        #: The latest view of the message.
        self.last = last


class SpoolError(BatonError):
    """The local spool could not do what was asked."""


class SpoolRefusedError(SpoolError):
    """The spool file was refused: damaged, written by a newer client, missing (read-only
    open), unreadable, or a pragma did not read back. The message names the file."""


class SpoolFullError(SpoolError):
    """The message would take the spool past one of its bounds; nothing was spooled."""


class SpoolKeyConflictError(SpoolError):
    """The spool holds another message under this idempotency key."""

    def __init__(self, key: str, position: int) -> None:
        super().__init__(f"spool: idempotency key {key!r} is already spooled (position {position}) with other content")
        self.key = key
        self.position = position


class SpoolNotFailedError(SpoolError):
    """A discard or retry named a position that holds no failed message."""

    def __init__(self, position: int) -> None:
        super().__init__(f"spool: no failed message at position {position}")
        self.position = position


def api_error(status: int, body: bytes) -> ApiError:
    """The error for an error answer: the hub's ``{code, message}``, or the start of whatever
    else came (a proxy's page), as the class of its status's family."""
    code, message = "", ""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("code"), str) and isinstance(parsed.get("message"), str):
        code, message = parsed["code"], parsed["message"]
    else:
        message = body[:ERROR_QUOTE_BYTES_MAX].decode("utf-8", errors="replace")
    return error_class(status, code)(status, code, message)


def error_class(status: int, code: str = "") -> type[ApiError]:
    """The class of an error answer with ``status`` and ``code``."""
    if status >= 500 or status in (408, 429):
        return HubUnavailableError
    if status == 400 and code == "bad_cursor":
        return BadCursorError
    return {
        400: InvalidRequestError,
        401: DeniedError,
        403: DeniedError,
        404: NotFoundError,
        409: ConflictError,
        410: CursorExpiredError,
    }.get(status, RefusedError)
