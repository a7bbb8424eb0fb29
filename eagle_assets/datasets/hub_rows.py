"""Row counts of a Hub split without downloading its data: what the shard keys need when the definitions load.

Every process that loads the definitions lists every dataset's shards; fetching a whole Hub split for that
would download gigabytes before anyone asked, and a Hub outage would fail the code location. So the card
pins the commit, the tree listing gives the files, Parquet footers are read by byte ranges through
``HfFileSystem`` (JSON Lines, having no footer, is downloaded once into the HF cache), and the counts are
kept per (repo, commit), which never goes stale; see docs/datasets.md ("Loading the definitions downloads no
Hub data"). Every failure is a :class:`HubSourceError` naming the dataset, the commit and the cause.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_assets.datasets.file_readers import count_file_rows, file_kind
from eagle_assets.datasets.hub_source import (
    HubDatasetRef,
    HubSourceError,
    SplitPatterns,
    hf_cache_dir,
    hub_endpoint,
    hub_offline,
    split_patterns,
)
from eagle_assets.durable_files import atomic_write_text

# What pyarrow asks for first is the last 64 kB (its default footer read); a block of that size keeps fsspec
# from reading ahead past it.
FOOTER_BLOCK_BYTES = 64 << 10
CACHE_VERSION = 1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubRowCount:
    """The rows of each file of a split at a commit, in split order."""

    commit: str
    config: str | None
    rows: tuple[tuple[str, int], ...]  # (repo path, rows)

    @property
    def total(self) -> int:
        return sum(n for _, n in self.rows)


def _cache_file(cache_dir: Path, repo_id: str, commit: str) -> Path:
    return cache_dir / "hub-rows" / repo_id.replace("/", "--") / f"{commit}.json"


def _read_record(path: Path) -> dict[str, Any]:
    """The cached listing and counts of one commit; an unreadable or older record is as good as none."""
    try:
        raw = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION:
        return {}
    return raw


def _where(ref: HubDatasetRef, commit: str, path: str | None = None) -> str:
    return f"{ref.label}@{commit}" + (f" file {path}" if path else "")


def _refuse_offline(ref: HubDatasetRef, commit: str, what: str) -> HubSourceError:
    return HubSourceError(
        f"{_where(ref, commit)}: {what} is not cached and HF_HUB_OFFLINE is set: load the definitions once online"
    )


def _list_files(ref: HubDatasetRef, commit: str) -> dict[str, int]:
    """Every file of the commit and its size, from the Hub's tree listing."""
    if hub_offline():
        raise _refuse_offline(ref, commit, "the file list")
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    try:
        entries = HfApi(endpoint=hub_endpoint()).list_repo_tree(
            ref.repo_id, recursive=True, revision=commit, repo_type="dataset"
        )
        return {e.path: int(e.size) for e in entries if isinstance(e, RepoFile)}
    except Exception as exc:  # httpx's connection errors and the Hub's HTTP errors alike: the Hub did not answer
        raise HubSourceError(
            f"{_where(ref, commit)}: the Hub's file list could not be read ({type(exc).__name__}: {exc})"
        ) from exc


def _cached_copy(ref: HubDatasetRef, commit: str, path: str) -> Path | None:
    """The file from the HF cache when a partition already downloaded it (its footer is then read locally)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(ref.repo_id, path, cache_dir=hf_cache_dir(), revision=commit, repo_type="dataset")
    return Path(found) if isinstance(found, str) else None


def _footer_rows(ref: HubDatasetRef, commit: str, path: str) -> int:
    """A Parquet file's row count from its footer, fetched with range requests (the data pages stay on the Hub)."""
    import pyarrow.parquet as pq
    from huggingface_hub import HfFileSystem

    fs = HfFileSystem(endpoint=hub_endpoint())  # fsspec keeps one per endpoint: its listings are per commit
    try:
        with fs.open(f"datasets/{ref.repo_id}/{path}", "rb", revision=commit, block_size=FOOTER_BLOCK_BYTES) as remote:
            return int(pq.ParquetFile(remote).metadata.num_rows)
    except Exception as exc:  # connection, HTTP, or a footer pyarrow cannot read
        raise HubSourceError(
            f"{_where(ref, commit, path)}: its Parquet footer could not be read ({type(exc).__name__}: {exc})"
        ) from exc


def _downloaded(ref: HubDatasetRef, commit: str, path: str, size: int) -> Path:
    """A JSON file fetched whole into the HF cache: it has no footer to count its rows from."""
    from huggingface_hub import hf_hub_download

    log.warning(
        "%s: counting the rows of a JSON file means reading it: downloading %.1f MB into the Hugging Face cache"
        " (Parquet files are counted from their footers; revision refs/convert/parquet avoids this)",
        _where(ref, commit, path),
        size / 1e6,
    )
    try:
        local = hf_hub_download(
            ref.repo_id, path, repo_type="dataset", revision=commit, endpoint=hub_endpoint(), cache_dir=hf_cache_dir()
        )
        return Path(local)
    except Exception as exc:
        raise HubSourceError(
            f"{_where(ref, commit, path)}: could not be downloaded to count its rows ({type(exc).__name__}: {exc})"
        ) from exc


def _count(ref: HubDatasetRef, commit: str, path: str, size: int) -> int:
    local = _cached_copy(ref, commit, path)
    if local is not None:
        return count_file_rows(local)
    if hub_offline():
        raise _refuse_offline(ref, commit, f"the row count of {path}")
    if file_kind(path) == "parquet":
        return _footer_rows(ref, commit, path)
    return count_file_rows(_downloaded(ref, commit, path, size))


def _pinned(ref: HubDatasetRef) -> SplitPatterns:
    """The split's commit and globs; whatever goes wrong reaching the Hub is a :class:`HubSourceError`, which the
    shard keys turn into a placeholder shard: the code location must load while the Hub is away."""
    try:
        return split_patterns(ref)
    except HubSourceError:
        raise
    except Exception as exc:  # a proxy refusing, an answer that is not the Hub's: still the Hub not answering
        raise HubSourceError(
            f"{ref.label}@{ref.revision or 'main'}: the dataset card could not be fetched ({type(exc).__name__}: {exc})"
        ) from exc


def hub_row_count(ref: HubDatasetRef, cache_dir: Path) -> HubRowCount:
    """The split's row count per file, from the cache or the Hub's metadata and footers; no Parquet data read."""
    split = _pinned(ref)
    cache = _cache_file(cache_dir, ref.repo_id, split.commit)
    record = _read_record(cache)
    listing: dict[str, int] = record.get("files") or _list_files(ref, split.commit)
    counts: dict[str, int] = dict(record.get("rows") or {})
    paths = split.select(list(listing))
    missing = [p for p in paths if p not in counts]
    for p in missing:
        counts[p] = _count(ref, split.commit, p, listing[p])
    if missing or not record:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            cache, json.dumps({"version": CACHE_VERSION, "commit": split.commit, "files": listing, "rows": counts})
        )
    return HubRowCount(split.commit, split.config, tuple((p, counts[p]) for p in paths))
