"""An upstream's `isError` result is not a final answer for a proxied tool unless its policy says so.

An upstream written on an SDK answers an exception (a transient crash) with an `isError` result,
which the proxy cannot tell from a deliberate one. Kept under the engine's default
(`tool_errors = "persist"`), it would answer every retry of the key with the crash for a day; the
proxy's default releases it, so a retry runs again. A policies file that says
`tool_errors = "persist"` (for the tool, or in `[defaults]`) keeps it.

The upstream is the plain Python upstream over stdio (a real subprocess); its `flaky` tool
(`idempotentHint: true`) raises on its first execution only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client, MCPError

from mcp_durable.policy_file import load_policies
from mcp_durable.proxy import ProxyServer
from mcp_durable.server.tasks import TASK_NOT_FOUND
from tests.helpers import first_text, key_meta, meta_of
from tests.proxy.task_clients import ERAS, client_kwargs, create_task, task_result
from tests.proxy.upstreams import plain_stdio_spec, upstream_env
from tests.server.servers.counting import Counter
from tests.server.task_client import request

RELEASED = {
    "no policies file": None,
    "a file listing the tool without tool_errors": '[tools.flaky]\nin_doubt = "refuse"\n',
    "tool_errors = release": '[tools.flaky]\ntool_errors = "release"\n',
}
PERSISTED = {
    "tool_errors = persist": '[tools.flaky]\ntool_errors = "persist"\n',
    "persist in [defaults]": '[defaults]\ntool_errors = "persist"\n\n[tools.flaky]\nin_doubt = "retry"\n',
}


def _proxy(tmp_path: Path, policies: str | None) -> tuple[ProxyServer, Counter]:
    env = upstream_env(tmp_path)
    loaded = None
    if policies is not None:
        path = tmp_path / "policies.toml"
        path.write_text(policies)
        loaded = load_policies(path)
    proxy = ProxyServer(plain_stdio_spec(env), loaded, journal=f"sqlite:///{tmp_path}/proxy.db")
    return proxy, Counter(env["COUNTER_FILE"])


@pytest.mark.parametrize("policies", list(RELEASED.values()), ids=list(RELEASED))
async def test_an_upstream_error_result_is_released_so_a_retry_runs_again(tmp_path: Path, policies: str | None) -> None:
    proxy, counter = _proxy(tmp_path, policies)
    async with Client(proxy, mode="legacy") as client:
        crashed = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
        retried = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
        replayed = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
    assert crashed.is_error and "Error executing tool flaky" in first_text(crashed)
    assert not retried.is_error, retried  # before the fix: the crash, replayed
    assert meta_of(retried).get("mcp-durable/replayed") is not True
    assert meta_of(replayed)["mcp-durable/replayed"] is True  # the success is final
    assert counter.count("flaky") == 2


@pytest.mark.parametrize("policies", list(PERSISTED.values()), ids=list(PERSISTED))
async def test_an_upstream_error_result_is_kept_where_the_policy_says_persist(tmp_path: Path, policies: str) -> None:
    proxy, counter = _proxy(tmp_path, policies)
    async with Client(proxy, mode="legacy") as client:
        crashed = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
        repeated = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
    assert crashed.is_error and repeated.is_error
    assert meta_of(repeated)["mcp-durable/replayed"] is True
    assert first_text(repeated) == first_text(crashed)
    assert counter.count("flaky") == 1


#: `flaky` made a task-capable durable tool under the proxy's default `tool_errors = "release"`;
#: `task_after = 0`: a 2026-07-28 call is answered with a task.
FLAKY_TASKS = '[tools.flaky]\ntask_support = "optional"\ntask_after = 0\n'


@pytest.mark.parametrize("era", ERAS)
async def test_a_released_upstream_error_result_is_its_tasks_result_and_a_retry_of_the_key_runs_again(
    tmp_path: Path, era: str
) -> None:
    proxy, counter = _proxy(tmp_path, FLAKY_TASKS)
    async with Client(proxy, **client_kwargs(era)) as client:
        crashed_id = await create_task(client, era, "flaky", {"text": "x"}, key="f-1")
        crashed = await task_result(client, era, crashed_id)
        crashed_task = await request(client, "tasks/get", {"taskId": crashed_id})
        if era == "modern":  # (a 2025-11-25 cancel of a terminal task is an error: not tried)
            await request(client, "tasks/cancel", {"taskId": crashed_id})
        after_cancel = await request(client, "tasks/get", {"taskId": crashed_id})
        retried_id = await create_task(client, era, "flaky", {"text": "x"}, key="f-1")
        retried = await task_result(client, era, retried_id)
        repeated_id = await create_task(client, era, "flaky", {"text": "x"}, key="f-1")
        with pytest.raises(MCPError) as superseded:
            await request(client, "tasks/get", {"taskId": crashed_id})
    # The upstream's own error result is the task's result (before the fix: `failed`, no result),
    # and the task is terminal: 2026-07-28 calls it completed (result.isError), 2025-11-25 failed.
    assert crashed["isError"] is True and "Error executing tool flaky" in crashed["content"][0]["text"]
    assert crashed_task["status"] == ("completed" if era == "modern" else "failed")
    assert after_cancel["status"] == crashed_task["status"]  # a cancel changes nothing
    # Released: a retry of the key runs again, as a new task; its success is final.
    assert retried_id != crashed_id and retried["isError"] is False
    assert repeated_id == retried_id and counter.count("flaky") == 2
    # The key's record is the retry's now: the first task id answers like an unknown one.
    assert superseded.value.error.message == TASK_NOT_FOUND
