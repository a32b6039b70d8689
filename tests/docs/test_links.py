"""Every relative link in the docs leads somewhere: a file that exists, and a heading of it.

The docs are README.md, docs/**/*.md (the developers' notebooks in docs/dev/ included) and
examples/*.md. For each Markdown link `[text](target)` outside fenced blocks and code spans
whose target is not a URL (`http:`, `mailto:` …):
- the path, relative to the linking file, exists (a file or a folder);
- a `#fragment` names a heading of that Markdown file, slugged as GitHub slugs headings
  (lower case, punctuation and symbols dropped, spaces to hyphens, `-1`, `-2` … for repeats).
A link to a section that moved or was renamed therefore fails here, naming the file and line.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.docs.snippets import REPO

LINK = re.compile(
    r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target><[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+\"[^\"]*\")?\)"
)
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^()\s]+)\)")
CODE_SPAN = re.compile(r"(`+).*?\1")
FENCE = re.compile(r"^\s*```")
HEADING = re.compile(r"^(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").glob("*.md"))]
    return [path for path in files if path.exists()]


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The lines of `path` outside fenced blocks, with their code spans blanked out."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, CODE_SPAN.sub("", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before repeats are numbered)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown file, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        base = slug(match["text"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(path):
        for pattern in (LINK, IMAGE):
            for match in pattern.finditer(line):
                target = match["target"].strip("<>")
                if target and not SCHEME.match(target):
                    yield number, target


def broken(path: Path, target: str) -> str | None:
    """Why `target`, linked from `path`, leads nowhere; None when it leads somewhere."""
    file_part, _, fragment = target.partition("#")
    destination = (path.parent / file_part).resolve() if file_part else path
    if not destination.exists():
        return f"no such file: {destination.relative_to(REPO) if destination.is_relative_to(REPO) else destination}"
    if fragment and destination.suffix == ".md" and fragment not in anchors(destination):
        return f"no heading #{fragment} in {destination.relative_to(REPO)}"
    return None


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_in_the_doc_leads_to_a_file_and_heading_that_exist(doc: Path) -> None:
    problems = [
        f"{doc.relative_to(REPO)}:{line}: ({target}) {why}"
        for line, target in links(doc)
        if (why := broken(doc, target)) is not None
    ]
    assert problems == [], "\n".join(problems)


def test_the_slug_is_githubs_for_headings_with_code_symbols_and_punctuation() -> None:
    assert slug("`file://DIR`") == "filedir"
    assert slug("Capacity: calls per second one Postgres carries") == "capacity-calls-per-second-one-postgres-carries"
    assert slug("Miss throughput at 64 callers ≥ 0.7× plain") == "miss-throughput-at-64-callers--07-plain"
    assert slug("How do I migrate from one journal to another?") == "how-do-i-migrate-from-one-journal-to-another"


def test_a_link_to_a_missing_heading_or_file_is_reported(tmp_path: Path) -> None:
    doc = REPO / "docs" / "backends.md"
    assert broken(doc, "deployment.md#capacity-calls-per-second-one-postgres-carries") is None
    assert broken(doc, "deployment.md#no-such-heading") is not None
    assert broken(doc, "no-such-page.md") is not None
