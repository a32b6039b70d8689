"""The public API type-checks in a user's code under `mypy --strict`, and says so (PEP 561).

`DurableServer` is loaded lazily at run time (`mcp_durable.__getattr__`, so journal-only users
do not import the whole SDK); type checkers must still see the class, or every annotation and
decorator that names it fails in the user's code ("not valid as a type", "untyped decorator").
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import mcp_durable

ROOT = Path(__file__).resolve().parents[2]

USER_CODE = """
from typing import Any

from mcp_durable import DurableServer, ToolPolicy, current_call


def build(journal: str) -> DurableServer:
    server: DurableServer = DurableServer("payments", journal=journal)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",)))
    def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        return {"order_id": order_id, "key": current_call().key}

    return server
"""


def test_user_code_naming_the_server_type_checks_strictly(tmp_path: Path) -> None:
    user = tmp_path / "user_server.py"
    user.write_text(textwrap.dedent(USER_CODE))
    # From the project's root: mypy cannot follow an editable install's import hook, so it reads
    # the package from the source tree here (an installed wheel carries `py.typed`, below).
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(user),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_carries_the_pep_561_marker() -> None:
    # Without it, mypy ignores an installed package's annotations: every import of it is an
    # error under --strict (pyproject.toml ships it as package data).
    assert (Path(mcp_durable.__file__).parent / "py.typed").is_file()
