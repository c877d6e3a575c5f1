"""One implementation of every call for both clients: each operation is a *flow*, a generator
that yields the steps it needs (an HTTP request, a pause, a piece of local blocking work) and
receives their results, and decides everything else itself: request building, validation,
answer decoding, retries, the long-poll loop of ``wait``, the spool's delivering loop.

``Client`` runs a flow with a blocking driver (httpx's ``Client``, ``time.sleep``), and
``AsyncClient`` with an asyncio driver (httpx's ``AsyncClient``, ``asyncio.sleep``, local work
on a thread). A driver never decides anything: it sends the request and hands back its
``Answer`` (any status), or throws the transport failure into the flow.

Retries are safe by construction: ``retrying`` is applied only by flows of idempotent calls
(a submit carries its idempotency key, a read changes nothing), and only to ``transient``
errors, at most ``RetryPolicy.attempts_max`` tries with equal-jitter backoff.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TypeVar, Union

from .errors import BatonError, api_error
from .limits import (
    REQUEST_TIMEOUT_S,
    RETRY_ATTEMPTS_MAX,
    RETRY_BACKOFF_BASE_S,
    RETRY_BACKOFF_MAX_S,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One HTTP request to the hub."""

    method: str
    #: The path, each id in it already one percent-encoded segment.
    path: str
    query: tuple[tuple[str, str], ...] = ()
    #: The JSON body, for a POST.
    body: bytes | None = None
    #: The whole request's timeout (a long-poll's wait plus the hub's margin).
    timeout_s: float = REQUEST_TIMEOUT_S


@dataclass(frozen=True)
class Answer:
    """The hub's answer to a ``Call``, whatever its status."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Sleep:
    """A pause (a retry's backoff, ``wait``'s pace)."""

    seconds: float


@dataclass(frozen=True)
class Blocking:
    """Local blocking work (the spool's SQLite): run in place by the blocking driver, on a
    worker thread by the asyncio one."""

    fn: Callable[[], object]


#: What a flow may ask its driver for.
Step = Union[Call, Sleep, Blocking]
#: An operation: yields steps, receives their results, returns its value.
Flow = Generator[Step, object, T]


def call(c: Call) -> Flow[Answer]:
    """Sends ``c``; its answer, whatever its status (a transport failure is thrown in here)."""
    answer = yield c
    if not isinstance(answer, Answer):
        raise TypeError(f"a driver answered a call with {type(answer).__name__}")
    return answer


def expect(c: Call, decode: Callable[[int, bytes], T]) -> Flow[T]:
    """Sends ``c``; a 2xx answer decoded, else the hub's refusal raised as its ``ApiError``."""
    answer = yield from call(c)
    if 200 <= answer.status < 300:
        return decode(answer.status, answer.body)
    raise api_error(answer.status, answer.body)


def blocking(fn: Callable[[], T]) -> Flow[T]:
    """Runs ``fn`` (local blocking work) through the driver; its result."""
    result = yield Blocking(fn)
    return result  # type: ignore[return-value]  # the driver hands back fn's own result


def sleep(seconds: float) -> Flow[None]:
    """Pauses for ``seconds``."""
    yield Sleep(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """How an idempotent call is retried: at most ``attempts_max`` tries, paused by a backoff
    that starts at ``backoff_base_s`` and doubles up to ``backoff_max_s``, each pause drawn
    from its upper half (equal jitter), so many clients do not retry in step."""

    #: Tries at most, the first included (at least 1).
    attempts_max: int = RETRY_ATTEMPTS_MAX
    #: The pause before the first retry.
    backoff_base_s: float = RETRY_BACKOFF_BASE_S
    #: The longest pause.
    backoff_max_s: float = RETRY_BACKOFF_MAX_S

    @staticmethod
    def once() -> RetryPolicy:
        """One try, no retry."""
        return RetryPolicy(attempts_max=1)

    def pause_s(self, failures: int) -> float:
        """The pause after ``failures`` failed tries (1 for the first)."""
        ceiling = min(self.backoff_base_s * float(2 ** min(max(failures - 1, 0), 20)), self.backoff_max_s)
        half = ceiling / 2
        return half + random.uniform(0, half)


def retrying(policy: RetryPolicy, attempt: Callable[[], Flow[T]]) -> Flow[T]:
    """Runs ``attempt`` until it succeeds, fails for good (not ``transient``), or was tried
    ``policy.attempts_max`` times; the last failure is raised. Only for idempotent calls."""
    attempts_max = max(policy.attempts_max, 1)
    failures = 0
    while True:
        try:
            return (yield from attempt())
        except BatonError as e:
            if not e.transient or failures + 1 >= attempts_max:
                raise
            failures += 1
            yield from sleep(policy.pause_s(failures))


class Backoff:
    """Pacing for a loop that retries until its own deadline (the spool's flush): each failure
    doubles the ceiling from ``base_s`` up to ``max_s``; each pause is drawn from zero to the
    ceiling (full jitter). A success ``reset``s it."""

    def __init__(self, base_s: float, max_s: float) -> None:
        if base_s > max_s:
            raise ValueError(f"backoff base {base_s} s must not exceed its cap {max_s} s")
        self.base_s = base_s
        self.max_s = max_s
        self.failures = 0

    def next_delay_s(self) -> float:
        """The pause before the next try; counts one more failure."""
        ceiling = min(self.base_s * float(2 ** min(self.failures, 20)), self.max_s)
        self.failures += 1
        return random.uniform(0, ceiling)

    def reset(self) -> None:
        """Forgets past failures after a success."""
        self.failures = 0
