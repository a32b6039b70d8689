"""Making files and directory entries durable: the few syncs every local journal relies on.

A file's `fsync`/`fdatasync` makes its data durable, not its name: a new directory entry
(a created file or directory, a rename, an unlink) survives a power loss only once the
directory holding it is fsynced. `fsync_dir` does that; `make_dirs` creates a directory
(and its missing parents) so that each new entry is durable before anything is written in it.

TEST ONLY: the environment variable `MCP_DURABLE_TEST_SKIP_FSYNC` (read here, once, and
nowhere else) removes one kind of sync to build a deliberately broken journal: `dir` skips
every directory fsync, `data` the file journal's per-batch `fdatasync`. The power-loss
harness (tests/powerloss) sets it on its recorded workload to prove it catches the loss.
Never set it anywhere else: the journal then loses acknowledged results on a power cut.
"""

from __future__ import annotations

import os
from pathlib import Path

_TEST_SKIP_FSYNC = os.environ.get("MCP_DURABLE_TEST_SKIP_FSYNC", "")


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` durable (creates, renames, unlinks in it)."""
    if _TEST_SKIP_FSYNC == "dir":
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_data(fd: int) -> None:
    """`fdatasync(fd)`: the file's data and size are durable when it returns."""
    if _TEST_SKIP_FSYNC == "data":
        return
    os.fdatasync(fd)


def truncate_synced(fd: int, size: int) -> None:
    """Cut the file open at `fd` to `size` bytes, durably: its new size survives a power loss."""
    os.ftruncate(fd, size)
    os.fsync(fd)


def make_dirs(path: Path, mode: int) -> None:
    """`mkdir -p path` whose result survives a power loss.

    The parent of `path` is fsynced even when `path` already existed: a process that created
    it may have died before syncing its entry, and files made durable inside a directory whose
    own entry is not are lost with it. New parents are synced the same way, top down.
    """
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=mode)
        except FileExistsError:
            pass
        _sync_parent(d)
    if not missing:
        _sync_parent(path)


def _sync_parent(path: Path) -> None:
    try:
        fsync_dir(path.parent)
    except PermissionError:
        pass  # a parent we may write but not read (mode -wx): nothing more can be done from here
