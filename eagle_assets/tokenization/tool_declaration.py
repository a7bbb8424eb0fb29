"""The TypeScript-style tool declaration Kimi K2.5's tokenizer puts in the ``tool_declare`` turn.

The real tokenizer's ``apply_chat_template`` (which vLLM and SGLang call) deep-sorts the tool dicts
and converts them to a TypeScript-like text, passed to the template as ``tools_ts_str``::

    # Tools

    ## functions
    namespace functions {
    // Current weather for a city.
    type get_weather = (_: {
      // City name
      city: string,
      unit?: "celsius" | "fahrenheit"
    }) => any;
    }

When the conversion fails the template prints the deep-sorted tools as compact JSON instead. The
target was trained and served on exactly that text, so its token ids are part of every prompt we
rebuild. This module is written for this project from the rules of the upstream
``tool_declaration_ts.py``: what it renders, and which schemas make it give up (``const``, ``oneOf``,
``allOf``, ``#/definitions/...`` references, an unknown name in a ``type`` list, ...), follow upstream
exactly, because both decide the ids. Checks happen where upstream's would: some only when a piece is
actually printed, which matters for the rare schema that is parsed but never printed (see
``_render_function``).
"""

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from eagle_assets.errors import TargetError

INDENT = "  "
_FIELD_SEP = ",\n"
_UNION_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}
_CONSTRAINT_KEYS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
}
_ARRAY_CONSTRAINT_KEYS = ("minItems", "maxItems")
_SELF_REF = "#"
_DEFS_PREFIX = "#/$defs/"


class ToolDeclarationError(TargetError, ValueError):
    """A schema the upstream encoder cannot convert; the template then declares the tools as JSON."""


def deep_sort(obj: Any) -> Any:
    """Dicts with their keys sorted, at every depth (lists keep their order), as the real tokenizer does."""
    if isinstance(obj, dict):
        return {key: deep_sort(obj[key]) for key in sorted(obj)}
    if isinstance(obj, list):
        return [deep_sort(item) for item in obj]
    return obj


def _comment(text: Any, indent: str = "") -> str:
    # Upstream calls ``.split("\n")`` on the description: anything but a string fails the conversion.
    if not isinstance(text, str):
        raise ToolDeclarationError(f"description must be a string, got {type(text).__name__}")
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _iterable(value: Any, what: str) -> Any:
    """``value`` where upstream iterates it: lists, and (as Python iterates them) strings and dict keys."""
    if not isinstance(value, list | str | dict):
        raise ToolDeclarationError(f"{what} must be a list, got {type(value).__name__}")
    return value


@dataclass
class _Defs:
    """The ``$defs`` seen so far in one function (registered as objects are parsed), and whether ``#`` was used."""

    entries: dict[str, Any] = field(default_factory=dict)
    self_ref: bool = False

    def register(self, defs: Any) -> None:
        if not defs:
            return
        if not isinstance(defs, dict):
            raise ToolDeclarationError("$defs must be an object")
        self.entries.update(defs)


class _Type:
    """A parsed schema: its comment lines and its TypeScript text."""

    def __init__(self, schema: dict[str, Any], constraint_keys: Sequence[str] = ()) -> None:
        self.description: Any = schema.get("description", "")
        self.constraints = sorted((k, v) for k, v in schema.items() if k in constraint_keys)

    def comments(self, indent: str) -> str:
        """Description and constraint lines, each ending in a newline; empty when there are none."""
        lines = []
        if self.description:
            lines.append(_comment(self.description, indent))
        if self.constraints:
            lines.append(indent + "// " + ", ".join(f"{k}: {v}" for k, v in self.constraints))
        return "".join(line + "\n" for line in lines)

    def text(self, indent: str) -> str:
        """The type as printed inside an f-string (any value is formatted)."""
        raise NotImplementedError

    def joined_text(self, indent: str) -> str:
        """The type where upstream concatenates or joins strings (a non-string would fail there)."""
        return self.text(indent)


class _Scalar(_Type):
    def __init__(self, name: Any, schema: dict[str, Any] | None = None) -> None:
        keys = _CONSTRAINT_KEYS.get(name, ()) if isinstance(name, str) else ()
        super().__init__(schema or {}, keys)
        self.name = name

    def _value(self) -> Any:
        return "number" if self.name == "integer" else self.name

    def text(self, indent: str) -> str:
        return f"{self._value()}"

    def joined_text(self, indent: str) -> str:
        value = self._value()
        if not isinstance(value, str):
            raise ToolDeclarationError(f"type must be a string, got {value!r}")
        return value


@dataclass
class _Field:
    name: str
    type: _Type
    optional: bool
    default: Any

    def render(self, indent: str) -> str:
        out = self.type.comments(indent)
        if self.default is not None:
            if isinstance(self.default, int | float):  # bool is an int: Python's True/False
                shown = repr(self.default)
            else:
                shown = json.dumps(self.default, ensure_ascii=False)
            out += f"{indent}// Default: {shown}\n"
        return out + f"{indent}{self.name}{'?' if self.optional else ''}: {self.type.text(indent)}"


