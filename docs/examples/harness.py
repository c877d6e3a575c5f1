#!/usr/bin/env python3
"""A Baton harness, built on `baton_client.harness`: what a node runs for each delivered turn.

The node starts it once per turn, without a shell, with the message's payload (JSON) on stdin
and the turn's ids in the environment (BATON_DELIVERY_ID, BATON_MESSAGE_ID, BATON_CONVERSATION,
BATON_SEQ, BATON_PRODUCER, BATON_ATTEMPT_ID, BATON_ATTEMPT, BATON_INSTANCE_ID, and BATON_RERUN
on a retry or redrive), which `harness.run` reads into a `Turn`. What the turn returns becomes
the attempt's result (JSON on stdout, bounded by the node's result_bytes_max); raising
`harness.RetryLater` exits 75 (a retry, when the message allows more attempts); any other error
fails the turn (exit 1). `harness.progress` sends a progress line when the node takes them.

Configure a node with it (node.toml), the package installed for that interpreter:

    command = ["/usr/bin/python3", "/opt/baton/harness.py"]

This one answers {"text": "..."} with the text's word count and the text upper-cased.
"""

from __future__ import annotations

from baton_client import harness


def turn(t: harness.Turn) -> object:
    """The turn's work: here, a small transformation of the payload's text."""
    payload = t.payload
    if not isinstance(payload, dict):
        raise ValueError("the payload is not a JSON object")
    text = payload.get("text", "")
    if not isinstance(text, str):
        raise ValueError("the payload's text is not a string")
    harness.progress({"step": "counting", "chars": len(text)})
    return {
        "delivery_id": t.delivery_id,
        "conversation": t.conversation,
        "seq": t.seq,
        "producer": t.producer,
        "words": len(text.split()),
        "upper": text.upper(),
    }


if __name__ == "__main__":
    harness.run(turn)
