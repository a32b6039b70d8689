"""Arguments JSON cannot journal are refused with their own code before any claim: non-finite
numbers (`non_finite_argument`) and nesting over the depth limit (`arguments_too_deep`).

Through the in-memory client in both eras (which sends NaN as `null` itself, so the tool's model
reading the strings `"nan"`, `"Infinity"`, `"1e400"` as floats is what reaches the server), and
raw JSON over HTTP, where `NaN`, `Infinity`, `-Infinity` and `1e400` arrive as numbers. Before
the fix these shared a fingerprint with `null`: `{"value": NaN}` then `{"value": null}` with one
key replayed, and the record showed `null`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from mcp_durable import DurableServer
from mcp_durable.limits import DEFAULT_MAX_ARGUMENT_DEPTH
from tests.hardening.conftest import KEY_META, MODES, Runs, connect, snapshot
from tests.helpers import first_text, key_meta, serve_app

NON_FINITE_STRINGS = ["nan", "NaN", "Infinity", "-Infinity", "inf", "1e400", "-1e400"]
NON_FINITE_RAW = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]
HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "mcp-protocol-version": "2025-11-25",
}


def _server(tmp_path: Path, runs: Runs, **kwargs: Any) -> DurableServer:
    server = DurableServer("values", journal=f"sqlite:///{tmp_path}/journal.db", **kwargs)

    @server.tool(durable=True)
    def measure(value: float) -> dict[str, Any]:
        runs.calls.append(("measure", value))
        return {"value": repr(value)}

    @server.tool(durable=True)
    def store(value: Any = None) -> dict[str, Any]:
        runs.calls.append(("store", value))
        return {"value": repr(value)}

    @server.tool(durable=True)
    def price(value: Decimal) -> dict[str, Any]:
        runs.calls.append(("price", value))
        return {"value": str(value)}

    @server.tool(durable=True)
    def tags(value: list[str]) -> dict[str, Any]:
        runs.calls.append(("tags", value))
        return {"value": value}

    return server


def error_of(result: Any) -> dict[str, Any]:
    """The refusal a result carries (`_meta["mcp-durable/error"]`, else `structuredContent`)."""
    assert result.is_error, result
    meta = result.meta or {}
    refusal = meta.get("mcp-durable/error") or result.structured_content
    assert isinstance(refusal, dict), result
    return refusal


def nested(depth: int) -> Any:
    """A value that makes `{"value": …}` nest `depth` levels (the arguments object is level 1)."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("mode", MODES)
async def test_a_number_the_tool_reads_as_non_finite_is_refused_before_any_claim(tmp_path: Path, mode: str) -> None:
    runs = Runs()
    server = _server(tmp_path, runs)
    async with connect(server, mode) as client:
        for text in NON_FINITE_STRINGS:
            before = await snapshot(server.journal)
            result = await client.call_tool("measure", {"value": text}, meta=key_meta("m-1"))
            assert error_of(result)["error"] == "non_finite_argument", text
            assert error_of(result)["argument"] == "/value"
            assert "not a finite number" in first_text(result)
            assert await snapshot(server.journal) == before and runs.calls == []
        ok = await client.call_tool("measure", {"value": 1.5}, meta=key_meta("m-1"))  # the key is not poisoned
    assert not ok.is_error and runs.calls == [("measure", 1.5)]


@pytest.mark.parametrize("mode", MODES)
async def test_a_non_finite_number_validation_makes_of_a_string_is_refused_whatever_the_field_type(
    tmp_path: Path, mode: str
) -> None:
    """Validated arguments are checked again only where validation can make a non-finite number
    of finite input: an `Any` field given a JSON string the SDK parses (`"[NaN]"` becomes
    `[nan]`). (Pydantic refuses a non-finite Decimal itself: a validation error, nothing
    claimed either.) A field that cannot (a list of strings) runs as usual."""
    runs = Runs()
    server = _server(tmp_path, runs)
    async with connect(server, mode) as client:
        for tool, text in [("store", "[NaN]"), ("store", '{"a": [Infinity]}'), ("price", "NaN")]:
            before = await snapshot(server.journal)
            result = await client.call_tool(tool, {"value": text}, meta=key_meta(f"{tool}-1"))
            assert result.is_error, (tool, text)
            if tool == "store":
                assert error_of(result)["error"] == "non_finite_argument", text
            assert await snapshot(server.journal) == before and runs.calls == []
        result = await client.call_tool("tags", {"value": ["NaN", "Infinity"]}, meta=key_meta("tags-1"))
        assert not result.is_error and runs.calls == [("tags", ["NaN", "Infinity"])]


