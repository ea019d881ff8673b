"""A torch process group's store as the mailbox the ranks' logs travel
through: a real gloo group (a world of one, in a process of its own)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_bytes_posted_are_taken_once_and_an_absent_key_waits_its_bound() -> None:
    pytest.importorskip("torch.distributed")
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PATH": "",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.orchestrator.mailbox_worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["taken_whole"], seen["taken_once"], seen["absent"]) == (True, True, True)
    # Waited for the key that never came, and not much longer than asked.
    assert 0.25 <= seen["waited_s"] < 10
