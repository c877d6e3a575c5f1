"""The producer's spool: a durable local outbox of messages not yet accepted by the hub, so that
a send made while no hub answers is kept and delivered later instead of being the caller's
problem.

The same file as ``baton send --spool DIR`` keeps (``DIR/spool.db``, the schema of
``schema/spool/``, one SQLite file opened with WAL and ``synchronous=FULL``, its pragmas read
back, a damaged or newer file refused naming it), with the same rules, so ``baton spool status
--spool DIR`` reads a spool this package wrote, ``baton spool flush`` delivers it, and this
package delivers one ``baton`` wrote:

- A message is committed to the spool (``Spool.push``) before any hub sees it, with the exact
  request text every try will send.
- The delivering loop (``flush``) sends the spooled messages one at a time, the oldest ready
  first, each with its own idempotency key, and removes each only after the hub confirmed it
  (201, or 200 marked duplicate: accepted before). So a conversation's messages are accepted
  in the order they were spooled, each once, whatever the outage.
- A message the hub refuses for good (every 4xx but 401, 408 and 429) is kept, ``failed``, with
  the hub's status and code; the later messages of its conversation wait behind it until it is
  discarded or retried; other conversations go on. A 401 fails no message: it stops the flush.
- Who runs the loop is the caller's choice: ``Spooler.send`` flushes before it returns,
  ``Spooler.flush`` on demand. Nothing runs in the background.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from .errors import (
    ApiError,
    BatonError,
    CertificateRevokedError,
    InvalidArgumentError,
    SpoolError,
    SpoolFullError,
    SpoolKeyConflictError,
    SpoolNotFailedError,
    SpoolRefusedError,
)
from .limits import (
    SPOOL_BUSY_TIMEOUT_S,
    SPOOL_BYTES_MAX_DEFAULT,
    SPOOL_MESSAGES_MAX_DEFAULT,
    SPOOL_RETRY_PAUSE_BASE_S,
    SPOOL_RETRY_PAUSE_MAX_S,
)
from ._steps import Backoff, Flow, blocking, sleep
from .wire import SubmitRequest, SubmitResult

if TYPE_CHECKING:
    from ._api import Api

#: The spool's file in its directory.
SPOOL_FILE = "spool.db"
#: The spool's migrations, in order (append-only; the same files as ``schema/spool/``).
MIGRATION_FILES = ("0001-create-spool.sql",)
#: ``PRAGMA synchronous`` of a spool: FULL, every commit synced before it returns.
_SYNCHRONOUS_FULL = 2
#: ``PRAGMA temp_store`` of a spool: memory.
_TEMP_STORE_MEMORY = 2


def migrations() -> list[str]:
    """The migration scripts, as shipped in this package."""
    folder = resources.files("baton_client").joinpath("schema")
    return [folder.joinpath(name).read_text(encoding="utf-8") for name in MIGRATION_FILES]


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, as the spool records its times."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class SpoolLimits:
    """The spool's bounds: a push that would pass either is refused (``SpoolFullError``)."""

    #: Messages the spool holds at most, waiting and failed.
    messages_max: int = SPOOL_MESSAGES_MAX_DEFAULT
    #: Bytes of spooled requests the spool holds at most.
    bytes_max: int = SPOOL_BYTES_MAX_DEFAULT

    def check(self) -> None:
        """Refuses a bound below 1 (a spool that can hold nothing)."""
        if isinstance(self.messages_max, bool) or not isinstance(self.messages_max, int) or self.messages_max < 1:
            raise InvalidArgumentError("spool_messages_max", "must be at least 1")
        if isinstance(self.bytes_max, bool) or not isinstance(self.bytes_max, int) or self.bytes_max < 1:
            raise InvalidArgumentError("spool_bytes_max", "must be at least 1")


@dataclass(frozen=True)
class Spooled:
    """A message committed to the spool."""

    #: Its position in the spool's order (increasing, never reused).
    position: int
    #: Its idempotency key, sent unchanged on every try.
    idempotency_key: str
    #: True when the spool already held this key with this content: nothing was added.
    already: bool


@dataclass(frozen=True)
class Ready:
    """A waiting message with no failed message of its conversation ahead of it."""

    position: int
    idempotency_key: str
    conversation: str
    #: The exact request text, as spooled.
    request: str


@dataclass(frozen=True)
class FailedMessage:
    """A message the hub refused for good, kept for inspection."""

    position: int
    idempotency_key: str
    conversation: str
    #: The hub's HTTP status.
    status: int
    #: The hub's error code (empty when its answer had none).
    code: str
    #: The hub's refusal, in full.
    error: str


