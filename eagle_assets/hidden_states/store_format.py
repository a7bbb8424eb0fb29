"""What a hidden-state store is: its files, its settings (``StoreMeta``), its errors and dtypes.

Layout of a store directory::

    index.json                       store metadata + one entry per completed shard
    shard-00000.safetensors          all features of corpus shard 0 (HF backend: one pass)
    shard-00001-aux.safetensors      or one file per feature group when features come from
    shard-00001-last.safetensors     separate passes (``run_extraction(group=...)``)

A shard file packs its samples back to back: ``aux`` [T, n_aux*H] (low | mid | high), ``last`` [T, H],
``input_ids`` [T] int32, ``loss_mask`` [T] uint8 and ``sample_offsets`` [n+1] int64; its header also carries the
sample ids and an input fingerprint, so a file can be checked on its own. The last state is the final norm's output
(``post_norm``, as HF's ``output_hidden_states[-1]`` and SpecForge's), so the target's logits are ``lm_head(last)``,
or its input (``pre_norm``: what vLLM's capture gives, logits ``lm_head(norm(last))``); ``last_kind`` records which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eagle_assets.errors import TargetError
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.target.architecture import LAST_KINDS

FORMAT = "eagle-forge-hidden-states"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"
LOCK_NAME = ".index.lock"
FEATURES = ("aux", "last")
GiB = 1024**3

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


def shard_name(index: int) -> str:
    """Store shard ``index``'s name: its index entry, its calibration record, the stem of its files."""
    return f"shard-{index:05d}"


def shard_file_name(index: int, group: Sequence[str], all_features: Sequence[str]) -> str:
    suffix = "" if tuple(group) == tuple(all_features) else "-" + "-".join(group)
    return f"{shard_name(index)}{suffix}.safetensors"
