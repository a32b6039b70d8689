"""SIGKILL a FastMCP 4 server made durable before, inside and after the danger window, then retry.

The server is `shop_server.py`, a process of its own over stdio, on the file journal and on a
shared SQLite journal (where a killed owner's lease must run out before a retry takes its call
over). Each trial arms a crash at one point of one call (`tests/crash/crash_servers/hooks.py`):
`before_effect` (the claim journaled, nothing done downstream), `danger_window` (the effect made
downstream, its result not journaled), `after_journal` (the result journaled, not answered). The
test sees the server die, starts a new process on the same journal and retries with the same key,
as `tests/crash/test_danger_window.py` does for `mcp-durable serve`. The downstream systems are
SQLite files read by the test, never by the server: a ledger that honours keys (`refund`) and an
outbox that does not (`send_mail`).

A mail left in doubt under `reconcile` is also decided by the restarted server's background
recovery, with no call for its key: the middleware's engine, its tools' reconcile hooks and result
conversion, started by the server's lifespan.

One trial per crash point and configuration: a crash is armed at an exact point of the code, so
a further trial repeats the same path (`tests/crash/` runs the long trials for the engine itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_types import CallToolResult

from mcp_durable import CallIdentity, CallState, create_journal
from mcp_durable.journal.model import CallRecord
from tests.crash.crash_servers.harness import StdioServer, error_code, journal_url
from tests.crash.crash_servers.hooks import POINTS, Counter, CrashPlan
from tests.fastmcp.servers import SHOP_SERVER, Shop, shop_env, shop_stdio

JOURNALS = ["file", "sqlite"]
RECONCILED = "mcp-durable/reconciled"
REPLAYED = "mcp-durable/replayed"


class ShopProcess(StdioServer):
    """The crash tests' restartable stdio server (`StdioServer`), running `shop_server.py`."""

    def __init__(self, journal: str, env: Mapping[str, str]) -> None:
        super().__init__(str(SHOP_SERVER), journal, env)
        self.params = shop_stdio(journal, env)


@dataclass
class Run:
    """One configuration's server, crash plan, event counter and downstream systems."""

    tmp: Path
    journal: str
    mail_policy: str = "reconcile"
    settings: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.shop = Shop(self.tmp)
        self.plan = CrashPlan(self.tmp / "plan.json")
        self.events = Counter(self.tmp / "events.log")
        settings = {"SHOP_MAIL_POLICY": self.mail_policy, "SHOP_LEASE": "0.5", **self.settings}
        env = shop_env(self.shop, CRASH_PLAN=str(self.plan.path), CRASH_COUNTER=str(self.events.path), **settings)
        self.url = journal_url(self.journal, self.tmp)
        self.server = ShopProcess(self.url, env)

    async def crash(self, tool: str, args: dict[str, Any], key: str, point: str) -> None:
        """Arm a crash at `point` for `key`, call, check the server died there; start a new one."""
        self.plan.arm(key, point)
        result = await self.server.call(tool, args, key)
        assert result is None, f"the server should have been killed at {point} of {key}, but answered {result}"
        assert self.plan.armed() is None, "the crash plan fired (and was consumed)"
        await self.server.start()


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_refund_whose_provider_honours_the_key_is_made_once_and_its_result_never_lost(
    journal: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, journal)
    async with run.server:
        for trial, point in enumerate(POINTS):
            key, order = f"refund-{trial}", f"O-{trial}"
            args = {"order_id": order, "amount_cents": 100 + trial}
            await run.crash("refund", args, key, point)
            result = await run.server.call("refund", args, key)
            assert result is not None and not result.is_error, result
            effects = run.shop.ledger.effects(subject=order)
            assert len(effects) == 1, f"{point}: {len(effects)} refunds"
            assert result.structured_content is not None and result.structured_content["id"] == effects[0]["id"]
            invoked = run.events.count(f"invoke refund {key}")
            meta = result.meta or {}
            if point == "after_journal":
                assert invoked == 1 and meta.get(REPLAYED) is True, (point, invoked, meta)
            else:  # in doubt after the restart: `in_doubt = "retry"` runs it again, the provider deduplicates
                assert invoked == 2 and REPLAYED not in meta, (point, invoked, meta)
    assert [request["outcome"] for request in run.shop.ledger.requests()].count("applied") == len(POINTS)


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_mail_the_outbox_would_send_twice_is_sent_once_under_reconcile(journal: str, tmp_path: Path) -> None:
    run = Run(tmp_path, journal, mail_policy="reconcile")
    async with run.server:
        for trial, point in enumerate(POINTS):
            key = f"mail-{trial}"
            args = {"to": f"c{trial}@example.com", "subject": "Your refund", "body": f"trial {trial}"}
            await run.crash("send_mail", args, key, point)
            result = await run.server.call("send_mail", args, key)
            assert result is not None and not result.is_error, result
            mails = run.shop.outbox.mails(key=key)
            assert len(mails) == 1, f"{point}: {len(mails)} mails sent"
            assert result.structured_content is not None and result.structured_content["id"] == mails[0]["id"]
            meta = result.meta or {}
            invoked = run.events.count(f"invoke send_mail {key}")
            if point == "before_effect":
                assert invoked == 2 and not meta.get(RECONCILED), "not found in the outbox: the call ran"
            elif point == "danger_window":
                assert invoked == 1 and meta.get(RECONCILED) is True, "found in the outbox: completed, not resent"
            else:
                assert invoked == 1 and meta.get(REPLAYED) is True


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_mail_under_refuse_stays_in_doubt_never_runs_again_by_itself_and_the_operator_resolves_it(
    journal: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, journal, mail_policy="refuse")
    async with run.server:
        for trial, point in enumerate(POINTS):
            key = f"mail-{trial}"
            args = {"to": f"c{trial}@example.com", "subject": "Your refund", "body": f"trial {trial}"}
            await run.crash("send_mail", args, key, point)
            result = await run.server.call("send_mail", args, key)
            assert result is not None
            if point == "after_journal":
                assert not result.is_error and (result.meta or {}).get(REPLAYED) is True, result
            else:
                # Killed after the claim, before the record: in doubt, asked again still in doubt, never re-run.
                assert error_code(result) == "in_doubt", result
                again = await run.server.call("send_mail", args, key)
                assert again is not None and error_code(again) == "in_doubt", again
                listed = await run.server.call("in_doubt_calls", {"tool": "send_mail"})
                assert listed is not None and listed.structured_content is not None
                assert key in listed.structured_content["keys"]
                assert run.events.count(f"invoke send_mail {key}") == 1, "refuse must never run it again by itself"
                result = await _resolved_by_operator(run, key, args, sent_before=point == "danger_window")
            mails = run.shop.outbox.mails(key=key)
            assert len(mails) == 1, f"{point}: {len(mails)} mails sent"
            assert result.structured_content is not None and result.structured_content["id"] == mails[0]["id"]


