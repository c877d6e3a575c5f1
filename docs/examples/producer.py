#!/usr/bin/env python3
"""A Baton producer with nothing but the Python standard library (ssl + http.client).

Submits one message over mutual TLS, then waits for how every delivery of it ended with the
long-poll read (GET /v1/messages/{id}?wait_ms=...), and prints the message as JSON:

    python3 producer.py --hub https://hub.example:7443 \
        --ca ca.crt --cert billing.crt --key billing.key \
        --conversation support --to host-a --idempotency-key order-42 \
        --payload '{"text": "hello"}'

The certificate comes from `baton-hub enroll producer NAME --out DIR` (NAME.crt, NAME.key,
ca.crt). Without --to the message goes to the conversation's members.

A submit is safe to retry: the idempotency key makes a repeat return the original message
(HTTP 200, "duplicate": true), so a connection lost before the answer is retried as it is.

Exit status: 0 every delivery succeeded; 1 one failed or ended unknown; 2 usage or a request
the hub refused (the error's code and message are printed); 4 the hub could not be reached, or
the wait ran out first.
"""

import argparse
import http.client
import json
import ssl
import sys
import time
import urllib.parse

# One long-poll asks the hub to wait at most this long (the hub caps it at long_poll_wait_max).
WAIT_MS = 25_000
# Each request's socket timeout: longer than one long-poll.
REQUEST_TIMEOUT_S = 40
# Attempts of one request while the hub is unreachable or answers 503, and the pause between.
ATTEMPTS = 5
RETRY_PAUSE_S = 1.0


class Refused(Exception):
    """The hub answered with an error body {"code", "message"}: retrying will not help."""

    def __init__(self, status, body):
        self.status = status
        self.code = body.get("code", "?") if isinstance(body, dict) else "?"
        super().__init__(f"{status} {self.code}: {body.get('message', body) if isinstance(body, dict) else body}")


class Hub:
    """The hub's producer endpoints over mTLS: the hub CA is the only trusted root."""

    def __init__(self, url, ca, cert, key):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"--hub must be an https:// URL, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 443
        self.tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        self.tls.load_cert_chain(cert, key)

    def call(self, method, path, body=None):
        """One request, retried while the hub is unreachable or unavailable (503); returns
        (status, JSON body). Every call here is safe to repeat."""
        for attempt in range(1, ATTEMPTS + 1):
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls, timeout=REQUEST_TIMEOUT_S)
            try:
                data = None if body is None else json.dumps(body).encode()
                headers = {"content-type": "application/json"} if data is not None else {}
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                answer = json.loads(resp.read() or b"null")
                if resp.status == 503 and attempt < ATTEMPTS:
                    time.sleep(RETRY_PAUSE_S)
                    continue
                if resp.status >= 400:
                    raise Refused(resp.status, answer)
                return resp.status, answer
            except (OSError, http.client.HTTPException):
                if attempt == ATTEMPTS:
                    raise
                time.sleep(RETRY_PAUSE_S)
            finally:
                conn.close()
        raise AssertionError("unreachable")

    def submit(self, conversation, key, payload, to):
        body = {"conversation": conversation, "idempotency_key": key, "payload": payload}
        if to:
            body["to"] = to
        return self.call("POST", "/v1/messages", body)[1]

    def read(self, message_id, wait_ms):
        path = f"/v1/messages/{urllib.parse.quote(message_id)}?wait_ms={wait_ms}"
        return self.call("GET", path)[1]


def current_attempt(delivery):
    """The reported attempt of the delivery's current run, or None. A retry or an operator's
    redrive starts a new run (`attempt` counts them): the attempts of earlier runs stay listed,
    and say nothing about how the current one ends."""
    run = delivery.get("attempt", 1)
    return next((a for a in reversed(delivery["attempts"]) if a.get("attempt", 1) == run), None)


def settled(delivery):
    """A delivery has ended: failed, unknown, or delivered with its current run reported."""
    state = delivery["state"]
    return state in ("failed", "unknown") or (state == "delivered" and current_attempt(delivery) is not None)


def succeeded(delivery):
    attempt = current_attempt(delivery)
    return delivery["state"] == "delivered" and attempt is not None and attempt["outcome"] == "succeeded"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hub", required=True, help="the hub's URL, https://HOST:PORT")
    p.add_argument("--ca", required=True, help="the hub CA certificate (ca.crt)")
    p.add_argument("--cert", required=True, help="this producer's certificate")
    p.add_argument("--key", required=True, help="this producer's private key")
    p.add_argument("--conversation", required=True)
    p.add_argument("--to", action="append", default=[], help="a recipient host (repeat; default: the members)")
    p.add_argument("--idempotency-key", required=True, help="names this message; a retry reuses it")
    p.add_argument("--payload", default="{}", help="the payload, JSON text (default {})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the outcome")
    args = p.parse_args(argv)
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as e:
        p.error(f"--payload is not JSON: {e}")

    try:
        hub = Hub(args.hub, args.ca, args.cert, args.key)
        accepted = hub.submit(args.conversation, args.idempotency_key, payload, args.to)
        message_id = accepted["message_id"]
        deadline = time.monotonic() + args.timeout
        message = hub.read(message_id, 0)
        while not all(settled(d) for d in message["deliveries"]):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                print(json.dumps(message, indent=2))
                print(f"producer: message {message_id} has not settled within {args.timeout}s", file=sys.stderr)
                return 4
            message = hub.read(message_id, min(WAIT_MS, left_ms))
    except Refused as e:
        print(f"producer: the hub refused: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError, http.client.HTTPException) as e:
        print(f"producer: {e}", file=sys.stderr)
        return 4
    print(json.dumps(message, indent=2))
    return 0 if all(succeeded(d) for d in message["deliveries"]) else 1


if __name__ == "__main__":
    sys.exit(main())
