"""Conversation formats of published prompt sets, detected from their columns, read into OpenAI messages.

The sets EAGLE drafts train on come in a handful of shapes: OpenAI ``messages`` (UltraChat-200k,
OpenThoughts' chat exports), ShareGPT ``conversations`` of ``from``/``value`` turns, ``conversations``
of ``role``/``content``, UltraChat's alternating ``data`` list, Alpaca ``instruction``/``input``, and a
plain ``prompt``. Each row becomes one canonical conversation (system, user, assistant and tool
messages, plus tools), so everything after this module sees one shape. ``columns`` maps a format's
field names onto a set's own column names (``{prompt: question, id: task_id}``), which covers
anything else.

A row that cannot be read raises :class:`RowError` with a short ``reason`` (for the counts shown in
the UI) and a message that says what is wrong; the caller reports it with the file and line and
keeps the other rows.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from eagle_assets.errors import DataError

VALID_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
FORMATS = ("openai", "sharegpt", "conversations", "ultrachat", "alpaca", "prompt")
FIELDS: dict[str, tuple[str, ...]] = {
    "openai": ("messages", "tools", "id"),
    "sharegpt": ("conversations", "tools", "system", "id"),
    "conversations": ("conversations", "tools", "system", "id"),
    "ultrachat": ("data", "system", "id"),
    "alpaca": ("instruction", "input", "system", "id"),
    "prompt": ("prompt", "system", "id"),
}
ALL_FIELDS = frozenset(f for fields in FIELDS.values() for f in fields)
# Columns that carry a row's own id, in the order they are preferred.
ID_COLUMNS = ("id", "prompt_id", "conversation_id", "conv_id", "uuid")
# ShareGPT speakers → roles. ``function_call`` turns become assistant tool calls, ``observation`` their results.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


class RowError(DataError, ValueError):
    """One row cannot be used; ``reason`` is the short class it is counted under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class FormatError(DataError, ValueError):
    """The dataset as a whole is in no format we know (or the one named does not fit its columns)."""


@dataclass(frozen=True)
class RowFormat:
    """How to read a dataset's rows: the format, and which column holds each of its fields."""

    name: str
    columns: Mapping[str, str] = field(default_factory=dict)  # field → column actually read
    detected: bool = True  # False when ``format:`` named it

    @property
    def source_columns(self) -> list[str]:
        return sorted(set(self.columns.values()))

    def describe(self) -> str:
        how = "detected" if self.detected else "configured"
        renamed = "".join(f", {k} from {v}" for k, v in sorted(self.columns.items()) if k != v)
        return f"{self.name} ({how}{renamed})"


