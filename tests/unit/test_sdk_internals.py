"""The SDK's internals are used in one module only (mcp_durable/server/sdk_internals.py), and each
of them is still there in the installed SDK.

A private name here is one the MCP SDK (`mcp`, `mcp_types`) or asyncio defines (a function,
class, stored attribute or field starting with one underscore), plus pydantic's
`__pydantic_private__` storage. The scan finds, in every module of the package: a read of such
a name on any object but `self`/`cls` (the package reads no private attribute of another object,
its own included); a read on `self`/`cls` of one the package does not define itself (an SDK
internal inherited by a subclass); `getattr`/`hasattr`/`setattr` with such a constant name;
an import of a private name or from a private module of the SDK or asyncio. A documented
standard-library function whose name starts with one underscore, read on its module
(`os._exit`), is no internal (`STDLIB_PUBLIC`).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp
import mcp_types
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool

from mcp_durable import DurableServer
from mcp_durable.keys import KEY_META
from mcp_durable.server import sdk_internals
from mcp_durable.server.sdk_internals import (
    INTERNALS,
    bare_tools_call_handler,
    connection_of,
    lowlevel_server,
    registered_tool,
    request_meta,
    send_raw_request,
    subscription_bus,
)
from tests.helpers import key_meta

PACKAGE = Path(__file__).resolve().parents[2] / "mcp_durable"
ADAPTER = Path(sdk_internals.__file__).resolve()
#: FastMCP's internals have an adapter of their own, each declared in its `INTERNALS` as
#: `Class.name` and checked by tests/fastmcp/test_internals.py. A name declared there is
#: FastMCP's, even where the SDK has a private one spelled the same (FastMCP's `_mcp_server`).
FASTMCP_ADAPTER = PACKAGE / "fastmcp" / "internals.py"
#: Private in any library: where pydantic keeps a model's private attributes.
ALWAYS_PRIVATE = frozenset({"__pydantic_private__"})
#: Public functions of the standard library whose names start with one underscore, read on the
#: module itself (`os._exit`: a forked child leaves without exit handlers, `snapshot_child`).
STDLIB_PUBLIC = frozenset({("os", "_exit")})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _defined_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, stored attributes, class fields."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return {name for name in names if _private(name)}


def _declared_fastmcp_internals(tree: ast.Module) -> set[str]:
    """The attribute names the FastMCP adapter declares in its `INTERNALS` table (read from the
    source: FastMCP is an optional extra)."""
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "INTERNALS" and isinstance(node, ast.AnnAssign):
            assert isinstance(node.value, ast.Dict)
            return {str(key.value).rsplit(".", 1)[-1] for key in node.value.keys if isinstance(key, ast.Constant)}
    return set()


def _library_private_names() -> set[str]:
    names: set[str] = set()
    for module in (mcp, mcp_types, asyncio):
        for _, tree in _trees(Path(module.__file__ or "").parent):
            names |= _defined_names(tree)
    return names


def _uses(tree: ast.Module, private: set[str], ours: set[str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (node.attr in private or node.attr in ALWAYS_PRIVATE):
            on = node.value.id if isinstance(node.value, ast.Name) else None
            allowed = (on, node.attr) in STDLIB_PUBLIC or (on in ("self", "cls") and node.attr in ours)
            if not allowed:
                yield node.lineno, node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1:
                name = node.args[1]
                if isinstance(name, ast.Constant) and (name.value in private or name.value in ALWAYS_PRIVATE):
                    yield node.lineno, str(name.value)
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root in ("mcp", "mcp_types", "asyncio"):
                if any(_private(part) for part in node.module.split(".")):
                    yield node.lineno, f"module {node.module}"
                for alias in node.names:
                    if _private(alias.name):
                        yield node.lineno, f"{node.module}.{alias.name}"


def test_no_module_but_the_adapter_uses_an_sdk_or_asyncio_internal() -> None:
    trees = list(_trees(PACKAGE))
    ours: set[str] = set()
    for _, tree in trees:
        ours |= _defined_names(tree)
    private = _library_private_names()
    assert "_tool_manager" in private and "_ready" in private  # the scan sees the SDK's and asyncio's
    outside = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path, tree in trees
        if path.resolve() != ADAPTER
        for line, name in _uses(tree, private, ours)
        if not (path.resolve() == FASTMCP_ADAPTER and name in _declared_fastmcp_internals(tree))
    ]
    assert not outside, "SDK/asyncio internals used outside server/sdk_internals.py:\n" + "\n".join(outside)
    inside = sorted({name for _, name in _uses(ast.parse(ADAPTER.read_text(encoding="utf-8")), private, ours)})
    # Every internal the adapter reads is named in its INTERNALS table, with the reason.
    documented = " ".join(INTERNALS)
    undocumented = [name for name in inside if name.split(".")[-1].removeprefix("module ") not in documented]
    assert not undocumented, f"internals used in the adapter but not listed in INTERNALS: {undocumented}"


def _make_server(tmp_path: Path) -> DurableServer:
    server = DurableServer("internals", journal=f"file://{tmp_path / 'journal'}")

    @server.tool(durable=True)
    def echo(text: str) -> str:
        return text

    return server


def test_the_sdk_objects_the_adapter_reaches_are_still_there(tmp_path: Path) -> None:
    server = _make_server(tmp_path)
    for internal, attribute in (
        ("MCPServer._tool_manager", "_tool_manager"),
        ("MCPServer._lowlevel_server", "_lowlevel_server"),
        ("MCPServer._subscriptions", "_subscriptions"),
        ("MCPServer._handle_call_tool", "_handle_call_tool"),
    ):
        assert internal in INTERNALS
        assert hasattr(server, attribute), f"the SDK no longer has {internal}: see mcp_durable/server/sdk_internals.py"
    assert isinstance(registered_tool(server, "echo"), Tool), "MCPServer._tool_manager.get_tool changed"
    assert registered_tool(server, "nope") is None
    assert isinstance(lowlevel_server(server), Server), "MCPServer._lowlevel_server is no longer a Server"
    bus = subscription_bus(server)
    assert callable(getattr(bus, "publish", None)) and callable(getattr(bus, "subscribe", None)), (
        "MCPServer._subscriptions is no longer a SubscriptionBus"
    )
    handler = bare_tools_call_handler(server)
    assert inspect.iscoroutinefunction(handler) and list(inspect.signature(handler).parameters) == ["ctx", "params"], (
        "MCPServer._handle_call_tool(ctx, params) changed"
    )
    # The fast path to a request's `_meta`: the storage pydantic keeps private attributes in.
    private = Context(mcp_server=server).__pydantic_private__
    assert private is not None and "_request_context" in private, (
        "Context._request_context is no longer in __pydantic_private__: request_meta takes the slow path"
    )
    from mcp_durable.server.sdk_internals import create_mcp_http_client

    assert callable(create_mcp_http_client), "mcp.shared._httpx_utils.create_mcp_http_client is gone"


async def test_a_served_request_gives_the_adapter_its_meta_and_its_connection(tmp_path: Path) -> None:
    server = _make_server(tmp_path)
    seen: dict[str, Any] = {}

    @server.tool()
    def inspect_request(ctx: Context) -> str:
        seen["meta"] = request_meta(ctx)
        session = ctx.request_context.session
        seen["has_connection"] = hasattr(session, "_connection")
        seen["connection"] = connection_of(session)
        return "ok"

    async with Client(server, mode="legacy") as client:  # a connection with a session: 2025-11-25
        await client.call_tool("inspect_request", {}, meta=key_meta("k-1"))
        first = seen["connection"]
        await client.call_tool("inspect_request", {}, meta=key_meta("k-2"))
    assert seen["has_connection"], "ServerSession._connection is gone: subscriptions lose their connection"
    meta = seen["meta"]
    assert meta is not None and dict(meta).get(KEY_META) == "k-2", f"request_meta read {meta!r}"
    # One connection, two requests (a session object each): the same connection identity.
    assert seen["connection"] is first


async def test_a_client_session_sends_a_raw_request_through_the_adapter(tmp_path: Path) -> None:
    """`send_raw_request` reaches `ClientSession._dispatcher`: a `tools/call` answered unvalidated."""
    server = _make_server(tmp_path)
    async with Client(server, mode="legacy") as client:
        assert hasattr(client.session, "_dispatcher"), "ClientSession._dispatcher is gone: see sdk_internals.py"
        answered = await send_raw_request(client.session, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
    assert isinstance(answered, dict) and answered["content"][0]["text"] == "hi"
