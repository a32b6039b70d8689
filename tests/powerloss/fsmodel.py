"""A model of what a power loss leaves on disk, replayed from the recorded syscalls.

The rules (POSIX's promises, no more; no file system is assumed to be kinder):
- a file's data and size are durable once an `fsync`/`fdatasync` of that file returned; writes
  and truncations after its last sync may be lost, kept, kept in part, or kept out of order;
- a directory entry (a create, `mkdir`, rename or unlink in that directory) is durable once an
  `fsync` of the directory returned. A file's own fsync does not make its *name* durable.
  Entries changed after the directory's last sync survive as a prefix of those changes, in
  order (file systems journal metadata in order; a rename is one atomic change);
- the root of the recorded tree existed (durably) before the workload started.

A crash state is sampled per cut point with a seeded RNG: per directory a prefix of its
unsynced changes, per file none, all, a torn prefix, or a torn subset of its unsynced writes
(torn at 512-byte sector boundaries; a sector is written whole or not at all; bytes beyond
the old end that no kept write covers read as zeros).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

SECTOR = 512


@dataclass(slots=True)
class Inode:
    number: int
    is_dir: bool
    durable: bytearray = field(default_factory=bytearray)  # file data as of its last sync
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)  # ("w", off, data) | ("t", size, b"")
    # directories: name -> inode number
    durable_entries: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    dir_pending: list[tuple[str, str, int]] = field(default_factory=list)  # ("link"|"unlink", name, inode)


class Model:
    """The recorded tree under `root`: the volatile view (what the running process saw) and,
    for every inode, what is durable and what is not yet."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.inodes: dict[int, Inode] = {}
        self.root_inode = self.new_inode(is_dir=True)
        self.fds: dict[int, int] = {}  # descriptor -> inode (one traced process)
        self.offsets: dict[int, int] = {}

    def load_tree(self, path: Path, node: int | None = None) -> None:
        """Take the files under `path` as durable (the start of a second recording)."""
        node = self.root_inode if node is None else node
        for child in sorted(path.iterdir()):
            number = self.new_inode(is_dir=child.is_dir())
            d = self.inodes[node]
            d.entries[child.name] = d.durable_entries[child.name] = number
            if child.is_dir():
                self.load_tree(child, number)
            else:
                self.inodes[number].durable = bytearray(child.read_bytes())

    def new_inode(self, *, is_dir: bool) -> int:
        number = len(self.inodes) + 1
        self.inodes[number] = Inode(number, is_dir)
        return number

    # -- the namespace ------------------------------------------------------------------------------

    def relative(self, path: str) -> list[str] | None:
        """`path` split below the root, or None outside it."""
        path = os.path.normpath(path)
        if path == self.root:
            return []
        if not path.startswith(self.root + "/"):
            return None
        return path[len(self.root) + 1 :].split("/")

    def lookup(self, parts: list[str]) -> int | None:
        node = self.root_inode
        for part in parts:
            entries = self.inodes[node].entries
            if part not in entries:
                return None
            node = entries[part]
        return node

    def parent_of(self, parts: list[str]) -> int | None:
        return self.lookup(parts[:-1]) if parts else None

    def link(self, parent: int, name: str, inode: int) -> None:
        d = self.inodes[parent]
        d.entries[name] = inode
        d.dir_pending.append(("link", name, inode))

    def unlink(self, parent: int, name: str) -> None:
        d = self.inodes[parent]
        inode = d.entries.pop(name, None)
        if inode is not None:
            d.dir_pending.append(("unlink", name, inode))

    def rename(self, old: list[str], new: list[str]) -> None:
        src, dst = self.parent_of(old), self.parent_of(new)
        if src is None or dst is None:
            return
        inode = self.inodes[src].entries.get(old[-1])
        if inode is None:
            return
        if src == dst:
            d = self.inodes[src]
            del d.entries[old[-1]]
            d.entries[new[-1]] = inode
            d.dir_pending.append(("rename", f"{old[-1]}\0{new[-1]}", inode))  # one atomic change
        else:
            self.unlink(src, old[-1])
            self.link(dst, new[-1], inode)

    # -- data ---------------------------------------------------------------------------------------

    def write(self, inode: int, offset: int, data: bytes) -> None:
        if data:
            self.inodes[inode].pending.append(("w", offset, data))

    def truncate(self, inode: int, size: int) -> None:
        self.inodes[inode].pending.append(("t", size, b""))

    def sync(self, inode: int) -> None:
        node = self.inodes[inode]
        if node.is_dir:
            node.durable_entries = dict(node.entries)
            node.dir_pending.clear()
        else:
            apply_ops(node.durable, node.pending)
            node.pending.clear()

    def sync_all(self) -> None:
        for number in self.inodes:
            self.sync(number)

    # -- crash states -------------------------------------------------------------------------------

    def crash_state(self, target: Path, rng: random.Random | None) -> dict[str, str]:
        """Write the state a power loss now could leave into `target` (a new directory).

        `rng=None`: only what is durable. Returns how each unsynced file was treated.
        """
        target.mkdir(parents=True)
        choices: dict[str, str] = {}
        self._build(self.root_inode, target, rng, choices, "")
        return choices

    def _build(self, number: int, at: Path, rng: random.Random | None, choices: dict[str, str], rel: str) -> None:
        node = self.inodes[number]
        entries = dict(node.durable_entries)
        if rng is not None and node.dir_pending:
            keep = rng.randint(0, len(node.dir_pending))
            for op, name, inode in node.dir_pending[:keep]:
                if op == "link":
                    entries[name] = inode
                elif op == "unlink":
                    entries.pop(name, None)
                else:
                    old, new = name.split("\0")
                    entries.pop(old, None)
                    entries[new] = inode
            if keep < len(node.dir_pending):
                choices[rel or "."] = f"dir: {keep}/{len(node.dir_pending)} changes"
        for name, child in sorted(entries.items()):
            path = at / name
            if self.inodes[child].is_dir:
                path.mkdir()
                self._build(child, path, rng, choices, f"{rel}/{name}".lstrip("/"))
            else:
                data, how = self._file_data(self.inodes[child], rng)
                if how:
                    choices[f"{rel}/{name}".lstrip("/")] = how
                path.write_bytes(data)

    def _file_data(self, node: Inode, rng: random.Random | None) -> tuple[bytes, str]:
        data = bytearray(node.durable)
        if rng is None or not node.pending:
            return bytes(data), ("lost all unsynced" if node.pending else "")
        mode = rng.choice(("none", "all", "prefix", "subset", "subset"))
        n = len(node.pending)
        if mode == "none":
            return bytes(data), f"none of {n} unsynced"
        if mode == "all":
            apply_ops(data, node.pending)
            return bytes(data), f"all {n} unsynced"
        if mode == "prefix":
            keep = rng.randint(0, n)
            ops = node.pending[:keep]
            if keep < n and node.pending[keep][0] == "w":
                _, off, chunk = node.pending[keep]
                pieces = sectors(off, chunk)
                ops = [*ops, *pieces[: rng.randint(0, len(pieces))]]
            apply_ops(data, ops)
            return bytes(data), f"prefix {keep}/{n}, torn"
        kept: list[tuple[str, int, bytes]] = []
        for op in node.pending:
            if rng.random() < 0.5:
                continue
            if op[0] == "w":
                kept.extend(p for p in sectors(op[1], op[2]) if rng.random() < 0.7)
            else:
                kept.append(op)
        apply_ops(data, kept)
        return bytes(data), f"subset of {n}, torn sectors"


def sectors(offset: int, data: bytes) -> list[tuple[str, int, bytes]]:
    """A write split at sector boundaries: the pieces a torn write keeps or loses."""
    pieces: list[tuple[str, int, bytes]] = []
    pos = 0
    while pos < len(data):
        stop = min(len(data), (offset + pos) // SECTOR * SECTOR + SECTOR - offset)
        pieces.append(("w", offset + pos, data[pos:stop]))
        pos = stop
    return pieces


def apply_ops(data: bytearray, ops: list[tuple[str, int, bytes]]) -> None:
    for kind, where, chunk in ops:
        if kind == "t":
            if where < len(data):
                del data[where:]
            else:
                data.extend(bytes(where - len(data)))
        else:
            end = where + len(chunk)
            if end > len(data):
                data.extend(bytes(end - len(data)))
            data[where:end] = chunk
