"""Browser tests of the operator console: Debian's chromium driven by Playwright, real servers.

Chromium comes from the distribution (`apt-get install chromium`, which `.ci/run` does); Playwright
drives it through `executable_path` (`playwright install` cannot download browsers here, and is
never run). Without chromium or the playwright package these tests skip, saying what is missing,
and fail when `CI` is set.

One chromium, launched once, serves every test of this package: a test's pages live in browser
contexts of their own (`signed_in` opens one per principal), with their own cookies and storage,
and `browser` closes every context the test opened when it ends. Playwright's objects belong to
the event loop that made them, so every test that uses `browser` runs in this package's event
loop (`pytest_collection_modifyitems` below).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

HERE = Path(__file__).parent
CHROMIUM = os.environ.get("MCP_DURABLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _missing(what: str) -> None:
    message = f"the console's browser tests need {what}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set: a skip here would hide a broken console)")
    pytest.skip(message)


@pytest.fixture(scope="package")
def chromium() -> str:
    """The path of Debian's chromium, with Playwright importable (else skip; under CI, fail)."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _missing("the playwright package (pip install -e '.[dev]'; never `playwright install`)")
    if not Path(CHROMIUM).exists():
        _missing(f"Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
    return CHROMIUM


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def launched_chromium(chromium: str) -> AsyncIterator[Any]:
    """A headless Debian chromium under Playwright, launched once for the package."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(loop_scope="package")
async def browser(launched_chromium: Any) -> AsyncIterator[Any]:
    """The package's chromium, with no context open; every context the test opens is closed after it
    (with its pages and their live connections), so no test sees another's."""
    assert not launched_chromium.contexts, "a previous test left a browser context open"
    try:
        yield launched_chromium
    finally:
        for context in list(launched_chromium.contexts):
            await context.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run each test of this package that uses `browser` in the package's event loop, where the
    package's chromium lives (an asyncio mark of its own, ahead of the one asyncio's auto mode adds)."""
    for item in items:
        if item.path.is_relative_to(HERE) and "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.asyncio(loop_scope="package"), append=False)
