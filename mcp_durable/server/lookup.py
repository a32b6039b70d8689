"""`journal_lookup`: a read tool for agents, opt-in per server (`DurableServer(lookup_tool=True)`).

Many hosts never show resources to the model, so an agent cannot read `journal://calls/…` to ask
"did my refund go through?". `journal_lookup(tool, key)` answers it as a tool: the state of the
caller's own record of `(tool, key)` and, once final, its stored result. Not an admin tool:
every principal may call it, and it reads only records of the calling principal — another
principal's record with the same key answers exactly like a key never used (`found: false`).
Arguments and results are masked like the resources (the tool policy's `sensitive` names); the
internals operators see (owner, lease, fingerprint, run id) are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations

from ..journal.model import CallIdentity
from .redact import record_view

if TYPE_CHECKING:
    from .app import DurableServer

LOOKUP_TOOL = "journal_lookup"
_SHOWN = ("tool", "key", "state", "attempts", "created_at", "completed_at", "result", "error")


def register_lookup_tool(server: DurableServer) -> None:
    """Add `journal_lookup` to `server`."""

    async def journal_lookup(tool: str, key: str, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Look up your own earlier call of `tool` with idempotency `key` (the `_meta["mcp-durable/key"]`
        of its result): whether it ran (`state`: pending, completed, failed, in_doubt, released)
        and, when completed or failed, its result. `found` is false for a key you never used."""
        identity = CallIdentity(server.principal_of(ctx), tool, key)
        await server.engine.start()  # a JournalError is answered as journal_unavailable by the server
        record = await server.journal.get(identity)
        if record is None or record.is_expired(server.engine.clock()):
            return {"found": False, "tool": tool, "key": key}
        policy = server.policies.get(tool)
        view = record_view(record, policy.sensitive if policy else ())
        shown = {name: view[name] for name in _SHOWN}
        if not record.state.is_final:
            shown["result"] = None
        return {"found": True, **shown}

    server.add_tool(journal_lookup, name=LOOKUP_TOOL,
                    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False))


