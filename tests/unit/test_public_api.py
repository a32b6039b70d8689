"""`mcp_durable.__all__` is what the package exports: every name in it resolves, every public
name the package imports is in it, and every error a user may meet is exported (each public
class of `errors.py`)."""

from __future__ import annotations

import inspect
import types

import mcp_durable
from mcp_durable import errors


def test_all_is_exactly_the_public_names_of_the_package() -> None:
    assert len(mcp_durable.__all__) == len(set(mcp_durable.__all__))
    imported = {
        name
        for name, value in vars(mcp_durable).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "TYPE_CHECKING"
    }
    assert set(mcp_durable.__all__) == imported | {"DurableServer"}  # the server is loaded on first use
    for name in mcp_durable.__all__:
        assert getattr(mcp_durable, name) is not None, name


def test_every_public_error_is_exported() -> None:
    public = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.DurableError) and not name.startswith("_")
    }
    assert public <= set(mcp_durable.__all__), sorted(public - set(mcp_durable.__all__))
    for name in public:
        assert getattr(mcp_durable, name) is getattr(errors, name)
