"""Record a workload's file-system calls with strace, and parse the log into ordered operations.

Why strace: SQLite writes from C, so a Python-level hook sees none of its writes or syncs; a
FUSE file system needs /dev/fuse and a privileged mount (not available in this sandbox); an
LD_PRELOAD shim misses raw syscalls and would have to be built. ptrace sees every syscall of
every thread, whichever library makes it. `--seccomp-bpf` stops the tracee only on the traced
calls, so the workload runs at a few times its normal speed.

The log is `-f -xx -s 1000000 -y`: every thread, every byte of every string in hex (so the
written data and the paths are exact), and each descriptor annotated with its path. An
operation is placed where it *completed* (`<... resumed>` for an interrupted line): a sync
counts once it returned, and a marker written after a sync returned is ordered after it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

TRACED = (
    "write,pwrite64,writev,pwritev,pwritev2,fsync,fdatasync,sync,syncfs,sync_file_range,"
    "rename,renameat,renameat2,open,openat,creat,truncate,ftruncate,unlink,unlinkat,mkdir,mkdirat,rmdir,"
    "fallocate,link,linkat"
)


def strace_binary() -> str | None:
    return shutil.which("strace")


def traced_command(argv: Sequence[str], log: Path) -> list[str]:
    """`argv` run under strace, its log written to `log`."""
    strace = strace_binary()
    if strace is None:
        raise RuntimeError("strace is not installed (apt-get install strace)")
    return [strace, "-f", "-xx", "-s", "1000000", "-y", "--seccomp-bpf", "-e", f"trace={TRACED}", "-o", str(log), *argv]


def run_traced(
    argv: Sequence[str], log: Path, *, timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        traced_command(argv, log), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
    )


@dataclass(frozen=True, slots=True)
class Call:
    """One completed syscall: its name, raw arguments (still escaped) and return value."""

    pid: int
    name: str
    args: list[str]
    ret: str


_LINE = re.compile(r"^(\d+) +(.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_UNFINISHED = " <unfinished ...>"
_RET = re.compile(r"\) += (.*)$")
_HEX = re.compile(rb"\\x([0-9a-f]{2})")


def decode(text: str) -> bytes:
    """The bytes of an escaped strace string (`-xx`: every byte is `\\xNN`)."""
    raw = text.encode("latin-1")
    return _HEX.sub(lambda m: bytes([int(m.group(1), 16)]), raw)


def string_arg(arg: str) -> bytes:
    """A quoted string argument, decoded (a truncated string ends with `...`)."""
    if not (arg.startswith('"') and arg.endswith('"')):
        raise ValueError(f"not a complete string argument: {arg[:60]!r}")
    return decode(arg[1:-1])


def fd_arg(arg: str) -> tuple[int | None, str | None]:
    """A descriptor argument `3</path>` (or `AT_FDCWD</path>`): its number and path."""
    number, _, rest = arg.partition("<")
    path = decode(rest[:-1]).decode("utf-8", "surrogateescape") if rest.endswith(">") else None
    try:
        return int(number), path
    except ValueError:
        return None, path


def split_args(text: str) -> list[str]:
    """Split an argument list on the commas outside quotes, brackets and `<…>` annotations."""
    out: list[str] = []
    depth = 0
    quoted = False
    start = 0
    i = 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def parse(log: Path) -> Iterator[Call]:
    """Every completed syscall of the log, in completion order."""
    pending: dict[int, str] = {}
    with open(log, encoding="latin-1") as f:
        for line in f:
            m = _LINE.match(line.rstrip("\n"))
            if m is None:
                continue
            pid, body = int(m.group(1)), m.group(2)
            if body.startswith(("+++", "---")):
                continue
            if body.endswith(_UNFINISHED):
                pending[pid] = body[: -len(_UNFINISHED)]
                continue
            resumed = _RESUMED.match(body)
            if resumed is not None:
                head = pending.pop(pid, None)
                if head is None:
                    continue
                body = head + resumed.group(2)
            call = _split_call(pid, body)
            if call is not None:
                yield call


def _split_call(pid: int, body: str) -> Call | None:
    paren = body.find("(")
    if paren <= 0:
        return None
    name = body[:paren]
    ret = _RET.search(body)
    if ret is None:
        return None
    return Call(pid, name, split_args(body[paren + 1 : ret.start()]), ret.group(1).strip())
