"""Validate a durable call's arguments once, not twice.

The face validates a durable call's arguments before the claim (a call with bad arguments is
refused before anything is journaled, and the key and fingerprint are taken from the validated
values). The SDK's `Tool.run` then validated the same dict again before calling the function:
`pre_parse_json` and the argument model, about as costly as everything else the face adds.
For a durable tool its `FuncMetadata.validate_arguments` is replaced (`install`) by one that
returns the face's result when it is handed the very dict the face validated (`validated_as`,
a context variable, so concurrent calls never see each other's); any other dict is validated as
before. Besides the time, the tool now receives exactly the values its key was derived from,
even when a validator is not deterministic (a `default_factory`).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

from mcp.server.mcpserver.tools import Tool

_VALIDATED: ContextVar[tuple[dict[str, Any], dict[str, Any]] | None] = ContextVar(
    "mcp_durable_validated_arguments", default=None
)


def install(tool: Tool) -> None:
    """Make `tool` take the face's validation of the arguments it is called with (see module)."""
    meta = tool.fn_metadata
    if "validate_arguments" in vars(meta):
        return  # installed already
    validate = meta.validate_arguments

    def validate_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
        done = _VALIDATED.get()
        if done is not None and done[0] is arguments:
            return done[1]
        return validate(arguments)

    # An instance attribute shadows the method for this tool only (pydantic's __setattr__ would
    # refuse a name that is not a field).
    object.__setattr__(meta, "validate_arguments", validate_arguments)


def validated_as(arguments: dict[str, Any], validated: dict[str, Any]) -> Token[Any]:
    """From now until `done(token)`, `arguments` (this very dict) validates to `validated` for
    installed tools. (Two calls rather than a context manager: this is on every durable run,
    and a generator-based one cost more than the rest of this module.)"""
    return _VALIDATED.set((arguments, validated))


def done(token: Token[Any]) -> None:
    _VALIDATED.reset(token)
