"""A durable tool's per-call work done once: validation, the run, and the result's conversion.

The face validates a durable call's arguments before the claim (a call with bad arguments is
refused before anything is journaled, and the key and fingerprint are taken from the validated
values). Three things follow from that, each worked out once per tool (`PreparedTool`, built
when the face first serves the tool and rebuilt if it is registered again):

- **The SDK does not validate again.** `Tool.run` would validate the same dict a second time
  (`pre_parse_json` and the argument model). `run` calls the SDK's own `Tool.run` (the public
  seam: resolvers, the context, the SDK's exceptions and their texts, the conversion of the
  result) with `install`'s hook telling it the face's validation (`validated_as`, a context
  variable, so concurrent calls never see each other's). So the tool receives exactly the
  values its key was derived from, even when a validator is not deterministic (a
  `default_factory`).
- **A repeat is not validated at all** when validation is a pure function of the JSON it is
  given: an argument model with no Python code in its schema (no validator, serializer,
  `default_factory`, post-init or custom `__init__`: `pure_schema`). Then the validated
  arguments, their canonical JSON and fingerprint of a call that was answered as a replay
  are remembered under the request's own JSON (`remember`), and the next identical request
  (`recall`) goes straight to the engine, which answers it from its own cache. Only plain
  JSON requests are remembered (what the wire delivers: `limits.check_argument_values`), so
  no two different requests share an entry; bounded, oldest out first.
- **A text result is converted once.** For a tool declaring `str` (the SDK wraps it as
  `{"result": …}`), `Tool.run`'s conversion of a `str` return is the face's (`install`'s second
  hook: the result built directly, and its journal JSON written beside it, for the face's own
  run), instead of the SDK's output validation, dump and, for the journal, a second dump. Both
  builders are checked at preparation against the SDK's own conversion and dump of probes and
  installed only if both give the same values and bytes; anything else the tool returns goes to
  the SDK's conversion, and any other tool's result is dumped as usual (`results.dump_result`).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any

import orjson
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, InputRequiredResult, TextContent

from ..engine import Encoder
from ..policy import ToolPolicy
from .results import dump_result

#: Where a `str` tool's conversion leaves what it made for the face's run: (result, journal JSON).
TextConversions = list[tuple[CallToolResult, bytes]]

#: The face's run in progress: the arguments dict it validated, what the SDK hands the function
#: for it, and where a `str` tool's conversion reports (None: not asked).
_VALIDATED: ContextVar[tuple[dict[str, Any], dict[str, Any], TextConversions | None] | None] = ContextVar(
    "mcp_durable_validated_arguments", default=None
)

#: Validations remembered per tool (`PreparedTool.remember`), and the largest request remembered.
MEMO_ENTRIES = 1024
MEMO_MAX_BYTES = 4096

#: A request's validation as the face uses it: the validated arguments' JSON form, its canonical
#: JSON and the call's fingerprint under the tool's policy.
Validated = tuple[dict[str, Any], bytes, str]

Converted = CallToolResult | InputRequiredResult

#: Core-schema node types that run Python code (validators, calls, generators) or build
#: objects by calling their class: a schema with one of them is not a pure function of its input.
_IMPURE_TYPES = frozenset({"call", "dataclass", "dataclass-args", "generator", "callable"})
#: Core-schema keys naming code that runs during validation or serialization.
_IMPURE_KEYS = ("default_factory", "post_init", "missing", "computed_fields")


def pure_schema(schema: Any) -> bool:
    """Whether a pydantic core schema validates and dumps without running Python code of its
    model's author: then equal JSON in gives equal values out, every time. Conservative: any
    function node (`function-before/after/wrap/plain`, including serializers), `default_factory`,
    post-init, custom `__init__`, enum `_missing_`, computed field, dataclass or call makes it
    impure. (`metadata` holds JSON-schema hooks only and is not looked at.)"""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and (kind.startswith("function") or kind in _IMPURE_TYPES):
                return False
            if node.get("custom_init") or any(node.get(key) for key in _IMPURE_KEYS):
                return False
            stack.extend(value for key, value in node.items() if key != "metadata")
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return True


#: Core-schema node types whose validation can turn a finite JSON value into a non-finite number
#: (`"nan"` or `1e400` read as a float or a Decimal).
_NUMBER_TYPES = frozenset({"float", "decimal"})


def makes_non_finite(schema: Any) -> bool:
    """Whether validating against a pydantic core schema may produce a non-finite number from
    arguments that held none: a float or Decimal field anywhere, or any code of the model's
    author (which may return anything: `pure_schema`). Conservative: True when unsure. A False
    schema leaves non-finite values only where the request itself held them, which the face
    refuses before validation (`limits.check_argument_values`)."""
    if not pure_schema(schema):
        return True
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") in _NUMBER_TYPES:
                return True
            stack.extend(value for key, value in node.items() if key != "metadata")
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False


class PreparedTool:
    """One durable tool as the face serves it: what every call would otherwise work out again."""

    def __init__(self, tool: Tool, policy: ToolPolicy, encode: Encoder) -> None:
        self.tool = tool
        self.policy = policy
        #: The engine's `encode` for a reconcile hook's found value (the tool's own conversion).
        self.encode = encode
        meta = tool.fn_metadata
        self.arg_model = meta.arg_model
        self.pre_parse_json = meta.pre_parse_json
        #: (field name, the name the function takes it by): `model_dump_one_level` unrolled.
        self._names = tuple((name, field.alias or name) for name, field in self.arg_model.model_fields.items())
        schema = self.arg_model.__pydantic_core_schema__
        #: Validations of requests answered as replays, by the request's JSON (None: impure schema).
        self._memo: dict[bytes, Validated] | None = {} if pure_schema(schema) else None
        #: Whether validated arguments must be checked for non-finite numbers again
        #: (`makes_non_finite`): else the check of the request before validation is the only one.
        self.check_validated = makes_non_finite(schema)
        #: A `str` return is converted by the face (`install_text_conversion`): checked against
        #: the SDK's conversion first.
        self._text_result = _text_result_builder(tool)
        if self._text_result:
            install_text_conversion(tool)

    # -- validation --------------------------------------------------------------------------------

    def memo_key(self, arguments: dict[str, Any]) -> bytes | None:
        """What a plain JSON request is remembered under (None: not rememberable)."""
        if self._memo is None:
            return None
        try:
            raw = orjson.dumps(arguments)
        except TypeError:  # e.g. an integer beyond 64 bits: validated every time
            return None
        return raw if len(raw) <= MEMO_MAX_BYTES else None

    def recall(self, key: bytes) -> Validated | None:
        return self._memo.get(key) if self._memo is not None else None

    def remember(self, key: bytes, validated: Validated) -> None:
        memo = self._memo
        if memo is None or key in memo:
            return
        if len(memo) >= MEMO_ENTRIES:
            del memo[next(iter(memo))]  # oldest first
        memo[key] = validated

    def one_level(self, model: Any) -> dict[str, Any]:
        """What the SDK hands the function for a validated model (`model_dump_one_level`)."""
        values = model.__dict__
        return {out: values[name] for name, out in self._names}

    # -- the run -----------------------------------------------------------------------------------

    async def run(self, arguments: dict[str, Any], model: Any, context: Any) -> tuple[Converted, bytes | None]:
        """`Tool.run` (the SDK's, public: resolvers, the context, its exceptions and their texts,
        the result's conversion) on `arguments` as the face validated them (`model`): the SDK
        does not validate again (`validated_as`; `install` was called at registration). Returns
        the converted result and, for a `str` tool's text result, its journal JSON (None: the
        result is to be dumped, `results.dump_result`)."""
        made: TextConversions | None = [] if self._text_result else None
        token = validated_as(arguments, self.one_level(model), made)
        try:
            result: Converted = await self.tool.run(arguments, context, convert_result=True)
        finally:
            done(token)
        # The JSON is this result's only if the last conversion made for this run is the very
        # object returned (a tool that ran another `str` tool inside left that one's first).
        if made and made[-1][0] is result:
            return result, made[-1][1]
        return result, None


def _text_result(text: str) -> CallToolResult:
    """What the SDK's conversion makes of a `str` tool's `str` return. (Built by validation, as
    the SDK builds it, not with pydantic's `model_construct`, which saves nothing for these models.)"""
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content={"result": text})


