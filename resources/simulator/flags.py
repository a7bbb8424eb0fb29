"""Command-line flags declared on the settings dataclasses themselves.

A field is a setting's only declaration (its ``flag(...)`` metadata: spelling and help); the parser and the
flags of a config for a child process both derive from it, so copies cannot drift and config -> flags ->
config is exact.

A field without metadata is a flag named after it (``mean_completion_tokens`` ->
``--mean-completion-tokens``). Its annotation picks the shape: a bool is a switch that flips the
default, a ``frozenset[str]`` a repeatable flag, int/float/str/Path one value; any other type needs
``parse``/``show``. A nested settings dataclass is a ``group(...)``: its fields carry their own flags,
or are reached through one ``NAME=VALUE`` flag (``--fault rate_limit=0.05``).
"""

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_KEY = "cli"
_MISSING: Any = dataclasses.MISSING
_UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<unset>"})()  # a Flag without a command-line default
_TEXT_TYPES: tuple[type, ...] = (int, float, str, Path)


@dataclass(frozen=True)
class Flag:
    """How one field is spelled on the command line."""

    name: str | None = None  # None: ``--`` and the field name, dashed
    help: str = ""
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # text -> value; None: the annotated type
    show: Callable[[Any], str] | None = None  # value -> text; None: ``repr`` of a float, ``str`` of the rest
    # The command line's default where it is not the field's (a process listens on a known port, a test
    # config on an ephemeral one).
    cli_default: Any = _UNSET


@dataclass(frozen=True)
class Alias:
    """A shorthand setting several fields of a group at once (``--latency-lognormal MEDIAN SIGMA``)."""

    name: str
    fields: tuple[str, ...]
    help: str = ""
    metavar: tuple[str, ...] = ()  # () = the field names, upper-case


@dataclass(frozen=True)
class Group:
    """A field holding a settings dataclass of its own; ``each`` names a repeatable ``NAME=VALUE`` flag reaching
    all its fields (texts turned into values by the class's ``from_mapping``, if it has one)."""

    each: str | None = None
    each_help: str = ""
    aliases: tuple[Alias, ...] = ()


def flag(
    name: str | None = None,
    help: str = "",
    *,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    show: Callable[[Any], str] | None = None,
    cli_default: Any = _UNSET,
) -> dict[str, Flag]:
    """Field metadata: ``field(default=..., metadata=flag("--port", "help"))``."""
    return {_KEY: Flag(name, help, metavar, parse, show, cli_default)}


def group(each: str | None = None, each_help: str = "", aliases: tuple[Alias, ...] = ()) -> dict[str, Group]:
    """Field metadata of a nested settings dataclass."""
    return {_KEY: Group(each, each_help, aliases)}


@dataclass(frozen=True)
class _Option:
    """One flag derived from a field: its shape, conversions and default."""

    field: str
    dest: str  # the namespace attribute: ``port``, ``latency.median_s``
    name: str
    kind: str  # "value" | "switch" | "repeat"
    value_type: type | None  # what argparse converts the text with; None: text, converted by ``parse``
    parse: Callable[[str], Any] | None
    show: Callable[[Any], str]
    default: Any  # the command line's default; _MISSING where a factory makes it
    help: str
    metavar: str


def _strip_none(tp: Any) -> Any:
    """``X | None`` -> ``X``: None is never spelled on the command line, only left as the default."""
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return tp


