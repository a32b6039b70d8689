"""The seed-style agent process (`examples/agent_process.py`), SIGKILLed and recovered, on the file and
SQLite journals."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_process.py"
STEPS = 10
CHECKPOINT_EVERY = 3


def run_agent(journal: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "run",
            "--journal",
            journal,
            "--steps",
            str(STEPS),
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            *extra,
        ],
        capture_output=True,
        timeout=120,
    )


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_killed_agent_recovers_its_context_and_lifecycle_and_resumes_after_its_last_step(
    tmp_path: Path, kind: str
) -> None:
    journal = f"file:{tmp_path / 'journal'}" if kind == "file" else f"sqlite:{tmp_path / 'agent.db'}"
    crash_after = random.randrange(STEPS - 1)
    killed = run_agent(journal, "--crash-after", str(crash_after))
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]

    resumed = run_agent(journal)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    outcome = orjson.loads(resumed.stdout.splitlines()[-1])
    done = crash_after + 1
    expected_context = {"steps_done": done, **{f"finding_{i}": f"finding {i}" for i in range(done)}}
    assert outcome["recovered"]["context_state"] == expected_context
    assert outcome["recovered"]["lifecycle_state"] == "running"
    # two context updates per step since the last checkpoint (plus the first transition when none)
    since_checkpoint = done % CHECKPOINT_EVERY
    first_transition = 1 if done < CHECKPOINT_EVERY else 0
    assert outcome["recovered"]["entries_replayed"] == 2 * since_checkpoint + first_transition
    assert outcome["ran"] == list(range(done, STEPS))

    finished = orjson.loads(run_agent(journal).stdout.splitlines()[-1])
    assert finished["recovered"]["lifecycle_state"] == "done"
    assert finished["recovered"]["context_state"]["steps_done"] == STEPS
    assert finished["recovered"]["entries_replayed"] == 0
    assert finished["ran"] == []
