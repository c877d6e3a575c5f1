#!/usr/bin/env python3
"""A Baton harness: what a node runs for each delivered turn.

The node starts it once per turn, without a shell, with the message's payload (JSON) on stdin
and the delivery's ids in the environment:

    BATON_DELIVERY_ID  BATON_MESSAGE_ID  BATON_ATTEMPT_ID  BATON_INSTANCE_ID
    BATON_CONVERSATION  BATON_SEQ  BATON_PRODUCER

Whatever it writes to stdout becomes the attempt's result (bounded by the node's
result_bytes_max), and its exit status the outcome: 0 succeeded; 75 failed but retryable
(when the message allows more attempts); anything else failed. stderr goes to the node's log.

Configure a node with it (node.toml):

    command = ["/usr/bin/python3", "/opt/baton/harness.py"]

This one answers {"text": "..."} with the text's word count and the text upper-cased.
"""

import json
import os
import sys

def turn(payload, env):
    """The turn's work: here, a small transformation of the payload's text."""
    text = payload.get("text", "")
    return {
        "delivery_id": env.get("BATON_DELIVERY_ID"),
        "conversation": env.get("BATON_CONVERSATION"),
        "seq": int(env.get("BATON_SEQ", "0")),
        "producer": env.get("BATON_PRODUCER"),
        "words": len(text.split()),
        "upper": text.upper(),
    }


def main():
    try:
        payload = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"harness: the payload is not JSON: {e}", file=sys.stderr)
        return 1
    if not isinstance(payload, dict):
        print("harness: the payload is not a JSON object", file=sys.stderr)
        return 1
    json.dump(turn(payload, os.environ), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
