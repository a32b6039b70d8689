"""Start a child process, let it get going, SIGKILL it: the shape of every kill-at-random test."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kill_when_ready(module: str, args: list[str], delay: float) -> tuple[str, int]:
    """Run `python -m module *args` from the repository root, wait for its `ready` line, SIGKILL it
    `delay` seconds later; returns what it printed after `ready`, and its exit code."""
    child = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    assert first == b"ready\n", (first, child.stderr.read() if child.stderr else b"")
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate(timeout=60)
    return out.decode(errors="replace"), child.returncode
