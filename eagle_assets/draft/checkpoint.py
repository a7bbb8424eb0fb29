"""Checkpoint file mechanics: atomic writes (``durable_files``: a crash leaves the old file or the new one, and
``latest.json`` moves only once the checkpoint it names is durable), the pointer, RNG states as plain values."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_assets.durable_files import atomic_file

LATEST = "latest.json"


def rng_state() -> dict[str, Any]:
    """Plain Python values only: they travel through ``all_gather_object`` and load with ``weights_only``."""
    np_state = np.random.get_state(legacy=True)  # numpy's stub types the default call as legacy=False
    assert isinstance(np_state, tuple)  # the global RandomState is an MT19937: its legacy state is a tuple
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].tolist(), *(x.item() if hasattr(x, "item") else x for x in np_state[2:])),
        "torch": torch.get_rng_state().numpy().tobytes(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return state


def _bytes_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np.asarray(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(_bytes_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(b) for b in state["cuda"]])


def atomic_torch_save(obj: Any, path: Path) -> None:
    with atomic_file(path, "wb") as f:
        torch.save(obj, f)


def latest_checkpoint(directory: str | Path) -> Path | None:
    d = Path(directory)
    pointer = d / LATEST
    if not pointer.is_file():
        return None
    path = d / json.loads(pointer.read_text())["file"]
    return path if path.is_file() else None
