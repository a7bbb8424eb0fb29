"""Hugging Face Hub datasets as prompt sources: ``hf:owner/name`` with a revision, a config and a split.

The files are fetched by ``huggingface_hub`` itself (``snapshot_download``), so they land in its usual
cache, a second run downloads nothing, and ``HF_HUB_OFFLINE=1`` reads the cached snapshot. What the
resolution returns is pinned: the commit the revision pointed to (recorded in the asset metadata),
and the exact files of that commit that make up the split, in order.

Which files make up a split follows the Hub's own conventions, in this order:

1. ``data_files`` given in ``datasets.yaml`` (globs in the repo, fnmatch-style: ``*`` crosses ``/``);
2. the ``configs:`` block of the dataset card (``README.md`` front matter), as the Hub's "manual
   configuration" defines it: ``config_name``, ``data_files`` as a glob, a list of globs (the train
   split) or a list of ``{split, path}``; the default config is the one marked ``default: true``, else
   the one named ``default``, else the only one;
3. otherwise file names: the split's name delimited by non-word characters (``train.jsonl``,
   ``data/train-00000-of-00003.parquet``) or a folder of that name (``{config}/{split}/0000.parquet``,
   the layout of the Hub's Parquet conversion, revision ``refs/convert/parquet``); a repo whose files
   name no split is all ``train``.

The selection (:func:`select_paths`, :meth:`SplitPatterns.select`) is the same on a downloaded snapshot and on
the Hub's file listing that :mod:`.hub_rows` counts, so the shard keys are those of the files a partition
downloads. Data files are those :mod:`.file_readers` reads; loading scripts and CSV/TXT are not followed.
"""

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle_assets.datasets.file_readers import SUPPORTED_SUFFIXES, PromptFileError, is_data_file

HUB_PREFIX = "hf:"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT_DELIMITED = "[-._ 0-9]*"  # the Hub's "non-word characters" around a split name in a file name
DATA_FILE_PATTERNS = tuple(f"*{s}" for s in SUPPORTED_SUFFIXES)


class HubSourceError(PromptFileError):
    """A Hub dataset could not be resolved to data files (missing repo, revision, config or split)."""


@dataclass(frozen=True)
class HubDatasetRef:
    """What ``datasets.yaml`` names: the repo, and optionally which revision, config, split and files."""

    repo_id: str
    revision: str | None = None
    config: str | None = None
    split: str = "train"
    data_files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _REPO_ID.match(self.repo_id):
            raise HubSourceError(f"{self.repo_id!r} is not a Hub dataset id (expected hf:owner/name)")

    @staticmethod
    def parse(text: str, **kw: Any) -> "HubDatasetRef":
        """``hf:owner/name`` (``@revision`` may be appended instead of a ``revision`` key)."""
        if not text.startswith(HUB_PREFIX):
            raise HubSourceError(f"{text!r} does not name a Hub dataset (expected hf:owner/name)")
        repo, _, rev = text[len(HUB_PREFIX) :].partition("@")
        if rev and kw.get("revision") and kw["revision"] != rev:
            raise HubSourceError(f"{text!r}: revision given twice ({rev!r} and {kw['revision']!r})")
        return HubDatasetRef(repo, revision=kw.pop("revision", None) or rev or None, **kw)

    @property
    def label(self) -> str:
        return f"hf:{self.repo_id}"


@dataclass(frozen=True)
class HubSnapshot:
    """A resolved Hub source: the commit, and the cached files of the split in repo order."""

    ref: HubDatasetRef
    commit: str
    config: str | None
    files: tuple[Path, ...]
    repo_paths: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.ref.repo_id}@{self.commit[:12]}"


def is_hub_spec(text: str) -> bool:
    return text.startswith(HUB_PREFIX)


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_endpoint() -> str | None:
    """``HF_ENDPOINT`` read now (``huggingface_hub`` reads it at import), so a test's loopback Hub is used."""
    return os.environ.get("HF_ENDPOINT") or None


