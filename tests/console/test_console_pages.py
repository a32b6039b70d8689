"""The console's pages against a real `mcp-durable serve --transport http`, in a real browser
(JavaScript off: every page and form works without it), compared with what a real MCP client reads."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2

from tests.console.pages import TOKENS, console_url, counting_server, listed_keys, signed_in, table_counts
from tests.helpers import client_as, key_meta, read_json


async def _calls(url: str, principal: str, calls: list[tuple[str, str]]) -> None:
    async with client_as(url, TOKENS[principal], "auto") as client:
        for tool, key in calls:
            await client.call_tool(tool, {"text": key}, meta=key_meta(key))


async def test_the_overview_shows_the_figures_of_journal_stats_read_through_an_mcp_client(
    browser: Any, tmp_path: Path
) -> None:
    async with counting_server(tmp_path) as served:
        await _calls(served.url, "alice", [("record", "a-1"), ("record", "a-2"), ("tool_error", "a-3")])
        await _calls(served.url, "bob", [("record", "b-1"), ("whoami", "b-2")])
        for principal in ("ops", "alice"):
            async with client_as(served.url, TOKENS[principal], "auto") as client:
                stats = await read_json(client, "journal://stats")
            page = await signed_in(browser, console_url(served), principal)
            assert int(await page.inner_text("#calls-total")) == stats["calls"]
            assert await table_counts(page, "by-state", "state") == stats["calls_by_state"]
            assert await table_counts(page, "by-tool", "tool") == stats["calls_by_tool"]
            assert await page.inner_text("#backend") == stats["backend"]
            # Every call of the scope was made in the last minute: the chart's bars add up to them.
            bars = await page.eval_on_selector_all("#per-minute rect", "rs => rs.map(r => +r.dataset.n)")
            assert len(bars) == 60 and sum(bars) == stats["calls"]
            assert "None: nothing waits" in await page.inner_text("#oldest-in-doubt")
            html = await page.content()
            assert all(token not in html for token in TOKENS.values())  # no secret is ever rendered
        assert stats["scope"] == "principal" and stats["calls"] == 3  # alice's own, not bob's


async def test_the_call_list_filters_by_tool_state_principal_time_and_key_prefix_and_pages(
    browser: Any, tmp_path: Path
) -> None:
    async with counting_server(tmp_path) as served:
        keys = [f"order-{i:02d}" for i in range(7)]
        await _calls(served.url, "alice", [("record", k) for k in keys] + [("tool_error", "refused-1")])
        await _calls(served.url, "bob", [("record", "order-bob")])
        base = console_url(served)
        page = await signed_in(browser, base, "ops")

        await page.goto(f"{base}/calls")
        await page.fill("input[name=key_prefix]", "order-0")
        await page.fill("input[name=limit]", "3")
        await page.click("#filters button[type=submit]")
        pages = [await listed_keys(page)]
        while await page.query_selector("#next-page"):
            await page.click("#next-page")
            pages.append(await listed_keys(page))
        assert pages == [keys[6:3:-1], keys[3:0:-1], keys[0:1]]  # newest first, 3 a page, no empty page
        await page.click("#first-page")
        assert await listed_keys(page) == keys[6:3:-1]

        await page.goto(f"{base}/calls")
        await page.select_option("select[name=state]", "failed")
        await page.click("#filters button[type=submit]")
        assert await listed_keys(page) == ["refused-1"]
        await page.goto(f"{base}/calls")
        await page.select_option("select[name=tool]", "record")
        await page.fill("input[name=principal]", "bob")
        await page.click("#filters button[type=submit]")
        assert await listed_keys(page) == ["order-bob"]

        # Time range (UTC): everything was created after `since` and before `until`.
        async with client_as(served.url, TOKENS["ops"], "auto") as client:
            listing = await read_json(client, "journal://calls?limit=100")
        created = sorted(datetime.fromisoformat(c["created_at"]) for c in listing["calls"])
        since, until = created[0].replace(microsecond=0), created[-1] + timedelta(seconds=1)
        await page.goto(f"{base}/calls?since={since:%Y-%m-%dT%H:%M:%S}&until={until:%Y-%m-%dT%H:%M:%S}Z&limit=100")
        assert sorted(await listed_keys(page)) == sorted(c["key"] for c in listing["calls"])
        await page.goto(f"{base}/calls?since={until:%Y-%m-%dT%H:%M:%S}")
        assert await listed_keys(page) == []
        await page.goto(f"{base}/calls?until=2001-01-01T00:00")
        assert await listed_keys(page) == []
        await page.goto(f"{base}/calls?since=2001-01-01T00:00&key_prefix=order-0")
        assert sorted(await listed_keys(page)) == keys

        # A non-admin's list is its own, whatever principal it asks for.
        alice = await signed_in(browser, base, "alice")
        await alice.goto(f"{base}/calls?principal=bob&limit=100")
        assert sorted(await listed_keys(alice)) == sorted([*keys, "refused-1"])
        assert await alice.query_selector("input[name=principal]") is None


async def test_a_call_page_shows_the_record_masked_arguments_result_and_steps(browser: Any, tmp_path: Path) -> None:
    async with counting_server(tmp_path) as served:
        await _calls(served.url, "alice", [("record", "page-1")])
        page = await signed_in(browser, console_url(served), "ops")
        await page.goto(f"{console_url(served)}/calls")
        await page.click("a:text('page-1')")
        async with client_as(served.url, TOKENS["alice"], "auto") as client:
            view = await read_json(client, "journal://calls/record/page-1")
        assert await page.inner_text("#attempts") == str(view["attempts"])
        assert view["run_id"] in await page.inner_text("#record")
        assert '"text": "page-1"' in await page.inner_text("#arguments")
        assert view["result"]["structuredContent"]["run"] in await page.inner_text("#result")
        assert "created (claimed)" in await page.inner_text("#timeline")
        # Completed: no verdict, forget or cancel applies; an admin may only re-run it.
        assert (await page.inner_text("#actions")).split() == ["re-run"]


async def test_a_non_admin_sees_only_its_calls_no_action_buttons_and_a_forged_post_is_refused(
    browser: Any, tmp_path: Path
) -> None:
    async with counting_server(tmp_path) as served:
        await _calls(served.url, "alice", [("record", "mine")])
        await _calls(served.url, "bob", [("record", "bobs")])
        base = console_url(served)
        alice = await signed_in(browser, base, "alice")
        await alice.goto(f"{base}/calls")
        assert await listed_keys(alice) == ["mine"]
        response = await alice.goto(f"{base}/call?principal=bob&tool=record&key=bobs")
        assert response is not None and response.status == 404  # like a call that does not exist
        assert "bobs" not in await alice.inner_text("main") or "No call" in await alice.inner_text("main")
        await alice.goto(f"{base}/in-doubt")
        assert await alice.query_selector("a.button") is None
        response = await alice.goto(f"{base}/act?principal=alice&tool=record&key=mine&action=forget")
        assert response is not None and response.status == 403
        # A forged POST with alice's own valid session and CSRF token: refused, nothing changes.
        csrf = await alice.get_attribute("input[name=csrf]", "value")
        forged = await alice.request.post(
            f"{base}/act",
            form={"csrf": str(csrf), "action": "forget", "principal": "bob", "tool": "record", "key": "bobs"},
        )
        assert forged.status == 403
        async with client_as(served.url, TOKENS["bob"], "auto") as bob:
            assert (await read_json(bob, "journal://calls/record/bobs"))["state"] == "completed"


async def test_a_request_without_a_token_or_with_a_wrong_one_is_refused(browser: Any, tmp_path: Path) -> None:
    async with counting_server(tmp_path) as served:
        base = console_url(served)
        context = await browser.new_context(java_script_enabled=False)
        page = await context.new_page()
        for path in ("/", "/calls", "/in-doubt", "/call?tool=record&key=x"):
            response = await page.goto(base + path)
            assert response is not None and response.status == 401
            assert await page.query_selector("input[name=token]") is not None  # the login page
        await page.fill("input[name=token]", "not-a-token")
        await page.click("button[type=submit]")
        assert "not accepted" in await page.inner_text("main")
        async with httpx2.AsyncClient() as http:
            for path in ("/events", "/calls"):
                assert (await http.get(base + path)).status_code == 401
                assert (await http.get(base + path, headers={"Authorization": "Bearer wrong"})).status_code == 401
            assert (await http.post(base + "/act", data={"action": "forget"})).status_code == 401
            # The Authorization header works as well as the login form.
            shown = await http.get(base + "/calls", headers={"Authorization": f"Bearer {TOKENS['alice']}"})
            assert shown.status_code == 200 and ">alice<" in shown.text


async def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(browser: Any, tmp_path: Path) -> None:
    async with counting_server(tmp_path) as served:
        base = console_url(served)
        ops = await signed_in(browser, base, "ops")
        csrf = await ops.get_attribute("input[name=csrf]", "value")
        form = {"action": "forget", "principal": "alice", "tool": "record", "key": "x"}
        for extra in ({}, {"csrf": "forged"}):
            refused = await ops.request.post(f"{base}/act", form={**form, **extra})
            assert refused.status == 403 and "CSRF" in await refused.text()
        cross = await ops.request.post(
            f"{base}/act", form={**form, "csrf": str(csrf)}, headers={"Origin": "http://evil.example"}
        )
        assert cross.status == 403
        # The session's own token from the same origin gets through to the action (no such call).
        allowed = await ops.request.post(f"{base}/act", form={**form, "csrf": str(csrf)})
        assert allowed.status == 404 and "no call" in await allowed.text()
        # DNS rebinding: another Host is refused as the MCP endpoint refuses it.
        async with httpx2.AsyncClient() as http:
            headers = {"Host": "evil.example", "Authorization": f"Bearer {TOKENS['ops']}"}
            rebound = await http.get(base + "/", headers=headers)
            assert rebound.status_code == 421


async def test_serve_without_the_console_has_no_console(tmp_path: Path) -> None:
    from tests.console.pages import COUNTING, ENV
    from tests.helpers import serve_http

    env = {**ENV, "COUNTER_FILE": str(tmp_path / "counter")}
    async with serve_http(COUNTING, journal=f"file://{tmp_path}/j", env=env, extra_args=["--no-console"]) as served:
        async with httpx2.AsyncClient() as http:
            shown = await http.get(console_url(served) + "/", headers={"Authorization": f"Bearer {TOKENS['ops']}"})
        assert shown.status_code == 404
        assert "console: off (--no-console)" in served.stderr()
