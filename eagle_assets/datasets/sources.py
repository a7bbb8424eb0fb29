"""Where a dataset's rows come from: a local file or folder, or a Hugging Face Hub dataset.

The one loader for prompt data (the generation assets and the benchmark sets both read through it; its use
is shown in docs/datasets.md, "For other code"). A folder is read in sorted order, as one set; row indices
run across all files of the source in order, and are what shards and sampling are cut on.
"""

import hashlib
import json
from collections import Counter
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_assets.datasets.file_readers import (
    SUPPORTED_SUFFIXES,
    PromptFileError,
    RawRow,
    count_file_rows,
    file_kind,
    is_data_file,
    iter_file_rows,
    parquet_columns,
)
from eagle_assets.datasets.hub_source import HubDatasetRef, HubSnapshot, is_hub_spec, resolve_hub_dataset
from eagle_assets.durable_files import atomic_write_text

__all__ = [
    "PromptFileError",
    "RawRow",
    "ResolvedSource",
    "SourceSpec",
    "resolve_source",
]

_PEEK_ROWS = 50


@dataclass(frozen=True)
class SourceSpec:
    """A local ``path`` or a Hub ``hub`` reference (exactly one)."""

    path: Path | None = None
    hub: HubDatasetRef | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.hub is None):
            raise ValueError("a source is either a local path or a Hub dataset")

    @staticmethod
    def parse(
        text: str,
        base: Path | None = None,
        *,
        revision: str | None = None,
        config: str | None = None,
        split: str | None = None,
        data_files: list[str] | tuple[str, ...] | None = None,
    ) -> "SourceSpec":
        """``hf:owner/name[@revision]`` or a path (relative to ``base``); Hub keys on a path are an error."""
        if is_hub_spec(text):
            return SourceSpec(
                hub=HubDatasetRef.parse(
                    text, revision=revision, config=config, split=split or "train", data_files=tuple(data_files or ())
                )
            )
        given = [k for k, v in (("revision", revision), ("config", config), ("split", split)) if v is not None]
        if data_files:
            given.append("data_files")
        if given:
            raise PromptFileError(f"{text}: {', '.join(given)} apply to Hub datasets (hf:owner/name), not to a path")
        p = Path(text).expanduser()
        if not p.is_absolute() and base is not None:
            p = (base / p).resolve()
        return SourceSpec(path=p)

    @property
    def label(self) -> str:
        if self.hub is not None:
            return self.hub.label
        assert self.path is not None
        return str(self.path)


