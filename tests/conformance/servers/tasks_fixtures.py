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
  fixtures that ask their requestor for input (`input_required`, SEP-2322), interactive durable
  tools (docs/tasks.md): `confirm_delete` asks once (`ctx.elicit`), `multi_input` asks two
  questions at once, `test_tool_with_task` resolves `user_name` (`Resolve`/`Elicit`) before its
  task is created. The plain server's tools of these names answer without asking (the proxy
  serves no `input_required`).

None has key fields: the suite sends no idempotency key, so each of its calls is its own task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

import anyio
from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp_types.jsonrpc import INTERNAL_ERROR
from pydantic import BaseModel

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


class Confirmation(BaseModel):
    confirm: bool = False


class Name(BaseModel):
    name: str = ""
    confirm: bool = False


async def confirm_delete(filename: str, ctx: Context) -> str:
    """Asks its requestor to confirm, then deletes `filename` (or not)."""
    answer = await ctx.elicit(f"Delete {filename}?", Confirmation)
    confirmed = answer.action == "accept" and answer.data.confirm
    return f"deleted {filename}" if confirmed else f"kept {filename}"


async def multi_input(ctx: Context) -> str:
    """Asks two questions at once and answers with both answers."""
    async with anyio.create_task_group() as group:
        answers: list[str] = ["", ""]

        async def ask(index: int) -> None:
            answer = await ctx.elicit(f"Question {index + 1}: your name?", Name)
            answers[index] = answer.data.name if answer.action == "accept" else answer.action

        for index in range(2):
            group.start_soon(ask, index)
            await anyio.sleep(0)  # asked in order: the first question is the first asked
    return f"answered {answers[0]} and {answers[1]}"


async def ask_user_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


async def test_tool_with_task(user_name: Annotated[Name, Resolve(ask_user_name)]) -> str:
    """Its `user_name` is asked first (SEP-2322), then it runs as a task."""
    return f"Hello, {user_name.name}!"


async def plain_confirm_delete(filename: str) -> str:
    """The plain server's `confirm_delete`: deletes `filename` without asking."""
    return f"deleted {filename} without a confirmation"


async def plain_multi_input() -> str:
    """The plain server's `multi_input`: answers without asking."""
    return "answered without input"


async def plain_test_tool_with_task(user_name: str = "unknown") -> str:
    """The plain server's `test_tool_with_task`: greets without asking."""
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
#: The tools that ask their requestor (`interactive`), and the plain server's tool in their place.
ASKING: dict[Callable[..., Awaitable[str]], Callable[..., Awaitable[str]]] = {
    confirm_delete: plain_confirm_delete,
    multi_input: plain_multi_input,
    test_tool_with_task: plain_test_tool_with_task,
}
#: An optional tool's call is answered with a task unless it finishes this soon (seconds).
TASK_AFTER = 0.1

server = DurableServer("conformance-tasks")
plain = MCPServer("conformance-tasks-upstream")
for _tool, _support in TASK_SUPPORT.items():
    _interactive = _tool in ASKING
    _policy = ToolPolicy(task_support=_support, task_after=TASK_AFTER, interactive=_interactive) if _support else True
    server.add_tool(_tool, durable=_policy)
    plain.add_tool(ASKING.get(_tool, _tool), name=_tool.__name__)

#: The proxy's policies file for `plain`: the same tasks, served by the proxy, under the proxy's
#: default `tool_errors = "release"`: `failing_job`'s error result is still its task's result
#: (`completed`, `isError`), as the `DurableServer`'s is; only a retry of its key runs again.
PROXY_POLICIES = "".join(
    f'[tools.{tool.__name__}]\ntask_support = "{support}"\ntask_after = {TASK_AFTER}\n'
    for tool, support in TASK_SUPPORT.items()
    if support
)

if __name__ == "__main__":
    plain.run()
