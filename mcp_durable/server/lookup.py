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

from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import ToolAnnotations

from ..journal.model import CallIdentity
from .ports import DurableHost, ToolSpec
from .redact import record_view

LOOKUP_TOOL = "journal_lookup"
_SHOWN = ("tool", "key", "state", "attempts", "created_at", "completed_at", "result", "error")


def journal_lookup_tool(host: DurableHost) -> ToolSpec:
    """`journal_lookup`, for `DurableServer` to register (`lookup_tool=True`)."""

    async def journal_lookup(tool: str, key: str, ctx: Context[Any, Any]) -> dict[str, Any]:
        """Look up your own earlier call of `tool` with idempotency `key` (the `_meta["mcp-durable/key"]`
        of its result): whether it ran (`state`: pending, completed, failed, in_doubt, released)
        and, when completed or failed, its result. `found` is false for a key you never used."""
        identity = CallIdentity(host.principal_of(ctx), tool, key)
        await host.engine.start()  # a JournalError is answered as journal_unavailable by the server
        record = await host.engine.journal.get(identity)
        if record is None or record.is_expired(host.engine.clock()):
            return {"found": False, "tool": tool, "key": key}
        policy = host.policies.get(tool)
        view = record_view(record, policy.sensitive if policy else ())
        shown = {name: view[name] for name in _SHOWN}
        if not record.state.is_final:
            shown["result"] = None
        return {"found": True, **shown}

    return ToolSpec(
        journal_lookup, LOOKUP_TOOL, ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False)
    )