def hf_cache_dir() -> str | None:
    """The hub cache as ``huggingface_hub`` would pick it, but read now: its own constants are fixed at import."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _download(ref: HubDatasetRef, revision: str, patterns: list[str]) -> Path:
    """``snapshot_download`` of the matching files; endpoint, cache and offline mode are read now, not at import."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            ref.repo_id,
            repo_type="dataset",
            revision=revision,
            allow_patterns=patterns,
            endpoint=hub_endpoint(),
            cache_dir=hf_cache_dir(),
            local_files_only=hub_offline(),
        )
    except LocalEntryNotFoundError as exc:
        raise HubSourceError(
            f"{ref.label}@{revision}: not in the local Hugging Face cache and the Hub cannot be reached"
            f"{' (HF_HUB_OFFLINE is set)' if hub_offline() else ''}: fetch it once online. ({exc})"
        ) from exc
    except HfHubHTTPError as exc:
        raise HubSourceError(f"{ref.label}@{revision}: the Hub refused it ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:
        if type(exc).__name__ in {"RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError"}:
            raise HubSourceError(f"{ref.label}@{revision}: {type(exc).__name__}: {exc}") from exc
        raise
    return Path(folder)


def _front_matter(readme: Path) -> dict[str, Any]:
    try:
        text = readme.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        doc = yaml.safe_load(text[3:end]) or {}
    except yaml.YAMLError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def card_split_patterns(card: dict[str, Any], config: str | None, split: str, where: str) -> tuple[str, list[str]]:
    """(config name, globs of ``split``) from a dataset card's ``configs:`` block; raises naming the choices."""
    configs = [c for c in card.get("configs") or [] if isinstance(c, dict) and c.get("config_name")]
    names = [str(c["config_name"]) for c in configs]
    if config is None:
        chosen = next((c for c in configs if c.get("default") is True), None)
        chosen = chosen or next((c for c in configs if c["config_name"] == "default"), None)
        if chosen is None and len(configs) == 1:
            chosen = configs[0]
        if chosen is None:
            raise HubSourceError(f"{where}: several configs and none is the default; set `config:` to one of {names}")
    else:
        chosen = next((c for c in configs if str(c["config_name"]) == config), None)
        if chosen is None:
            raise HubSourceError(f"{where}: no config {config!r}; the dataset card lists {names}")
    data_dir = str(chosen.get("data_dir") or "").strip("/")
    files = chosen.get("data_files")
    splits: dict[str, list[str]] = {}
    if isinstance(files, str) or (isinstance(files, list) and all(isinstance(f, str) for f in files)):
        splits["train"] = _as_list(files)
    elif isinstance(files, list):
        for entry in files:
            if isinstance(entry, dict) and entry.get("split"):
                splits[str(entry["split"])] = _as_list(entry.get("path"))
    elif isinstance(files, dict):
        splits = {str(k): _as_list(v) for k, v in files.items()}
    if not splits and data_dir:
        return str(chosen["config_name"]), _filename_patterns(split, data_dir)
    if split not in splits:
        raise HubSourceError(
            f"{where}: config {chosen['config_name']!r} has no split {split!r}; it has {sorted(splits)}"
        )
    globs = [f"{data_dir}/{p}" if data_dir else p for p in splits[split]]
    return str(chosen["config_name"]), globs


def _filename_patterns(split: str, prefix: str | None) -> list[str]:
    base = f"{prefix.strip('/')}/" if prefix else ""
    return [
        f"{base}{split}{_SPLIT_DELIMITED}",
        f"{base}*/{split}{_SPLIT_DELIMITED}",
        f"{base}*[-._ 0-9]{split}{_SPLIT_DELIMITED}",
        f"{base}{split}/*",
        f"{base}*/{split}/*",
    ]


def select_paths(paths: list[str], patterns: list[str]) -> list[str]:
    """The data files among ``paths`` (repo paths) that match ``patterns``, sorted: the one rule for which files
    make up a split, used both on a downloaded snapshot and on the Hub's file listing. Sorted by path parts (as
    ``Path`` objects sort), so row indices do not depend on where the list came from."""
    picked = [p for p in paths if is_data_file(p) and any(fnmatch.fnmatch(p, pat) for pat in patterns)]
    return sorted(picked, key=lambda p: p.split("/"))


def _matching(folder: Path, patterns: list[str]) -> list[tuple[str, Path]]:
    if not folder.is_dir():
        return []
    rels = [path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()]
    return [(rel, folder / rel) for rel in select_paths(rels, patterns)]


@dataclass(frozen=True)
class SplitPatterns:
    """What a split is made of before any data file is fetched: the commit the revision points to, the config,
    and the globs its files match (from ``data_files``, the dataset card, or the file-name conventions)."""

    ref: HubDatasetRef
    commit: str
    config: str | None
    patterns: tuple[str, ...]

    @property
    def train_fallback(self) -> bool:
        """Whether a split naming no file is all the repo's data files (the Hub's rule for ``train``)."""
        return not self.ref.data_files and self.ref.split == "train" and self.ref.config is None

    def missing(self, patterns: list[str] | tuple[str, ...]) -> HubSourceError:
        revision = self.ref.revision or "main"
        return HubSourceError(
            f"{self.ref.label}@{revision} (commit {self.commit}): no data files for split {self.ref.split!r}"
            f"{f' of config {self.config!r}' if self.config else ''} (looked for {list(patterns)}; supported"
            f" files end in {', '.join(SUPPORTED_SUFFIXES)})"
        )

    def select(self, repo_paths: list[str]) -> list[str]:
        """The split's files among all the files of the commit; raises naming the globs when there are none."""
        found = select_paths(repo_paths, list(self.patterns))
        if not found and self.train_fallback:
            found = select_paths(repo_paths, list(DATA_FILE_PATTERNS))
        if not found:
            raise self.missing(self.patterns)
        return found


def split_patterns(ref: HubDatasetRef) -> SplitPatterns:
    """Pin the revision to a commit and work out the split's globs; fetches the dataset card only (offline: the
    cached one)."""
    revision = ref.revision or "main"
    where = f"{ref.label}@{revision}"
    card_folder = _download(ref, revision, ["README.md"])
    commit = card_folder.name  # snapshots/<commit>: what the revision pointed to now
    # A repo without a card leaves no snapshot folder, and huggingface_hub offline pins a branch only to a commit
    # whose folder exists: without it, the shard keys of a card-less Parquet split would need the Hub every load.
    card_folder.mkdir(parents=True, exist_ok=True)
    config = ref.config
    if ref.data_files:
        patterns = list(ref.data_files)
    else:
        card = _front_matter(card_folder / "README.md")
        if card.get("configs"):
            config, patterns = card_split_patterns(card, ref.config, ref.split, where)
        else:
            patterns = _filename_patterns(ref.split, ref.config)
    return SplitPatterns(ref, commit, config, tuple(patterns))


def resolve_hub_dataset(ref: HubDatasetRef) -> HubSnapshot:
    """Fetch (or find in the cache) the files of ``ref``'s split and pin the commit they came from."""
    split = split_patterns(ref)
    commit, config, patterns = split.commit, split.config, list(split.patterns)
    folder = _download(ref, commit, patterns)
    found = _matching(folder, patterns)
    if not found and split.train_fallback:
        # The Hub's rule: files that name no split are all the train split.
        patterns = list(DATA_FILE_PATTERNS)
        folder = _download(ref, commit, patterns)
        found = _matching(folder, patterns)
    if not found:
        raise split.missing(patterns)
    return HubSnapshot(ref, commit, config, tuple(p for _, p in found), tuple(r for r, _ in found))
