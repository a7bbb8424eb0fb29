"""The dataset declarations: one YAML file names every prompt set, its source, format, regeneration mode,
token budget and shard size.

Configuration mistakes must surface before anything is spent, with the file and key named; a key
this module does not know is such a mistake (a misspelt ``regenerate:`` silently ignored would buy
the wrong data).
"""

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eagle_assets.datasets.file_readers import PromptFileError
from eagle_assets.datasets.formats import ALL_FIELDS, FORMATS
from eagle_assets.datasets.hub_rows import hub_row_count
from eagle_assets.datasets.regeneration import DEFAULT_MODE, MODES
from eagle_assets.datasets.samples import BUILDERS, write_samples
from eagle_assets.datasets.sampling import ORDERS, RowOrder, shard_count
from eagle_assets.datasets.sources import ResolvedSource, SourceSpec, cached_row_count, resolve_source
from eagle_assets.errors import ConfigError
from eagle_assets.layout import dataset_cache_dir, samples_dir
from eagle_assets.settings import current_settings

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "datasets.yaml"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
SAMPLE_COUNT = 48
DEFAULT_MAX_BAD_FRACTION = 0.05
SOURCE_KEYS = frozenset({"path", "revision", "config", "split", "data_files"})
SETTING_KEYS = frozenset(
    {
        "description",
        "output_token_budget",
        "shard_size",
        "format",
        "columns",
        "regenerate",
        "max_turns",
        "max_bad_fraction",
        "order",
        "seed",
    }
)
TOP_LEVEL_KEYS = frozenset({"defaults", "datasets"})

log = logging.getLogger(__name__)


class DatasetConfigError(ConfigError, ValueError):
    """The dataset configuration is invalid; the message names the file and the entry."""


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    path: Path | None  # a local file or folder; None for a Hub source (``source``)
    output_token_budget: int
    shard_size: int
    description: str = ""
    source: SourceSpec | None = None  # None: the local ``path``
    format: str | None = None  # None: detected from the columns
    columns: tuple[tuple[str, str], ...] = ()  # field → column renames
    regenerate: str = DEFAULT_MODE
    max_turns: int | None = None
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
    order: str = "shuffled"
    seed: int = 0
    _resolved: dict[str, ResolvedSource] = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def source_spec(self) -> SourceSpec:
        if self.source is not None:
            return self.source
        if self.path is None:
            raise DatasetConfigError(f"{self.name}: neither a path nor a Hub source")
        return SourceSpec(path=self.path)

    @property
    def source_label(self) -> str:
        return self.source_spec.label

    def resolve(self) -> ResolvedSource:
        """The source's files (a Hub split is fetched into the HF cache: only when a partition runs, never
        when the definitions load), kept for this process."""
        if "source" not in self._resolved:
            self._resolved["source"] = resolve_source(self.source_spec)
        return self._resolved["source"]

    def row_count(self) -> int:
        """Rows of the whole source, without downloading a Hub split: the definitions call this on every load
        (see :mod:`.hub_rows`); a local source is counted once per fingerprint."""
        spec = self.source_spec
        if spec.hub is not None:
            return hub_row_count(spec.hub, dataset_cache_dir()).total
        return cached_row_count(self.resolve(), dataset_cache_dir())

    def shard_keys(self) -> list[str]:
        """Partition keys for this dataset's shards (one placeholder shard when the source cannot be read now,
        a local file missing or the Hub unreachable with nothing cached: the code location still loads, and
        materializing the shard fails naming the source and the cause)."""
        try:
            rows = self.row_count()
        except PromptFileError as exc:
            log.warning("%s: %s (one placeholder shard until it can be read)", self.name, exc)
            rows = 0
        return [f"{i:04d}" for i in range(shard_count(rows, self.shard_size))]

    def row_order(self, rows: int) -> RowOrder:
        return RowOrder(rows, self.seed, shuffled=self.order == "shuffled")


def config_path() -> Path:
    return current_settings().datasets or DEFAULT_CONFIG


