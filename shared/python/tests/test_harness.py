"""The harness helper: the turn from stdin and the environment, progress lines on a pipe, exit
statuses."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import unittest
from pathlib import Path

from baton_client import harness

ENV = {
    "BATON_DELIVERY_ID": "d-1",
    "BATON_MESSAGE_ID": "m-1",
    "BATON_CONVERSATION": "c",
    "BATON_SEQ": "7",
    "BATON_PRODUCER": "billing",
    "BATON_ATTEMPT_ID": "a-1",
    "BATON_ATTEMPT": "2",
    "BATON_INSTANCE_ID": "i-1",
    "BATON_RERUN": "retry",
}
SRC = str(Path(harness.__file__).resolve().parents[1])


def read_lines(fd: int) -> list[bytes]:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).splitlines(keepends=True)


class Turns(unittest.TestCase):
    def test_the_turn_is_read_from_stdin_and_the_environment(self) -> None:
        t = harness.read_turn(io.BytesIO(b'{"n": 1.50}'), ENV)
        self.assertEqual((t.delivery_id, t.seq, t.attempt, t.rerun, t.producer), ("d-1", 7, 2, "retry", "billing"))
        self.assertEqual(t.payload_text, '{"n": 1.50}')
        self.assertEqual(t.payload, {"n": 1.5})
        first = {k: v for k, v in ENV.items() if k != "BATON_RERUN"}
        self.assertIsNone(harness.read_turn(io.BytesIO(b"{}"), first).rerun)

    def test_a_harness_not_started_by_a_node_is_told_what_is_missing(self) -> None:
        for broken, says in (
            ({k: v for k, v in ENV.items() if k != "BATON_DELIVERY_ID"}, "BATON_DELIVERY_ID is not set"),
            ({**ENV, "BATON_SEQ": "seven"}, "BATON_SEQ"),
        ):
            with self.assertRaises(harness.HarnessError) as caught:
                harness.read_turn(io.BytesIO(b"{}"), broken)
            self.assertIn(says, str(caught.exception))
        with self.assertRaises(harness.HarnessError):
            harness.read_turn(io.BytesIO(b"{not json"), ENV)


class Progress(unittest.TestCase):
    def test_each_progress_object_is_one_utf8_json_line_on_the_pipe(self) -> None:
        r, w = os.pipe()
        try:
            p = harness.Progress({harness.PROGRESS_FD_VAR: str(w)}, stderr=io.StringIO())
            self.assertTrue(p.send({"step": "start", "pct": 0}))
            self.assertTrue(p.send({"text": "é\nline", "nested": {"a": [1, 2]}}))
            self.assertTrue(p.send({"big": "x" * 20_000}))
            with self.assertRaises(TypeError):
                p.send([1, 2])  # type: ignore[arg-type]
            with self.assertRaises(ValueError):
                p.send({"n": float("nan")})
        finally:
            os.close(w)
        lines = read_lines(r)
        os.close(r)
        self.assertEqual(len(lines), 3)
        self.assertTrue(all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines))
        decoded = [json.loads(line.decode("utf-8")) for line in lines]
        self.assertEqual(decoded[0], {"step": "start", "pct": 0})
        self.assertEqual(decoded[1]["text"], "é\nline")
        self.assertIn("é".encode(), lines[1], "UTF-8, not escaped")
        self.assertEqual(len(decoded[2]["big"]), 20_000)

    def test_without_the_variable_progress_is_a_noop_said_once(self) -> None:
        err = io.StringIO()
        p = harness.Progress({}, stderr=err)
        self.assertFalse(p.send({"a": 1}))
        self.assertFalse(p.send({"a": 2}))
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertIn("BATON_PROGRESS_FD is not set", err.getvalue())
        err = io.StringIO()
        self.assertFalse(harness.Progress({harness.PROGRESS_FD_VAR: "nope"}, stderr=err).send({"a": 1}))
        self.assertIn("not an open file descriptor", err.getvalue())

    def test_a_closed_pipe_stops_progress_without_failing_the_turn(self) -> None:
        r, w = os.pipe()
        os.close(r)
        err = io.StringIO()
        p = harness.Progress({harness.PROGRESS_FD_VAR: str(w)}, stderr=err)
        try:
            self.assertFalse(p.send({"a": 1}))
            self.assertFalse(p.send({"a": 2}))
        finally:
            os.close(w)
        self.assertEqual(err.getvalue().count("\n"), 1, err.getvalue())

    def test_a_harness_process_writes_progress_on_the_descriptor_the_node_names(self) -> None:
        script = (
            "from baton_client import harness\n"
            "def turn(t):\n"
            "    harness.progress({'attempt': t.attempt, 'step': 'one'})\n"
            "    harness.progress({'step': 'two'})\n"
            "    if t.payload.get('retry'):\n"
            "        raise harness.RetryLater('not now')\n"
            "    return {'seq': t.seq}\n"
            "harness.run(turn)\n"
        )
        for payload, status in ((b"{}", 0), (b'{"retry": true}', 75)):
            r, w = os.pipe()
            env = {**ENV, harness.PROGRESS_FD_VAR: str(w), "PYTHONPATH": SRC}
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", script], input=payload, env=env, pass_fds=(w,), capture_output=True, timeout=60
                )
            finally:
                os.close(w)
            lines = read_lines(r)
            os.close(r)
            self.assertEqual(proc.returncode, status, proc.stderr.decode())
            self.assertEqual([json.loads(x) for x in lines], [{"attempt": 2, "step": "one"}, {"step": "two"}])
            if status == 0:
                self.assertEqual(json.loads(proc.stdout), {"seq": 7})
            else:
                self.assertIn(b"not now", proc.stderr)
        # Without the variable: the turn runs, and stderr says once that progress is not sent.
        env = {**ENV, "PYTHONPATH": SRC}
        proc = subprocess.run([sys.executable, "-c", script], input=b"{}", env=env, capture_output=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr.decode())
        self.assertEqual(proc.stderr.decode().count("BATON_PROGRESS_FD is not set"), 1)

    def test_a_failing_turn_exits_1(self) -> None:
        script = "from baton_client import harness\ndef turn(t):\n    raise RuntimeError('broken tool')\nharness.run(turn)\n"
        proc = subprocess.run(
            [sys.executable, "-c", script], input=b"{}", env={**ENV, "PYTHONPATH": SRC}, capture_output=True, timeout=60
        )
        self.assertEqual(proc.returncode, 1)
        self.assertIn(b"broken tool", proc.stderr)


if __name__ == "__main__":
    unittest.main()
