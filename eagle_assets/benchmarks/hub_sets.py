"""Rows of a benchmark prompt set from the Hugging Face Hub, through the project's one dataset loader.

The prompt sets are read with :mod:`eagle_assets.datasets.sources` (the loader the generation assets
use): ``huggingface_hub`` fetches the pinned revision into its usual cache, so a second run downloads
nothing and ``HF_HUB_OFFLINE=1`` works; the commit the revision resolved to is returned with the rows
and recorded in the benchmark's metadata. A row the files cannot decode fails the set, naming where it is.
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