class _Object(_Type):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema)
        self.fields: list[_Field] = []
        self.extra: Any = None
        if not schema:
            return
        if "$defs" in schema:
            defs.register(schema["$defs"])
        extra = schema.get("additionalProperties")
        self.extra = _parse(extra, defs) if isinstance(extra, dict) else extra
        if "properties" not in schema:
            return
        required = _iterable(schema.get("required", []), "required")
        try:
            required_names = set(required)
        except TypeError as exc:  # an unhashable entry
            raise ToolDeclarationError(f"required: {exc}") from exc
        properties = schema["properties"]
        if not isinstance(properties, dict):
            raise ToolDeclarationError("properties must be an object")
        for name, prop in properties.items():
            default = prop.get("default") if isinstance(prop, dict) else None
            self.fields.append(_Field(name, _parse(prop, defs), name not in required_names, default))

    def text(self, indent: str) -> str:
        inner = indent + INDENT
        ordered = sorted((f for f in self.fields if not f.optional), key=lambda f: f.name)
        ordered += sorted((f for f in self.fields if f.optional), key=lambda f: f.name)
        parts = [f.render(inner) for f in ordered]
        if self.extra is not None:
            if self.extra is True:
                value = "any"
            elif self.extra is False:
                value = "never"
            elif isinstance(self.extra, _Type):
                value = self.extra.text(inner)
            else:
                raise ToolDeclarationError(f"unsupported additionalProperties: {self.extra!r}")
            parts.append(f"{inner}[k: string]: {value}")
        if not parts:
            return "{}"
        return "{\n" + _FIELD_SEP.join(parts) + "\n" + indent + "}"


class _Array(_Type):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema, _ARRAY_CONSTRAINT_KEYS)
        items = schema.get("items")
        self.item: _Type = _parse(items, defs) if items else _Scalar("any")

    def text(self, indent: str) -> str:
        inner = indent + INDENT
        doc = self.item.comments(inner)
        if doc:
            return "Array<\n" + doc + inner + self.item.joined_text(inner) + "\n" + indent + ">"
        return f"Array<{self.item.text(indent)}>"


def _enum_base_type(declared: Any) -> Any:
    """The one type an enum's values are checked against: ``[T]`` and ``[T, "null"]`` reduce to ``T``."""
    if not isinstance(declared, list):
        return declared
    if len(declared) == 1:
        return declared[0]
    if len(declared) == 2 and "null" in declared:
        return declared[0] if declared[0] != "null" else declared[1]
    raise ToolDeclarationError(f"enum type {declared!r} is not supported")


_ENUM_CHECKS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
}


class _Enum(_Type):
    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__(schema)
        self.values: Any = schema["enum"]
        if "type" not in schema:
            return
        base = _enum_base_type(schema["type"])
        allowed = _ENUM_CHECKS.get(base) if isinstance(base, str) else None
        for value in _iterable(self.values, "enum"):
            if value is not None and allowed is not None and not isinstance(value, allowed):
                raise ToolDeclarationError(f"enum value {value!r} is not a {base}")

    def text(self, indent: str) -> str:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in _iterable(self.values, "enum"))


class _AnyOf(_Type):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema)
        self.options = [_parse(option, defs) for option in _iterable(schema["anyOf"], "anyOf")]

    def text(self, indent: str) -> str:
        return " | ".join(option.joined_text(indent) for option in self.options)


class _Union(_Type):
    """``"type": [...]``: a union of plain type names; an unknown name fails the conversion."""

    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__(schema)
        self.names = []
        for name in schema["type"]:
            if not isinstance(name, str) or name not in _UNION_NAMES:
                raise ToolDeclarationError(f"type {name!r} cannot be part of a union")
            self.names.append(_UNION_NAMES[name])

    def text(self, indent: str) -> str:
        return " | ".join(self.names)


class _Ref(_Type):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema)
        ref = schema["$ref"]
        if ref == _SELF_REF:
            defs.self_ref = True
            self.name = "parameters"
            return
        if not isinstance(ref, str) or not ref.startswith(_DEFS_PREFIX):
            raise ToolDeclarationError(f"unsupported $ref {ref!r} (only #/$defs/NAME and #)")
        name = ref.split("/")[-1]
        if name not in defs.entries:
            raise ToolDeclarationError(f"$ref {ref!r} not found (defined so far: {sorted(defs.entries)})")
        target = defs.entries[name]
        if not isinstance(target, dict):
            raise ToolDeclarationError(f"$defs entry {name!r} must be an object")
        self.name = "parameters" if target.get("$self_ref", False) else name

    def text(self, indent: str) -> str:
        return self.name


