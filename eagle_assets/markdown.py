"""Markdown tables for Dagster metadata: one helper, so one escaping rule.

Dagster's UI renders ``MetadataValue.md`` as GitHub-flavoured Markdown, where a ``|`` inside a cell
starts a new column and a line break ends the row. Tables built by hand in each asset escaped this
differently or not at all (a provider or reason with a ``|``, an example prompt with a newline, broke
its row), so every table the project shows is built here: a ``|`` in a cell becomes ``\\|``, a line
break becomes a space, and an empty cell is ``| |``.

Pure functions on strings; the module imports nothing from the project.
"""

from collections.abc import Iterable, Sequence


def cell(value: object) -> str:
    """One cell's text: ``str(value)`` with ``|`` escaped and line breaks turned into spaces."""
    text = str(value).replace("\r\n", "\n").replace("\r", "\n").replace("\n", " ")
    return text.replace("|", "\\|")


def row(cells: Iterable[object]) -> str:
    """One table line: ``| a | b |`` (an empty cell is ``| |``)."""
    return "|" + "|".join(f" {c} " if c else " " for c in map(cell, cells)) + "|"


def table(headers: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: the header line, ``|---|---|``, then one line per row. A row shorter than the header is
    padded with empty cells; a longer one is an error (its extra cells would be dropped by the renderer)."""
    width = len(headers)
    lines = [row(headers), "|" + "---|" * width]
    for r in rows:
        if len(r) > width:
            raise ValueError(f"a row of {len(r)} cells under a header of {width}: {list(r)!r}")
        lines.append(row([*r, *[""] * (width - len(r))]))
    return "\n".join(lines)
