"""docs/tasks.md's worked example (2026-07-28, the Python client) runs twice against one journal.

The docs check (`test_snippets.py`) runs each program once, in a fresh directory. The example
promises more: a repeat of a task-creating call gets the same task. Its second run, on the
journal the first left behind (the relative `file://.mcp-durable/tasks-example`), repeats every
call of the first, so each answer is a repeat of a finished call: the task the first run
created, with its id, never the plain result (which the program cannot read a task id from).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.docs.snippets import REPO, Block, blocks
from tests.docs.test_snippets import run_env

TIMEOUT = 60
TASK_LINE = re.compile(r"^task (?P<id>\S+) +(?P<status>\w+) \| repeat gets the same task: (?P<same>\w+)$", re.M)


def worked_example() -> Block:
    """The one python block of docs/tasks.md that is a whole client program."""
    found = [b for b in blocks(REPO / "docs" / "tasks.md") if b.lang == "python" and "anyio.run(main)" in b.text]
    assert len(found) == 1, "docs/tasks.md should show one worked client program"
    return found[0]


def run_example(script: Path) -> str:
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"{worked_example().where} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_worked_tasks_example_runs_twice_on_one_journal_and_the_repeat_gets_the_first_task(
    tmp_path: Path,
) -> None:
    script = tmp_path / "tasks_example.py"
    script.write_text(worked_example().text)
    first = run_example(script)
    second = run_example(script)
    created, repeated = TASK_LINE.search(first), TASK_LINE.search(second)
    assert created is not None and repeated is not None, first + second
    assert created["same"] == "True" and repeated["same"] == "True"
    assert repeated["id"] == created["id"]  # the second run's calls are repeats: the first run's task
    assert repeated["status"] == "completed"  # it finished in the first run
    for out in (first, second):
        assert "completed report R-1 is ready" in out and "report R-2 is ready" in out
