"""Registration refuses an interactive tool that may run as a task.

A task runs in the background, outside any request: an interactive tool (it asks its client
while it runs) has no client to ask there, so every run of it as a task would fail. Such a
policy is refused when the tool is registered, with a `ConfigError` naming the tool and why,
and the tool is left unregistered.
"""

from __future__ import annotations

import pytest

from mcp_durable import ConfigError, DurableServer, ToolPolicy


@pytest.mark.parametrize("support", ["optional", "required"])
async def test_an_interactive_tool_with_task_support_is_refused_at_registration(support: str) -> None:
    server = DurableServer("interactive-tasks", journal="memory://")
    policy = ToolPolicy(interactive=True, task_support=support)  # type: ignore[arg-type]  # a Literal, parametrized

    with pytest.raises(ConfigError) as refused:

        @server.tool(durable=policy)
        async def confirm_order(order_id: str) -> str:
            return order_id

    message = str(refused.value)
    assert "'confirm_order'" in message and "interactive" in message and f"task_support={support!r}" in message
    assert "background" in message  # why: a task has no client to ask
    assert "confirm_order" not in {tool.name for tool in await server.list_tools()}
    assert "confirm_order" not in server.policies


async def test_interactive_tools_without_tasks_and_task_tools_that_are_not_interactive_register() -> None:
    server = DurableServer("interactive-tasks", journal="memory://")

    async def ask(order_id: str) -> str:
        return order_id

    server.add_tool(ask, name="ask", durable=ToolPolicy(interactive=True))
    server.add_tool(ask, name="background", durable=ToolPolicy(task_support="optional"))
    assert {"ask", "background"} <= {tool.name for tool in await server.list_tools()}
