"""The node side: helpers for a harness, the program a node runs for each delivered turn.

The node starts the harness without a shell, with the message's payload (JSON text) on stdin
and the turn's ids in the environment (``BATON_DELIVERY_ID``, ``BATON_MESSAGE_ID``,
``BATON_CONVERSATION``, ``BATON_SEQ``, ``BATON_PRODUCER``, ``BATON_ATTEMPT_ID``,
``BATON_ATTEMPT``, ``BATON_INSTANCE_ID``, and ``BATON_RERUN`` on a retry or redrive). What it
writes to stdout is the attempt's result (bounded by the node's ``result_bytes_max``); its exit
status is the outcome: 0 succeeded, 75 asks for a retry (``HARNESS_RETRY_EXIT_STATUS``, honoured
while the message's ``max_attempts`` leaves room), anything else failed. stderr goes to the
node's log and the end of it to the attempt.

Progress: when the node passes ``BATON_PROGRESS_FD``, it names an open file descriptor (a
pipe's write end) on which the harness writes one JSON object per line, UTF-8,
newline-terminated. ``progress(obj)`` writes one such line; without the variable it does
nothing, and says so once on stderr. Progress is best effort: a progress descriptor that is
bad or closed is said once on stderr and then ignored, never a failed turn.

Typical use::

    from baton_client import harness

    def turn(t: harness.Turn) -> object:
        harness.progress({"step": "started"})
        if not ready():
            raise harness.RetryLater("the tool is not ready")
        return {"echo": t.payload}

    harness.run(turn)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, NoReturn

from .limits import HARNESS_RETRY_EXIT_STATUS
from .wire import JsonValue

#: The variable naming the progress file descriptor.
PROGRESS_FD_VAR = "BATON_PROGRESS_FD"
#: The exit status of a turn that succeeded.
EXIT_SUCCEEDED = 0
#: The exit status of a turn that failed (the harness's own error).
EXIT_FAILED = 1


class HarnessError(Exception):
    """The harness was not started the way a node starts it (a variable missing or malformed,
    a payload that is not JSON); the message names what."""


class RetryLater(Exception):
    """Raised from a turn function run by ``run``: the turn exits 75 and asks for a retry (the
    message, if any, goes to stderr)."""


@dataclass(frozen=True)
class Turn:
    """One delivered turn, as the node handed it over."""

    delivery_id: str
    message_id: str
    conversation: str
    #: The message's sequence number in its conversation.
    seq: int
    #: The producer that submitted the message (empty from a hub that predates the field).
    producer: str
    #: The node's id of this attempt (its report id).
    attempt_id: str
    #: Which run of the delivery this is (1 for the first).
    attempt: int
    #: The node instance running it.
    instance_id: str
    #: ``retry`` or ``redrive`` when this is not the first run, else ``None``.
    rerun: str | None
    #: The payload's exact JSON text.
    payload_text: str

    @property
    def payload(self) -> JsonValue:
        """The payload, decoded by Python's ``json``."""
        value: JsonValue = json.loads(self.payload_text)
        return value


