"""tools/mailer.py and tools/shipping.py served by `mcp-durable serve tools/NAME.py` (stdio subprocesses)."""

from __future__ import annotations

from pathlib import Path

from mcp_durable.demo.outbox import Outbox
from mcp_durable.demo.warehouse import Warehouse
from tests.helpers import connect, key_meta, meta_of

MAIL = {"to": "ann@example.com", "subject": "Your refund", "body": "It is on its way."}


async def test_the_served_mailer_requires_a_key_and_sends_one_mail_per_key(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.db")
    async with connect(
        "stdio-legacy",
        target="tools/mailer.py",
        journal=f"sqlite:///{tmp_path}/j.db",
        env={"MAILER_OUTBOX": str(outbox.path)},
    ) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        missing = await client.call_tool("send_email", MAIL)
        first = await client.call_tool("send_email", MAIL, meta=key_meta("welcome-ann"))
        second = await client.call_tool("send_email", MAIL, meta=key_meta("welcome-ann"))
    assert not (tools["send_email"].annotations and tools["send_email"].annotations.idempotent_hint)
    assert missing.is_error and meta_of(missing)["mcp-durable/error"]["error"] == "missing_key"
    assert not first.is_error and second.structured_content == first.structured_content
    assert second.meta is not None and second.meta["mcp-durable/replayed"] is True
    assert [m["id"] for m in outbox.mails()] == [first.structured_content["id"]]


async def test_the_served_shipping_tool_ships_an_order_once(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "warehouse.db")
    async with connect(
        "stdio-legacy",
        target="tools/shipping.py",
        journal=f"sqlite:///{tmp_path}/j.db",
        env={"WAREHOUSE_DB": str(warehouse.path)},
    ) as client:
        first = await client.call_tool("ship_order", {"order_id": "O-42"})
        second = await client.call_tool("ship_order", {"order_id": "O-42"})
    assert not first.is_error and second.structured_content == first.structured_content
    assert [o["outcome"] for o in warehouse.operations("O-42")] == ["applied"] * 3
    assert warehouse.available("SKU-1") == 999
