"""Cancel and re-run from the console, by an admin, through a real browser against a real server.

Re-run: a completed call's page offers `re-run`; once confirmed, the next MCP call with the key
runs the tool again (a new attempt, not a replay). Cancel: a running call's page offers
`cancel`; once confirmed, the tool stops where it runs and the caller is answered `cancelled`.
Both leave an audit entry on the call's page. A non-admin gets neither button.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from tests.console.pages import TOKENS, console_url, counting_server, signed_in
from tests.helpers import client_as, key_meta
from tests.server.servers.counting import Counter


async def test_an_admin_re_runs_a_completed_call_from_its_page_and_the_next_call_runs_it_again(
    browser: Any, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "counter")
    async with counting_server(tmp_path) as served:
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            first = await alice.call_tool("record", {"text": "r"}, meta=key_meta("rerun-1"))
            again = await alice.call_tool("record", {"text": "r"}, meta=key_meta("rerun-1"))
        assert (again.meta or {}).get("mcp-durable/replayed") is True and counter.count("record") == 1
        page = f"{console_url(served)}/call?principal=alice&tool=record&key=rerun-1"
        bob = await signed_in(browser, console_url(served), "bob")
        await bob.goto(page)
        assert await bob.locator("#actions").count() == 0  # not bob's call, and bob is no admin
        ops = await signed_in(browser, console_url(served), "ops")
        await ops.goto(page)
        links = await ops.inner_text("#actions")
        assert "re-run" in links and "cancel" not in links and "forget" not in links  # what applies when completed
        await ops.click("#actions a:text('re-run')")
        await ops.fill("input[name=note]", "the provider lost it")
        await ops.click("#confirm button[type=submit]")
        assert "rerun" in await ops.inner_text("#audit")
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            rerun = await alice.call_tool("record", {"text": "r"}, meta=key_meta("rerun-1"))
    assert not rerun.is_error and not (rerun.meta or {}).get("mcp-durable/replayed")
    assert rerun.meta is not None and first.meta is not None
    assert rerun.meta["mcp-durable/key"] == first.meta["mcp-durable/key"]
    assert counter.count("record") == 2  # ran again, once


async def test_an_admin_cancels_a_running_call_from_its_page_and_its_caller_is_told(
    browser: Any, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "counter")
    answers: list[Any] = []
    async with counting_server(tmp_path) as served:

        async def call() -> None:
            async with client_as(served.url, TOKENS["alice"], "auto") as alice:
                answers.append(await alice.call_tool("gated", {"text": "c"}, meta=key_meta("cancel-1")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(30):
                while counter.count("gated") == 0:  # the tool is running (and blocked on its gate)
                    await anyio.sleep(0.05)
            ops = await signed_in(browser, console_url(served), "ops")
            await ops.goto(f"{console_url(served)}/call?principal=alice&tool=gated&key=cancel-1")
            await ops.click("#actions a:text('cancel')")
            await ops.fill("input[name=note]", "customer withdrew")
            await ops.click("#confirm button[type=submit]")
            assert "cancel" in await ops.inner_text("#audit")
            with anyio.fail_after(30):
                while not answers:
                    await anyio.sleep(0.05)
        counter.open_gate()  # too late: the cancelled run never finishes
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            repeat = await alice.call_tool("gated", {"text": "c"}, meta=key_meta("cancel-1"))
    (answer,) = answers
    assert answer.is_error and answer.meta is not None
    assert answer.meta["mcp-durable/error"]["error"] == "cancelled"
    assert repeat.is_error and repeat.meta is not None and repeat.meta["mcp-durable/error"]["error"] == "cancelled"
    assert counter.count("gated") == 1  # one run, cancelled; the repeat did not run it again