def _var(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if value is None:
        raise HarnessError(f"{name} is not set: is this running as a Baton node's harness?")
    return value


def _int_var(env: Mapping[str, str], name: str) -> int:
    text = _var(env, name)
    try:
        return int(text)
    except ValueError:
        raise HarnessError(f"{name}={text[:80]!r} is not an integer") from None


def read_turn(stdin: IO[bytes] | None = None, environ: Mapping[str, str] | None = None) -> Turn:
    """The turn: the payload read from ``stdin`` (all of it) and the ids from ``environ``
    (default: this process's). A missing variable or a payload that is not JSON is a
    ``HarnessError`` naming it."""
    env = os.environ if environ is None else environ
    raw = (sys.stdin.buffer if stdin is None else stdin).read()
    try:
        text = raw.decode("utf-8")
        json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise HarnessError(f"the payload on stdin is not JSON text: {e}") from None
    rerun = env.get("BATON_RERUN") or None
    return Turn(
        delivery_id=_var(env, "BATON_DELIVERY_ID"),
        message_id=_var(env, "BATON_MESSAGE_ID"),
        conversation=_var(env, "BATON_CONVERSATION"),
        seq=_int_var(env, "BATON_SEQ"),
        producer=env.get("BATON_PRODUCER", ""),
        attempt_id=_var(env, "BATON_ATTEMPT_ID"),
        attempt=_int_var(env, "BATON_ATTEMPT"),
        instance_id=_var(env, "BATON_INSTANCE_ID"),
        rerun=rerun,
        payload_text=text,
    )


class Progress:
    """The progress channel: JSON objects, one per line, to the descriptor ``BATON_PROGRESS_FD``
    names. Safe to use from several threads (each line is written whole under a lock)."""

    def __init__(self, environ: Mapping[str, str] | None = None, stderr: IO[str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._stderr = stderr
        self._lock = threading.Lock()
        self._said = False
        self.fd: int | None = None
        text = env.get(PROGRESS_FD_VAR)
        if text is None or text == "":
            self._why_not = f"{PROGRESS_FD_VAR} is not set (this node takes no progress); progress is not sent"
            return
        try:
            fd = int(text)
            if fd < 0:
                raise ValueError("negative")
            os.fstat(fd)
        except (ValueError, OSError) as e:
            self._why_not = f"{PROGRESS_FD_VAR}={text[:40]!r} is not an open file descriptor ({e}); progress is not sent"
            return
        self.fd = fd
        self._why_not = ""

    def _say_once(self, what: str) -> None:
        if not self._said:
            self._said = True
            print(f"baton harness: {what}", file=self._stderr or sys.stderr, flush=True)

    def send(self, obj: Mapping[str, object]) -> bool:
        """Writes ``obj`` as one line; true when it was written. ``obj`` must be a JSON object
        (a mapping with string keys); anything else is a ``TypeError`` or ``ValueError``, the
        caller's bug. A channel that is absent, bad or closed writes nothing (said once)."""
        if not isinstance(obj, Mapping):
            raise TypeError(f"progress takes a JSON object (a mapping), not {type(obj).__name__}")
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
        data = line.encode("utf-8")  # a lone surrogate is a UnicodeEncodeError: not UTF-8 text
        with self._lock:
            if self.fd is None:
                self._say_once(self._why_not)
                return False
            try:
                view = memoryview(data)
                while view:
                    written = os.write(self.fd, view)
                    view = view[written:]
            except OSError as e:
                self._say_once(f"the progress descriptor {self.fd} failed ({e}); progress is not sent any more")
                self.fd = None
                self._why_not = "progress is not sent"
                return False
        return True


_default: Progress | None = None
_default_lock = threading.Lock()


def progress(obj: Mapping[str, object]) -> bool:
    """Sends one progress object on this process's channel (``BATON_PROGRESS_FD``); a no-op
    that says so once on stderr when the node passed none. True when it was written."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Progress()
        channel = _default
    return channel.send(obj)


def write_result(result: object, stdout: IO[bytes] | None = None) -> None:
    """Writes the turn's result to stdout: a ``str`` or ``bytes`` as it is, anything else as
    one line of JSON."""
    out = sys.stdout.buffer if stdout is None else stdout
    if isinstance(result, bytes):
        out.write(result)
    elif isinstance(result, str):
        out.write(result.encode("utf-8"))
    else:
        out.write(json.dumps(result, ensure_ascii=False).encode("utf-8") + b"\n")
    out.flush()


def retry_later(message: str | None = None) -> NoReturn:
    """Ends the turn asking for a retry: ``message`` to stderr, exit 75."""
    if message:
        print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    raise SystemExit(HARNESS_RETRY_EXIT_STATUS)


def run(turn: Callable[[Turn], object]) -> NoReturn:
    """Runs one turn: reads it, calls ``turn``, writes what it returns (``write_result``) and
    exits 0. ``RetryLater`` exits 75 (a retry); any other exception is printed to stderr and
    exits 1 (failed), as is a harness not started by a node."""
    try:
        t = read_turn()
        result = turn(t)
    except RetryLater as e:
        retry_later(str(e) or None)
    except HarnessError as e:
        print(f"baton harness: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_FAILED) from None
    except Exception:
        traceback.print_exc()
        raise SystemExit(EXIT_FAILED) from None
    write_result(result)
    raise SystemExit(EXIT_SUCCEEDED)
