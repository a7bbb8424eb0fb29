"""The dataset declarations: one YAML file names every prompt set, its token budget and shard size.

Configuration mistakes must surface before anything is spent, with the file and key named.
"""

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle_assets import settings
from eagle_assets.datasets.prompts import count_rows
from eagle_assets.datasets.samples import BUILDERS, write_samples

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "datasets.yaml"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
SAMPLE_COUNT = 48


class DatasetConfigError(ValueError):
    """The dataset configuration is invalid; the message names the file and the entry."""


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    path: Path
    output_token_budget: int
    shard_size: int
    description: str = ""

    def shard_keys(self) -> list[str]:
        """Partition keys for this dataset's shards (one placeholder shard if the file is missing)."""
        rows = count_rows(self.path) if self.path.is_file() else 0
        return [f"{i:04d}" for i in range(max(1, math.ceil(rows / self.shard_size)))]

    def shard_range(self, shard_key: str) -> tuple[int, int]:
        i = int(shard_key)
        return i * self.shard_size, (i + 1) * self.shard_size


def config_path() -> Path:
    return Path(os.environ.get("EAGLE_FORGE_DATASETS") or DEFAULT_CONFIG)


def _positive_int(value: Any, where: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise DatasetConfigError(f"{where} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise DatasetConfigError(f"{where} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return int(value)


def _resolve_path(raw: str, base: Path, name: str) -> Path:
    if raw.startswith("sample:"):
        sample = raw.split(":", 1)[1]
        if sample not in BUILDERS:
            raise DatasetConfigError(f"{name}: unknown sample set {sample!r} (have {sorted(BUILDERS)})")
        write_samples(settings.samples_dir(), count=SAMPLE_COUNT, names=[sample])
        return settings.samples_dir() / f"{sample}.jsonl"
    p = Path(raw).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def load_datasets(path: Path | None = None) -> dict[str, DatasetSpec]:
    path = path or config_path()
    if not path.is_file():
        raise DatasetConfigError(f"dataset config not found: {path}")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise DatasetConfigError(f"{path}: not valid YAML: {exc}") from None
    defaults = doc.get("defaults") or {}
    entries = doc.get("datasets")
    if not isinstance(entries, dict) or not entries:
        raise DatasetConfigError(f"{path}: 'datasets' must map dataset names to entries")
    specs: dict[str, DatasetSpec] = {}
    for name, entry in entries.items():
        where = f"{path}: datasets.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise DatasetConfigError(f"{where}: name must match {NAME_RE.pattern}")
        entry = entry or {}
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise DatasetConfigError(f"{where}: needs a 'path' string")
        merged = {**defaults, **entry}
        specs[name] = DatasetSpec(
            name=name,
            path=_resolve_path(entry["path"], path.parent, name),
            output_token_budget=_positive_int(
                merged.get("output_token_budget", 10_000_000), f"{where}.output_token_budget", allow_zero=True
            ),
            shard_size=_positive_int(merged.get("shard_size", 1000), f"{where}.shard_size"),
            description=str(merged.get("description", "")),
        )
    return specs


def get_dataset(name: str, specs: dict[str, DatasetSpec] | None = None) -> DatasetSpec:
    specs = specs if specs is not None else load_datasets()
    if name not in specs:
        raise DatasetConfigError(f"unknown dataset {name!r}; configured: {', '.join(specs)}")
    return specs[name]
