"""Browser tests of the operator console: Debian's chromium driven by Playwright, real servers.

Chromium comes from the distribution (`apt-get install chromium`, which `.ci/run` does); Playwright
drives it through `executable_path` (`playwright install` cannot download browsers here, and is
never run). Without chromium or the playwright package these tests skip, saying what is missing,
and fail when `CI` is set.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
def chromium() -> str:
    """The path of Debian's chromium, with Playwright importable (else skip; under CI, fail)."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _missing("the playwright package (pip install -e '.[dev]'; never `playwright install`)")
    if not Path(CHROMIUM).exists():
        _missing(f"Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Any]:
    """A headless Debian chromium under Playwright, closed after the test."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()
