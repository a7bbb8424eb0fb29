"""Sharded safetensors store of target features, one store shard per corpus shard.

Layout of a store directory::

    index.json                       store metadata + one entry per completed shard
    shard-00000.safetensors          all features of corpus shard 0 (HF backend: one pass)
    shard-00001-aux.safetensors      or one file per feature group when features come from
    shard-00001-last.safetensors     separate passes (SGLang backend: one engine per feature)

Each shard file packs its samples back to back (no padding): ``aux`` [T, n_aux*H] (low | mid |
high, in layer order), ``last`` [T, H], ``input_ids`` [T] int32, ``loss_mask`` [T] uint8 and
``sample_offsets`` [n+1] int64, where T is the shard's token count. The safetensors header also
carries the shard's sample ids and an input fingerprint, so a file can be checked on its own.

Why this shape:

- **Streaming writes.** Every sample's length is known before its features are computed, so the
  header (and therefore every row's byte offset) is written first and features are ``pwrite``-n to
  their place as batches finish, in any order (the backends sort by length). A shard never has to
  fit in RAM: at 56 KiB/token (Kimi K2.5) a 2,000-sample shard is ~200 GB.
- **Atomic, resumable.** A shard is written to ``<name>.tmp-<host>-<pid>``, fsync-ed, renamed,
  and only then recorded in ``index.json`` (itself replaced atomically, under a file lock and a lease
  in the ledger's database, so that several extraction processes, on several hosts, can share one
  store). On rerun, a shard whose file is structurally complete (header parses, size matches,
  metadata and input fingerprint match the current corpus shard) is skipped, even if the crash
  came between rename and index update; anything else is deleted and recomputed. Stale
  temporaries of dead processes are removed.
- **The last hidden state is the final norm's output** (``last_kind="post_norm"``): HF's
  ``output_hidden_states[-1]``, SGLang's ``return_hidden_states`` output and SpecForge's
  ``last_hidden_states`` are all this tensor, so the target's logits are ``lm_head(last)`` — see
  ``TargetHead`` (``draft/target.py``), whose test reproduces the model's logits from the store. ``"pre_norm"`` (the
  last decoder layer's raw output, logits = ``lm_head(norm(last))``) is available from the HF backend
  for trainers that want to apply the norm themselves.
- Default dtype bf16 (what the target computes in; (3 + 1) × H × 2 bytes per token); fp32 for tests.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_assets.durable_files import atomic_write_bytes as durable_atomic_write_bytes
from eagle_assets.durable_files import durable_replace, host_tag, pid_alive
from eagle_assets.errors import TargetError
from eagle_assets.generation.database_lease import DatabaseLease
from eagle_assets.generation.folder_lease import exclusive
from eagle_assets.hidden_states.layers import AuxLayers

FORMAT = "eagle-forge-hidden-states"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"
LOCK_NAME = ".index.lock"
# An index update takes milliseconds: a writer that waits this long for another has met a stuck one.
INDEX_LEASE_WAIT_S = 600.0
FEATURES = ("aux", "last")
LAST_KINDS = ("post_norm", "pre_norm")
GiB = 1024**3

_ST_DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.uint8: "U8",
}
_DTYPE_NAMES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class StoreError(TargetError, RuntimeError):
    """The store on disk cannot be used as asked."""


class StoreMismatchError(StoreError):
    """An existing store was written with other settings (model, layers, dtype...)."""


class InsufficientDiskError(StoreError, OSError):
    """The disk cannot hold the features that are about to be written."""


def dtype_name(dtype: torch.dtype) -> str:
    for name, dt in _DTYPE_NAMES.items():
        if dt == dtype:
            return name
    raise ValueError(f"unsupported feature dtype {dtype} (use bfloat16, float16 or float32)")


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPE_NAMES[name]
    except KeyError as exc:
        raise ValueError(f"unsupported feature dtype {name!r}") from exc


# ----------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class HiddenStateSample:
    """One training row as the extractor sees it: exact target token ids and the assistant mask."""

    sample_id: str
    input_ids: Sequence[int]
    loss_mask: Sequence[int]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"sample {self.sample_id}: {len(self.input_ids)} input ids but {len(self.loss_mask)} mask entries"
            )
        if len(self.input_ids) == 0:
            raise ValueError(f"sample {self.sample_id} has no tokens")

    def __len__(self) -> int:
        return len(self.input_ids)


def as_sample(obj: HiddenStateSample | Mapping[str, Any]) -> HiddenStateSample:
    """Accept rows from the tokenization stage (``sample_id``/``id``, ``input_ids``, ``loss_mask``)."""
    if isinstance(obj, HiddenStateSample):
        return obj
    sid = obj.get("sample_id", obj.get("id"))
    if sid is None:
        raise ValueError("a sample needs a 'sample_id' (or 'id')")
    ids = obj["input_ids"]
    mask = obj["loss_mask"]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    mask = mask.tolist() if hasattr(mask, "tolist") else list(mask)
    return HiddenStateSample(str(sid), ids, mask)


def input_fingerprint(samples: Sequence[HiddenStateSample]) -> str:
    """Identifies a corpus shard's exact inputs, so a stale shard (corpus changed) is recomputed."""
    h = hashlib.blake2b(digest_size=16)
    for s in samples:
        h.update(s.sample_id.encode())
        h.update(b"\0")
        h.update(np.asarray(s.input_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(s.loss_mask, dtype=np.uint8).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Sizes and disk


def estimate_store_bytes(
    n_tokens: int, hidden: int, n_aux: int = 3, with_last: bool = True, dtype_bytes: int = 2
) -> int:
    """Bytes the shard files will take for ``n_tokens`` tokens.

    Exact for the tensor data of this format: features ``(n_aux + with_last) * hidden * dtype_bytes``
    per token, plus 5 bytes per token for ``input_ids`` (int32) and ``loss_mask`` (uint8). Not
    included: 8 bytes per sample for offsets and a header of a few KiB per shard file.
    Kimi K2.5 (H = 7168, bf16): 57,349 B/token, about 3.44 TB (3.13 TiB) for 60M tokens.
    """
    per_token = (n_aux + int(with_last)) * hidden * dtype_bytes + 4 + 1
    return int(n_tokens) * per_token


def _existing_ancestor(path: Path) -> Path:
    p = path.expanduser().absolute()
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def check_disk(path: str | Path, bytes_needed: int, *, reserve_bytes: int = 0) -> int:
    """Raise ``InsufficientDiskError`` unless the filesystem holding ``path`` has room; return free bytes.

    ``reserve_bytes`` is headroom that must stay free after the write (logs, checkpoints, other
    jobs sharing the disk). The path need not exist yet: its nearest existing ancestor is measured.
    """
    where = _existing_ancestor(Path(path))
    free = shutil.disk_usage(where).free
    if bytes_needed + reserve_bytes > free:
        raise InsufficientDiskError(
            f"not enough disk for hidden states at {path}: need {bytes_needed / GiB:.2f} GiB"
            + (f" + {reserve_bytes / GiB:.2f} GiB reserve" if reserve_bytes else "")
            + f", only {free / GiB:.2f} GiB free on the filesystem of {where}. "
            "Free space, point the store elsewhere, shrink the corpus, or use online features."
        )
    return free


# ----------------------------------------------------------------------------------------------
# Small filesystem helpers


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temporaries carry host and pid so that crash leftovers of dead processes can be swept."""
    durable_atomic_write_bytes(path, data, f"{path.name}.tmp-{host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete ``*.tmp-<host>-<pid>-*`` files left by dead processes of this host (crash leftovers)."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    host = host_tag()
    for p in directory.iterdir():
        name = p.name
        if ".tmp-" not in name or not p.is_file():
            continue
        parts = name.rsplit(".tmp-", 1)[1].split("-")
        if len(parts) < 2 or parts[0] != host or not parts[1].isdigit():
            continue  # another host's (shared filesystem) or not ours: leave it alone
        if int(parts[1]) == os.getpid() or pid_alive(int(parts[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed


# ----------------------------------------------------------------------------------------------
# Store metadata


@dataclass(frozen=True)
class StoreMeta:
    """Store-wide settings; every shard of a store shares them, and a rerun must ask for the same."""

    model_id: str
    hidden_size: int
    layers: AuxLayers
    dtype: torch.dtype = torch.bfloat16
    features: tuple[str, ...] = FEATURES
    last_kind: str = "post_norm"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        dtype_name(self.dtype)
        if "aux" not in self.features or any(f not in FEATURES for f in self.features):
            raise ValueError(f"features must include 'aux' and be among {FEATURES}, got {self.features}")
        if self.last_kind not in LAST_KINDS:
            raise ValueError(f"last_kind must be one of {LAST_KINDS}")

    @property
    def with_last(self) -> bool:
        return "last" in self.features

    def width(self, feature: str) -> int:
        return self.layers.n_aux * self.hidden_size if feature == "aux" else self.hidden_size

    def identity(self) -> dict[str, Any]:
        """The fields that must match for two runs to write into the same store."""
        return {
            "model_id": self.model_id,
            "hidden_size": self.hidden_size,
            "dtype": dtype_name(self.dtype),
            "features": list(self.features),
            "last_kind": self.last_kind,
            "layers": self.layers.to_dict(),
        }

    def to_index(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            **self.identity(),
            "n_aux": self.layers.n_aux,
            "with_last": self.with_last,
            "tensors": {
                "aux": f"[tokens, {self.width('aux')}] {dtype_name(self.dtype)}: "
                f"HF hidden_states{list(self.layers.hf_indices)} concatenated low|mid|high",
                "last": f"[tokens, {self.hidden_size}] {dtype_name(self.dtype)}: "
                + (
                    "final norm output (HF hidden_states[-1]); logits = lm_head(last)"
                    if self.last_kind == "post_norm"
                    else "last decoder layer output before the final norm; logits = lm_head(norm(last))"
                ),
                "input_ids": "[tokens] int32",
                "loss_mask": "[tokens] uint8 (1 = assistant token, trained on)",
                "sample_offsets": "[n_samples + 1] int64 token offsets of the samples inside the shard file",
            },
            "extra": dict(self.extra),
        }

    @classmethod
    def from_index(cls, d: Mapping[str, Any]) -> StoreMeta:
        if d.get("format") != FORMAT:
            raise StoreError(f"not an eagle-forge hidden-state store (format={d.get('format')!r})")
        if int(d.get("version", 0)) > FORMAT_VERSION:
            raise StoreError(f"store format version {d.get('version')} is newer than this code ({FORMAT_VERSION})")
        return cls(
            model_id=d["model_id"],
            hidden_size=int(d["hidden_size"]),
            layers=AuxLayers.from_dict(d["layers"]),
            dtype=dtype_from_name(d["dtype"]),
            features=tuple(d["features"]),
            last_kind=d.get("last_kind", "post_norm"),
            extra=d.get("extra", {}),
        )


def shard_file_name(index: int, group: Sequence[str], all_features: Sequence[str]) -> str:
    if tuple(group) == tuple(all_features):
        return f"shard-{index:05d}.safetensors"
    return f"shard-{index:05d}-{'-'.join(group)}.safetensors"


# ----------------------------------------------------------------------------------------------
# One shard file: layout, streaming writer, structural check


@dataclass(frozen=True)
class _TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


class ShardLayout:
    """Byte layout of a shard file, computable before any feature exists."""

    def __init__(self, meta: StoreMeta, group: Sequence[str], lengths: Sequence[int], metadata: Mapping[str, str]):
        self.group = tuple(group)
        self.lengths = [int(n) for n in lengths]
        self.n_tokens = sum(self.lengths)
        offsets = [0]
        for n in self.lengths:
            offsets.append(offsets[-1] + n)
        self.sample_offsets = offsets
        t = self.n_tokens
        # Widest element first keeps every tensor naturally aligned in the data buffer.
        specs = [
            _TensorSpec("sample_offsets", torch.int64, (len(self.lengths) + 1,)),
            _TensorSpec("input_ids", torch.int32, (t,)),
        ]
        specs += [_TensorSpec(f, meta.dtype, (t, meta.width(f))) for f in self.group]
        specs.append(_TensorSpec("loss_mask", torch.uint8, (t,)))
        self.specs = {s.name: s for s in specs}
        header: dict[str, Any] = {"__metadata__": dict(metadata)}
        pos = 0
        self.data_offsets: dict[str, int] = {}
        for s in specs:
            header[s.name] = {
                "dtype": _ST_DTYPES[s.dtype],
                "shape": list(s.shape),
                "data_offsets": [pos, pos + s.nbytes],
            }
            self.data_offsets[s.name] = pos
            pos += s.nbytes
        self.data_bytes = pos
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.header = struct.pack("<Q", len(raw)) + raw
        self.file_bytes = len(self.header) + self.data_bytes

    def row_offset(self, feature: str, token: int) -> int:
        spec = self.specs[feature]
        row_bytes = spec.nbytes // max(spec.shape[0], 1)
        return len(self.header) + self.data_offsets[feature] + token * row_bytes


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8).numpy().data.cast("B") if t.numel() else memoryview(b"")  # .data: its buffer


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


class ShardWriter:
    """Streams one shard file into place: header first, feature rows as they arrive, then rename."""

    def __init__(
        self,
        directory: Path,
        file_name: str,
        meta: StoreMeta,
        group: Sequence[str],
        samples: Sequence[HiddenStateSample],
        metadata: Mapping[str, str],
    ):
        self.meta = meta
        self.final = directory / file_name
        self.tmp = directory / f"{file_name}.tmp-{host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.layout = ShardLayout(meta, group, [len(s) for s in samples], metadata)
        self._pending = {f: set(range(len(samples))) for f in self.layout.group}
        self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._reserve(self.layout.file_bytes)
            _pwrite_all(self._fd, memoryview(self.layout.header), 0)
            base = len(self.layout.header)
            ids = torch.tensor([i for s in samples for i in s.input_ids], dtype=torch.int64)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > 2**31 - 1):
                raise ValueError("token ids must fit in int32")
            mask = torch.tensor([int(m) for s in samples for m in s.loss_mask], dtype=torch.uint8)
            for name, tensor in (
                ("sample_offsets", torch.tensor(self.layout.sample_offsets, dtype=torch.int64)),
                ("input_ids", ids.to(torch.int32)),
                ("loss_mask", mask),
            ):
                _pwrite_all(self._fd, _tensor_bytes(tensor), base + self.layout.data_offsets[name])
        except BaseException:
            self.abort()
            raise

    def _reserve(self, nbytes: int) -> None:
        # Reserving the whole file up front turns "disk full" into an immediate, clear error instead
        # of a failure hours into the shard.
        try:
            os.posix_fallocate(self._fd, 0, nbytes)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self.abort()
                free = shutil.disk_usage(self.final.parent).free
                raise InsufficientDiskError(
                    f"not enough disk for shard {self.final.name}: need {nbytes / GiB:.2f} GiB, "
                    f"{free / GiB:.2f} GiB free"
                ) from exc
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(self._fd, nbytes)  # filesystems without fallocate support

    def write(self, index: int, features: Mapping[str, torch.Tensor]) -> None:
        """Write sample ``index``'s rows; ``features`` maps each feature of the group to [len, width]."""
        length = self.layout.lengths[index]
        start = self.layout.sample_offsets[index]
        for name in self.layout.group:
            t = features[name]
            width = self.meta.width(name)
            if tuple(t.shape) != (length, width):
                raise ValueError(f"{name} of sample {index}: shape {tuple(t.shape)}, expected {(length, width)}")
            _pwrite_all(self._fd, _tensor_bytes(t.to(self.meta.dtype)), self.layout.row_offset(name, start))
            self._pending[name].discard(index)

    @property
    def missing(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def commit(self) -> int:
        """fsync + rename into place; returns the file size."""
        if self.missing:
            raise StoreError(f"{self.final.name}: {self.missing} sample feature blocks were never written")
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        durable_replace(self.tmp, self.final)
        return self.layout.file_bytes

    def abort(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


def read_shard_header(path: Path) -> dict[str, Any] | None:
    """The parsed header if ``path`` is a structurally complete safetensors file, else ``None``.

    Complete = the 8-byte length and JSON header parse, the tensors tile the data buffer exactly and
    the file is exactly as long as the header says (a truncated or partially copied file is not).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 * 1024 * 1024):
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    ends = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            return None
        ends.append((begin, end))
    ends.sort()
    pos = 0
    for begin, end in ends:
        if begin != pos or end < begin:
            return None
        pos = end
    if size != 8 + n + pos:
        return None
    return header


# ----------------------------------------------------------------------------------------------
# Writer side of a store


class StoreWriter:
    """Owns ``index.json`` for writers: checks settings, decides what is done, records commits."""

    def __init__(
        self,
        directory: str | Path,
        meta: StoreMeta,
        *,
        lease_location: str | Path | None = None,
        lease_wait_s: float = INDEX_LEASE_WAIT_S,
    ):
        self.directory = Path(directory).expanduser().absolute()
        self.meta = meta
        self.lease_location = lease_location  # the ledger holding the index's lease; None: the configured one
        self.lease_wait_s = lease_wait_s
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.directory)
        with self._index_writer() as lease:
            index = self._read_index()
            if index is None:
                lease.check()
                atomic_write_bytes(self.directory / INDEX_NAME, _dump({**meta.to_index(), "shards": {}}))
            else:
                self._check_identity(index)

    def _index_writer(self) -> contextlib.AbstractContextManager[DatabaseLease]:
        """``index.json`` is read, changed and replaced whole: one writer at a time, on every host (its ``flock``
        and its lease in the ledger's database, which GPU workers on other hosts wait for)."""
        what = f"the hidden-state store index {self.directory / INDEX_NAME}"
        return exclusive(self.directory, LOCK_NAME, what=what, location=self.lease_location, wait_s=self.lease_wait_s)

    def _read_index(self) -> dict[str, Any] | None:
        p = self.directory / INDEX_NAME
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise StoreError(f"{p} is not valid JSON ({exc}); it is only ever replaced atomically") from exc

    def _check_identity(self, index: Mapping[str, Any]) -> None:
        existing = StoreMeta.from_index(index).identity()
        wanted = self.meta.identity()
        if existing != wanted:
            diff = {k: (existing.get(k), wanted.get(k)) for k in wanted if existing.get(k) != wanted.get(k)}
            raise StoreMismatchError(
                f"{self.directory} holds features written with other settings {diff} (existing, requested); "
                "use another directory or delete this store"
            )

    def shard_metadata(self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]) -> dict:
        return {
            "format": f"{FORMAT}/{FORMAT_VERSION}",
            "shard_index": str(index),
            "shard_key": key,
            "features": json.dumps(list(group)),
            "identity": json.dumps(self.meta.identity(), sort_keys=True),
            "input_fingerprint": input_fingerprint(samples),
            "sample_ids": json.dumps([s.sample_id for s in samples]),
        }

    def is_complete(self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]) -> bool:
        """True when the group's file for this shard is whole and was made from exactly these inputs."""
        path = self.directory / shard_file_name(index, group, self.meta.features)
        header = read_shard_header(path)
        if header is None:
            return False
        md = header.get("__metadata__", {})
        want = self.shard_metadata(index, key, group, samples)
        if any(md.get(k) != want[k] for k in ("format", "features", "identity", "input_fingerprint")):
            return False
        shapes_ok = all(
            name in header and header[name]["shape"] == [sum(len(s) for s in samples), self.meta.width(name)]
            for name in group
        )
        return shapes_ok

    def discard(self, index: int, group: Sequence[str], *, listed: bool = True) -> None:
        """Remove an incomplete or stale file (and its index entry, if ``listed``) before recomputing it."""
        name = shard_file_name(index, group, self.meta.features)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / name).unlink()
        if not listed:
            return
        with self._index_writer() as lease:
            index_doc = self._read_index() or {**self.meta.to_index(), "shards": {}}
            entry = index_doc["shards"].get(f"shard-{index:05d}")
            if entry and name in entry.get("files", {}):
                del entry["files"][name]
                lease.check()
                atomic_write_bytes(self.directory / INDEX_NAME, _dump(index_doc))

    def open_shard(
        self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]
    ) -> ShardWriter:
        return ShardWriter(
            self.directory,
            shard_file_name(index, group, self.meta.features),
            self.meta,
            group,
            samples,
            self.shard_metadata(index, key, group, samples),
        )

    def record(self, index: int, key: str, group: Sequence[str], samples: Sequence[HiddenStateSample]) -> None:
        """Enter a committed (or recovered) file in ``index.json``; idempotent."""
        name = shard_file_name(index, group, self.meta.features)
        size = (self.directory / name).stat().st_size
        lengths = [len(s) for s in samples]
        offsets = [0]
        for n in lengths[:-1]:
            offsets.append(offsets[-1] + n)
        with self._index_writer() as lease:
            doc = self._read_index() or {**self.meta.to_index(), "shards": {}}
            self._check_identity(doc)
            sid = f"shard-{index:05d}"
            fp = input_fingerprint(samples)
            entry = doc["shards"].get(sid)
            if entry is None or entry.get("input_fingerprint") != fp:
                entry = {
                    "index": index,
                    "key": key,
                    "input_fingerprint": fp,
                    "n_samples": len(samples),
                    "n_tokens": sum(lengths),
                    "sample_ids": [s.sample_id for s in samples],
                    "offsets": offsets,
                    "lengths": lengths,
                    "files": {},
                }
            entry["files"][name] = {"features": list(group), "bytes": size}
            entry["complete"] = sorted(f for fi in entry["files"].values() for f in fi["features"]) == sorted(
                self.meta.features
            )
            doc["shards"][sid] = entry
            doc["shards"] = dict(sorted(doc["shards"].items()))
            lease.check()
            atomic_write_bytes(self.directory / INDEX_NAME, _dump(doc))


def _dump(doc: Mapping[str, Any]) -> bytes:
    """Readable store metadata, one line per shard: the index is rewritten after every shard, and
    an indented per-sample list would triple its size (~40 bytes per sample this way)."""
    head = {k: v for k, v in doc.items() if k != "shards"}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # reopen the object: drop "\n}"
    shards = doc.get("shards", {})
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))}" for k, v in shards.items()]
    body = ",\n".join(lines)
    return (text + ',\n "shards": {' + ("\n" + body + "\n " if lines else "") + "}\n}\n").encode()


