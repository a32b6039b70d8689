"""A call left in doubt by a SIGKILL, seen and resolved in the console; live updates; the console
on its own beside a running server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_durable.demo.outbox import Outbox
from tests.cli.test_journal_cli import populate
from tests.console.pages import ENV, TOKENS, console_url, counting_server, listed_keys, signed_in, standalone_console
from tests.crash.crash_servers.hooks import CrashPlan
from tests.helpers import client_as, key_meta, read_json, serve_http


def bearer(principal: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[principal]}"}


DANGER = "tests/crash/crash_servers/danger.py:make_server"
MAIL = {"to": "customer@example.com", "subject": "Your refund", "body": "It is on its way."}


def _danger_env(tmp_path: Path) -> dict[str, str]:
    return {
        **ENV,
        "CRASH_PLAN": str(tmp_path / "plan.json"),
        "CRASH_COUNTER": str(tmp_path / "events.log"),
        "PAYMENTS_LEDGER": str(tmp_path / "ledger.db"),
        "MAILER_OUTBOX": str(tmp_path / "outbox.db"),
        "CRASH_MAIL_POLICY": "refuse",
        "CRASH_LEASE": "0.5",
        "CRASH_WAIT": "1",
    }


async def test_a_call_left_in_doubt_by_a_sigkill_is_resolved_from_the_page_and_the_next_call_sees_it(
    browser: Any, tmp_path: Path
) -> None:
    journal, env = f"file://{tmp_path}/journal", _danger_env(tmp_path)
    CrashPlan(tmp_path / "plan.json").arm("alice:mail-1", "danger_window")  # alice's scoped key: sent, not journaled
    async with serve_http(DANGER, journal=journal, env=env) as served:
        with pytest.raises(Exception):  # noqa: B017 - the server dies under the call, however that surfaces
            with anyio.fail_after(30):
                async with client_as(served.url, TOKENS["alice"], "auto") as alice:
                    await alice.call_tool("send_email", MAIL, meta=key_meta("mail-1"))
        served.proc.wait(timeout=10)
        assert served.proc.returncode == -9  # SIGKILL, in the danger window
    assert len(Outbox(str(tmp_path / "outbox.db")).mails()) == 1

    async with serve_http(DANGER, journal=journal, env=env) as served:
        base = console_url(served)
        ops = await signed_in(browser, base, "ops")
        assert int(await ops.inner_text("#in-doubt-count")) == 1
        assert "mail-1" in await ops.inner_text("#oldest-in-doubt")
        await ops.click("nav >> text=In doubt")
        row = ops.locator("#in-doubt tr[data-key='mail-1']")
        assert "alice" in await row.inner_text()
        await row.locator("a:text('resolve as completed')").click()
        assert "Confirm" in await ops.inner_text("h1")  # a confirmation before anything happens
        await ops.fill("textarea[name=result]", '{"sent": "checked in the outbox by hand"}')
        await ops.fill("input[name=note]", "mail found in the outbox")
        await ops.click("#confirm button[type=submit]")
        assert "Done: resolve as completed" in await ops.inner_text("#done")
        assert "resolve completed" in await ops.inner_text("#audit")
        assert "console:ops" in await ops.inner_text("#audit")
        await ops.click("nav >> text=In doubt")
        assert await ops.query_selector("#in-doubt tr[data-key='mail-1']") is None

        async with client_as(served.url, TOKENS["alice"], "legacy") as alice:
            again = await alice.call_tool("send_email", MAIL, meta=key_meta("mail-1"))
        assert not again.is_error
        assert again.structured_content == {"sent": "checked in the outbox by hand"}
        assert (again.meta or {}).get("mcp-durable/replayed") is True
    assert len(Outbox(str(tmp_path / "outbox.db")).mails()) == 1  # the tool did not run again


async def test_forget_from_the_page_lets_the_key_run_again_as_a_new_call(browser: Any, tmp_path: Path) -> None:
    journal, env = f"file://{tmp_path}/journal", _danger_env(tmp_path)
    CrashPlan(tmp_path / "plan.json").arm("alice:mail-2", "before_effect")
    async with serve_http(DANGER, journal=journal, env=env) as served:
        with pytest.raises(Exception):  # noqa: B017
            with anyio.fail_after(30):
                async with client_as(served.url, TOKENS["alice"], "auto") as alice:
                    await alice.call_tool("send_email", MAIL, meta=key_meta("mail-2"))
    async with serve_http(DANGER, journal=journal, env=env) as served:
        base = console_url(served)
        ops = await signed_in(browser, base, "ops")
        await ops.goto(f"{base}/call?principal=alice&tool=send_email&key=mail-2")
        await ops.click("#actions a:text('forget')")
        await ops.fill("input[name=note]", "never sent: safe to send anew")
        await ops.click("#confirm button[type=submit]")
        assert "forget" in await ops.inner_text("#audit")
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            # Other arguments under the same key: a new call, not key_reuse.
            fresh = await alice.call_tool("send_email", {**MAIL, "body": "Resent."}, meta=key_meta("mail-2"))
        assert not fresh.is_error and not (fresh.meta or {}).get("mcp-durable/replayed")
    assert [m["body"] for m in Outbox(str(tmp_path / "outbox.db")).mails()] == ["Resent."]


async def test_an_open_page_updates_live_when_a_call_changes(browser: Any, tmp_path: Path) -> None:
    from playwright.async_api import expect  # present: the `browser` fixture skipped or failed otherwise

    async with counting_server(tmp_path) as served:
        ops = await signed_in(browser, console_url(served), "ops", javascript=True)
        await ops.wait_for_selector("#live:not([hidden])")  # the event stream is open
        assert await ops.inner_text("#calls-total") == "0"
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            await alice.call_tool("record", {"text": "live"}, meta=key_meta("live-1"))
        await expect(ops.locator("#calls-total")).to_have_text("1", timeout=20_000)  # no reload: the event
        # A non-admin's page is not told about another principal's calls.
        bob = await signed_in(browser, console_url(served), "bob", javascript=True)
        await bob.wait_for_selector("#live:not([hidden])")
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            await alice.call_tool("record", {"text": "live"}, meta=key_meta("live-2"))
        await expect(ops.locator("#calls-total")).to_have_text("2", timeout=20_000)
        assert await bob.inner_text("#calls-total") == "0"
        # The pages' event streams end before the server stops: it would wait for them to close
        # (until it is killed) instead of stopping at once.
        for page in (ops, bob):
            await page.context.close()


async def test_the_console_on_its_own_reads_a_file_journal_beside_its_running_server(
    browser: Any, tmp_path: Path
) -> None:
    journal = f"file://{tmp_path}/journal"
    async with counting_server(tmp_path, journal) as served:
        async with client_as(served.url, TOKENS["alice"], "auto") as alice:
            await alice.call_tool("record", {"text": "x"}, meta=key_meta("beside-1"))
        async with standalone_console(journal) as base:
            ops = await signed_in(browser, base, "ops")
            await ops.goto(f"{base}/calls")
            assert await listed_keys(ops) == ["beside-1"]
            # The writer keeps working (the console took no lock), and the console sees its appends.
            async with client_as(served.url, TOKENS["alice"], "auto") as alice:
                await alice.call_tool("record", {"text": "y"}, meta=key_meta("beside-2"))
                assert (await read_json(alice, "journal://stats"))["calls"] == 2
            await ops.reload()
            assert await listed_keys(ops) == ["beside-2", "beside-1"]
            await ops.click("a:text('beside-1')")
            assert await ops.query_selector("#actions") is None  # read-only beside the writer
            assert TOKENS["ops"] not in await ops.content()
            async with httpx2.AsyncClient() as http:  # the same DNS-rebinding rule as the MCP endpoint
                rebound = await http.get(f"{base}/", headers={"Host": "evil.example", **bearer("ops")})
                assert rebound.status_code == 421
                assert (await http.get(f"{base}/", headers=bearer("ops"))).status_code == 200


async def test_the_console_on_its_own_masks_sensitive_values_and_resolves_on_a_shared_sqlite_journal(
    browser: Any, tmp_path: Path
) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    await populate(journal)  # refunds whose `card` is sensitive, and a `local` call in doubt
    async with standalone_console(journal) as base:
        ops = await signed_in(browser, base, "ops")
        await ops.goto(f"{base}/call?principal=local&tool=refund&key=r%2F1")
        page = await ops.inner_text("main")
        assert "[redacted]" in await ops.inner_text("#arguments") and "4111-0000" not in page
        assert "4111-0000" not in await ops.content()
        await ops.goto(f"{base}/in-doubt")
        await ops.locator("#in-doubt tr[data-key='ghost'] a:text('resolve as not applied')").click()
        await ops.fill("input[name=note]", "no refund at the provider")
        await ops.click("#confirm button[type=submit]")
        assert "Done: resolve as not applied" in await ops.inner_text("#done")
        assert "console:ops" in await ops.inner_text("#audit")
    from mcp_durable.journal import CallIdentity, CallState, create_journal

    store = create_journal(journal)
    await store.open()
    try:
        record = await store.get(CallIdentity("local", "refund", "ghost"))
    finally:
        await store.aclose()
    assert record is not None and record.state == CallState.RELEASED
