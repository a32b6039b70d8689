"""A test target whose module builds its server on a journal of its own (`$MODULE_JOURNAL`), the way a
module with a hard-coded journal URL does; `mcp-durable serve --journal URL` must serve it on URL.

`held(text)` runs until the file `$GATE_FILE` exists, with a 0.6 s lease renewed every 0.2 s, so
a test can watch the lease of a running call being renewed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from mcp_durable import DurableServer, ToolPolicy

server = DurableServer("own-journal", journal=os.environ["MODULE_JOURNAL"])


@server.tool(durable=ToolPolicy(key="required", lease=0.6))
async def held(text: str) -> dict[str, Any]:
    gate = Path(os.environ["GATE_FILE"])
    while not gate.exists():  # released by the test
        await anyio.sleep(0.01)
    return {"text": text}
