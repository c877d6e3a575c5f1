"""What the tests share: the hub the end-to-end suite started (from the environment), and a
client whose HTTP goes to a function instead of a hub (httpx's ``MockTransport``), so the
flows, the retry rules and the decoding run unchanged without a network."""

from __future__ import annotations

import json
import os
import unittest
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from baton_client._api import Api
from baton_client._steps import Flow, RetryPolicy
from baton_client._transport import SyncDriver

#: Set by the end-to-end suite (``tests/it/python_client.rs``): the hub's URL, and the CA,
#: certificate and key of the producer it enrolled.
HUB_VARS = ("BATON_TEST_HUB_URL", "BATON_TEST_CA", "BATON_TEST_CERT", "BATON_TEST_KEY")
#: The node host serving the hub (its harness is ``e2e_harness.py``).
HOST_VAR = "BATON_TEST_HOST"
#: Which outage phase to run (``spool-down``, ``spool-up``); unset: none.
PHASE_VAR = "BATON_TEST_PHASE"
#: The spool directories of the outage phases: one this package writes, one ``baton`` wrote.
SPOOL_VAR, RUST_SPOOL_VAR = "BATON_TEST_SPOOL", "BATON_TEST_RUST_SPOOL"

#: Retries fast enough for tests.
FAST = RetryPolicy(attempts_max=3, backoff_base_s=0.001, backoff_max_s=0.002)


@dataclass(frozen=True)
class HubEnv:
    url: str
    ca: str
    cert: str
    key: str
    host: str


def hub_env() -> HubEnv | None:
    """The hub of the end-to-end suite, or ``None`` when these tests run alone."""
    url, ca, cert, key = (os.environ.get(v, "") for v in HUB_VARS)
    if not (url and ca and cert and key):
        return None
    return HubEnv(url, ca, cert, key, os.environ.get(HOST_VAR, ""))


def needs_hub(cls: type[unittest.TestCase]) -> type[unittest.TestCase]:
    """Skips a test class unless a real hub is named in the environment."""
    return unittest.skipUnless(hub_env(), "no hub: run by tests/it/python_client.rs")(cls)


#: A fake hub: takes the request, answers (or raises an httpx error).
Handler = Callable[[httpx.Request], httpx.Response]


class Fake:
    """Runs flows against ``handler``, recording every request."""

    def __init__(self, handler: Handler, retry: RetryPolicy = FAST) -> None:
        self.requests: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return handler(request)

        http = httpx.Client(base_url="https://hub.test", transport=httpx.MockTransport(record))
        self.driver = SyncDriver(http)
        self.api = Api(retry)

    def run(self, flow: Flow[object]) -> object:
        return self.driver.run(flow)


def answer(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(body).encode())


def scripted(*answers: httpx.Response | Exception) -> Handler:
    """A handler answering with ``answers`` in turn (an exception is raised); the last one
    repeats."""
    queue = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        a = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(a, Exception):
            raise a
        return a

    return handle


MESSAGE_ID = "0190aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee"
DELIVERY_ID = "0190aaaa-bbbb-7ccc-8ddd-ffffffffffff"


def accepted(key: str = "k", duplicate: bool = False, seq: int = 1) -> dict[str, object]:
    return {
        "message_id": MESSAGE_ID,
        "seq": seq,
        "duplicate": duplicate,
        "deliveries": [{"delivery_id": DELIVERY_ID, "host": "host-a", "state": "queued"}],
    }


def attempt(run: int, outcome: str) -> dict[str, object]:
    return {
        "attempt_id": f"a{run}",
        "report_id": f"r{run}",
        "outcome": outcome,
        "exit_code": 0 if outcome == "succeeded" else 75,
        "signal": None,
        "duration_ms": 5,
        "result": None,
        "reason": None,
        "reported_at_ms": 1,
        "attempt": run,
        "retryable": False,
        "rerun": None,
        "caused_by": "hub",
        "stderr_tail": None,
        "stderr_dropped_bytes": None,
    }


def delivery(state: str, run: int = 1, attempts: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {
        "delivery_id": DELIVERY_ID,
        "host": "host-a",
        "state": state,
        "reason": None,
        "updated_at_ms": 1,
        "attempts": attempts or [],
        "attempt": run,
        "max_attempts": 3,
        "not_before_ms": None,
        "cancel_requested_at_ms": None,
        "cancel_reason": None,
    }


def view(*deliveries: dict[str, object], omitted: dict[str, object] | None = None) -> dict[str, object]:
    return {
        "message_id": MESSAGE_ID,
        "conversation": "c",
        "seq": 1,
        "producer": "p",
        "idempotency_key": "k",
        "payload": {"x": 1},
        "accepted_at_ms": 1,
        "deliveries": list(deliveries),
        "omitted": omitted,
    }