def _parse(schema: Any, defs: _Defs) -> _Type:
    """One JSON schema as a type; the checks are upstream's, in upstream's order ($ref, anyOf, enum, type)."""
    if isinstance(schema, bool):
        return _Scalar("any" if schema else "null")
    if not isinstance(schema, dict):
        raise ToolDeclarationError(f"a schema must be an object or a boolean, got {type(schema).__name__}")
    if "$ref" in schema:
        return _Ref(schema, defs)
    if "anyOf" in schema:
        return _AnyOf(schema, defs)
    if "enum" in schema:
        return _Enum(schema)
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, list):
            return _Union(schema)
        if kind == "object":
            return _Object(schema, defs)
        if kind == "array":
            return _Array(schema, defs)
        return _Scalar(kind, schema)
    if not schema:
        return _Scalar("any")
    raise ToolDeclarationError(f"schema without $ref, anyOf, enum or type: {sorted(schema)}")


def _render_function(function: dict[str, Any]) -> str:
    """``[interfaces]\\n[// description]\\ntype NAME = (_: PARAMS) => any;`` for one function.

    Interfaces are the ``$defs`` registered while parsing the parameters (a definition's own
    nested ``$defs`` can be referenced but get no interface, as upstream); with a ``#`` reference
    the parameters are printed once as ``interface parameters`` (in key order, without an index
    signature) and the root object itself is never printed.
    """
    defs = _Defs()
    parameters = function.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ToolDeclarationError("parameters must be an object")
    root = _Object(parameters, defs)
    interfaces = []
    self_ref = defs.self_ref
    if self_ref:
        body = _FIELD_SEP.join(f.render(INDENT) for f in root.fields)
        interfaces.append("interface parameters {" + (f"\n{body}\n" if body else "") + "}")
    for name, schema in list(defs.entries.items()):
        text = _parse(schema, defs).text("")
        if not isinstance(schema, dict):
            raise ToolDeclarationError(f"$defs entry {name!r} must be an object")
        description = schema.get("description", "")
        prefix = _comment(description) + "\n" if description else ""
        interfaces.append(f"{prefix}interface {name} {text}")
    signature = "parameters" if self_ref else root.text("")
    description = function.get("description")
    parts = [
        "\n".join(interfaces),
        _comment(description) if description else "",
        f"type {function.get('name', 'function')} = (_: {signature}) => any;",
    ]
    return "\n".join(part for part in parts if part)


def encode_tools_typescript(tools: Any) -> str:
    """The declaration text for deep-sorted ``tools``; ``""`` when there is no function tool.

    Raises ``ToolDeclarationError`` where the real tokenizer's conversion fails.
    """
    if not tools:
        return ""
    functions = []
    for tool in _iterable(tools, "tools"):
        if not isinstance(tool, dict):
            raise ToolDeclarationError(f"a tool must be an object, got {type(tool).__name__}")
        if tool.get("type") != "function":
            continue  # other tool kinds are not declared
        function = tool.get("function", {})
        if not function:
            continue
        if not isinstance(function, dict):
            raise ToolDeclarationError("function must be an object")
        functions.append(_render_function(function))
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


@dataclass(frozen=True)
class ToolDeclaration:
    """What the template receives: the deep-sorted ``tools`` and ``tools_ts_str`` (None: the JSON fallback).

    ``tools`` is shared between callers through the cache: read it, never mutate it.
    """

    tools: list[Any] | None
    tools_ts_str: str | None

    def template_kwargs(self) -> dict[str, str]:
        """``{"tools_ts_str": ...}`` when the conversion succeeded (as the real tokenizer passes it), else ``{}``."""
        return {} if self.tools_ts_str is None else {"tools_ts_str": self.tools_ts_str}


def _declare(tools: Sequence[Any] | None) -> ToolDeclaration:
    if tools is None:
        return ToolDeclaration(None, None)
    ordered = deep_sort(tools if isinstance(tools, list) else list(tools))
    if not ordered:
        return ToolDeclaration(ordered, None)
    try:
        text: str | None = encode_tools_typescript(ordered)
    except ToolDeclarationError:
        text = None
    return ToolDeclaration(ordered, text)


class _DeclarationCache:
    """Declarations per distinct tool list (by its key-sorted JSON), LRU; thread-safe.

    A dataset usually has a handful of tool lists across millions of samples, so the conversion
    runs once per list and each later sample pays one ``orjson.dumps`` for the key.
    """

    def __init__(self, maxsize: int = 1024) -> None:
        self.maxsize = maxsize
        self._items: OrderedDict[bytes, ToolDeclaration] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, tools: Sequence[Any] | None) -> ToolDeclaration:
        if not tools:
            return _declare(tools)
        try:
            key = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # not JSON (e.g. an integer beyond 64 bits): no cache
            return _declare(tools)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return hit
        value = _declare(tools)
        with self._lock:
            self.misses += 1
            self._items[key] = value
            if len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


DECLARATIONS = _DeclarationCache()


def declare_tools(tools: Sequence[Any] | None) -> ToolDeclaration:
    """The template inputs for ``tools`` as the real tokenizer builds them, cached per distinct tool list."""
    return DECLARATIONS.get(tools)
