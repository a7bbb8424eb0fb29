"""Render chat templates exactly as Hugging Face ``apply_chat_template`` does (transformers 5.x).

Serving stacks (vLLM, SGLang) render the Kimi template through transformers, so the training text
must come from the same Jinja configuration: a plain ``jinja2.Environment`` differs in whitespace
(``trim_blocks``/``lstrip_blocks``), lacks ``{% break %}``, and its ``tojson`` sorts keys and
escapes non-ASCII, all of which change token ids. The input normalisation is HF's too: keys whose
value is ``None`` are dropped (the Kimi template would otherwise render ``<think>None</think>``),
and reasoning given as ``reasoning``/``thinking``/``reasoning_content`` is aliased to all three.
"""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in filter sorts keys and HTML-escapes; HF's keeps order and non-ASCII text.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateNamespace(jinja2.utils.Namespace):
    """HF's namespace: rejects underscore attributes so templates cannot reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _TemplateDict:
    """HF's ``dict`` global: construction only, no attribute access to the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """Compile once per template text; compilation costs far more than a render."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _TemplateNamespace
    env.globals["dict"] = _TemplateDict()
    return env.from_string(template)


def normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """HF's pre-render normalisation: drop ``None`` values, alias the reasoning field names."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {type(message).__name__}")
        msg = {k: v for k, v in message.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if k in msg), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def render_normalized(
    template: str,
    messages: list[dict[str, Any]],
    tools: Sequence[Any] | None,
    add_generation_prompt: bool,
    kwargs: Mapping[str, Any],
) -> str:
    """Render already-normalised messages; split out so token-exact encoding can render marked copies."""
    return compile_template(template).render(
        messages=messages,
        tools=None if tools is None else list(tools),
        documents=kwargs.get("documents"),
        add_generation_prompt=add_generation_prompt,
        **{k: v for k, v in kwargs.items() if k != "documents"},
    )