# ----------------------------------------------------------------------------------------------
# Reader


class HiddenStateStore:
    """Random access to a store's samples, in corpus order (shard order, then order within a shard).

    ``store[i]`` returns ``{"input_ids": int64 [L], "loss_mask": bool [L], "aux": [L, n_aux*H],
    "last": [L, H]}`` (``last`` only when stored), as independent tensors in the store dtype (or
    ``dtype``). Rows are read lazily from memory-mapped shard files, so iterating a multi-TB store
    costs only what is read. Only complete shards (every feature present) are visible.
    """

    def __init__(self, directory: str | Path, *, dtype: torch.dtype | None = None, verify: bool = False):
        self.directory = Path(directory).expanduser().absolute()
        p = self.directory / INDEX_NAME
        if not p.exists():
            raise StoreError(f"no {INDEX_NAME} in {self.directory}: not a hidden-state store (or nothing written yet)")
        self.index: dict[str, Any] = json.loads(p.read_text())
        self.meta = StoreMeta.from_index(self.index)
        self.dtype = dtype
        self._shards: list[dict[str, Any]] = [e for _, e in sorted(self.index["shards"].items()) if e.get("complete")]
        self._starts: list[int] = []
        total = 0
        for e in self._shards:
            self._starts.append(total)
            total += e["n_samples"]
        self._len = total
        self._handles: dict[str, Any] = {}
        if verify:
            for e in self._shards:
                for name in e["files"]:
                    if read_shard_header(self.directory / name) is None:
                        raise StoreError(f"{name} is damaged (truncated or not safetensors)")

    @property
    def layers(self) -> AuxLayers:
        return self.meta.layers

    @property
    def hidden_size(self) -> int:
        return self.meta.hidden_size

    @property
    def n_tokens(self) -> int:
        return sum(e["n_tokens"] for e in self._shards)

    @property
    def shard_entries(self) -> list[dict[str, Any]]:
        return list(self._shards)

    def __len__(self) -> int:
        return self._len

    def _locate(self, i: int) -> tuple[dict[str, Any], int]:
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"sample {i} out of range for a store of {self._len}")
        lo, hi = 0, len(self._starts) - 1
        while lo < hi:  # last shard whose start <= i
            mid = (lo + hi + 1) // 2
            if self._starts[mid] <= i:
                lo = mid
            else:
                hi = mid - 1
        return self._shards[lo], i - self._starts[lo]

    def sample_id(self, i: int) -> str:
        entry, j = self._locate(i)
        return entry["sample_ids"][j]

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            from safetensors import safe_open

            h = safe_open(str(self.directory / name), framework="pt")
            self._handles[name] = h
        return h

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        entry, j = self._locate(int(i))
        start = entry["offsets"][j]
        end = start + entry["lengths"][j]
        out: dict[str, torch.Tensor] = {}
        for name, info in entry["files"].items():
            h = self._handle(name)
            if "input_ids" not in out:
                out["input_ids"] = h.get_slice("input_ids")[start:end].to(torch.int64)
                out["loss_mask"] = h.get_slice("loss_mask")[start:end].to(torch.bool)
            for feature in info["features"]:
                t = h.get_slice(feature)[start:end]
                # Always a fresh, aligned copy: a slice of the memory map can start at any byte, and
                # BLAS kernels pick different (differently rounded) code paths for unaligned inputs,
                # which would make recomputed logits differ from the target's in the last bits.
                out[feature] = t.to(self.dtype or t.dtype, copy=True)
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(self._len):
            yield self[i]

    def iter_ids(self) -> Iterable[str]:
        for e in self._shards:
            yield from e["sample_ids"]

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> HiddenStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
