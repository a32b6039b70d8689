"""The tasks fixtures of the MCP conformance suite 0.2.0-alpha.12 (tasks_fixtures.py's tools) as a
FastMCP 4 server made durable (`make_durable`: `DurableMiddleware` and `DurableTasks`), as a
FastMCP author writes them: `@app.tool` with FastMCP's own `task=` declarations and `Context`.

- `greet(name)`: sync-only (no task support): `Hello, {name}!`.
- `slow_compute(seconds, label)`: task support optional; sleeps `seconds`, then answers.
- `failing_job()`: task support required; answers a tool error (`ToolError`) after a second.
- `protocol_error_job()`: task support optional; raises a protocol error (the task `failed`).
- `confirm_delete(filename)`, `multi_input()`: interactive, ask their requestor through FastMCP's
  `ctx.elicit` (one question; two at once).
- `test_tool_with_task()`: task support required, interactive, its question first
  (`asks_first`: the round before the task is answered `input_required`, SEP-2663's MRTR
  composition), its answer read as `ctx.input_responses` (FastMCP's guard pattern).

Each durable tool's policy (`POLICIES`) sets what FastMCP has no word for: `task_after`,
`interactive`. `make_app(journal)` builds the server; `http_app` is what a test serves.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig
from mcp import MCPError
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from mcp_types.jsonrpc import INTERNAL_ERROR
from pydantic import BaseModel

from mcp_durable import ToolPolicy
from mcp_durable.fastmcp import asks_first, make_durable

#: An optional tool's call is answered with a task unless it finishes this soon (seconds).
TASK_AFTER = 0.1
#: The durable tools' policies: what a tool's `task=` does not say.
POLICIES = {
    "greet": ToolPolicy(),
    "slow_compute": ToolPolicy(task_after=TASK_AFTER),
    "failing_job": ToolPolicy(task_after=TASK_AFTER),
    "protocol_error_job": ToolPolicy(task_after=TASK_AFTER),
    "confirm_delete": ToolPolicy(task_after=TASK_AFTER, interactive=True),
    "multi_input": ToolPolicy(task_after=TASK_AFTER, interactive=True),
    "test_tool_with_task": ToolPolicy(task_after=TASK_AFTER, interactive=True),
}


class Confirmation(BaseModel):
    confirm: bool = False


class Name(BaseModel):
    name: str = ""
    confirm: bool = False


async def needs_user_name(ctx: Context) -> InputRequiredResult | None:
    """`test_tool_with_task`'s guard: asks for `user_name` until the request answers it."""
    if "user_name" in (ctx.input_responses or {}):
        return None
    question = ElicitRequestFormParams(message="What is your name?", requested_schema=Name.model_json_schema())
    return InputRequiredResult(input_requests={"user_name": ElicitRequest(params=question)})


def make_app(journal: str) -> FastMCP[Any]:
    """The fixtures' FastMCP server, durable on `journal`, its tasks served by `DurableTasks`."""
    app: FastMCP[Any] = FastMCP("conformance-tasks-fastmcp")

    @app.tool
    async def greet(name: str) -> str:
        """Greets `name` at once (no task)."""
        return f"Hello, {name}!"

    @app.tool(task=TaskConfig(mode="optional"))
    async def slow_compute(seconds: float = 1.0, label: str = "") -> str:
        """Sleeps `seconds`, then answers: a task unless it is quick."""
        await anyio.sleep(seconds)
        return f"computed {label} in {seconds}s"

    @app.tool(task=TaskConfig(mode="required"))
    async def failing_job() -> str:
        """Answers a tool error after a second."""
        await anyio.sleep(1.0)
        raise ToolError("failing_job failed as designed")

    @app.tool(task=TaskConfig(mode="optional"))
    async def protocol_error_job() -> str:
        """Raises a protocol error: its task fails."""
        raise MCPError(code=INTERNAL_ERROR, message="protocol_error_job raised a protocol error as designed")

    @app.tool(task=TaskConfig(mode="optional"))
    async def confirm_delete(filename: str, ctx: Context) -> str:
        """Asks its requestor to confirm, then deletes `filename` (or not)."""
        answer = await ctx.elicit(f"Delete {filename}?", Confirmation)
        confirmed = answer.action == "accept" and answer.data.confirm
        return f"deleted {filename}" if confirmed else f"kept {filename}"

    @app.tool(task=TaskConfig(mode="optional"))
    async def multi_input(ctx: Context) -> str:
        """Asks two questions at once and answers with both answers."""
        answers: list[str] = ["", ""]

        async def ask(index: int) -> None:
            answer = await ctx.elicit(f"Question {index + 1}: your name?", Name)
            answers[index] = answer.data.name if answer.action == "accept" else answer.action

        async with anyio.create_task_group() as group:
            for index in range(2):
                group.start_soon(ask, index)
                await anyio.sleep(0)  # asked in order: the first question is the first asked
        return f"answered {answers[0]} and {answers[1]}"

    @app.tool(task=TaskConfig(mode="required"))
    @asks_first(needs_user_name)
    async def test_tool_with_task(ctx: Context) -> str | InputRequiredResult:
        """Its `user_name` is asked first (SEP-2322), then it runs as a task."""
        asked = await needs_user_name(ctx)  # a run resumed without the answer asks it through the task
        if asked is not None:
            return asked
        answer = (ctx.input_responses or {})["user_name"]
        name = (getattr(answer, "content", None) or {}).get("name", "")
        return f"Hello, {name}!"

    make_durable(app, journal=journal, policies=POLICIES)
    return app
