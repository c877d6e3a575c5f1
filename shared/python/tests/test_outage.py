"""The spool through a hub outage, in the phases ``tests/it/python_client.rs`` runs around
stopping and restarting the hub (each phase is skipped unless ``BATON_TEST_PHASE`` names it):

- ``spool-down`` (the hub is stopped): sends wait in this package's spool; a spool ``baton``
  wrote meanwhile is read, and the same message spooled again here is recognised byte for
  byte; one more message is added to it. Between the phases the suite has ``baton spool
  status`` read this package's spool, and, once the hub is back, ``baton spool flush`` deliver
  it.
- ``spool-up`` (the hub is back): this package flushes the spool ``baton`` wrote, and every
  message of both spools is accepted once, in spool order per conversation.
"""

from __future__ import annotations

import os
import unittest
from collections.abc import Callable

import baton_client as b

from support import PHASE_VAR, RUST_SPOOL_VAR, SPOOL_VAR, hub_env

#: This package's sends during the outage: (conversation, key), in the order sent.
SENT = [("py-out-a", "out-1"), ("py-out-b", "out-2"), ("py-out-a", "out-3"), ("py-out-a", "out-4"), ("py-out-b", "out-5")]
#: The message ``baton send --spool`` spooled (conversation, key, payload text), and the one
#: this package adds to that spool.
RUST_SENT = ("py-out-r", "rs-1", '{"n": 1}')
ADDED = ("py-out-r", "rs-2")
#: How long the flush of the ``spool-up`` phase keeps trying.
FLUSH_WAIT_S = 60.0


def phase(name: str) -> Callable[[type[unittest.TestCase]], type[unittest.TestCase]]:
    """Skips a test class unless ``BATON_TEST_PHASE`` is ``name`` and a hub is named."""
    return unittest.skipUnless(os.environ.get(PHASE_VAR) == name and hub_env(), f"not the {name} phase")


def client() -> b.Client:
    e = hub_env()
    assert e is not None
    return b.Client(e.url, ca=e.ca, cert=e.cert, key=e.key)


def host() -> str:
    e = hub_env()
    assert e is not None
    return e.host


@phase("spool-down")
class HubDown(unittest.TestCase):
    def test_sends_wait_in_the_spool_while_no_hub_answers(self) -> None:
        with client() as c, c.spooler(os.environ[SPOOL_VAR]) as spool:
            for conversation, key in SENT:
                sent = spool.send(conversation, {"key": key}, to=[host()], idempotency_key=key)
                self.assertTrue(sent.waiting, sent)
                self.assertFalse(sent.spooled.already)
                self.assertIsInstance(sent.report.stopped, b.UnavailableError)
            # Sent again unchanged, a spooled message is not spooled twice.
            self.assertTrue(spool.push(b.message(SENT[0][0], {"key": SENT[0][1]}, to=[host()], idempotency_key=SENT[0][1])).already)
            st = spool.status()
            self.assertEqual((st.waiting, st.failed), (len(SENT), ()))
            assert st.last_error is not None
            self.assertIn("unreachable", st.last_error[1])

    def test_a_spool_baton_wrote_is_read_and_its_messages_recognised(self) -> None:
        conversation, key, payload = RUST_SENT
        with b.Spool(os.environ[RUST_SPOOL_VAR]) as spool:
            self.assertEqual([(k, s) for _, k, s in spool.keys()], [(key, "waiting")])
            same = b.message(conversation, b.RawJson(payload), to=[host()], idempotency_key=key)
            self.assertTrue(spool.push(same).already, "the same request, written the same way")
            with self.assertRaises(b.SpoolKeyConflictError):
                spool.push(b.message(conversation, b.RawJson('{"n": 2}'), to=[host()], idempotency_key=key))
            spool.push(b.message(ADDED[0], {"key": ADDED[1]}, to=[host()], idempotency_key=ADDED[1]))
            self.assertEqual(spool.status().waiting, 2)


@phase("spool-up")
class HubBack(unittest.TestCase):
    def test_every_spooled_message_is_accepted_once_in_order(self) -> None:
        with client() as c:
            with c.spooler(os.environ[RUST_SPOOL_VAR]) as spool:
                report = spool.flush(wait_s=FLUSH_WAIT_S)
                self.assertIsNone(report.stopped)
                self.assertEqual(
                    [s.result.idempotency_key for s in report.settled if isinstance(s, b.Accepted)], [RUST_SENT[1], ADDED[1]]
                )
                self.assertEqual(spool.status().waiting, 0)
            with b.Spool(os.environ[SPOOL_VAR], read_only=True) as py_spool:
                self.assertEqual(py_spool.status().waiting, 0, "baton spool flush delivered it")
            by_conversation: dict[str, list[str]] = {}
            for conversation, key in [*SENT, RUST_SENT[:2], ADDED]:
                by_conversation.setdefault(conversation, []).append(key)
            for conversation, keys in by_conversation.items():
                seqs = [c.get_by_key(k).seq for k in keys]
                self.assertEqual(seqs, sorted(seqs), f"{conversation}: accepted out of spool order: {keys} {seqs}")
                self.assertEqual(c.conversation(conversation).last_seq, len(keys), f"{conversation}: none twice, none extra")
                for k in keys:
                    self.assertTrue(c.wait(idempotency_key=k, timeout_s=90.0).succeeded)


if __name__ == "__main__":
    unittest.main()