@pytest.mark.parametrize("mode", MODES)
async def test_arguments_nested_over_the_limit_are_refused_with_the_limit_before_any_claim(
    tmp_path: Path, mode: str
) -> None:
    runs = Runs()
    server = _server(tmp_path, runs)
    async with connect(server, mode) as client:
        for depth in (DEFAULT_MAX_ARGUMENT_DEPTH + 1, 150):
            before = await snapshot(server.journal)
            result = await client.call_tool("store", {"value": nested(depth)}, meta=key_meta("d-1"))
            refusal = error_of(result)
            assert refusal["error"] == "arguments_too_deep" and refusal["limit"] == DEFAULT_MAX_ARGUMENT_DEPTH
            assert f"the limit is {DEFAULT_MAX_ARGUMENT_DEPTH}" in first_text(result)
            assert await snapshot(server.journal) == before and runs.calls == []
        ok = await client.call_tool("store", {"value": nested(DEFAULT_MAX_ARGUMENT_DEPTH)}, meta=key_meta("d-1"))
    assert not ok.is_error and len(runs.calls) == 1


async def test_the_depth_limit_is_configurable(tmp_path: Path) -> None:
    runs = Runs()
    server = _server(tmp_path, runs, max_argument_depth=3)
    async with connect(server, "legacy") as client:
        assert not (await client.call_tool("store", {"value": [[1]]})).is_error
        refused = await client.call_tool("store", {"value": [[[1]]]})
    assert error_of(refused) == {**error_of(refused), "error": "arguments_too_deep", "limit": 3}


class RawHttp:
    """JSON-RPC bodies written by hand (NaN and 1e400 are not JSON a client library would send)."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http, self.url, self.next_id = http, url, 1

    async def post(self, body: str) -> httpx2.Response:
        return await self.http.post(self.url, content=body, headers=HEADERS)

    async def call(self, tool: str, raw_arguments: str, key: str) -> dict[str, Any]:
        self.next_id += 1
        params = f'{{"name":"{tool}","arguments":{raw_arguments},"_meta":{{"{KEY_META}":"{key}"}}}}'
        body = f'{{"jsonrpc":"2.0","id":{self.next_id},"method":"tools/call","params":{params}}}'
        answer = orjson.loads((await self.post(body)).content)
        return dict(answer)


@asynccontextmanager
async def _raw(server: DurableServer) -> AsyncIterator[RawHttp]:
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    async with serve_app(app) as base, httpx2.AsyncClient(timeout=30.0) as http:
        yield RawHttp(http, f"{base}/mcp")


async def test_raw_nan_infinity_and_1e400_over_http_are_refused_and_a_later_null_runs_anew(tmp_path: Path) -> None:
    runs = Runs()
    server = _server(tmp_path, runs)
    async with _raw(server) as wire:
        for tool in ("store", "measure"):
            for raw in NON_FINITE_RAW:
                before = await snapshot(server.journal)
                answer = await wire.call(tool, '{"value":' + raw + "}", key=f"{tool}-1")
                result = answer["result"]
                assert result["isError"] is True, (tool, raw, answer)
                refusal = result.get("_meta", {}).get("mcp-durable/error") or result["structuredContent"]
                assert refusal["error"] == "non_finite_argument" and refusal["argument"] == "/value", (tool, raw)
                assert await snapshot(server.journal) == before and runs.calls == []
        # Deeper in the arguments, the pointer names the place.
        answer = await wire.call("store", '{"value":{"items":[1,{"price":NaN}]}}', key="deep-nan")
        assert answer["result"]["structuredContent"]["argument"] == "/value/items/1/price"
        # The same key with `null` is a new call that runs (not a replay of a NaN call, not key_reuse).
        answer = await wire.call("store", '{"value":null}', key="store-1")
        assert answer["result"].get("isError") is not True
        assert "mcp-durable/replayed" not in answer["result"]["_meta"]
    assert runs.calls == [("store", None)]


async def test_raw_nesting_over_http_gets_our_limit_and_what_the_sdk_refuses_first_runs_nothing(
    tmp_path: Path,
) -> None:
    runs = Runs()
    server = _server(tmp_path, runs)
    async with _raw(server) as wire:
        answer = await wire.call("store", '{"value":' + orjson.dumps(nested(100)).decode() + "}", key="deep")
        refusal = answer["result"]["structuredContent"]
        assert refusal["error"] == "arguments_too_deep" and refusal["limit"] == DEFAULT_MAX_ARGUMENT_DEPTH
        # About 200 levels deep the SDK's JSON parser refuses the whole message (-32700) before any
        # server code runs (docs/guarantees.md): nothing is claimed, nothing runs.
        before = await snapshot(server.journal)
        answer = await wire.call("store", '{"value":%s}' % ("[" * 1000 + "1" + "]" * 1000), key="deeper")
        assert answer["error"]["code"] == -32700
        assert await snapshot(server.journal) == before
    assert runs.calls == []