def _positive_int(value: Any, where: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise DatasetConfigError(f"{where} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise DatasetConfigError(f"{where} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return int(value)


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise DatasetConfigError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _optional_str(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
        raise DatasetConfigError(f"{where} must be a non-empty string, got {value!r}")
    return str(value)


def _unknown_keys(entry: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in entry if k not in allowed)
    if unknown:
        raise DatasetConfigError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            f" (known: {', '.join(sorted(allowed))})"
        )


def _source(entry: dict[str, Any], base: Path, name: str, where: str) -> tuple[Path | None, SourceSpec | None]:
    raw = entry["path"]
    if raw.startswith("sample:"):
        sample = raw.split(":", 1)[1]
        if sample not in BUILDERS:
            raise DatasetConfigError(f"{name}: unknown sample set {sample!r} (have {sorted(BUILDERS)})")
        write_samples(samples_dir(), count=SAMPLE_COUNT, names=[sample])
        return samples_dir() / f"{sample}.jsonl", None
    data_files = entry.get("data_files")
    if isinstance(data_files, str):
        data_files = [data_files]
    if data_files is not None and (not isinstance(data_files, list) or not all(isinstance(x, str) for x in data_files)):
        raise DatasetConfigError(f"{where}.data_files must be a glob or a list of globs, got {data_files!r}")
    try:
        spec = SourceSpec.parse(
            raw,
            base,
            revision=_optional_str(entry.get("revision"), f"{where}.revision"),
            config=_optional_str(entry.get("config"), f"{where}.config"),
            split=_optional_str(entry.get("split"), f"{where}.split"),
            data_files=data_files,
        )
    except PromptFileError as exc:
        raise DatasetConfigError(f"{where}: {exc}") from None
    return (spec.path, None) if spec.hub is None else (None, spec)


def _columns(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise DatasetConfigError(f"{where} must map field names to column names, e.g. {{prompt: question}}")
    unknown = sorted(set(value) - ALL_FIELDS)
    if unknown:
        raise DatasetConfigError(f"{where}: unknown field(s) {unknown}; fields are {sorted(ALL_FIELDS)}")
    return tuple(sorted(value.items()))


def _fraction(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise DatasetConfigError(f"{where} must be a number in [0, 1], got {value!r}")
    return float(value)


def load_datasets(path: Path | None = None) -> dict[str, DatasetSpec]:
    path = path or config_path()
    if not path.is_file():
        raise DatasetConfigError(f"dataset config not found: {path}")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise DatasetConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise DatasetConfigError(f"{path}: 'datasets' must map dataset names to entries")
    entries = doc.get("datasets")
    if not isinstance(entries, dict) or not entries:
        raise DatasetConfigError(f"{path}: 'datasets' must map dataset names to entries")
    _unknown_keys(doc, TOP_LEVEL_KEYS, str(path))
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise DatasetConfigError(f"{path}: 'defaults' must be a mapping")
    _unknown_keys(defaults, SETTING_KEYS, f"{path}: defaults")
    specs: dict[str, DatasetSpec] = {}
    for name, entry in entries.items():
        where = f"{path}: datasets.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise DatasetConfigError(f"{where}: name must match {NAME_RE.pattern}")
        entry = entry or {}
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise DatasetConfigError(f"{where}: needs a 'path' string (a file, a folder or hf:owner/name)")
        _unknown_keys(entry, SOURCE_KEYS | SETTING_KEYS, where)
        merged = {**defaults, **entry}
        local, hub = _source(entry, path.parent, name, where)
        fmt = merged.get("format")
        max_turns = merged.get("max_turns")
        specs[name] = DatasetSpec(
            name=name,
            path=local,
            source=hub,
            output_token_budget=_positive_int(
                merged.get("output_token_budget", 10_000_000), f"{where}.output_token_budget", allow_zero=True
            ),
            shard_size=_positive_int(merged.get("shard_size", 1000), f"{where}.shard_size"),
            description=str(merged.get("description", "")),
            format=None if fmt in (None, "auto") else _choice(fmt, FORMATS, f"{where}.format"),
            columns=_columns(merged.get("columns"), f"{where}.columns"),
            regenerate=_choice(merged.get("regenerate", DEFAULT_MODE), MODES, f"{where}.regenerate"),
            max_turns=None if max_turns is None else _positive_int(max_turns, f"{where}.max_turns"),
            max_bad_fraction=_fraction(
                merged.get("max_bad_fraction", DEFAULT_MAX_BAD_FRACTION), f"{where}.max_bad_fraction"
            ),
            order=_choice(merged.get("order", "shuffled"), ORDERS, f"{where}.order"),
            seed=_positive_int(merged.get("seed", 0), f"{where}.seed", allow_zero=True),
        )
    return specs
