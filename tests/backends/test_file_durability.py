"""The contract suite again on the file journal with relaxed durability (no fsync).

`tests/contract/` runs the file journal with its default, strict durability; this runs every
contract test unchanged against `?durability=relaxed`, the setting tests and benchmarks use.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcp_durable.journal import Journal, create_journal
from tests.contract import test_calls, test_entries


def contract_tests() -> list[Any]:
    cases: list[Any] = []
    for module in (test_calls, test_entries):
        for name, fn in inspect.getmembers(module, inspect.iscoroutinefunction):
            if not name.startswith("test_"):
                continue
            marks = getattr(fn, "pytestmark", [])
            sizes = [m.args[1] for m in marks if m.name == "parametrize" and m.args[0] == "size"]
            for size in sizes[0] if sizes else [None]:
                cases.append(pytest.param(fn, size, id=f"{name}[{size}]" if size is not None else name))
    return cases


@pytest.mark.parametrize("durability", ["relaxed", "strict"])
@pytest.mark.parametrize(("test", "size"), contract_tests())
async def test_the_contract_holds_with_relaxed_and_strict_durability(
    tmp_path: Path, durability: str, test: Callable[..., Any], size: int | None
) -> None:
    url = f"file://{tmp_path}/journal?durability={durability}"

    def factory() -> Journal:
        return create_journal(url)

    params = inspect.signature(test).parameters
    if "journal_factory" in params:
        await test(factory)
        return
    journal = factory()
    await journal.open()
    try:
        await (test(journal, size) if "size" in params else test(journal))
    finally:
        await journal.aclose()
