"""examples/crash_demo.py end to end: a plain MCPServer duplicates refunds in the danger window, mcp-durable never.

Three trials (one per crash point, shuffled) against real `mcp-durable serve` processes over stdio,
each SIGKILLed once mid-batch; the refunds are counted in the provider's ledger.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from tests.helpers import REPO, serve_command

sys.path.insert(0, str(REPO))

from examples.crash_demo import POINTS, render, run_experiment, schedule  # noqa: E402


async def test_the_crash_demo_shows_the_plain_server_duplicating_in_the_danger_window_and_mcp_durable_never(
    tmp_path: Path,
) -> None:
    assert sorted(point for _, point in schedule(3, seed=1)) == sorted(POINTS)
    plain, durable = await run_experiment(trials=3, seed=1, journal="sqlite", workdir=tmp_path)
    for tally in (plain, durable):
        assert tally.trials == 3 and dict(tally.kills) == dict.fromkeys(POINTS, 1)
    # Plain: the refund made before the answer was lost is made again by the client's retry.
    assert plain.duplicate_trials["danger_window"] == 1 and plain.duplicate_trials["after_journal"] == 1
    assert plain.duplicate_trials["before_effect"] == 0 and plain.duplicate_refunds == 2
    # mcp-durable: nothing twice, nothing lost; both calls cut before journaling were found in doubt.
    assert durable.duplicate_refunds == 0 and durable.lost_refunds == 0
    assert durable.in_doubt == 2
    assert durable.resolutions["retried, provider deduplicated"] == 1
    assert durable.resolutions["retried, had not happened"] == 1
    assert plain.lost_refunds == 0
    console = Console(record=True, width=160)
    console.print(render([plain, durable], seed=1, journal="sqlite"))
    text = console.export_text()
    assert "plain MCPServer" in text and "mcp-durable" in text


def test_the_crash_demo_is_reachable_from_the_cli() -> None:
    shown = subprocess.run([*serve_command(), "demo", "crash", "--help"], capture_output=True, text=True, check=True)
    assert "--trials" in shown.stdout and "--journal" in shown.stdout