def _text_json(text: str) -> bytes:
    """`dump_result(_text_result(text))`, without the model between."""
    return orjson.dumps(
        {
            "content": [{"type": "text", "text": text}],
            "structuredContent": {"result": text},
            "isError": False,
            "resultType": "complete",
        }
    )


def _text_result_builder(tool: Tool) -> bool:
    """Whether `tool` declares `str` (wrapped as `{"result": …}`) and `_text_result` /
    `_text_json` give, for probes, exactly the SDK's conversion and its journal JSON."""
    meta = tool.fn_metadata
    convert = type(meta).convert_result  # the SDK's own, even where `install_text_conversion` ran
    model = meta.output_model
    if not meta.wrap_output or model is None or meta.output_schema is None:
        return False
    fields = getattr(model, "model_fields", {})
    if list(fields) != ["result"] or fields["result"].annotation is not str:
        return False
    for probe in ("", 'probe \u2713 "quoted"\n\u2028'):
        try:
            sdk = convert(meta, probe)
        except Exception:  # noqa: BLE001 - an SDK that converts differently: no shortcut
            return False
        ours = _text_result(probe)
        if (
            not isinstance(sdk, CallToolResult)
            or sdk != ours
            or not (dump_result(sdk) == dump_result(ours) == _text_json(probe))
        ):
            return False
    return True


def install(tool: Tool) -> None:
    """Make `tool`'s `Tool.run` take the face's validation of the arguments it is called with
    (for tools run through the SDK: see the module docstring)."""
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


def install_text_conversion(tool: Tool) -> None:
    """Make `tool`'s conversion of a `str` return the face's (`_text_result`), reporting the result
    and its journal JSON to the face's run in progress (`validated_as`'s `made`). Only for a tool
    `_text_result_builder` accepted: the same result the SDK's conversion makes. Any other return
    value goes to the SDK's conversion, so its errors and their texts stay the SDK's."""
    meta = tool.fn_metadata
    if "convert_result" in vars(meta):
        return  # installed already
    convert = meta.convert_result

    def convert_result(result: Any) -> Converted:
        if type(result) is not str:
            return convert(result)
        converted = _text_result(result)
        run = _VALIDATED.get()
        if run is not None and run[2] is not None:
            run[2].append((converted, _text_json(result)))
        return converted

    object.__setattr__(meta, "convert_result", convert_result)  # as `install`: this tool only


def validated_as(
    arguments: dict[str, Any], validated: dict[str, Any], made: TextConversions | None = None
) -> Token[Any]:
    """From now until `done(token)`, `arguments` (this very dict) validates to `validated` for
    installed tools, and a `str` tool's conversion reports to `made` (when given). (Two calls
    rather than a generator-based context manager: this is on every durable run.)"""
    return _VALIDATED.set((arguments, validated, made))


def done(token: Token[Any]) -> None:
    _VALIDATED.reset(token)