def _show_default(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:
        return typing.cast(Callable[[], Any], f.default_factory)()  # MISSING is ruled out above
    raise TypeError(f"setting {f.name} has no default: every setting needs one")


def _option(f: dataclasses.Field[Any], annotation: Any, prefix: str) -> _Option:
    spec = f.metadata.get(_KEY) or Flag()
    if not isinstance(spec, Flag):
        raise TypeError(f"setting {f.name}: expected flag(...) metadata, got {spec!r}")
    tp = _strip_none(annotation)
    if tp is bool:
        kind, value_type = "switch", None
    elif typing.get_origin(tp) is frozenset:
        kind, value_type = "repeat", None
    elif spec.parse is not None:
        kind, value_type = "value", None
    elif tp in _TEXT_TYPES:
        kind, value_type = "value", tp
    else:
        raise TypeError(f"setting {f.name} of type {tp!r} needs parse= and show= in its flag(...)")
    name = spec.name or "--" + f.name.replace("_", "-")
    if spec.cli_default is not _UNSET:
        default = spec.cli_default
    elif f.default is not _MISSING:
        default = f.default
    else:
        default = _MISSING  # made by a factory: compared with a fresh one when needed
    return _Option(
        field=f.name,
        dest=prefix + f.name,
        name=name,
        kind=kind,
        value_type=value_type,
        parse=spec.parse,
        show=spec.show or _show_default,
        default=default,
        help=spec.help,
        metavar=spec.metavar or name.lstrip("-").upper().replace("-", "_"),
    )


def _fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def _group_options(f: dataclasses.Field[Any], annotation: Any) -> tuple[type, Group, list[_Option]]:
    spec = f.metadata[_KEY]
    sub: type = annotation
    options: list[_Option] = []
    for g, sub_annotation in _fields(sub):
        if _KEY in g.metadata:
            options.append(_option(g, sub_annotation, f"{f.name}."))
        elif spec.each is None:
            raise TypeError(f"setting {f.name}.{g.name} has no flag and its group no NAME=VALUE flag")
    return sub, spec, options


def _add(parser: argparse.ArgumentParser, opt: _Option) -> None:
    text = opt.help
    if opt.value_type is not None and opt.default is not _MISSING and opt.default is not None:
        text = f"{text} (default: {opt.show(opt.default)})".strip()
    common: dict[str, Any] = {"dest": opt.dest, "default": argparse.SUPPRESS, "help": text or None}
    if opt.kind == "switch":
        parser.add_argument(opt.name, action="store_const", const=not opt.default, **common)
    elif opt.kind == "repeat":
        parser.add_argument(opt.name, action="append", metavar=opt.metavar, **common)
    else:
        parser.add_argument(opt.name, type=opt.value_type or str, metavar=opt.metavar, **common)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add a flag for every field of the settings dataclass ``cls`` (no defaults: absent means the field's)."""
    for f, annotation in _fields(cls):
        if isinstance(f.metadata.get(_KEY), Group):
            sub, spec, options = _group_options(f, annotation)
            if spec.each is not None:
                names = ", ".join(g.name for g in dataclasses.fields(sub))
                parser.add_argument(
                    spec.each,
                    dest=f"{f.name}.*",
                    action="append",
                    default=argparse.SUPPRESS,
                    metavar="NAME=VALUE",
                    help=f"{spec.each_help} (repeatable; NAME: {names})".strip(),
                )
            for alias in spec.aliases:
                parser.add_argument(
                    alias.name,
                    dest=f"{f.name}.@{alias.name}",
                    type=float,
                    nargs=len(alias.fields),
                    metavar=alias.metavar or tuple(a.upper() for a in alias.fields),
                    default=argparse.SUPPRESS,
                    help=alias.help or None,
                )
            for opt in options:
                _add(parser, opt)
        else:
            _add(parser, _option(f, annotation, ""))


def _value(opt: _Option, given: Any) -> Any:
    if opt.kind == "repeat":
        return frozenset(given)
    if opt.parse is not None:
        return opt.parse(given)
    return given


def settings_from_namespace(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Keyword arguments of ``cls`` for the flags given; a group's ``NAME=VALUE`` items, then its aliases, then its
    own flags (a later one wins), and a group that rejects its values raises ``ValueError`` naming it."""
    given = vars(args)
    kwargs: dict[str, Any] = {}
    for f, annotation in _fields(cls):
        if isinstance(f.metadata.get(_KEY), Group):
            sub, spec, options = _group_options(f, annotation)
            values: dict[str, Any] = {}
            for item in given.get(f"{f.name}.*", ()):
                name, sep, text = item.partition("=")
                if not sep:
                    raise ValueError(f"bad {f.name} setting: {spec.each} expects NAME=VALUE, got {item!r}")
                values[name.strip()] = text.strip()
            for alias in spec.aliases:
                if (numbers := given.get(f"{f.name}.@{alias.name}")) is not None:
                    values.update(zip(alias.fields, numbers, strict=True))
            for opt in options:
                if opt.dest in given:
                    values[opt.field] = _value(opt, given[opt.dest])
            if values:
                try:
                    from_mapping = getattr(sub, "from_mapping", None)
                    kwargs[f.name] = sub(**values) if from_mapping is None else from_mapping(values)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"bad {f.name} setting: {exc}") from None
            continue
        opt = _option(f, annotation, "")
        if opt.dest in given:
            kwargs[f.name] = _value(opt, given[opt.dest])
        elif opt.default is not _MISSING and opt.default is not f.default:
            kwargs[f.name] = opt.default  # the command line's own default (``cli_default``), not the field's
    return kwargs


def _tokens(name: str, text: str) -> list[str]:
    # ``--key -x`` would read ``-x`` as a flag of its own; ``--key=-x`` cannot.
    if text == "--":  # Python 3.11's argparse drops a "--" value even as ``--key=--`` (it parses as [])
        raise ValueError(f"{name}: the value '--' cannot pass through the command line; choose another")
    return [f"{name}={text}"] if text.startswith("-") else [name, text]


def _flags_of_option(opt: _Option, value: Any, default: Any) -> list[str]:
    if value == default:
        return []
    if opt.kind == "switch":
        return [opt.name]
    if opt.kind == "repeat":
        if not value:
            raise ValueError(f"{opt.dest}={value!r} has no flags: an empty set is not the default {default!r}")
        return [token for item in sorted(value) for token in _tokens(opt.name, str(item))]
    if value is None:
        raise ValueError(f"{opt.dest}=None has no flags: its default is {default!r}")
    return _tokens(opt.name, opt.show(value))


def _show_item(value: Any) -> str:
    return "none" if value is None else _show_default(value)


def flags_of(config: Any) -> list[str]:
    """The flags that make the parser of ``type(config)`` reproduce ``config`` (defaults left out)."""
    cls = type(config)
    args: list[str] = []
    for f, annotation in _fields(cls):
        value = getattr(config, f.name)
        if isinstance(f.metadata.get(_KEY), Group):
            sub, spec, options = _group_options(f, annotation)
            own = {opt.field: opt for opt in options}
            base = sub()
            for g in dataclasses.fields(sub):
                item, default = getattr(value, g.name), getattr(base, g.name)
                if g.name in own:
                    args += _flags_of_option(own[g.name], item, default)
                elif item != default:
                    assert spec.each is not None  # checked by _group_options
                    args += [spec.each, f"{g.name}={_show_item(item)}"]
            continue
        opt = _option(f, annotation, "")
        default = _default(f) if opt.default is _MISSING else opt.default
        args += _flags_of_option(opt, value, default)
    return args
