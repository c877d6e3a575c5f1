"""The client's bounds, named once, each with its unit last (``_S`` seconds, ``_BYTES``).

They mirror the Rust client's (``shared/client/src/limits.rs``) and the hub's fixed limits
(``shared/src/limits.rs``, ``shared/src/ids.rs``), so that a Python producer and ``baton``
behave alike against the same hub.
"""

from __future__ import annotations

# Timeouts.

#: Longest a connection to the hub may take to establish: a dead hub is noticed quickly.
CONNECT_TIMEOUT_S = 10.0
#: Longest a request that does not wait (submit, cancel, a read without ``wait``) may take.
REQUEST_TIMEOUT_S = 30.0
#: Longest wait asked of the hub in one long-poll read; the hub caps it by its own
#: ``long_poll_wait_max`` (default 30 s), so asking for more only lengthens the timeout.
LONG_POLL_WAIT_MAX_S = 30.0
#: Added to a long-poll's wait for its request timeout: the time the hub needs to answer after
#: the wait ran out.
CLIENT_TIMEOUT_MARGIN_S = 15.0
#: How long one long poll of an events feed waits for the next item when following it
#: (``Client.watch``, ``Client.follow``), as ``baton watch`` waits; the hub caps it by its
#: ``long_poll_wait_max``.
FEED_WAIT_S = 25.0

# Retries of idempotent calls (submit, batch submit, reads).

#: Tries of an idempotent call at most, the first included.
RETRY_ATTEMPTS_MAX = 5
#: The pause before the first retry; each later one doubles it (equal jitter), up to
#: ``RETRY_BACKOFF_MAX_S``.
RETRY_BACKOFF_BASE_S = 0.2
#: The longest pause between two tries of an idempotent call.
RETRY_BACKOFF_MAX_S = 5.0
#: The pause between two reads of ``wait`` while the hub cannot answer (restarting,
#: unreachable, busy), as ``baton wait`` pauses.
WAIT_RETRY_PACE_S = 1.0

# The hub's fixed bounds, checked before a request is sent.

#: Messages one batch carries at most (``BATCH_ITEMS_MAX``).
BATCH_ITEMS_MAX = 256
#: Bytes of JSON one batch body has at most (``BATCH_BYTES_MAX``).
BATCH_BYTES_MAX = 1024 * 1024
#: Objects and arrays a payload nests at most (``PAYLOAD_DEPTH_MAX``).
PAYLOAD_DEPTH_MAX = 64
#: Characters of a cancel, approve or reject reason at most (``REASON_CHARS_MAX``).
REASON_CHARS_MAX = 1024
#: Characters of a host, conversation or producer name at most (``NAME_CHARS_MAX``).
NAME_CHARS_MAX = 64
#: Characters of an idempotency key at most (``KEY_CHARS_MAX``).
KEY_CHARS_MAX = 128
#: Items one events feed page may be asked for at most (``FEED_PAGE_MAX_RANGE``); the hub also
#: caps it by its ``limits.feed_page_max``.
FEED_PAGE_LIMIT_MAX = 10_000
#: The largest value of a 32-bit unsigned field (``max_attempts``).
U32_MAX = 2**32 - 1
#: The largest value of a 64-bit unsigned field (``retry_backoff_ms``, ``approval_timeout_ms``).
U64_MAX = 2**64 - 1
#: Bytes of an error answer that is not the hub's ``{code, message}`` quoted in the error.
ERROR_QUOTE_BYTES_MAX = 200

# The spool.

#: Messages a spool holds at most by default, waiting and failed (``spool_messages_max``).
SPOOL_MESSAGES_MAX_DEFAULT = 10_000
#: Bytes of spooled requests a spool holds at most by default (``spool_bytes_max``): 256 MiB.
SPOOL_BYTES_MAX_DEFAULT = 256 * 1024 * 1024
#: The ceiling of the first pause of a flush whose hub does not answer; it doubles per failure.
SPOOL_RETRY_PAUSE_BASE_S = 0.1
#: The longest pause between two tries of a spooled message while no hub answers: a restarted
#: hub is found again within it.
SPOOL_RETRY_PAUSE_MAX_S = 2.0
#: How long a spool connection waits for another writer's lock (another process flushing).
SPOOL_BUSY_TIMEOUT_S = 5.0

# The harness.

#: The exit status with which a harness asks for a retry of its turn (``EX_TEMPFAIL``); the hub
#: retries while the message's ``max_attempts`` leaves room.
HARNESS_RETRY_EXIT_STATUS = 75

assert RETRY_ATTEMPTS_MAX >= 1
assert RETRY_BACKOFF_BASE_S <= RETRY_BACKOFF_MAX_S
# A retried call's worst case (every pause at its cap) stays within a few request timeouts.
assert RETRY_BACKOFF_MAX_S * RETRY_ATTEMPTS_MAX < 4 * REQUEST_TIMEOUT_S
# A long poll never waits longer than a request that does not wait may take in total.
assert LONG_POLL_WAIT_MAX_S <= REQUEST_TIMEOUT_S
assert FEED_WAIT_S <= LONG_POLL_WAIT_MAX_S
assert SPOOL_RETRY_PAUSE_BASE_S <= SPOOL_RETRY_PAUSE_MAX_S
