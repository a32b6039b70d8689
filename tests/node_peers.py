"""Real MCP peers from npm, installed in `tests/node/` (pinned in its package.json and lock file).

    from tests.node_peers import node_script, NODE_MODULES

    proc = node_script(tmp_path / "client.mjs", source, args=[url])   # runs `node` on tests/node's packages

`require_node_peers()` skips the calling test where node or the packages are missing on a developer
machine, and fails it when `CI` is set: `.ci/run` runs `npm ci --prefix tests/node`, so CI always
has them. Scripts written by tests are ES modules (`.mjs`); they import the packages by name, which
resolves because `node_script` links `tests/node/node_modules` beside the script (ES modules are
resolved from the script's own directory: neither the working directory nor NODE_PATH counts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE_MODULES = NODE_DIR / "node_modules"

#: The packages tests/node/package.json pins; each must be installed for `require_node_peers`.
PACKAGES = (
    "@modelcontextprotocol/sdk",
    "@modelcontextprotocol/ext-tasks",
    "@modelcontextprotocol/server-everything",
    "@modelcontextprotocol/server-memory",
    "conformance-0-1",  # @modelcontextprotocol/conformance@0.1.16, aliased (tests/conformance/)
    "conformance-tasks",  # @modelcontextprotocol/conformance@0.2.0-alpha.12, aliased
)


def require_node_peers() -> str:
    """The path of `node`; skip (or fail under CI) unless node and every pinned package exist."""
    node = shutil.which("node")
    missing = [p for p in PACKAGES if not (NODE_MODULES / p / "package.json").exists()]
    why = None
    if node is None:
        why = "node is not installed"
    elif missing:
        why = f"npm packages missing in {NODE_MODULES}: {', '.join(missing)} (run: npm ci --prefix tests/node)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must have them (.ci/run installs them)")
        pytest.skip(why)
    assert node is not None
    return node


def package_bin(package: str, name: str | None = None) -> list[str]:
    """The command that runs an installed package's executable (its `bin` entry) with node."""
    import json

    meta = json.loads((NODE_MODULES / package / "package.json").read_text())
    bins = meta.get("bin")
    if isinstance(bins, str):
        rel = bins
    else:
        rel = bins[name] if name else next(iter(bins.values()))
    return [require_node_peers(), str(NODE_MODULES / package / rel)]


def node_script(
    script: Path,
    source: str,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Write `source` to `script` (an `.mjs` file), run it with node from tests/node, return the run."""
    node = require_node_peers()
    script.write_text(source)
    beside = script.parent / "node_modules"
    if not beside.exists():
        beside.symlink_to(NODE_MODULES, target_is_directory=True)
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [node, str(script), *args],
        cwd=NODE_DIR,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
