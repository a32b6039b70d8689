"""Reading the fenced blocks of the docs: the commands and Python programs users are shown.

A fenced block's info string says what it is:
- ```sh: every line is a command (a trailing `\\` continues it; `#` starts a comment);
- ```console: lines starting with `$ ` are commands, the other lines are their output;
- ```python: a whole program.
A command whose line ends in a comment saying `exit status N` is expected to exit with N.
Other blocks (```json, ```text) are shown output and are not run.

The docs are README.md, docs/*.md and examples/*.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[\w+-]*)\s*$")
RUN_LANGS = ("sh", "console", "python")
EXPECT = re.compile(r"#.*\bexit status (?P<status>\d+)")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: the file, the line of its opening fence, its language and its text."""

    path: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True, slots=True)
class Command:
    """One shell command shown in a doc, with the block it came from."""

    block: Block
    text: str
    expect: int = 0  # the exit status the doc promises (`# exit status N` on the line), else 0


def doc_files() -> list[Path]:
    """Every document whose blocks are checked, in a stable order."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*.md"))]
    return [path for path in files if path.exists()]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        start, indent, lang = index, len(match["indent"]), match["info"]
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index][indent:] if lines[index][:indent].strip() == "" else lines[index])
            index += 1
        found.append(Block(path, start + 1, lang, "\n".join(body) + "\n"))
        index += 1
    return found


def _strip_comment(line: str) -> str:
    """A shell line without its trailing `# comment` (quotes respected)."""
    quote = ""
    for position, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position].rstrip()
    return line.rstrip()


def commands(block: Block) -> list[Command]:
    """The commands of a ```sh or ```console block (continuations joined, comments dropped)."""
    if block.lang not in ("sh", "console"):
        return []
    found: list[Command] = []
    pending = ""
    expect = 0
    for raw in block.text.splitlines():
        if block.lang == "console":
            if pending:
                line = raw
            elif raw.startswith("$ "):
                line = raw[2:]
            else:
                continue  # output
        else:
            line = raw
        status = EXPECT.search(line)
        if status is not None:
            expect = int(status["status"])
        line = _strip_comment(line) if not pending else line.rstrip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            joined = " ".join(text.split()) if "'" not in text and '"' not in text else text
            found.append(Command(block, joined, expect))
        expect = 0
    return found


def all_blocks() -> Iterator[Block]:
    for path in doc_files():
        yield from blocks(path)


def all_commands() -> Iterator[Command]:
    for block in all_blocks():
        yield from commands(block)
