"""A FastMCP 4 server's tools made durable by `make_durable`: one effect per key, replays
byte-identical with the replay `_meta`, `key_reuse`, a duplicate in flight waiting for the first.

Through FastMCP's own `Client` (in memory) and the MCP Python SDK's `Client` over streamable HTTP
in both protocol eras. Effects are counted outside the server, in the stand-ins' ledger and outbox.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from tests.fastmcp.servers import CLIENTS, FastMCPClient, Shop, arrivals, connected, make_durable, shop_app
from tests.helpers import body_bytes, first_text, meta_of

REPLAYED = "mcp-durable/replayed"
FIRST = "mcp-durable/first-completed-at"
REFUND = {"order_id": "O-1", "amount_cents": 500}
MAIL = {"to": "ada@example.com", "subject": "Your refund", "body": "500 cents are on their way."}


@pytest.mark.parametrize("client", CLIENTS)
async def test_each_key_makes_one_effect_and_its_repeats_replay_the_first_answer_byte_for_byte(
    client: str, tmp_path: Path
) -> None:
    shop = Shop(tmp_path)
    app = shop_app(shop)
    make_durable(app, journal="memory://", policies=shop.policies)
    async with connected(client, app) as caller:
        refunds = [await caller.call("refund", REFUND, key="refund-O-1") for _ in range(3)]
        mails = [await caller.call("send_mail", MAIL, key="mail-O-1") for _ in range(3)]
        another = await caller.call("refund", REFUND, key="refund-O-1-again")  # a new key: a new refund
    assert [effect["amount_cents"] for effect in shop.ledger.effects(op="refund")] == [500, 500]
    assert len(shop.ledger.requests()) == 2  # the provider was asked once per key: the tool ran once per key
    assert len(shop.outbox.mails()) == 1
    for results, key in ((refunds, "refund-O-1"), (mails, "mail-O-1")):
        first, repeats = results[0], results[1:]
        assert not first.is_error, first
        assert meta_of(first)["mcp-durable/key"] == key and REPLAYED not in meta_of(first)
        for repeat in repeats:
            assert body_bytes(repeat) == body_bytes(first)
            assert meta_of(repeat)[REPLAYED] is True and meta_of(repeat)["mcp-durable/key"] == key
            assert meta_of(repeat)[FIRST] == meta_of(first)[FIRST]
    assert refunds[0].structured_content is not None and another.structured_content is not None
    assert refunds[0].structured_content["id"] != another.structured_content["id"]


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_key_used_again_with_other_arguments_is_refused_key_reuse_and_nothing_runs(
    client: str, tmp_path: Path
) -> None:
    shop = Shop(tmp_path)
    app = shop_app(shop)
    make_durable(app, journal="memory://", policies=shop.policies)
    async with connected(client, app) as caller:
        first = await caller.call("refund", REFUND, key="k-1")
        reused = await caller.call("refund", {**REFUND, "amount_cents": 900}, key="k-1")
        mail = await caller.call("send_mail", MAIL, key="k-2")
        mail_reused = await caller.call("send_mail", {**MAIL, "subject": "Another"}, key="k-2")
    assert not first.is_error and not mail.is_error
    for refused, key in ((reused, "k-1"), (mail_reused, "k-2")):
        assert refused.is_error
        error = meta_of(refused)["mcp-durable/error"]
        assert error["error"] == "key_reuse" and error["key"] == key
        assert meta_of(refused)["mcp-durable/key"] == key
        assert first_text(refused).startswith("key_reuse: ")
        assert refused.structured_content == error  # the tools' open object schema accepts the refusal
    assert [effect["amount_cents"] for effect in shop.ledger.effects(op="refund")] == [500]
    assert len(shop.outbox.mails()) == 1


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_duplicate_in_flight_waits_for_the_first_call_and_gets_its_answer(client: str, tmp_path: Path) -> None:
    shop = Shop(tmp_path)
    app = shop_app(shop)
    make_durable(app, journal="memory://", policies=shop.policies)
    seen = arrivals(app)
    results: dict[str, Any] = {}
    async with connected(client, app) as caller:

        async def call(which: str) -> None:
            results[which] = await caller.call("refund", REFUND, key="in-flight")

        gate = shop.hold_refunds()
        async with anyio.create_task_group() as group:
            group.start_soon(call, "first")
            await seen.wait_for("refund", 1)
            group.start_soon(call, "second")
            await seen.wait_for("refund", 2)  # both are in the server; the first is held in the tool
            await anyio.wait_all_tasks_blocked()  # the second is waiting on the first's record
            await checkpoint()
            gate.set()
    first, second = results["first"], results["second"]
    assert len(shop.ledger.requests()) == 1  # one run for the two calls
    assert not first.is_error and not second.is_error, (first, second)
    assert body_bytes(second) == body_bytes(first)
    assert meta_of(second)[REPLAYED] is True and REPLAYED not in meta_of(first)


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_read_only_tool_is_not_journaled_and_a_mail_without_a_key_is_refused(
    client: str, tmp_path: Path
) -> None:
    shop = Shop(tmp_path)
    app = shop_app(shop)
    durable = make_durable(app, journal="memory://", policies=shop.policies)
    async with connected(client, app) as caller:
        before = await caller.call("order_status", {"order_id": "O-1"})
        await caller.call("refund", REFUND, key="r")
        after = await caller.call("order_status", {"order_id": "O-1"})
        unkeyed = await caller.call("send_mail", MAIL)
    assert before.structured_content == {"order_id": "O-1", "refunds": 0}
    assert after.structured_content == {"order_id": "O-1", "refunds": 1}  # read anew: never replayed
    assert before.meta is None or "mcp-durable/key" not in before.meta
    assert unkeyed.is_error and meta_of(unkeyed)["mcp-durable/error"]["error"] == "missing_key"
    assert shop.outbox.mails() == []
    assert set(durable.durable) == {"refund", "send_mail"}


async def test_durable_tools_advertise_idempotent_hint_and_the_read_only_tool_keeps_its_annotations(
    tmp_path: Path,
) -> None:
    shop = Shop(tmp_path)
    app = shop_app(shop)
    make_durable(app, journal="memory://", policies=shop.policies)
    async with FastMCPClient(app) as client:
        listed = {tool.name: tool for tool in await client.list_tools()}
    refund, mail, status = listed["refund"], listed["send_mail"], listed["order_status"]
    assert refund.annotations is not None and refund.annotations.idempotent_hint is True
    # send_mail takes only its caller's key (`key = "required"`): a repeat is deduplicated, so the
    # hint is kept too; its own annotations stay as they were.
    assert mail.annotations is not None and mail.annotations.idempotent_hint is True
    assert mail.annotations.destructive_hint is True
    assert status.annotations is not None and status.annotations.read_only_hint is True
    assert status.annotations.idempotent_hint is None
