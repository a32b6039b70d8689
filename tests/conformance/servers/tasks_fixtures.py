"""The tasks fixtures of the MCP conformance suite 0.2.0-alpha.12 (its `tasks-*` server scenarios,
SEP-2663), served two ways, as users serve them:

- `server`, a `DurableServer` serving tasks of its own tools: `mcp-durable serve
  tests/conformance/servers/tasks_fixtures.py --transport http --journal URL`;
- `plain`, a plain `MCPServer` with the same tools and no tasks, run over stdio by this file
  (`python tests/conformance/servers/tasks_fixtures.py`): the upstream of `mcp-durable proxy
  --policies` with `PROXY_POLICIES`, which makes the proxy serve the same tasks.

The tools:
- `greet(name)`: sync-only (no task support): `Hello, {name}!`.
- `slow_compute(seconds, label)`: task support optional; sleeps `seconds`, then answers. A
  `tasks/cancel` while it sleeps stops it: the task ends `cancelled`.
- `failing_job()`: task support required; answers a tool error (`isError`) after a second.
- `protocol_error_job()`: task support optional; raises a protocol error (the task `failed`).
- `confirm_delete(filename)`, `multi_input()`, `test_tool_with_task(user_name)`: the suite's
  fixtures that ask their client for input while they run (`input_required`, SEP-2322). A durable
  task runs in the background and never asks (docs/tasks.md): these answer without asking.

None has key fields: the suite sends no idempotency key, so each of its calls is its own task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.jsonrpc import INTERNAL_ERROR

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.policy import TaskSupport


async def greet(name: str) -> str:
    """Greets `name` at once (no task)."""
    return f"Hello, {name}!"


async def slow_compute(seconds: float = 1.0, label: str = "") -> str:
    """Sleeps `seconds`, then answers: a task unless it is quick."""
    await anyio.sleep(seconds)
    return f"computed {label} in {seconds}s"


async def failing_job() -> str:
    """Answers a tool error after a second."""
    await anyio.sleep(1.0)
    raise ToolError("failing_job failed as designed")


async def protocol_error_job() -> str:
    """Raises a protocol error: its task fails."""
    raise MCPError(code=INTERNAL_ERROR, message="protocol_error_job raised a protocol error as designed")


async def confirm_delete(filename: str) -> str:
    """Deletes `filename` (the suite's fixture asks for a confirmation first; a durable task cannot)."""
    return f"deleted {filename} without a confirmation"


async def multi_input() -> str:
    """The suite's fixture asks two questions at once; a durable task cannot ask."""
    return "answered without input"


async def test_tool_with_task(user_name: str = "unknown") -> str:
    """The suite's fixture asks for `user_name` first (SEP-2322), then runs as a task."""
    return f"Hello, {user_name}!"


#: Each tool's task support (None: no task): the suite's.
TASK_SUPPORT: dict[Callable[..., Awaitable[str]], TaskSupport | None] = {
    greet: None,
    slow_compute: "optional",
    failing_job: "required",
    protocol_error_job: "optional",
    confirm_delete: "optional",
    multi_input: "optional",
    test_tool_with_task: "required",
}
#: An optional tool's call is answered with a task unless it finishes this soon (seconds).
TASK_AFTER = 0.1

server = DurableServer("conformance-tasks")
plain = MCPServer("conformance-tasks-upstream")
for _tool, _support in TASK_SUPPORT.items():
    _policy = ToolPolicy(task_support=_support, task_after=TASK_AFTER) if _support else True
    server.add_tool(_tool, durable=_policy)
    plain.add_tool(_tool)

#: The proxy's policies file for `plain`: the same tasks, served by the proxy. `tool_errors =
#: "persist"`: `failing_job`'s error result is its answer (the proxy's default releases it, so a
#: retry runs again), as the `DurableServer`'s is.
PROXY_POLICIES = "".join(
    f'[tools.{tool.__name__}]\ntask_support = "{support}"\ntask_after = {TASK_AFTER}\ntool_errors = "persist"\n'
    for tool, support in TASK_SUPPORT.items()
    if support
)

if __name__ == "__main__":
    plain.run()
