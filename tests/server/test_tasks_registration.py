"""An interactive tool may be a task: registration keeps its policy.

An interactive tool (it asks its client while it runs) run as a task asks its requestor instead
(`input_required`, docs/tasks.md; tested over HTTP in tests/tasks/test_input_required.py): such a
policy registers like any other, and the tool is listed with its task support.
"""

from __future__ import annotations

import pytest

from mcp_durable import DurableServer, ToolPolicy


@pytest.mark.parametrize("support", ["optional", "required"])
async def test_an_interactive_tool_with_task_support_registers(support: str) -> None:
    server = DurableServer("interactive-tasks", journal="memory://")
    policy = ToolPolicy(interactive=True, task_support=support)  # type: ignore[arg-type]  # a Literal, parametrized

    @server.tool(durable=policy)
    async def confirm_order(order_id: str) -> str:
        return order_id

    assert "confirm_order" in {tool.name for tool in await server.list_tools()}
    assert server.policies["confirm_order"] is policy


async def test_interactive_tools_without_tasks_and_task_tools_that_are_not_interactive_register() -> None:
    server = DurableServer("interactive-tasks", journal="memory://")

    async def ask(order_id: str) -> str:
        return order_id

    server.add_tool(ask, name="ask", durable=ToolPolicy(interactive=True))
    server.add_tool(ask, name="background", durable=ToolPolicy(task_support="optional"))
    assert {"ask", "background"} <= {tool.name for tool in await server.list_tools()}
