"""Bad input gets a clear refusal and changes nothing: through real MCP clients, in both protocol eras.

After every refusal the journal is compared with a snapshot taken before it, and the tool's
body must not have run. A well-formed call with the same key afterwards still runs: a refusal
never poisons a key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from mcp_durable.journal import CallState, Journal
from tests.hardening.conftest import KEY_META, Runs, build_server, connect, snapshot, text_of
from tests.helpers import key_meta, meta_of

WRONG_TYPES: list[Any] = [5, 1.5, True, {"key": "k"}, ["k"]]  # (a null key is dropped by the client: see the raw test)
BAD_STRINGS = [
    "",  # empty
    "k" * 256,  # one over the 255-character limit
    "line\nbreak",
    "nul\x00byte",
    "tab\tkey",
    "del\x7f",
    "escape\x1b[31m",
    "clé",  # non-ASCII
    "ключ",
    "emoji-🔑",
    "zero\u200bwidth",
]


@pytest.fixture
def served(embedded: str, journal_for: Callable[[str], Journal]) -> tuple[Any, Runs]:
    runs = Runs()
    return build_server(journal_for(embedded), runs), runs


async def _refused_without_change(client: Any, server: Any, runs: Runs, call: Callable[[], Any]) -> Any:
    before = await snapshot(server.journal)
    ran_before = len(runs.calls)
    result = await call()
    assert await snapshot(server.journal) == before, "a refusal changed the journal"
    assert len(runs.calls) == ran_before, "a refused call ran the tool"
    return result


@pytest.mark.parametrize("key", WRONG_TYPES, ids=lambda k: type(k).__name__)
async def test_a_key_of_the_wrong_type_is_refused_as_invalid_key_and_changes_nothing(
    served: tuple[Any, Runs], mode: str, key: Any
) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        result = await _refused_without_change(
            client,
            server,
            runs,
            lambda: client.call_tool("pay", {"order_id": "O-1", "amount_cents": 5}, meta=key_meta(key)),
        )
        assert result.is_error and result.meta["mcp-durable/error"]["error"] == "invalid_key"
        assert "must be a string" in result.structured_content["reason"]
        ok = await client.call_tool("pay", {"order_id": "O-1", "amount_cents": 5}, meta=key_meta("K-1"))
        assert not ok.is_error and runs.count("pay") == 1


@pytest.mark.parametrize("key", BAD_STRINGS, ids=lambda k: repr(k)[:20])
async def test_an_empty_overlong_control_or_non_ascii_key_is_refused_and_changes_nothing(
    served: tuple[Any, Runs], mode: str, key: str
) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        result = await _refused_without_change(
            client, server, runs, lambda: client.call_tool("echo", {"text": "a"}, meta=key_meta(key))
        )
        assert result.is_error and result.meta["mcp-durable/error"]["error"] == "invalid_key"
        assert result.structured_content["tool"] == "echo" and result.structured_content["reason"]


async def test_a_key_of_exactly_255_printable_characters_is_accepted(served: tuple[Any, Runs], mode: str) -> None:
    server, runs = served
    key = "".join(chr(32 + i % 95) for i in range(255))  # every printable ASCII character, space to tilde
    async with connect(server, mode) as client:
        first = await client.call_tool("echo", {"text": "a"}, meta=key_meta(key))
        again = await client.call_tool("echo", {"text": "a"}, meta=key_meta(key))
    assert not first.is_error and meta_of(first)["mcp-durable/key"] == key
    assert meta_of(again).get("mcp-durable/replayed") is True and runs.count("echo") == 1


async def test_a_missing_required_key_is_refused_and_changes_nothing(served: tuple[Any, Runs], mode: str) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        result = await _refused_without_change(
            client, server, runs, lambda: client.call_tool("pay", {"order_id": "O-1", "amount_cents": 5})
        )
    assert result.meta["mcp-durable/error"]["error"] == "missing_key"


async def test_arguments_over_the_size_limit_are_refused_before_any_claim(served: tuple[Any, Runs], mode: str) -> None:
    server, runs = served
    assert server.max_argument_bytes == 1 << 20  # the documented default
    overhead = len('{"text":""}')
    async with connect(server, mode) as client:
        result = await _refused_without_change(
            client,
            server,
            runs,
            lambda: client.call_tool("echo", {"text": "x" * ((1 << 20) - overhead + 1)}, meta=key_meta("big")),
        )
        assert result.is_error
        assert "1048577 bytes" in text_of(result) and "max_argument_bytes" in text_of(result)
        assert result.meta["mcp-durable/error"] == {
            "error": "too_large",
            "message": text_of(result).removeprefix("too_large: "),
            "what": "arguments",
            "size_bytes": 1048577,
            "limit_bytes": 1 << 20,
        }
        # Exactly at the limit it runs; the refused key was not poisoned.
        ok = await client.call_tool("echo", {"text": "x" * ((1 << 20) - overhead)}, meta=key_meta("big"))
    assert not ok.is_error and runs.count("echo") == 1


async def test_the_argument_limit_is_configurable(embedded: str, journal_for: Callable[[str], Journal]) -> None:
    runs = Runs()
    server = build_server(journal_for(embedded), runs, max_argument_bytes=100)
    async with connect(server, "legacy") as client:
        refused = await _refused_without_change(
            client, server, runs, lambda: client.call_tool("echo", {"text": "y" * 100})
        )
        ok = await client.call_tool("echo", {"text": "y" * 50})
    assert refused.is_error and "limit is 100 bytes" in text_of(refused)
    assert not ok.is_error and runs.count("echo") == 1


async def test_arguments_the_journal_cannot_encode_are_refused_and_change_nothing(
    served: tuple[Any, Runs], mode: str
) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        result = await _refused_without_change(client, server, runs, lambda: client.call_tool("count", {"n": 2**70}))
    assert result.is_error and "not JSON-serialisable" in text_of(result)
    assert result.meta["mcp-durable/error"]["error"] == "not_serialisable"


async def test_a_result_that_cannot_be_serialised_becomes_an_error_and_is_released(
    served: tuple[Any, Runs], mode: str
) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        first = await client.call_tool("huge_number", {}, meta=key_meta("n-1"))
        assert first.is_error and "cannot be journaled" in text_of(first)
        assert meta_of(first)["mcp-durable/error"] == {
            "error": "not_serialisable",
            "what": "result",
            "message": meta_of(first)["mcp-durable/error"]["message"],
        }
        records, _ = await snapshot(server.journal)
        (record,) = [r for r in records if r.identity.tool == "huge_number"]
        assert record.state == CallState.RELEASED and record.result is None, "the record was left pending"
        again = await client.call_tool("huge_number", {}, meta=key_meta("n-1"))
    assert again.is_error and runs.count("huge_number") == 2  # released: a retry runs it again


async def test_an_unserialisable_result_under_persisted_exceptions_is_a_replayed_failure(
    served: tuple[Any, Runs], mode: str
) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        first = await client.call_tool("huge_number_persisted", {}, meta=key_meta("p-1"))
        again = await client.call_tool("huge_number_persisted", {}, meta=key_meta("p-1"))
        records, _ = await snapshot(server.journal)
    (record,) = [r for r in records if r.identity.tool == "huge_number_persisted"]
    assert record.state == CallState.FAILED
    assert first.is_error and again.is_error and meta_of(again).get("mcp-durable/replayed") is True
    assert text_of(again) == text_of(first) and "cannot be journaled" in text_of(first)
    assert (
        meta_of(again)["mcp-durable/error"]["error"]
        == meta_of(first)["mcp-durable/error"]["error"]
        == "not_serialisable"
    )
    assert runs.count("huge_number_persisted") == 1


async def test_a_result_over_the_result_limit_becomes_an_error_and_is_released(
    embedded: str, journal_for: Callable[[str], Journal], mode: str
) -> None:
    runs = Runs()
    server = build_server(journal_for(embedded), runs, max_result_bytes=10_000)
    async with connect(server, mode) as client:
        small = await client.call_tool("blob", {"size": 1_000}, meta=key_meta("small"))
        big = await client.call_tool("blob", {"size": 20_000}, meta=key_meta("big"))
        records, _ = await snapshot(server.journal)
    assert not small.is_error
    assert big.is_error and "max_result_bytes" in text_of(big) and "limit is 10000 bytes" in text_of(big)
    assert meta_of(big)["mcp-durable/error"]["error"] == "too_large"
    assert meta_of(big)["mcp-durable/error"]["what"] == "result"
    states = {r.identity.key: r.state for r in records}
    assert states == {"small": CallState.COMPLETED, "big": CallState.RELEASED}
    assert all(len(r.result or b"") <= 10_000 for r in records)


async def test_the_default_result_limit_is_16_mib(journal_for: Callable[[str], Journal]) -> None:
    runs = Runs()
    server = build_server(journal_for("memory"), runs)
    assert server.max_result_bytes == 16 << 20
    async with connect(server, "auto") as client:
        big = await client.call_tool("blob", {"size": 16 << 20}, meta=key_meta("big"))
        records, _ = await snapshot(server.journal)
    assert big.is_error and "max_result_bytes" in text_of(big)
    assert [r.state for r in records] == [CallState.RELEASED]


async def test_an_unknown_tool_is_refused_and_changes_nothing(served: tuple[Any, Runs], mode: str) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        result = await _refused_without_change(
            client, server, runs, lambda: client.call_tool("no_such_tool", {"a": 1}, meta=key_meta("k"))
        )
    assert result.is_error and "Unknown tool" in text_of(result)


async def test_arguments_that_fail_validation_are_refused_and_do_not_poison_the_key(
    served: tuple[Any, Runs], mode: str
) -> None:
    server, runs = served
    async with connect(server, mode) as client:
        bad = await _refused_without_change(
            client,
            server,
            runs,
            lambda: client.call_tool("pay", {"order_id": "O-1", "amount_cents": "lots"}, meta=key_meta("K")),
        )
        good = await client.call_tool("pay", {"order_id": "O-1", "amount_cents": 5}, meta=key_meta("K"))
    assert bad.is_error and not good.is_error and runs.count("pay") == 1


# -- malformed _meta, sent raw (the SDK client would not send these) ---------------------------------


async def _raw_call_modern(client: Any, params: dict[str, Any], meta: Any) -> dict[str, Any] | MCPError:
    """A `tools/call` on a 2026-07-28 in-memory connection with `_meta` exactly as given (merged with the
    era's envelope when it is an object, replaced otherwise)."""
    data: dict[str, Any] = {"method": "tools/call", "params": dict(params)}
    opts: dict[str, Any] = {}
    client.session._stamp(data, opts)
    if isinstance(meta, dict):
        data["params"]["_meta"].update(meta)
    else:
        data["params"]["_meta"] = meta
    try:
        result: dict[str, Any] = await client.session._dispatcher.send_raw_request("tools/call", data["params"], opts)
        return result
    except MCPError as exc:
        return exc


# `null` too: on 2026-07-28 `_meta` carries the request's envelope (protocol version), so it is required.
@pytest.mark.parametrize("meta", ["a string", ["a", "list"], 42, None], ids=lambda m: type(m).__name__)
async def test_a_meta_of_the_wrong_type_is_refused_and_changes_nothing_on_the_modern_era(
    served: tuple[Any, Runs], meta: Any
) -> None:
    server, runs = served
    async with connect(server, "auto") as client:
        answer = await _refused_without_change(
            client, server, runs, lambda: _raw_call_modern(client, {"name": "echo", "arguments": {"text": "m"}}, meta)
        )
        ok = await client.call_tool("echo", {"text": "after"})
    assert isinstance(answer, MCPError) or answer.get("isError") is True
    assert not ok.is_error


@pytest.mark.parametrize(
    "key", [{"nested": "object"}, ["k"], 7, "", None], ids=lambda k: type(k).__name__ + repr(k)[:8]
)
async def test_a_key_under_a_wrong_type_in_raw_meta_is_refused_as_invalid_key(
    served: tuple[Any, Runs], key: Any
) -> None:
    server, runs = served
    async with connect(server, "auto") as client:
        answer = await _refused_without_change(
            client,
            server,
            runs,
            lambda: _raw_call_modern(client, {"name": "echo", "arguments": {"text": "k"}}, {KEY_META: key}),
        )
    assert not isinstance(answer, MCPError), answer
    assert answer["isError"] is True and answer["_meta"]["mcp-durable/error"]["error"] == "invalid_key"


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "1MiB"])
def test_a_size_limit_that_is_not_a_positive_number_of_bytes_is_a_configuration_error(limit: Any) -> None:
    from mcp_durable.errors import ConfigError

    with pytest.raises(ConfigError, match="max_argument_bytes"):
        build_server("memory://", Runs(), max_argument_bytes=limit)
    with pytest.raises(ConfigError, match="max_result_bytes"):
        build_server("memory://", Runs(), max_result_bytes=limit)
    assert build_server("memory://", Runs(), max_argument_bytes=None, max_result_bytes=None).max_result_bytes is None
