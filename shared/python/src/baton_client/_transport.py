"""The two drivers that run flows (``_steps``) over httpx, and what they share: the mTLS
context, the hub URL check, and how a failed request is classified.

mTLS: the hub CA is the only trusted root (no system roots), the hub's name is checked against
its certificate, and the producer presents its certificate and key, all in one
``ssl.SSLContext`` handed to httpx.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
import urllib.parse
from typing import TypeVar, cast

import httpx

from .errors import BatonError, CertificateRevokedError, InvalidArgumentError, TransportError
from .limits import CONNECT_TIMEOUT_S
from ._steps import Answer, Blocking, Call, Flow, Sleep

T = TypeVar("T")

_JSON_HEADERS = {"content-type": "application/json"}


def tls_context(ca: str | os.PathLike[str], cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> ssl.SSLContext:
    """The client's TLS context: trusts the hub CA in ``ca`` alone, checks the hub's name, and
    presents ``cert`` with its ``key``. An unreadable or wrong file is an
    ``InvalidArgumentError`` naming it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED by default
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=os.fspath(ca))
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgumentError("ca", f"cannot load the hub CA from {os.fspath(ca)!r}: {e}") from None
    try:
        ctx.load_cert_chain(certfile=os.fspath(cert), keyfile=os.fspath(key))
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgumentError(
            "cert", f"cannot load the certificate {os.fspath(cert)!r} with its key {os.fspath(key)!r}: {e}"
        ) from None
    return ctx


def check_hub_url(hub_url: str) -> str:
    """``hub_url`` without a trailing slash, when it is ``https://HOST[:PORT]``."""
    parts = urllib.parse.urlsplit(hub_url)
    if parts.scheme != "https":
        raise InvalidArgumentError("hub_url", f"{hub_url!r} must start with https:// (the hub speaks mTLS only)")
    if not parts.hostname:
        raise InvalidArgumentError("hub_url", f"{hub_url!r} names no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidArgumentError("hub_url", f"{hub_url!r} must be https://HOST[:PORT], without a path")
    try:
        parts.port
    except ValueError as e:
        raise InvalidArgumentError("hub_url", f"{hub_url!r}: {e}") from None
    return hub_url.rstrip("/")


def transport_error(e: Exception) -> BatonError:
    """Classifies a failed request. A failure to connect means the hub never saw it; anything
    later (a timeout, a connection lost) may have reached it."""
    chain, seen, cur = [], set(), cast("BaseException | None", e)
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(str(cur) or type(cur).__name__)
        cur = cur.__cause__ or cur.__context__
    text = ": ".join(chain)
    lower = text.lower()
    if "certificate revoked" in lower or "certificate_revoked" in lower:
        return CertificateRevokedError(text)
    maybe_sent = not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol))
    if any(w in lower for w in ("certificate", "alert", "handshake")):
        text += " (the hub may have refused our client certificate: revoked or expired? the hub's log says why)"
    return TransportError(text, maybe_sent=maybe_sent)


def _timeout(c: Call) -> httpx.Timeout:
    return httpx.Timeout(c.timeout_s, connect=min(CONNECT_TIMEOUT_S, c.timeout_s))


class SyncDriver:
    """Runs flows in the calling thread over one ``httpx.Client``."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def send(self, c: Call) -> Answer:
        headers = _JSON_HEADERS if c.body is not None else None
        try:
            r = self.http.request(
                c.method, c.path, params=c.query or None, content=c.body, headers=headers, timeout=_timeout(c)
            )
        except httpx.HTTPError as e:
            raise transport_error(e) from e
        return Answer(r.status_code, r.content)

    def run(self, flow: Flow[T]) -> T:
        """Drives ``flow`` to its end; its value, or what it raised."""
        result: object = None
        thrown: BaseException | None = None
        while True:
            try:
                step = flow.throw(thrown) if thrown is not None else flow.send(result)
            except StopIteration as stop:
                return cast(T, stop.value)
            result, thrown = None, None
            try:
                if isinstance(step, Call):
                    result = self.send(step)
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                else:
                    result = step.fn()
            except Exception as e:  # handed to the flow, which decides
                thrown = e


class AsyncDriver:
    """Runs flows on the running event loop over one ``httpx.AsyncClient``; ``Blocking`` work
    runs on a worker thread, so the loop never waits on SQLite."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def send(self, c: Call) -> Answer:
        headers = _JSON_HEADERS if c.body is not None else None
        try:
            r = await self.http.request(
                c.method, c.path, params=c.query or None, content=c.body, headers=headers, timeout=_timeout(c)
            )
        except httpx.HTTPError as e:
            raise transport_error(e) from e
        return Answer(r.status_code, r.content)

    async def run(self, flow: Flow[T]) -> T:
        """Drives ``flow`` to its end; its value, or what it raised."""
        result: object = None
        thrown: BaseException | None = None
        while True:
            try:
                step = flow.throw(thrown) if thrown is not None else flow.send(result)
            except StopIteration as stop:
                return cast(T, stop.value)
            result, thrown = None, None
            try:
                if isinstance(step, Call):
                    result = await self.send(step)
                elif isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, Blocking):
                    result = await asyncio.to_thread(step.fn)
            except Exception as e:  # handed to the flow, which decides
                thrown = e
