"""A small durable server for hardening tests run as a subprocess (`mcp-durable serve tests/hardening/target.py`).

`echo` appends one line per real run to `$HARDENING_RUNS` (when set), so a test can count side
effects from outside the process. `serve --journal` names the journal.
"""

from __future__ import annotations

import os
from typing import Any

from mcp_durable import DurableServer, ToolPolicy

server = DurableServer("hardening-target")


@server.tool(durable=ToolPolicy(key="derived"))  # a call without a caller key is keyed by its text
def echo(text: str) -> dict[str, Any]:
    """Echo `text`; each real run is one line in $HARDENING_RUNS."""
    runs = os.environ.get("HARDENING_RUNS")
    if runs:
        with open(runs, "a", encoding="utf-8") as handle:
            handle.write(text.replace("\n", " ") + "\n")
    return {"text": text}
