"""Refused calls: `key_reuse`, `missing_key`, `invalid_key` — each an `isError` result with the
code in `_meta["mcp-durable/error"]` and a message, and the tool not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_durable import KEY_META
from tests.helpers import connect, first_text, key_meta, meta_of, request_meta
from tests.server.conftest import CountingSetup
from tests.server.servers.counting import Counter

MEMORY = ["memory-legacy", "memory-auto"]


def _refused(result: Any, code: str) -> None:
    assert result.is_error, result
    assert result.meta is not None and result.meta["mcp-durable/error"]["error"] == code, result
    assert result.meta["mcp-durable/error"]["message"]
    assert code in first_text(result)


@pytest.mark.parametrize("transport", MEMORY)
async def test_the_same_key_with_different_arguments_is_refused_as_key_reuse_and_the_tool_does_not_run(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        first = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
        reused = await client.call_tool("record", {"text": "b"}, meta=key_meta("k-1"))
        again = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
    assert not first.is_error
    _refused(reused, "key_reuse")
    assert meta_of(reused)["mcp-durable/error"]["key"] == "k-1"
    assert counter.count("record") == 1
    assert again.meta is not None and again.meta["mcp-durable/replayed"] is True  # the record is intact


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_required_key_tool_called_without_a_key_is_refused_as_missing_key(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        missing = await client.call_tool("required", {"text": "a"})
        keyed = await client.call_tool("required", {"text": "a"}, meta=key_meta("k-2"))
    _refused(missing, "missing_key")
    assert not keyed.is_error and keyed.meta is not None and keyed.meta["mcp-durable/key"] == "k-2"
    assert counter.count("required") == 1


BAD_KEYS = {
    "256 characters": "k" * 256,
    "a newline": "order\n7",
    "a NUL": "order\x007",
    "a DEL": "order\x7f",
    "non-ASCII": "ordér-7",
    "empty": "",
    "a number": 12345,
    "an object": {"id": "order-7"},
    "a list": ["order-7"],
}  # (a null is dropped by the client's serialiser before it reaches the wire)


@pytest.mark.parametrize("transport", MEMORY)
@pytest.mark.parametrize("bad", list(BAD_KEYS), ids=list(BAD_KEYS))
async def test_a_key_that_is_not_one_to_255_printable_ascii_characters_is_refused_as_invalid_key(
    transport: str, bad: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        result = await client.call_tool("record", {"text": "a"}, meta=request_meta({KEY_META: BAD_KEYS[bad]}))
    _refused(result, "invalid_key")
    assert counter.count("record") == 0


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_key_of_255_printable_ascii_characters_is_accepted(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    printable = "".join(chr(c) for c in range(0x20, 0x7F))  # space … tilde, 95 characters
    key = (printable * 3)[:255]
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        first = await client.call_tool("record", {"text": "a"}, meta=key_meta(key))
        second = await client.call_tool("record", {"text": "a"}, meta=key_meta(key))
    assert not first.is_error, first
    assert first.meta is not None and first.meta["mcp-durable/key"] == key
    assert second.meta is not None and second.meta["mcp-durable/replayed"] is True
    assert counter.count("record") == 1


async def test_keys_are_validated_the_same_over_stdio(tmp_path: Path, counting_setup: CountingSetup) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect("stdio-legacy", **counting_setup("stdio-legacy")) as client:
        results = [
            await client.call_tool("record", {"text": "a"}, meta=request_meta({KEY_META: bad}))
            for bad in (7, {"id": 1}, "k" * 256, "tab\tkey")
        ]
        accepted = await client.call_tool("record", {"text": "a"}, meta=key_meta("~" * 255))
    for result in results:
        _refused(result, "invalid_key")
    assert not accepted.is_error and accepted.meta is not None and accepted.meta["mcp-durable/key"] == "~" * 255
    assert counter.count("record") == 1


@pytest.mark.parametrize("transport", MEMORY)
async def test_the_meta_key_wins_over_the_key_argument(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        arguments = {"text": "a", "idempotency_key": "arg-key"}
        by_meta = await client.call_tool("keyed", arguments, meta=key_meta("meta-key"))
        by_arg = await client.call_tool("keyed", {"text": "a", "idempotency_key": "arg-key"})
    assert by_meta.meta is not None and by_meta.meta["mcp-durable/key"] == "meta-key"
    assert by_arg.meta is not None and by_arg.meta["mcp-durable/key"] == "arg-key"
    assert counter.count("keyed") == 2


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_call_with_invalid_arguments_is_refused_without_claiming_its_key(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        bad = await client.call_tool("slow", {"text": "a", "delay": "not a number"}, meta=key_meta("k-3"))
        good = await client.call_tool("slow", {"text": "a", "delay": 0}, meta=key_meta("k-3"))
    assert bad.is_error
    assert not good.is_error and good.meta is not None and "mcp-durable/replayed" not in good.meta
    assert counter.count("slow") == 1
