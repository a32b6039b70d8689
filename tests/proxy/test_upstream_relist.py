"""An upstream session's tools listed again after the upstream's `notifications/tools/list_changed`.

The proxy lists them again as soon as it hears the change (`ProxyServer._tools_changed`), and a
client's listing or call that comes while that listing is under way must wait for it: answered
from the listing before the change, a client told "the tool exists" (by the response of the
call that made it) would not find it. A real stdio upstream (`subscribable_upstream.py`: its
`grow` adds the tool `extra` and announces it before answering).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp_types import ServerNotification, ToolListChangedNotification

from mcp_durable.proxy.upstream import Upstream, UpstreamSpec
from tests.helpers import REPO
from tests.proxy.upstreams import upstream_env

SUBSCRIBABLE = "tests/proxy/servers/subscribable_upstream.py"
SLOW_LIST_S = 1.0


async def test_a_request_made_while_the_changed_tools_are_listed_again_waits_for_that_listing(tmp_path: Path) -> None:
    told = anyio.Event()

    async def on_notification(message: ServerNotification) -> None:
        if isinstance(message, ToolListChangedNotification):
            told.set()

    env = {**upstream_env(tmp_path), "SUBSCRIBABLE_SLOW_LIST_S": str(SLOW_LIST_S)}
    spec = UpstreamSpec(command=[sys.executable, str(REPO / SUBSCRIBABLE)], env=env, cwd=str(REPO))
    pool = Upstream(spec, on_notification)
    async with anyio.create_task_group() as group:
        await group.start(pool.supervise)
        session = pool.session()
        client = await session.client()
        assert "extra" not in session.tools
        listed = session.listings
        await client.call_tool("grow", {})
        with anyio.fail_after(10):
            await told.wait()  # the session has marked its tools stale (before telling)
        group.start_soon(session.client)  # the proxy's own relisting, as `_tools_changed` starts it
        # … under way: the upstream answers its listing after `SLOW_LIST_S`. (Were it not begun
        # yet, this request would list the tools itself: the test could pass without the rule,
        # never fail with it.)
        await anyio.sleep(SLOW_LIST_S / 5)
        await session.client()  # a client's request in the meantime
        assert "extra" in session.tools
        assert session.listings == listed + 1  # one listing again, shared
        pool.stop()
