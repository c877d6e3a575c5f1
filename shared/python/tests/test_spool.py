"""The spool file and its delivering loop, against a fake hub."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import unittest
from pathlib import Path

import httpx

import baton_client as b
from baton_client.spool import SPOOL_FILE, Spool, flush_flow, migrations, send_flow

from support import Fake, accepted, answer, scripted

REPO_SCHEMA = Path(__file__).resolve().parents[3] / "schema" / "spool"


def req(conversation: str, key: str, payload: str = "{}") -> b.SubmitRequest:
    return b.message(conversation, b.RawJson(payload), to=["host-a"], idempotency_key=key)


class Store(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name) / "spool"

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def open(self, limits: b.SpoolLimits = b.SpoolLimits()) -> Spool:
        s = Spool(self.dir, limits)
        self.addCleanup(s.close)
        return s

    def drain(self, s: Spool) -> list[str]:
        out = []
        while (r := s.next_ready()) is not None:
            self.assertTrue(s.confirmed(r.position))
            out.append(r.idempotency_key)
        return out

    def test_the_schema_is_the_repositorys(self) -> None:
        if not REPO_SCHEMA.is_dir():
            self.skipTest("not run from the source tree")
        shipped = sorted(p.name for p in REPO_SCHEMA.glob("*.sql"))
        self.assertEqual(tuple(shipped), b.spool.MIGRATION_FILES)
        for name, text in zip(shipped, migrations()):
            self.assertEqual((REPO_SCHEMA / name).read_text(encoding="utf-8"), text, name)

    def test_it_opens_strictly(self) -> None:
        s = self.open()
        conn = sqlite3.connect(self.dir / SPOOL_FILE)
        try:
            self.assertEqual(conn.execute("PRAGMA journal_mode").fetchone()[0], "wal")
            self.assertEqual(conn.execute("PRAGMA user_version").fetchone()[0], 1)
        finally:
            conn.close()
        self.assertEqual(s._conn.execute("PRAGMA synchronous").fetchone()[0], 2)

    def test_messages_go_in_spool_order_with_their_exact_request(self) -> None:
        s = self.open()
        payload = '{"n": 1.50, "big": 12345678901234567890123}'
        for c, k in (("c1", "k1"), ("c2", "k2"), ("c1", "k3")):
            self.assertFalse(s.push(req(c, k, payload)).already)
        first = s.next_ready()
        assert first is not None
        self.assertEqual(json.loads(first.request)["idempotency_key"], "k1")
        self.assertIn(payload, first.request)
        self.assertEqual(self.drain(s), ["k1", "k2", "k3"])

    def test_a_message_stays_until_confirmed_even_across_a_reopen(self) -> None:
        s = self.open()
        p = s.push(req("c", "k1"), at_ms=1_000).position
        s.push(req("c", "k2"), at_ms=1_001)
        s.tried(p, "hub unreachable: connection refused", at_ms=2_000)
        st = s.status()
        self.assertEqual((st.waiting, st.oldest_spooled_at_ms), (2, 1_000))
        self.assertEqual(st.last_error, (2_000, "hub unreachable: connection refused"))
        s.close()
        s = self.open()
        self.assertEqual(self.drain(s), ["k1", "k2"])
        self.assertFalse(s.confirmed(p), "confirming twice removes nothing")
        p2 = s.push(req("c", "k3")).position
        self.assertGreater(p2, p, "positions are never reused")

    def test_the_same_key_is_spooled_once_and_other_content_is_refused(self) -> None:
        s = self.open()
        first = s.push(req("c", "k", '{"a": 1}'))
        again = s.push(req("c", "k", '{"a": 1}'))
        self.assertEqual((again.position, again.already), (first.position, True))
        with self.assertRaises(b.SpoolKeyConflictError) as caught:
            s.push(req("c", "k", '{"a": 2}'))
        self.assertEqual(caught.exception.position, first.position)

    def test_a_failed_message_holds_back_its_conversation_only(self) -> None:
        s = self.open()
        bad = s.push(req("c1", "k1")).position
        s.push(req("c1", "k2"))
        s.push(req("c2", "k3"))
        self.assertTrue(s.failed(bad, 403, "forbidden", "refused", at_ms=5))
        st = s.status()
        self.assertEqual((st.waiting, st.blocked, len(st.failed)), (2, 1, 1))
        self.assertEqual((st.failed[0].status, st.failed[0].code), (403, "forbidden"))
        r = s.next_ready()
        assert r is not None
        self.assertEqual(r.idempotency_key, "k3")
        s.confirmed(r.position)
        self.assertIsNone(s.next_ready())
        s.retry(bad)
        self.assertEqual(self.drain(s), ["k1", "k2"])
        with self.assertRaises(b.SpoolNotFailedError):
            s.discard(bad)

    def test_bounds_refuse_a_push_and_spool_nothing(self) -> None:
        s = self.open(b.SpoolLimits(messages_max=2, bytes_max=10_000))
        s.push(req("c", "k1"))
        s.push(req("c", "k2"))
        with self.assertRaises(b.SpoolFullError) as caught:
            s.push(req("c", "k3"))
        self.assertIn("spool_messages_max is 2", str(caught.exception))
        s.close()
        s = self.open(b.SpoolLimits(bytes_max=50))
        with self.assertRaises(b.SpoolFullError):
            s.push(req("c", "k4", '"' + "x" * 100 + '"'))
        self.assertEqual([k for _, k, _ in s.keys()], ["k1", "k2"])
        with self.assertRaises(b.InvalidArgumentError):
            Spool(self.dir, b.SpoolLimits(messages_max=0))

    def test_a_newer_or_damaged_spool_is_refused_and_left_as_it_was(self) -> None:
        self.open().close()
        path = self.dir / SPOOL_FILE
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 9")
        conn.commit()
        conn.close()
        with self.assertRaises(b.SpoolRefusedError) as caught:
            Spool(self.dir)
        self.assertIn("schema version 9", str(caught.exception))
        self.assertIn(str(path), str(caught.exception))
        path.write_bytes(b"not a database at all" * 100)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with self.assertRaises(b.SpoolRefusedError):
            Spool(self.dir)
        self.assertEqual(path.read_bytes(), b"not a database at all" * 100)
        self.assertFalse(Path(f"{path}-wal").exists())
        with self.assertRaises(b.SpoolRefusedError):
            Spool(Path(self.tmp.name) / "none", read_only=True)

    def test_a_schema_changed_by_hand_is_refused(self) -> None:
        self.open().close()
        conn = sqlite3.connect(self.dir / SPOOL_FILE)
        conn.execute("CREATE TABLE extra (x)")
        conn.commit()
        conn.close()
        with self.assertRaises(b.SpoolRefusedError) as caught:
            Spool(self.dir)
        self.assertIn("schema differs", str(caught.exception))


class Flush(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.spool = Spool(os.path.join(self.tmp.name, "spool"))

    def tearDown(self) -> None:
        self.spool.close()
        self.tmp.cleanup()

    def test_each_message_leaves_only_once_the_hub_confirmed_it(self) -> None:
        for k in ("k1", "k2", "k3"):
            self.spool.push(req("c", k))
        fake = Fake(scripted(answer(201, accepted()), answer(200, accepted(duplicate=True)), answer(201, accepted())))
        report = fake.driver.run(flush_flow(self.spool, fake.api, 0.0))
        self.assertIsNone(report.stopped)
        self.assertEqual([s.position for s in report.settled], [1, 2, 3])
        self.assertTrue(all(isinstance(s, b.Accepted) for s in report.settled))
        self.assertEqual([json.loads(r.content)["idempotency_key"] for r in fake.requests], ["k1", "k2", "k3"])
        self.assertEqual(self.spool.status().waiting, 0)

    def test_a_refused_message_is_kept_failed_and_a_401_fails_none(self) -> None:
        self.spool.push(req("c1", "k1"))
        self.spool.push(req("c1", "k2"))
        self.spool.push(req("c2", "k3"))
        fake = Fake(scripted(answer(403, {"code": "forbidden", "message": "scope"}), answer(201, accepted())))
        report = fake.driver.run(flush_flow(self.spool, fake.api, 0.0))
        self.assertIsInstance(report.settled[0], b.Refused)
        self.assertEqual([json.loads(r.content)["idempotency_key"] for r in fake.requests], ["k1", "k3"])
        st = self.spool.status()
        self.assertEqual((st.waiting, st.blocked, st.failed[0].code, st.failed[0].status), (1, 1, "forbidden", 403))
        self.spool.discard(st.failed[0].position)
        fake = Fake(scripted(answer(401, {"code": "unknown_certificate", "message": "who"})))
        report = fake.driver.run(flush_flow(self.spool, fake.api, 0.0))
        self.assertIsInstance(report.stopped, b.DeniedError)
        self.assertEqual((self.spool.status().waiting, self.spool.status().failed), (1, ()))

    def test_no_hub_keeps_every_message_and_stops_at_the_deadline(self) -> None:
        fake = Fake(scripted(httpx.ConnectError("connection refused")))
        sent = fake.driver.run(send_flow(self.spool, fake.api, req("c", "k1"), 0.3))
        self.assertTrue(sent.waiting)
        self.assertIsInstance(sent.report.stopped, b.TransportError)
        self.assertGreater(len(fake.requests), 1, "tried again within the wait")
        st = self.spool.status()
        self.assertEqual(st.waiting, 1)
        assert st.last_error is not None
        self.assertTrue(st.last_error[1].startswith("hub unreachable: "), st.last_error)
        fake = Fake(scripted(answer(201, accepted())))
        sent = fake.driver.run(send_flow(self.spool, fake.api, req("c", "k2"), 0.0))
        assert sent.accepted is not None
        self.assertEqual(sent.accepted.idempotency_key, "k2")
        self.assertEqual(len(sent.report.settled), 2, "the older message went first")


if __name__ == "__main__":
    unittest.main()