@dataclass(frozen=True)
class ReadRow:
    """A row in canonical form: the whole conversation as given (original answers included)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    given_id: str | None


def _maybe_json(value: Any) -> Any:
    """Parquet exports often store nested fields as JSON text; decode it, leave anything else as it is."""
    if isinstance(value, str | bytes) and value[:1] in ("[", "{", b"[", b"{"):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


# How many rows with turns decide between ShareGPT (from/value) and role/content ``conversations``.
_VOTING_ROWS = 5


def _first_turn(value: Any) -> Mapping[str, Any] | None:
    value = _maybe_json(value)
    if isinstance(value, list) and value and isinstance(value[0], Mapping):
        return value[0]
    return None


def _conversations_kind(samples: Sequence[Mapping[str, Any]], column: str) -> str:
    """``conversations`` (role/content) or ``sharegpt`` (from/value), by the first rows that have turns.

    Rows whose list is empty or not turns are passed over, so one empty first row cannot make every
    row of a role/content set unreadable; a tie (or no row with turns) reads as ShareGPT."""
    votes = {"conversations": 0, "sharegpt": 0}
    for sample in samples:
        first = _first_turn(sample.get(column))
        if first is None:
            continue
        votes["conversations" if "role" in first and "from" not in first else "sharegpt"] += 1
        if sum(votes.values()) >= _VOTING_ROWS:
            break
    return "conversations" if votes["conversations"] > votes["sharegpt"] else "sharegpt"


def detect_format(
    columns: Sequence[str],
    samples: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    name: str | None = None,
    mapping: Mapping[str, str] | None = None,
) -> RowFormat:
    """Pick the format from the column names (and, for ``conversations``, the keys of the first turns of
    the first rows that have turns: ``samples``, one row or several).

    ``name`` forces a format; ``mapping`` renames fields (field → column). Raises :class:`FormatError`
    naming the columns seen when nothing fits."""
    rows = [samples] if isinstance(samples, Mapping) else list(samples or [])
    mapping = dict(mapping or {})
    unknown = sorted(set(mapping) - ALL_FIELDS)
    if unknown:
        raise FormatError(f"columns: unknown field(s) {unknown}; fields are {sorted(ALL_FIELDS)}")
    present = set(columns)

    def col(f: str) -> str | None:
        c = mapping.get(f, f)
        return c if c in present else None

    def resolved(fmt: str, detected: bool) -> RowFormat:
        cols = {f: c for f in FIELDS[fmt] if (c := col(f)) is not None}
        if "id" not in cols and "id" not in mapping:
            given = next((c for c in ID_COLUMNS if c in present), None)
            if given is not None:
                cols["id"] = given
        main = FIELDS[fmt][0]
        if main not in cols:
            raise FormatError(
                f"format {fmt!r} needs a {main!r} column; the data has {sorted(present)}"
                f" (map it with columns: {{{main}: <column>}})"
            )
        return RowFormat(fmt, cols, detected)

    if name is not None:
        if name not in FORMATS:
            raise FormatError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}")
        return resolved(name, detected=False)
    if col("messages"):
        return resolved("openai", True)
    if conversations := col("conversations"):
        return resolved(_conversations_kind(rows, conversations), True)
    if col("data"):
        return resolved("ultrachat", True)
    if col("instruction"):
        return resolved("alpaca", True)
    if col("prompt"):
        return resolved("prompt", True)
    raise FormatError(
        f"unknown format: the data has columns {sorted(present)}; expected one of messages (OpenAI), conversations"
        " (ShareGPT from/value or role/content), data (UltraChat), instruction (Alpaca) or prompt. Name it with"
        " `format:` and map your column names with `columns:` (e.g. {prompt: question})"
    )


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise RowError("bad_field", f"{where} must be text, got {type(value).__name__}")


def _check_messages(messages: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise RowError("bad_message", f"{where}[{i}] is not an object")
        m = {k: v for k, v in m.items() if v is not None}  # Parquet structs fill absent fields with nulls
        role = m.get("role")
        if role not in VALID_ROLES:
            raise RowError("unknown_role", f"{where}[{i}].role {role!r} is not one of {sorted(VALID_ROLES)}")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RowError("bad_message", f"{where}[{i}].content must be a string, a list of parts or null")
        out.append(m)
    return out


def _tools(value: Any, where: str) -> list[dict[str, Any]] | None:
    value = _maybe_json(value)
    if value in (None, "", []):
        return None
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        raise RowError("bad_tools", f"{where} must be a list of tool objects")
    # Function specs without the OpenAI wrapper (LLaMA-Factory's ShareGPT ``tools``) are wrapped.
    return [dict(t) if "function" in t or "type" in t else {"type": "function", "function": dict(t)} for t in value]


def _system_first(system: Any, messages: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    if system in (None, ""):
        return messages
    return [{"role": "system", "content": _text(system, where)}, *messages]


def _list_field(row: Mapping[str, Any], column: str, what: str) -> list[Any]:
    value = _maybe_json(row.get(column))
    if value is None:
        raise RowError("missing_field", f"'{column}' is missing or null")
    if not isinstance(value, list):
        raise RowError("bad_field", f"'{column}' must be a list of {what}, got {type(value).__name__}")
    if not value:
        raise RowError("empty", f"'{column}' is an empty list")
    return value


def _sharegpt_messages(turns: list[Any], column: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending_calls: list[str] = []
    calls_so_far = 0
    for i, turn in enumerate(turns):
        where = f"{column}[{i}]"
        if not isinstance(turn, Mapping):
            raise RowError("bad_message", f"{where} is not an object")
        speaker = turn.get("from")
        if speaker is None and "role" in turn:
            raise RowError("bad_message", f"{where} has 'role' where ShareGPT has 'from' (use format: conversations)")
        role = SHAREGPT_ROLES.get(str(speaker).lower()) if isinstance(speaker, str) else None
        if role is None:
            raise RowError("unknown_role", f"{where}.from {speaker!r} is not one of {sorted(SHAREGPT_ROLES)}")
        value = turn.get("value")
        if speaker == "function_call":
            call = _maybe_json(value)
            calls = call if isinstance(call, list) else [call]
            tool_calls = []
            for c in calls:
                if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
                    raise RowError("bad_message", f"{where}: a function_call value must be JSON with a 'name'")
                args = c.get("arguments", {})
                call_id = f"functions.{c['name']}:{calls_so_far}"
                calls_so_far += 1
                pending_calls.append(call_id)
                tool_calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                        },
                    }
                )
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and not prev.get("tool_calls"):
                prev["tool_calls"] = tool_calls  # the text turn before a call is the same assistant message
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
            continue
        text = _text(value if value is not None else "", f"{where}.value")
        if role == "tool":
            out.append({"role": "tool", "content": text, "tool_call_id": pending_calls.pop(0) if pending_calls else ""})
        else:
            out.append({"role": role, "content": text})
    return out


def read_row(row: Any, fmt: RowFormat) -> ReadRow:
    """One stored row → its conversation, or :class:`RowError`."""
    if isinstance(row, Exception):
        raise RowError("invalid_json", str(row))
    if not isinstance(row, Mapping):
        raise RowError("not_an_object", f"row is a JSON {type(row).__name__}, not an object")
    c = fmt.columns
    system = row.get(c["system"]) if "system" in c else None
    tools = _tools(row.get(c["tools"]), f"'{c['tools']}'") if "tools" in c else None
    if fmt.name == "openai":
        raw = _list_field(row, c["messages"], "messages")
        messages = _check_messages(raw, c["messages"])
    elif fmt.name == "conversations":
        raw = _list_field(row, c["conversations"], "turns")
        messages = _system_first(system, _check_messages(raw, c["conversations"]), "'system'")
    elif fmt.name == "sharegpt":
        raw = _list_field(row, c["conversations"], "turns")
        messages = _system_first(system, _sharegpt_messages(raw, c["conversations"]), "'system'")
    elif fmt.name == "ultrachat":
        raw = _list_field(row, c["data"], "texts")
        turns = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": _text(t, f"{c['data']}[{i}]")}
            for i, t in enumerate(raw)
        ]
        messages = _system_first(system, turns, "'system'")
    elif fmt.name == "alpaca":
        instruction = _text(row.get(c["instruction"]) or "", f"'{c['instruction']}'")
        extra = row.get(c["input"]) if "input" in c else None
        extra = _text(extra, f"'{c['input']}'") if extra is not None else ""
        if not instruction.strip():
            raise RowError("empty", f"'{c['instruction']}' is empty")
        content = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        messages = _system_first(system, [{"role": "user", "content": content}], "'system'")
    elif fmt.name == "prompt":
        value = row.get(c["prompt"])  # text, or a list of texts: several user turns (MT-Bench)
        texts = value if isinstance(value, list) else [value]
        if value is None or not texts:
            raise RowError("missing_field", f"'{c['prompt']}' is missing or null")
        turns = [{"role": "user", "content": _text(t, f"'{c['prompt']}'")} for t in texts]
        if not any(t["content"].strip() for t in turns):
            raise RowError("empty", f"'{c['prompt']}' is empty")
        messages = _system_first(system, turns, "'system'")
    else:  # pragma: no cover - detect_format only returns known names
        raise FormatError(f"unknown format {fmt.name!r}")
    if not any(m["role"] == "user" for m in messages):
        raise RowError("no_user_turn", "the conversation has no user message: nothing to answer")
    pid = row.get(c["id"]) if "id" in c else None
    pid = None if pid is None or (isinstance(pid, str) and not pid.strip()) else str(pid)
    return ReadRow(messages, tools, pid)