async def _resolved_by_operator(run: Run, key: str, args: dict[str, Any], *, sent_before: bool) -> CallToolResult:
    """The operator looks in the outbox and resolves the call; the caller's next retry answers."""
    sent = run.shop.outbox.mails(key=key)
    assert len(sent) == (1 if sent_before else 0)
    if sent:
        found = {"id": sent[0]["id"], "to": sent[0]["to"], "subject": sent[0]["subject"], "status": "sent"}
        resolution: dict[str, Any] = {"tool": "send_mail", "key": key, "resolution": "completed", "result": found}
    else:
        resolution = {"tool": "send_mail", "key": key, "resolution": "not_applied"}
    resolved = await run.server.call("resolve_call", resolution)
    assert resolved is not None and not resolved.is_error, resolved
    result = await run.server.call("send_mail", args, key)
    assert result is not None and not result.is_error, result
    assert run.events.count(f"invoke send_mail {key}") == (1 if sent_before else 2)
    return result


@pytest.mark.parametrize("journal", JOURNALS)
@pytest.mark.parametrize("point", ["danger_window", "before_effect"])
async def test_a_mail_in_doubt_after_a_sigkill_is_reconciled_by_the_restarted_server_with_no_call_for_its_key(
    journal: str, point: str, tmp_path: Path
) -> None:
    # The lease outlives the restart, so on the shared journal the pass at start cannot decide yet
    # (the owner might be alive) and a later pass does.
    run = Run(tmp_path, journal, settings={"SHOP_RECONCILE_EVERY": "0.5", "SHOP_LEASE": "1"})
    key = f"mail-{point}"
    args = {"to": "ops@example.com", "subject": "Refunded", "body": "O-1 refunded"}
    async with run.server:
        await run.crash("send_mail", args, key, point)  # a new process on the same journal; no call for `key`
        record = await _decided(run.url, CallIdentity("local", "send_mail", key))
        sent = run.shop.outbox.mails(key=key)
        assert run.events.count(f"invoke send_mail {key}") == 1  # only the killed run
        if point == "danger_window":
            assert record.state == CallState.COMPLETED and record.result is not None
            assert len(sent) == 1 and sent[0]["id"].encode() in record.result
            again = await run.server.call("send_mail", args, key)
            assert again is not None and (again.meta or {}).get(REPLAYED) is True, again
            assert again.structured_content is not None and again.structured_content["id"] == sent[0]["id"]
        else:
            assert record.state == CallState.RELEASED and sent == []
            again = await run.server.call("send_mail", args, key)
            assert again is not None and not again.is_error, again
            assert run.events.count(f"invoke send_mail {key}") == 2  # not applied: the next call sends it
        assert len(run.shop.outbox.mails(key=key)) == 1


async def _decided(url: str, identity: CallIdentity) -> CallRecord:
    """Re-read the record (read-only, as the CLI would) until the background has decided it."""
    read_only = url + ("&" if "?" in url else "?") + "mode=ro"
    with anyio.fail_after(60):  # a bound on a hang, not a timing assertion
        while True:
            journal = create_journal(read_only)
            await journal.open()
            try:
                record = await journal.get(identity)
            finally:
                await journal.aclose()
            if record is not None and record.state in (CallState.COMPLETED, CallState.RELEASED):
                return record
            await anyio.sleep(0.1)
