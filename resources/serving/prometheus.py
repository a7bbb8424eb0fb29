"""A reader for the Prometheus text exposition format (version 0.0.4), the body of a server's ``/metrics``.

vLLM publishes its speculative-decoding counters only there. Comments are skipped, each sample is
``name{label="value",...} value [timestamp]``; any other line is an error that quotes it: a silently skipped
line could be the counter the benchmark needs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from eagle_assets.errors import EngineError

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_VALUES = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


class MetricsFormatError(EngineError, ValueError):
    """The text is not in the Prometheus exposition format; the message quotes the line."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _labels(text: str, line: str) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="x",b="y"}`` at the start of ``text``; returns the pairs and the characters used."""
    pairs: list[tuple[str, str]] = []
    i = 1
    while True:
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "}":
            return tuple(pairs), i + 1
        m = _LABEL_NAME.match(text, i)
        if not m or text[m.end() : m.end() + 2] != '="':
            raise MetricsFormatError(f"bad label in metrics line: {line!r}")
        key, i = m.group(0), m.end() + 2
        value: list[str] = []
        while True:
            if i >= len(text):
                raise MetricsFormatError(f"unterminated label value in metrics line: {line!r}")
            c = text[i]
            if c == "\\" and i + 1 < len(text):
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                value.append(c)
                i += 1
        pairs.append((key, "".join(value)))
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1


def _value(token: str, line: str) -> float:
    if token in _VALUES:
        return _VALUES[token]
    try:
        return float(token)
    except ValueError:
        raise MetricsFormatError(f"bad sample value {token!r} in metrics line: {line!r}") from None


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of a ``/metrics`` body, in order."""
    samples: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            raise MetricsFormatError(f"not a metrics sample line: {line!r}")
        rest = line[m.end() :]
        labels: tuple[tuple[str, str], ...] = ()
        if rest.startswith("{"):
            labels, used = _labels(rest, line)
            rest = rest[used:]
        fields = rest.split()
        if not fields or len(fields) > 2 or (rest and rest[0] not in " \t"):
            raise MetricsFormatError(f"not a metrics sample line: {line!r}")
        samples.append(Sample(m.group(0), labels, _value(fields[0], line)))
    return samples


def matching(samples: Iterable[Sample], name: str, labels: Mapping[str, str] | None = None) -> list[Sample]:
    """The samples called ``name`` whose labels include every pair of ``labels``."""
    want = dict(labels or {})
    return [s for s in samples if s.name == name and all(s.label(k) == v for k, v in want.items())]
