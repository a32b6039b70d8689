"""Fixtures of the server tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.server.servers.counting import make_server

COUNTING = "tests/server/servers/counting.py:make_server"

#: `transport` -> the keywords of `tests.helpers.connect` for the counting server.
CountingSetup = Callable[[str], dict[str, Any]]


@pytest.fixture
def counting_setup(tmp_path: Path) -> CountingSetup:
    """`connect(transport, **counting_setup(transport))` reaches the counting server
    (`servers/counting.py`) on a SQLite journal in `tmp_path`, its tools counting their runs in
    `tmp_path / "counter"` (read them with `Counter(tmp_path / "counter")`): the in-process server
    object for the `memory-*` transports, the target and its environment for the others."""

    def setup(transport: str) -> dict[str, Any]:
        journal = f"sqlite:///{tmp_path}/journal.db"
        counter = tmp_path / "counter"
        server = make_server(journal=journal, counter=counter) if transport.startswith("memory") else None
        return {"target": COUNTING, "journal": journal, "env": {"COUNTER_FILE": str(counter)}, "server": server}

    return setup
