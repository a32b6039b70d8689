"""`make console-screenshots` (docs/console_screenshots.py) works: run into a scratch folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_screenshot_command_captures_the_overview_and_a_call_page(chromium: str, tmp_path: Path) -> None:
    env = {**os.environ, "MCP_DURABLE_SCREENSHOTS": str(tmp_path), "MCP_DURABLE_CHROMIUM": chromium}
    done = subprocess.run(
        [sys.executable, "docs/console_screenshots.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for name in ("console-overview.png", "console-call.png", "console-in-doubt.png"):
        image = (tmp_path / name).read_bytes()
        assert image.startswith(PNG) and len(image) > 20_000, name
    assert "console-screenshots:" in (REPO / "Makefile").read_text()
