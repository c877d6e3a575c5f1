"""The harness the end-to-end suite's node runs (``tests/it/python_client.rs``), built on
``baton_client.harness``: it answers with the turn it saw, asks for one retry when the payload
says ``"do": "retry-once"``, sleeps when it says ``"do": "sleep"`` (for a cancel), and sends a
progress line at each step."""

from __future__ import annotations

import time

from baton_client import harness


def turn(t: harness.Turn) -> object:
    payload = t.payload
    do = payload.get("do") if isinstance(payload, dict) else None
    harness.progress({"attempt": t.attempt, "step": "start"})
    if do == "retry-once" and t.attempt == 1:
        raise harness.RetryLater("asked to retry once")
    if do == "sleep" and isinstance(payload, dict):
        seconds = payload.get("seconds", 0)
        time.sleep(float(seconds) if isinstance(seconds, (int, float)) else 0.0)
    harness.progress({"attempt": t.attempt, "step": "done"})
    return {
        "delivery_id": t.delivery_id,
        "message_id": t.message_id,
        "conversation": t.conversation,
        "seq": t.seq,
        "producer": t.producer,
        "attempt": t.attempt,
        "rerun": t.rerun,
        "payload": payload,
    }


if __name__ == "__main__":
    harness.run(turn)
