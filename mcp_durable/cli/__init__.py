"""The command line: `mcp-durable` (`commands.py`), its `journal …` commands (`journal.py`), serving
over stdio or HTTP (`serving.py`) and `mcp-durable proxy`'s options (`proxy.py`).

The only layer that reads the environment on the user's behalf (it turns the library's
`config.use_environment` on for the command it runs). Importing it loads no MCP SDK.
"""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
