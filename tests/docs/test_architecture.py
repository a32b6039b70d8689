"""docs/architecture.md names the modules that exist, and every module that exists.

- Its `## Modules` section lists every module file of the package, each once (a package by its
  folder, `mcp_durable/journal/file/` for its `__init__.py`), and nothing else.
- Every `mcp_durable/…` path named anywhere on the page exists.
- Every `name.py` in the layer map (the first text block) is a module of the package.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "mcp_durable"


def module_paths() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(REPO).as_posix()
        found.add(relative.removesuffix("__init__.py") if path.name == "__init__.py" else relative)
    return found


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_module_list_is_every_module() -> None:
    listed = re.findall(r"^- `(mcp_durable/[^`]*)`", section(DOC.read_text(), "Modules"), re.MULTILINE)
    assert len(listed) == len(set(listed)), "a module is listed twice"
    modules = module_paths()
    assert sorted(modules - set(listed)) == [], "modules missing from docs/architecture.md's module list"
    assert sorted(set(listed) - modules) == [], "listed in docs/architecture.md but not in the package"


def test_every_path_the_page_names_exists() -> None:
    named = set(re.findall(r"mcp_durable/[\w/.]*\w/?", DOC.read_text()))
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_layer_maps_files_are_modules() -> None:
    text = DOC.read_text()
    layer_map = text[text.index("```text") : text.index("```", text.index("```text") + 7)]
    names = set(re.findall(r"\b(\w+\.py)\b", layer_map))
    basenames = {Path(p).name for p in module_paths()}
    assert names, "no module named in the layer map"
    assert sorted(names - basenames) == [], "the layer map names files that are not modules"
