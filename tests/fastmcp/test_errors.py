"""A durable FastMCP tool's errors follow DurableServer's rules (docs/policies.md, "Errors"):
a tool's own `ToolError` is its result (journaled, replayed); an unexpected exception releases
the key (the next call runs again) unless `exceptions="persist"`; arguments that fail validation
are refused before any claim (a corrected retry with the same key runs); a run FastMCP's own
tool timeout stopped is in doubt, as one past `ToolPolicy.timeout` is.
"""

from __future__ import annotations

from typing import Any

import anyio

from mcp_durable import ToolPolicy
from tests.fastmcp.servers import FastMCP, connected, make_durable
from tests.helpers import body_bytes, first_text, meta_of


def _errors_app(runs: list[str]) -> FastMCP[Any]:
    from fastmcp.exceptions import ToolError

    app: FastMCP[Any] = FastMCP("errors")

    @app.tool
    def declined(order_id: str) -> dict[str, Any]:
        runs.append("declined")
        raise ToolError(f"order {order_id} cannot be refunded")

    @app.tool
    def flaky(order_id: str) -> dict[str, Any]:
        runs.append("flaky")
        if runs.count("flaky") == 1:
            raise ConnectionError("provider unreachable")
        return {"order_id": order_id, "ok": True}

    @app.tool
    def crashing(order_id: str) -> dict[str, Any]:
        runs.append("crashing")
        raise RuntimeError("the provider answered nonsense")

    @app.tool
    def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        runs.append("refund")
        return {"order_id": order_id, "amount_cents": amount_cents}

    @app.tool(timeout=0.05)
    async def hangs(order_id: str) -> dict[str, Any]:
        runs.append("hangs")
        await anyio.Event().wait()  # never set: FastMCP's timeout stops it
        return {}

    return app


POLICIES = {
    "declined": ToolPolicy(key_fields=("order_id",)),
    "flaky": ToolPolicy(key_fields=("order_id",)),
    "crashing": ToolPolicy(key_fields=("order_id",), exceptions="persist"),
    "refund": ToolPolicy(key_fields=("order_id",)),
    "hangs": ToolPolicy(key_fields=("order_id",), idempotent=False),  # in_doubt="refuse"
}


async def test_a_tool_error_is_its_result_and_is_replayed() -> None:
    runs: list[str] = []
    app = _errors_app(runs)
    make_durable(app, journal="memory://", policies=POLICIES)
    async with connected("fastmcp", app) as caller:
        first = await caller.call("declined", {"order_id": "O-1"})
        again = await caller.call("declined", {"order_id": "O-1"})
    assert runs == ["declined"]
    assert first.is_error and first_text(first) == "order O-1 cannot be refunded"
    assert body_bytes(again) == body_bytes(first) and meta_of(again)["mcp-durable/replayed"] is True


async def test_an_unexpected_exception_releases_the_key_and_the_next_call_runs_again() -> None:
    runs: list[str] = []
    app = _errors_app(runs)
    make_durable(app, journal="memory://", policies=POLICIES)
    async with connected("mcp-legacy", app) as caller:
        broken = await caller.call("flaky", {"order_id": "O-2"})
        fixed = await caller.call("flaky", {"order_id": "O-2"})
        replayed = await caller.call("flaky", {"order_id": "O-2"})
    assert runs == ["flaky", "flaky"]
    assert broken.is_error and "provider unreachable" in first_text(broken)  # FastMCP's own answer
    assert not fixed.is_error and meta_of(replayed)["mcp-durable/replayed"] is True


async def test_under_exceptions_persist_an_exception_is_journaled_as_the_result() -> None:
    runs: list[str] = []
    app = _errors_app(runs)
    make_durable(app, journal="memory://", policies=POLICIES)
    async with connected("fastmcp", app) as caller:
        first = await caller.call("crashing", {"order_id": "O-3"})
        again = await caller.call("crashing", {"order_id": "O-3"})
    assert runs == ["crashing"]
    assert first.is_error and "Error calling tool 'crashing'" in first_text(first)
    assert body_bytes(again) == body_bytes(first) and meta_of(again)["mcp-durable/replayed"] is True


async def test_bad_arguments_are_refused_before_the_claim_so_a_corrected_retry_with_the_key_runs() -> None:
    runs: list[str] = []
    app = _errors_app(runs)
    make_durable(app, journal="memory://", policies=POLICIES)
    async with connected("mcp-auto", app) as caller:
        bad = await caller.call("refund", {"order_id": "O-4", "amount_cents": "five"}, key="refund-O-4")
        corrected = await caller.call("refund", {"order_id": "O-4", "amount_cents": 5}, key="refund-O-4")
        # Validated values are fingerprinted: the JSON string "5" is the integer 5 to the tool.
        coerced = await caller.call("refund", {"order_id": "O-4", "amount_cents": "5"}, key="refund-O-4")
    assert bad.is_error and "amount_cents" in first_text(bad)
    assert bad.meta is None or "mcp-durable/key" not in bad.meta  # nothing was claimed
    assert not corrected.is_error and meta_of(corrected)["mcp-durable/key"] == "refund-O-4"
    assert meta_of(coerced)["mcp-durable/replayed"] is True
    assert runs == ["refund"]


