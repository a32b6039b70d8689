"""The crash model itself, on a recorded toy program: what survives is what POSIX promises."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from .recording import events_with_states
from .strace_log import parse, run_traced, strace_binary

if strace_binary() is None:
    if os.environ.get("CI"):
        pytest.fail("strace is required in CI for the power-loss harness", pytrace=False)
    pytest.skip("strace is not installed", allow_module_level=True)

PROGRAM = r"""
import os, sys, threading
root = sys.argv[1]
def dsync(p):
    fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY); os.fsync(fd); os.close(fd)
os.mkdir(f"{root}/d"); dsync(root)                                      # 1 mkdir, 2 fsync root
fd = os.open(f"{root}/d/a", os.O_WRONLY | os.O_CREAT, 0o600)            # 3 create a
os.write(fd, b"x" * 1000); os.fsync(fd)                                 # 4 write, 5 fsync a
dsync(f"{root}/d")                                                      # 6 fsync d
t = threading.Thread(target=lambda: os.pwrite(fd, b"y" * 600, 1000)); t.start(); t.join()  # 7
os.rename(f"{root}/d/a", f"{root}/d/b")                                 # 8 rename
"""


def _states(tmp_path: Path) -> list[tuple[str, Path, Path]]:
    root, log, program = tmp_path / "root", tmp_path / "log", tmp_path / "program.py"
    root.mkdir()
    program.write_text(PROGRAM)
    done = run_traced([sys.executable, str(program), str(root)], log, timeout=60)
    assert done.returncode == 0, done.stderr
    out = []
    for ev, model in events_with_states(parse(log), root, tmp_path / "no-markers"):
        durable, everything = tmp_path / f"d{ev.index}", tmp_path / f"a{ev.index}"
        model.crash_state(durable, None)
        model.crash_state(everything, _AllRandom())
        out.append((ev.label, durable, everything))
    return out


class _AllRandom(random.Random):
    """An RNG whose choices keep every unsynced change: the state a SIGKILL would leave."""

    def randint(self, a: int, b: int) -> int:
        return b

    def choice(self, seq: Any) -> Any:
        return "all"


def test_only_synced_data_and_names_of_synced_directories_survive(tmp_path: Path) -> None:
    states = _states(tmp_path)
    labels = [label.split()[0] + " " + label.split()[-1].rsplit("/", 1)[-1] for label, _, _ in states]
    assert [lbl.split()[0] for lbl in labels] == [
        "mkdir",
        "fsync",
        "create",
        "write",
        "fsync",
        "fsync",
        "write",
        "rename",
    ]
    by_step = {i + 1: (durable, everything) for i, (_, durable, everything) in enumerate(states)}
    # mkdir not yet synced: gone after a power loss; a SIGKILL would keep it.
    assert not (by_step[1][0] / "d").exists() and (by_step[1][1] / "d").is_dir()
    # the file's data synced, its name not (its directory not synced): gone.
    assert (by_step[2][0] / "d").is_dir() and not (by_step[5][0] / "d" / "a").exists()
    assert (by_step[5][1] / "d" / "a").read_bytes() == b"x" * 1000
    # directory synced: the file and its synced data survive.
    assert (by_step[6][0] / "d" / "a").read_bytes() == b"x" * 1000
    # an unsynced write (from another thread) is lost, or kept when nothing is lost.
    assert (by_step[7][0] / "d" / "a").read_bytes() == b"x" * 1000
    assert (by_step[7][1] / "d" / "a").read_bytes() == b"x" * 1000 + b"y" * 600
    # an unsynced rename is lost: the old name is what survives.
    assert sorted(p.name for p in (by_step[8][0] / "d").iterdir()) == ["a"]
    assert sorted(p.name for p in (by_step[8][1] / "d").iterdir()) == ["b"]


def test_a_torn_write_keeps_whole_sectors_only() -> None:
    from .fsmodel import SECTOR, sectors

    pieces = sectors(1000, b"z" * 1500)
    assert [(off, len(data)) for _, off, data in pieces] == [(1000, 24), (1024, 512), (1536, 512), (2048, 452)]
    assert all((off + len(data)) % SECTOR == 0 for _, off, data in pieces[:-1])
