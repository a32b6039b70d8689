"""From the strace log to events: each file-system change under the recorded root (applied to a
`Model`) and each marker the workload wrote (what was acknowledged, and when).

A cut point `c` is "power lost after the first `c` events": the model holds exactly what the
running process had done, and what of it was durable.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .fsmodel import Model, apply_ops
from .strace_log import Call, decode, fd_arg, string_arg

O_CREAT = "O_CREAT"
O_TRUNC = "O_TRUNC"


@dataclass(slots=True)
class Event:
    """One recorded change (or marker), in completion order."""

    index: int
    label: str
    marker: dict[str, Any] | None = None


@dataclass(slots=True)
class Recording:
    events: list[Event] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)


class Translator:
    """Turns completed syscalls into events against `model`; writes to `marker_path` are markers."""

    def __init__(self, model: Model, marker_path: Path) -> None:
        self.model = model
        self.marker_path = os.path.normpath(str(marker_path))
        self.marker_fds: set[int] = set()
        self.recording = Recording()

    def feed(self, calls: Iterable[Call]) -> Recording:
        for call in calls:
            if call.ret.startswith("-") or call.ret.startswith("?"):
                continue  # failed, or never returned: changed nothing
            handler = getattr(self, "_" + call.name, None)
            if handler is None:
                self.recording.ignored[call.name] = self.recording.ignored.get(call.name, 0) + 1
                continue
            handler(call)
        return self.recording

    def _event(self, label: str, marker: dict[str, Any] | None = None) -> None:
        self.recording.events.append(Event(len(self.recording.events), label, marker))

    # -- paths and descriptors ----------------------------------------------------------------------

    def _path(self, dirfd: str | None, raw: str) -> str:
        path = string_arg(raw).decode("utf-8", "surrogateescape")
        if not path.startswith("/") and dirfd is not None:
            _, base = fd_arg(dirfd)
            path = os.path.join(base or "/", path)
        return os.path.normpath(path)

    def _inode_of_fd(self, arg: str) -> int | None:
        """The inode a descriptor argument refers to, or None when it is outside the root."""
        fd, path = fd_arg(arg)
        if fd is None:
            return None
        deleted = path is not None and path.endswith(" (deleted)")
        if path is not None and not deleted and self.model.relative(path) is None:
            self.model.fds.pop(fd, None)  # the number now names something else
            return None
        if fd in self.model.fds:
            return self.model.fds[fd]
        parts = self.model.relative(path) if path is not None and not deleted else None
        return self.model.lookup(parts) if parts is not None else None

    def _name(self, inode: int) -> str:
        return _name_of(self.model, inode)

    # -- opening and creating -------------------------------------------------------------------------

    def _openat(self, call: Call) -> None:
        self._open_path(call.args[0], call.args[1], call.args[2], call.ret)

    def _open(self, call: Call) -> None:
        self._open_path(None, call.args[0], call.args[1], call.ret)

    def _open_path(self, dirfd: str | None, raw_path: str, flags: str, ret: str) -> None:
        path = self._path(dirfd, raw_path)
        fd, _ = fd_arg(ret)
        if fd is None:
            return
        if path == self.marker_path:
            self.marker_fds.add(fd)
            return
        self.marker_fds.discard(fd)
        parts = self.model.relative(path)
        if parts is None:
            self.model.fds.pop(fd, None)
            return
        model = self.model
        inode = model.lookup(parts)
        created = False
        if inode is None:
            parent = model.parent_of(parts)
            if parent is None or O_CREAT not in flags:
                model.fds.pop(fd, None)
                return
            inode = model.new_inode(is_dir=False)
            created = True
        model.fds[fd] = inode
        model.offsets[fd] = 0
        truncate = O_TRUNC in flags and not model.inodes[inode].is_dir
        if created:
            model.link(model.parent_of(parts), parts[-1], inode)  # type: ignore[arg-type]
        if truncate:
            model.truncate(inode, 0)
        if created or truncate:
            self._event(f"create {path}" if created else f"truncate-open {path}")
        if "O_APPEND" in flags:
            data = bytearray(model.inodes[inode].durable)
            apply_ops(data, model.inodes[inode].pending)
            model.offsets[fd] = len(data)

    def _mkdirat(self, call: Call) -> None:
        self._mkdir_path(self._path(call.args[0], call.args[1]))

    def _mkdir(self, call: Call) -> None:
        self._mkdir_path(self._path(None, call.args[0]))

    def _mkdir_path(self, path: str) -> None:
        parts = self.model.relative(path)
        if not parts:
            return
        parent = self.model.parent_of(parts)
        if parent is None:
            return
        inode = self.model.new_inode(is_dir=True)
        self.model.link(parent, parts[-1], inode)
        self._event(f"mkdir {path}")

    # -- data -----------------------------------------------------------------------------------------

    def _write(self, call: Call) -> None:
        self._data(call.args[0], string_arg(call.args[1]), None, int(call.ret))

    def _pwrite64(self, call: Call) -> None:
        self._data(call.args[0], string_arg(call.args[1]), int(call.args[3]), int(call.ret))

    def _writev(self, call: Call) -> None:
        self._data(call.args[0], _iov(call.args[1]), None, int(call.ret))

    def _pwritev(self, call: Call) -> None:
        self._data(call.args[0], _iov(call.args[1]), int(call.args[3]), int(call.ret))

    _pwritev2 = _pwritev

    def _data(self, fd_text: str, data: bytes, offset: int | None, written: int) -> None:
        fd, _ = fd_arg(fd_text)
        data = data[:written]
        if fd in self.marker_fds:
            for line in data.splitlines():
                if line.strip():
                    marker = orjson.loads(line)
                    self._event(f"marker {marker.get('m')}", marker=marker)
            return
        inode = self._inode_of_fd(fd_text)
        if inode is None or fd is None:
            return
        model = self.model
        if offset is None:
            offset = model.offsets.get(fd, 0)
            model.offsets[fd] = offset + len(data)
        model.write(inode, offset, data)
        self._event(f"write {self._name(inode)} @{offset}+{len(data)}")

    def _ftruncate(self, call: Call) -> None:
        inode = self._inode_of_fd(call.args[0])
        if inode is not None:
            self.model.truncate(inode, int(call.args[1]))
            self._event(f"ftruncate {self._name(inode)} to {call.args[1]}")

    def _truncate(self, call: Call) -> None:
        parts = self.model.relative(self._path(None, call.args[0]))
        inode = self.model.lookup(parts) if parts is not None else None
        if inode is not None:
            self.model.truncate(inode, int(call.args[1]))
            self._event(f"truncate {self._name(inode)} to {call.args[1]}")

    def _fallocate(self, call: Call) -> None:
        if self._inode_of_fd(call.args[0]) is not None:
            raise NotImplementedError("fallocate under the recorded root is not modelled")

    # -- syncs ----------------------------------------------------------------------------------------

    def _fsync(self, call: Call) -> None:
        inode = self._inode_of_fd(call.args[0])
        if inode is not None:
            self.model.sync(inode)
            kind = "dir" if self.model.inodes[inode].is_dir else "file"
            self._event(f"fsync {kind} {self._name(inode)}")

    _fdatasync = _fsync

    def _sync(self, call: Call) -> None:
        self.model.sync_all()
        self._event("sync")

    _syncfs = _sync

    def _sync_file_range(self, call: Call) -> None:
        pass  # flushes no metadata and waits for nothing durable: not a sync

    # -- names ----------------------------------------------------------------------------------------

    def _rename(self, call: Call) -> None:
        self._rename_paths(self._path(None, call.args[0]), self._path(None, call.args[1]))

    def _renameat(self, call: Call) -> None:
        self._rename_paths(self._path(call.args[0], call.args[1]), self._path(call.args[2], call.args[3]))

    _renameat2 = _renameat

    def _rename_paths(self, old: str, new: str) -> None:
        a, b = self.model.relative(old), self.model.relative(new)
        if a is None or b is None:
            return
        self.model.rename(a, b)
        self._event(f"rename {old} -> {new}")

    def _unlink(self, call: Call) -> None:
        self._unlink_path(self._path(None, call.args[0]))

    def _unlinkat(self, call: Call) -> None:
        self._unlink_path(self._path(call.args[0], call.args[1]))

    def _rmdir(self, call: Call) -> None:
        self._unlink_path(self._path(None, call.args[0]))

    def _unlink_path(self, path: str) -> None:
        parts = self.model.relative(path)
        if not parts:
            return
        parent = self.model.parent_of(parts)
        if parent is None or parts[-1] not in self.model.inodes[parent].entries:
            return
        self.model.unlink(parent, parts[-1])
        self._event(f"unlink {path}")

    def _link(self, call: Call) -> None:
        raise NotImplementedError("hard links under the recorded root are not modelled")

    _linkat = _link


def _iov(arg: str) -> bytes:
    out = b""
    for piece in arg.split('iov_base="')[1:]:
        out += decode(piece[: piece.index('"')])
    return out


def _name_of(model: Model, inode: int) -> str:
    for node in model.inodes.values():
        for name, child in node.entries.items():
            if child == inode:
                return name
    return f"inode{inode}"


def events_with_states(
    calls: Iterable[Call], root: Path, marker_path: Path, *, initial: Path | None = None
) -> Iterator[tuple[Event, Model]]:
    """Every event, after it was applied to the model (one model, mutated in place).

    `initial`: a copy of what `root` held, durably, before the recording started."""
    model = Model(root)
    if initial is not None:
        model.load_tree(initial)
    translator = Translator(model, marker_path)
    seen = 0
    for call in calls:
        translator.feed([call])
        events = translator.recording.events
        while seen < len(events):
            yield events[seen], model
            seen += 1
