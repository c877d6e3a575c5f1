#!/usr/bin/env python3
"""A Baton producer built on the `baton_client` package (`pip install shared/python`).

Submits one message over mutual TLS, waits until every delivery of it has ended (through the
retries the harness asks for and an operator's redrives, as `baton wait` does), and prints the
message as JSON:

    python3 producer.py --hub https://hub.example:7443 \
        --ca ca.crt --cert billing.crt --key billing.key \
        --conversation support --to host-a --idempotency-key order-42 \
        --payload '{"text": "hello"}'

With --watch it prints the message's events on stderr as they happen, one line each (its
deliveries' state changes, the progress its harness reports, each run's outcome), following the
message's events feed until the message settled.

The certificate comes from `baton-hub enroll producer NAME --out DIR` (NAME.crt, NAME.key,
ca.crt). Without --to the message goes to the conversation's members. Without
--idempotency-key the client makes one (printed on stderr); running again with the same key
and payload answers with the same message, so a producer that lost its answer simply runs again.

Exit status: 0 every delivery succeeded; 1 one failed or ended unknown; 2 usage or a request
the hub refused (its code and message are printed); 4 the hub could not be reached, or the wait
ran out first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import baton_client as baton


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--hub", required=True, help="the hub's URL, https://HOST:PORT")
    p.add_argument("--ca", required=True, help="the hub CA certificate (ca.crt)")
    p.add_argument("--cert", required=True, help="this producer's certificate")
    p.add_argument("--key", required=True, help="this producer's private key")
    p.add_argument("--conversation", required=True)
    p.add_argument("--to", action="append", default=[], help="a recipient host (repeat; default: the members)")
    p.add_argument("--idempotency-key", help="names this message; a retry reuses it (default: a new one)")
    p.add_argument("--payload", default="{}", help="the payload, JSON text, sent exactly as written (default {})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the outcome")
    p.add_argument("--watch", action="store_true", help="print the message's events on stderr as they happen")
    args = p.parse_args(argv)

    try:
        with baton.Client(args.hub, ca=args.ca, cert=args.cert, key=args.key) as client:
            sent = client.submit(
                args.conversation, baton.RawJson(args.payload), to=args.to or None, idempotency_key=args.idempotency_key
            )
            if args.idempotency_key is None:
                print(f"producer: idempotency key {sent.idempotency_key}", file=sys.stderr)
            if args.watch:
                for event in client.watch(sent.message_id, timeout_s=args.timeout):
                    print(f"producer: {describe(event)}", file=sys.stderr)
            message = client.wait(sent.message_id, timeout_s=args.timeout)
    except baton.WaitTimeoutError as e:
        print(json.dumps(dataclasses.asdict(e.last), indent=2))
        print(f"producer: {e}", file=sys.stderr)
        return 4
    except (baton.RefusedError, baton.InvalidArgumentError) as e:
        print(f"producer: {e}", file=sys.stderr)
        return 2
    except baton.BatonError as e:
        print(f"producer: {e}", file=sys.stderr)
        return 4
    print(json.dumps(dataclasses.asdict(message), indent=2))
    return 0 if message.succeeded else 1


def describe(event: baton.FeedEvent) -> str:
    """One line of an events feed's item."""
    if isinstance(event, baton.StateEvent):
        what = f"{event.from_ or 'created'} -> {event.to} by {event.actor}"
    elif isinstance(event, baton.ProgressEvent):
        what = f"progress #{event.seq} (run {event.attempt}) {json.dumps(event.progress)}"
    elif isinstance(event, baton.OutcomeEvent):
        what = f"run {event.attempt} {event.outcome}"
    else:
        what = event.kind
    return f"{event.host} {event.delivery_id}: {what}"


if __name__ == "__main__":
    sys.exit(main())