@dataclass(frozen=True)
class SpoolStatus:
    """What the spool holds now (``baton spool status``)."""

    path: Path
    #: Messages waiting to be sent, blocked ones included.
    waiting: int
    #: Waiting messages behind a failed message of their conversation.
    blocked: int
    failed: tuple[FailedMessage, ...]
    #: The bytes of every spooled request, waiting and failed.
    bytes: int
    #: When the oldest waiting message was spooled (ms since the epoch).
    oldest_spooled_at_ms: int | None
    #: The latest error a try to send a waiting message ended with: (when, what).
    last_error: tuple[int, str] | None
    limits: SpoolLimits


class Spool:
    """The spool store: one SQLite connection to ``DIR/spool.db``, usable from any thread (one
    lock around every call; one writer). Every change is one transaction, guarded on the row's
    expected state."""

    def __init__(self, directory: str | os.PathLike[str], limits: SpoolLimits = SpoolLimits(), *, read_only: bool = False) -> None:
        """Opens the spool in ``directory``, creating the directory and the file when missing
        and migrating an older one (``read_only``: an existing spool, changing nothing)."""
        limits.check()
        self.limits = limits
        self.path = Path(directory) / SPOOL_FILE
        self._lock = threading.Lock()
        if not read_only:
            try:
                Path(directory).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SpoolError(f"spool directory {os.fspath(directory)}: {e}") from None
        self._conn = _open(self.path, migrations(), read_only=read_only)

    def close(self) -> None:
        """Closes the connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._conn, self.path)

    def push(self, req: SubmitRequest, at_ms: int | None = None) -> Spooled:
        """Commits ``req`` to the spool after every message spooled before it; durable when
        this returns. The same key with the same request adds nothing (``already``); the same
        key with another request is ``SpoolKeyConflictError``; past a bound ``SpoolFullError``."""
        request = req.body
        size = len(request.encode("utf-8"))
        at_ms = now_ms() if at_ms is None else at_ms
        with self._lock, self._tx() as tx:
            row = tx.one("SELECT position, request FROM spool WHERE idempotency_key = ?", (req.idempotency_key,))
            if row is not None:
                if row[1] != request:
                    raise SpoolKeyConflictError(req.idempotency_key, int(row[0]))
                return Spooled(int(row[0]), req.idempotency_key, True)
            count, total = tx.one("SELECT count(*), coalesce(sum(bytes), 0) FROM spool") or (0, 0)
            if count + 1 > self.limits.messages_max:
                raise SpoolFullError(
                    f"spool full: {count} messages are spooled; spool_messages_max is {self.limits.messages_max}"
                )
            if total + size > self.limits.bytes_max:
                raise SpoolFullError(
                    f"spool full: {total} bytes are spooled and this message has {size}; "
                    f"spool_bytes_max is {self.limits.bytes_max}"
                )
            cur = tx.run(
                "INSERT INTO spool (idempotency_key, conversation, request, bytes, spooled_at_ms)"
                " VALUES (?, ?, ?, ?, ?)",
                (req.idempotency_key, req.conversation, request, size, at_ms),
            )
            position = cur.lastrowid
            if position is None:
                raise SpoolError(f"{self.path}: the insert returned no position")
            tx.commit()
            return Spooled(position, req.idempotency_key, False)

    def next_ready(self) -> Ready | None:
        """The oldest waiting message that no failed message of its own conversation is ahead
        of."""
        with self._lock:
            row = self._conn.execute(
                "SELECT s.position, s.idempotency_key, s.conversation, s.request FROM spool s"
                " WHERE s.state = 'waiting' AND NOT EXISTS ("
                "   SELECT 1 FROM spool f"
                "   WHERE f.conversation = s.conversation AND f.state = 'failed' AND f.position < s.position)"
                " ORDER BY s.position LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        position, key, conversation, request = int(row[0]), str(row[1]), str(row[2]), str(row[3])
        try:
            parsed = json.loads(request)
        except ValueError as e:
            raise SpoolError(f"spool is inconsistent: {self.path}: spool position {position}: not a message ({e})") from None
        if not isinstance(parsed, dict) or parsed.get("idempotency_key") != key:
            raise SpoolError(
                f"spool is inconsistent: {self.path}: spool position {position}: its request names another idempotency key"
            )
        return Ready(position, key, conversation, request)

    def confirmed(self, position: int) -> bool:
        """Removes the message at ``position`` once the hub confirmed it; false when it was no
        longer there (another flush removed it)."""
        with self._lock, self._tx() as tx:
            n = tx.run("DELETE FROM spool WHERE position = ? AND state = 'waiting'", (position,)).rowcount
            tx.commit()
        return n == 1

    def tried(self, position: int, error: str, at_ms: int | None = None) -> None:
        """Records a try that ended with no answer, or one asking to try later; the message
        keeps its place."""
        at_ms = now_ms() if at_ms is None else at_ms
        with self._lock, self._tx() as tx:
            tx.run(
                "UPDATE spool SET tries = tries + 1, last_try_at_ms = ?, last_error = ?"
                " WHERE position = ? AND state = 'waiting'",
                (at_ms, error, position),
            )
            tx.commit()

    def failed(self, position: int, status: int, code: str, error: str, at_ms: int | None = None) -> bool:
        """Marks the message at ``position`` refused for good (kept, never sent again unless
        ``retry``); false when it was no longer waiting."""
        at_ms = now_ms() if at_ms is None else at_ms
        with self._lock, self._tx() as tx:
            n = tx.run(
                "UPDATE spool SET state = 'failed', failed_status = ?, failed_code = ?, last_error = ?,"
                " tries = tries + 1, last_try_at_ms = ? WHERE position = ? AND state = 'waiting'",
                (status, code, error, at_ms, position),
            ).rowcount
            tx.commit()
        return n == 1

    def discard(self, position: int) -> None:
        """Removes the failed message at ``position`` for good: its conversation goes on."""
        with self._lock, self._tx() as tx:
            n = tx.run("DELETE FROM spool WHERE position = ? AND state = 'failed'", (position,)).rowcount
            if n != 1:
                raise SpoolNotFailedError(position)
            tx.commit()

    def retry(self, position: int) -> None:
        """Makes the failed message at ``position`` wait again, in its old place."""
        with self._lock, self._tx() as tx:
            n = tx.run(
                "UPDATE spool SET state = 'waiting', failed_status = NULL, failed_code = NULL"
                " WHERE position = ? AND state = 'failed'",
                (position,),
            ).rowcount
            if n != 1:
                raise SpoolNotFailedError(position)
            tx.commit()

    def status(self) -> SpoolStatus:
        """What the spool holds."""
        with self._lock:
            c = self._conn
            waiting, size, oldest = c.execute(
                "SELECT (SELECT count(*) FROM spool WHERE state = 'waiting'),"
                " (SELECT coalesce(sum(bytes), 0) FROM spool),"
                " (SELECT min(spooled_at_ms) FROM spool WHERE state = 'waiting')"
            ).fetchone()
            (blocked,) = c.execute(
                "SELECT count(*) FROM spool s WHERE s.state = 'waiting' AND EXISTS ("
                " SELECT 1 FROM spool f"
                " WHERE f.conversation = s.conversation AND f.state = 'failed' AND f.position < s.position)"
            ).fetchone()
            last = c.execute(
                "SELECT last_try_at_ms, last_error FROM spool"
                " WHERE state = 'waiting' AND last_error IS NOT NULL ORDER BY last_try_at_ms DESC LIMIT 1"
            ).fetchone()
            failed = tuple(
                FailedMessage(int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]), str(r[5]))
                for r in c.execute(
                    "SELECT position, idempotency_key, conversation, failed_status, coalesce(failed_code, ''),"
                    " coalesce(last_error, '') FROM spool WHERE state = 'failed' ORDER BY position"
                )
            )
        return SpoolStatus(
            path=self.path,
            waiting=int(waiting),
            blocked=int(blocked),
            failed=failed,
            bytes=int(size),
            oldest_spooled_at_ms=None if oldest is None else int(oldest),
            last_error=None if last is None else (int(last[0]), str(last[1])),
            limits=self.limits,
        )

    def keys(self) -> list[tuple[int, str, str]]:
        """Every spooled message's (position, idempotency key, state), in the spool's order."""
        with self._lock:
            rows = self._conn.execute("SELECT position, idempotency_key, state FROM spool ORDER BY position").fetchall()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back when left without ``commit``."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self.done = False

    def __enter__(self) -> _Transaction:
        self.conn.execute("BEGIN IMMEDIATE")
        return self

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self.conn.execute(sql, params).fetchone()
        return row

    def run(self, sql: str, params: Sequence[object] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def commit(self) -> None:
        self.conn.execute("COMMIT")
        self.done = True

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if not self.done:
            self.conn.execute("ROLLBACK")
        if kind is not None and issubclass(kind, sqlite3.Error):
            raise SpoolError(f"spool: {self.path}: {exc[0]}") from None


# The strict open: the same sequence as the Rust stores' (`baton_shared::sqlite::open`).


def _schema_of(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
    )
    return [f"{t} {n}: {s}" for t, n, s in rows]


def _open(path: Path, scripts: list[str], *, read_only: bool) -> sqlite3.Connection:
    """Refuses a file that is not a database or fails ``quick_check``, or whose schema is newer
    than this package; sets and reads back every pragma; applies the migrations, one
    transaction each with ``user_version``; checks the schema is exactly what they build. A
    refused file is left as it was found (the side files this open made are removed)."""
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    had_wal, had_shm = wal.exists(), shm.exists()
    try:
        return _open_inner(path, scripts, read_only=read_only)
    except BaseException:
        if not had_wal and wal.exists() and wal.stat().st_size == 0:
            wal.unlink(missing_ok=True)
        if not had_shm:
            shm.unlink(missing_ok=True)
        raise


def _open_inner(path: Path, scripts: list[str], *, read_only: bool) -> sqlite3.Connection:
    shown = str(path)
    exists = path.exists()
    if not exists and read_only:
        raise SpoolRefusedError(f"spool refused: {shown} does not exist")
    uri = f"{path.absolute().as_uri()}?mode={'ro' if read_only else 'rwc'}"
    try:
        conn = sqlite3.connect(
            uri, uri=True, timeout=SPOOL_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as e:
        raise SpoolRefusedError(f"spool refused: {shown} could not be opened ({e})") from None
    try:
        _prepare(conn, shown, scripts, exists=exists, read_only=read_only)
    except BaseException:
        conn.close()
        raise
    return conn


def _prepare(conn: sqlite3.Connection, shown: str, scripts: list[str], *, exists: bool, read_only: bool) -> None:
    def damaged(detail: object) -> SpoolRefusedError:
        return SpoolRefusedError(f"spool refused: {shown} is damaged or not a Baton database ({detail}); refusing to use it")

    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if exists:
            (check,) = conn.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise damaged(f"quick_check: {check}")
    except sqlite3.Error as e:
        raise damaged(e) from None
    known = len(scripts)
    if version > known:
        raise SpoolRefusedError(
            f"spool refused: {shown} has schema version {version}, newer than this package's {known};"
            " refusing to use it (upgrade baton-client)"
        )
    try:
        if read_only:
            conn.execute("PRAGMA query_only = 1")
            if version == known:
                _check_schema(conn, shown, scripts)
            return
        _pragma(conn, shown, "journal_mode", "wal", set_to="WAL")
        _pragma(conn, shown, "synchronous", str(_SYNCHRONOUS_FULL), set_to=str(_SYNCHRONOUS_FULL))
        _pragma(conn, shown, "foreign_keys", "1", set_to="ON")
        _pragma(conn, shown, "temp_store", str(_TEMP_STORE_MEMORY), set_to="MEMORY")
        _pragma(conn, shown, "busy_timeout", str(int(SPOOL_BUSY_TIMEOUT_S * 1000)))
        for n in range(version, known):
            try:
                conn.executescript(f"BEGIN IMMEDIATE;\n{scripts[n]}\n;PRAGMA user_version = {n + 1};\nCOMMIT;")
            except sqlite3.Error as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise SpoolRefusedError(f"spool refused: {shown}: migration failed: {e}") from None
        _check_schema(conn, shown, scripts)
    except sqlite3.Error as e:
        raise SpoolRefusedError(f"spool refused: {shown}: {e}") from None


def _pragma(conn: sqlite3.Connection, shown: str, name: str, expected: str, set_to: str | None = None) -> None:
    """Sets ``name`` (when ``set_to``) and reads it back; a value other than ``expected`` is
    refused (SQLite ignores a pragma it does not know, silently)."""
    if set_to is not None:
        conn.execute(f"PRAGMA {name} = {set_to}").fetchall()
    (found,) = conn.execute(f"PRAGMA {name}").fetchone()
    if str(found).lower() != expected:
        raise SpoolRefusedError(f"spool refused: {shown}: pragma {name} reads back {found}, expected {expected}")


def _check_schema(conn: sqlite3.Connection, shown: str, scripts: list[str]) -> None:
    """Refuses a file whose schema is not exactly what the migrations build."""
    reference = sqlite3.connect(":memory:")
    try:
        for s in scripts:
            reference.executescript(s)
        expected = _schema_of(reference)
    finally:
        reference.close()
    found = _schema_of(conn)
    if found != expected:
        first = next((i for i, (a, b) in enumerate(zip(found, expected)) if a != b), min(len(found), len(expected)))
        shown_row = found[first][:120] if first < len(found) else "(missing)"
        raise SpoolRefusedError(
            f"spool refused: {shown} is damaged or not a Baton database"
            f" (its schema differs from the one this package builds, at {shown_row!r}); refusing to use it"
        )


# The delivering loop, shared by `Spooler` and `AsyncSpooler`.


@dataclass(frozen=True)
class Accepted:
    """A spooled message the hub confirmed (new, or ``duplicate``: accepted before); it left the
    spool."""

    position: int
    conversation: str
    result: SubmitResult


@dataclass(frozen=True)
class Refused:
    """A spooled message the hub refused for good; it stays in the spool, ``failed``."""

    position: int
    idempotency_key: str
    error: BatonError


#: One message a flush settled.
Settled = Union[Accepted, Refused]


@dataclass
class FlushReport:
    """What a flush did and why it stopped."""

    #: The messages it settled, in the order it settled them.
    settled: list[Settled] = field(default_factory=list)
    #: Why it stopped with messages still ready: no hub answered (or one asked to try later)
    #: until the wait ran out, or the hub refused this producer's certificate (401, or the TLS
    #: alert of a revoked one). ``None``: nothing is ready.
    stopped: BatonError | None = None


@dataclass(frozen=True)
class SpoolSend:
    """What ``Spooler.send`` came to for its message."""

    spooled: Spooled
    #: The hub's answer when this message was accepted (it left the spool).
    accepted: SubmitResult | None
    #: The hub's refusal when it refused this message for good (it is kept, failed).
    refused: BatonError | None
    #: The whole flush that followed.
    report: FlushReport

    @property
    def waiting(self) -> bool:
        """True when the message is still waiting in the spool (no hub answered)."""
        return self.accepted is None and self.refused is None


def refuses_identity(e: BatonError) -> bool:
    """A refusal of this producer, not of the message: every message would get it."""
    return isinstance(e, CertificateRevokedError) or (isinstance(e, ApiError) and e.status == 401)


def refuses_message(e: BatonError) -> bool:
    """A refusal of this message for good: a 4xx other than 401, 408 and 429."""
    return isinstance(e, ApiError) and 400 <= e.status < 500 and e.status not in (401, 408, 429)


def flush_flow(spool: Spool, api: Api, wait_s: float, monotonic: Callable[[], float] = time.monotonic) -> Flow[FlushReport]:
    """Delivers the spooled messages, oldest ready first, one request at a time, until none is
    ready, or the hub refuses this producer, or a try finds no hub (or one asking to try later)
    after ``wait_s`` has passed; until then such a try is repeated after a pause (at most
    ``SPOOL_RETRY_PAUSE_MAX_S``). With ``wait_s`` zero the first such try stops it."""
    deadline = monotonic() + wait_s
    pace = Backoff(SPOOL_RETRY_PAUSE_BASE_S, SPOOL_RETRY_PAUSE_MAX_S)
    report = FlushReport()
    while True:
        ready = yield from blocking(spool.next_ready)
        if ready is None:
            return report
        try:
            result = yield from api.submit_once(ready.request, ready.idempotency_key)
        except BatonError as e:
            text, at = str(e), now_ms()
            position = ready.position
            if refuses_identity(e):
                yield from blocking(lambda: spool.tried(position, text, at))
                report.stopped = e
                return report
            if refuses_message(e):
                pace.reset()
                status, code = (e.status, e.code) if isinstance(e, ApiError) else (0, "")
                yield from blocking(lambda: spool.failed(position, status, code, text, at))
                report.settled.append(Refused(position, ready.idempotency_key, e))
                continue
            # No answer, or one asking to try later: the message keeps its place.
            yield from blocking(lambda: spool.tried(position, text, at))
            pause = pace.next_delay_s()
            if monotonic() + pause >= deadline:
                report.stopped = e
                return report
            yield from sleep(pause)
            continue
        pace.reset()
        position = ready.position
        yield from blocking(lambda: spool.confirmed(position))
        report.settled.append(Accepted(position, ready.conversation, result))


def send_flow(spool: Spool, api: Api, req: SubmitRequest, wait_s: float) -> Flow[SpoolSend]:
    """Commits ``req`` to the spool, then flushes; what came of ``req`` (``baton send
    --spool``). A refusal of this producer (401) is raised: no message can be accepted."""
    spooled = yield from blocking(lambda: spool.push(req))
    report = yield from flush_flow(spool, api, wait_s)
    mine = next((s for s in report.settled if s.position == spooled.position), None)
    if isinstance(mine, Accepted):
        return SpoolSend(spooled, mine.result, None, report)
    if isinstance(mine, Refused):
        return SpoolSend(spooled, None, mine.error, report)
    if report.stopped is not None and not report.stopped.transient:
        raise report.stopped
    return SpoolSend(spooled, None, None, report)