async def test_a_run_stopped_by_fastmcps_tool_timeout_is_in_doubt_and_refused_by_policy() -> None:
    runs: list[str] = []
    app = _errors_app(runs)
    make_durable(app, journal="memory://", policies=POLICIES)
    async with connected("fastmcp", app) as caller:
        first = await caller.call("hangs", {"order_id": "O-5"})
        again = await caller.call("hangs", {"order_id": "O-5"})
    assert runs == ["hangs"]  # the repeat did not run it again: its outcome is unknown
    for result in (first, again):
        assert result.is_error and meta_of(result)["mcp-durable/error"]["error"] == "in_doubt"


async def test_an_input_required_answer_is_passed_on_and_never_journaled() -> None:
    from fastmcp.tools.base import InputRequiredToolResult
    from mcp_types import InputRequiredResult

    app: FastMCP[Any] = FastMCP("asks")
    runs: list[str] = []

    @app.tool
    def confirm(order_id: str) -> Any:
        runs.append(order_id)
        if len(runs) == 1:
            return InputRequiredResult(request_state=f"confirm {order_id}")
        return {"order_id": order_id, "confirmed": True}

    durable = make_durable(app, journal="memory://", policies={"confirm": ToolPolicy(key="derived")})
    async with connected("fastmcp", app):  # the server started; called in process below
        asked = await app.call_tool("confirm", {"order_id": "O-6"})
        answered = await app.call_tool("confirm", {"order_id": "O-6"})
        replayed = await app.call_tool("confirm", {"order_id": "O-6"})
    assert isinstance(asked, InputRequiredToolResult) and asked.input_required.request_state == "confirm O-6"
    assert answered.structured_content == {"order_id": "O-6", "confirmed": True}
    assert replayed.meta is not None and replayed.meta["mcp-durable/replayed"] is True
    assert runs == ["O-6", "O-6"]  # the interim answer was not kept: the next call ran the tool
    assert "confirm" in durable.durable


async def test_under_exceptions_persist_an_exception_is_kept_even_where_tool_errors_are_released() -> None:
    # An exception's result stands for the exception, not for a deliberate error of the tool:
    # `tool_errors="release"` releases only the latter (docs/policies.md, as DurableServer).
    runs: list[str] = []
    app = _errors_app(runs)
    policies = {
        **POLICIES,
        "declined": ToolPolicy(key_fields=("order_id",), tool_errors="release"),
        "crashing": ToolPolicy(key_fields=("order_id",), exceptions="persist", tool_errors="release"),
    }
    make_durable(app, journal="memory://", policies=policies)
    async with connected("fastmcp", app) as caller:
        crashed = await caller.call("crashing", {"order_id": "O-7"})
        crashed_again = await caller.call("crashing", {"order_id": "O-7"})
        declined = await caller.call("declined", {"order_id": "O-7"})
        declined_again = await caller.call("declined", {"order_id": "O-7"})
    assert runs == ["crashing", "declined", "declined"]
    assert crashed.is_error and meta_of(crashed_again)["mcp-durable/replayed"] is True
    assert body_bytes(crashed_again) == body_bytes(crashed)
    assert declined.is_error and declined_again.is_error
    assert "mcp-durable/replayed" not in (declined_again.meta or {})


def _report_app(runs: list[str]) -> FastMCP[Any]:
    app: FastMCP[Any] = FastMCP("reports")

    @app.tool
    def report(order_id: str) -> dict[str, Any]:
        runs.append(order_id)
        return {"order_id": order_id, "text": "x" * 4096}

    return app


async def test_a_result_over_max_result_bytes_is_refused_and_released_so_the_next_call_runs_again() -> None:
    runs: list[str] = []
    app = _report_app(runs)
    make_durable(
        app, journal="memory://", policies={"report": ToolPolicy(key_fields=("order_id",))}, max_result_bytes=1024
    )
    async with connected("fastmcp", app) as caller:
        first = await caller.call("report", {"order_id": "O-8"})
        again = await caller.call("report", {"order_id": "O-8"})
    assert runs == ["O-8", "O-8"]
    for result in (first, again):
        assert result.is_error and meta_of(result)["mcp-durable/error"]["error"] == "too_large"
        assert "its claim was released" in first_text(result)


async def test_under_exceptions_persist_a_result_over_max_result_bytes_is_kept_as_its_refusal() -> None:
    # Kept even where tool errors are released: it stands for an exception (limits.py).
    runs: list[str] = []
    app = _report_app(runs)
    policy = ToolPolicy(key_fields=("order_id",), exceptions="persist", tool_errors="release")
    make_durable(app, journal="memory://", policies={"report": policy}, max_result_bytes=1024)
    async with connected("fastmcp", app) as caller:
        first = await caller.call("report", {"order_id": "O-9"})
        again = await caller.call("report", {"order_id": "O-9"})
    assert runs == ["O-9"]
    assert first.is_error and meta_of(first)["mcp-durable/error"]["error"] == "too_large"
    assert "journaled and replayed" in first_text(first)
    assert body_bytes(again) == body_bytes(first) and meta_of(again)["mcp-durable/replayed"] is True
