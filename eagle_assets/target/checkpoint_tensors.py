"""One tensor of a local safetensors checkpoint (the head, the final norm, the embeddings), read without loading
the model and opening only the file that holds it: a sharded checkpoint (Kimi K2.5: 64 files, about 600 GB) names
each tensor's file in its index; without one the files are searched in name order.

A name matches a suffix when it equals it or ends with ``"." + suffix``, shortest name first, so ``lm_head.weight``
finds Kimi K2.5's ``language_model.lm_head.weight`` and ``model.norm.weight`` its text model's norm, not a vision
tower's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"


def _match(names: Iterable[str], suffix: str) -> str | None:
    for name in sorted(names, key=lambda n: (len(n), n)):
        if name == suffix or name.endswith("." + suffix):
            return name
    return None


def _read(file: Path, name: str) -> torch.Tensor:
    with safe_open(str(file), framework="pt") as handle:
        return handle.get_tensor(name)


def checkpoint_tensor(path: str | Path, suffixes: Sequence[str]) -> torch.Tensor | None:
    """The first tensor matching one of ``suffixes`` (in their order), or None; FileNotFoundError without weights."""
    root = Path(path)
    index = root / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        for suffix in suffixes:
            name = _match(weight_map, suffix)
            if name is not None:
                return _read(root / weight_map[name], name)
        return None
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {root}")
    for suffix in suffixes:
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                name = _match(handle.keys(), suffix)
                if name is not None:
                    return handle.get_tensor(name)
    return None