@dataclass(frozen=True)
class ResolvedSource:
    """The files a source stands for right now, and (for the Hub) the commit they were read at."""

    spec: SourceSpec
    files: tuple[Path, ...]
    labels: tuple[str, ...]  # how each file is named in row reports
    commit: str | None = None
    config: str | None = None
    split: str | None = None
    _counts: dict[Path, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def description(self) -> str:
        """``owner/name@commit`` (split, config) or the local path, for logs and metadata."""
        if self.spec.hub is None:
            return self.spec.label
        extra = f"split {self.split}" + (f", config {self.config}" if self.config else "")
        return f"{self.spec.hub.repo_id}@{self.commit} ({extra})"

    def fingerprint(self) -> str:
        """Changes when the data may have: the commit, or the local files' sizes and mtimes."""
        h = hashlib.sha256(self.spec.label.encode())
        h.update(str(self.commit).encode())
        for f in self.files:
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:24]

    def file_rows(self, path: Path) -> int:
        if path not in self._counts:
            self._counts[path] = count_file_rows(path)
        return self._counts[path]

    def count_rows(self) -> int:
        return sum(self.file_rows(f) for f in self.files)

    def iter_rows(self, wanted: Container[int] | None = None, columns: list[str] | None = None) -> Iterator[RawRow]:
        """Every row (or those whose index is in ``wanted``), in source order, decoded lazily."""
        first = 0
        for path, label in zip(self.files, self.labels, strict=True):
            known = self._counts.get(path)
            if known is None and file_kind(path) == "parquet":
                known = self.file_rows(path)
            if wanted is not None and known is not None and not _any_in(wanted, first, known):
                first += known
                continue
            seen: list[int] = []
            for row in iter_file_rows(path, first, wanted, columns, seen):
                yield RawRow(label, row.line, row.index, row.value)
            self._counts[path] = seen[0]
            first += seen[0]

    def columns(self) -> tuple[list[str], list[dict[str, Any]]]:
        """The column names and the first rows that are objects (up to ``_PEEK_ROWS``), for format detection.

        Several rows, not one: a set whose first row is empty or odd must not decide the format of all
        the others. Raises :class:`PromptFileError` saying what was seen when the source holds no rows,
        or no object among its first rows, instead of leaving "unknown format: columns []" to explain it.
        """
        seen: Counter[str] = Counter()
        first_problem = ""
        for path, label in zip(self.files, self.labels, strict=True):
            names: dict[str, None] = {}
            samples: list[dict[str, Any]] = []
            if file_kind(path) == "parquet":
                names.update(dict.fromkeys(parquet_columns(path)))
            for row in iter_file_rows(path, 0, range(_PEEK_ROWS)):
                if isinstance(row.value, dict):
                    samples.append(row.value)
                    names.update(dict.fromkeys(row.value))
                    continue
                what = "invalid JSON" if isinstance(row.value, Exception) else f"a JSON {type(row.value).__name__}"
                seen[what] += 1
                first_problem = first_problem or f"{label}:{row.line}: {_short(row.value)}"
            if samples:
                return list(names), samples
        if not seen:
            raise PromptFileError(f"{self.description}: holds no rows")
        counts = ", ".join(f"{n} {what}" for what, n in seen.most_common())
        raise PromptFileError(
            f"{self.description}: no JSON object among the first {_PEEK_ROWS} rows of each file, so its format"
            f" cannot be detected; they hold {counts}. First: {first_problem}"
        )

    def where(self, row: RawRow) -> str:
        """The place of a row as a person looks it up: file and line, or (Hub) split and row index."""
        if self.spec.hub is not None:
            return f"{self.spec.hub.repo_id}@{(self.commit or '')[:12]} split {self.split} row {row.index} ({row.file})"
        return f"{row.file}:{row.line}" if row.unit == "line" else f"{row.file} row {row.line}"


def _short(value: Any, limit: int = 120) -> str:
    text = str(value) if isinstance(value, Exception) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


def _any_in(wanted: Container[int], first: int, n: int) -> bool:
    """Whether any index of ``[first, first+n)`` is wanted; a set is tested by its members, not the range."""
    if isinstance(wanted, set | frozenset):
        return any(first <= i < first + n for i in wanted)
    return any(i in wanted for i in range(first, first + n))


def _local_files(path: Path) -> list[Path]:
    if path.is_file():
        file_kind(path)  # refuses unsupported types with the suffixes that are understood
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and is_data_file(p.name)
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise PromptFileError(f"{path}: the folder holds no data files (expected {', '.join(SUPPORTED_SUFFIXES)})")
        return files
    raise PromptFileError(f"prompt file not found: {path}")


def resolve_source(spec: SourceSpec) -> ResolvedSource:
    """The files of ``spec``: a local file or folder as it is now, or the Hub split at its current commit."""
    if spec.hub is not None:
        snap: HubSnapshot = resolve_hub_dataset(spec.hub)
        labels = tuple(f"{spec.hub.repo_id}/{p}" for p in snap.repo_paths)
        return ResolvedSource(spec, snap.files, labels, snap.commit, snap.config, spec.hub.split)
    assert spec.path is not None
    files = _local_files(spec.path)
    return ResolvedSource(spec, tuple(files), tuple(str(f) for f in files))


def cached_row_count(source: ResolvedSource, cache_dir: Path) -> int:
    """``count_rows`` remembered on disk by fingerprint: every step process loads the definitions, and a
    1M-line file should be counted once, not on every import."""
    key = source.fingerprint()
    path = cache_dir / f"rows-{key}.json"
    try:
        return int(json.loads(path.read_text())["rows"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    rows = source.count_rows()
    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"rows": rows, "source": source.description}))
    return rows
