"""Rows of a benchmark prompt set from the Hugging Face Hub, through the project's one dataset loader.

The loader the generation assets use (:mod:`eagle_assets.datasets.sources`) fetches the pinned revision into
the Hub cache (a second run downloads nothing, ``HF_HUB_OFFLINE=1`` works) and names the commit it resolved to,
which the benchmark records.
"""

from __future__ import annotations

from typing import Any

from eagle_assets.benchmarks.prompt_sets import HubSet, PromptSetError


def load_hub_set(hub: HubSet) -> tuple[list[dict[str, Any]], str]:
    """(rows in file order, ``repo@commit (split, config)``)."""
    try:
        from eagle_assets.datasets.sources import PromptFileError, SourceSpec, resolve_source
    except ImportError as exc:
        raise PromptSetError(
            f"{hub.source}: this checkout has no Hub dataset loader (eagle_assets.datasets.sources): {exc}"
        ) from exc
    try:
        source = resolve_source(SourceSpec.parse(hub.source, revision=hub.revision, config=hub.config, split=hub.split))
        rows: list[dict[str, Any]] = []
        for row in source.iter_rows():
            if not isinstance(row.value, dict):
                raise PromptSetError(f"{source.where(row)}: not a record ({row.value!r:.200})")
            rows.append(row.value)
    except PromptFileError as exc:
        raise PromptSetError(f"{hub.source}@{hub.revision}: {exc}") from exc
    return rows, source.description
