"""The tiny targets built on this machine, by name: where each is kept, how it is built, the id stores record.

``llama-tiny`` (``tiny.py``), the default, is the fastest on CPU; ``kimi-k25-tiny`` (``tiny_kimi.py``) has the real
target's architecture. The target resource, the embedded simulator and the demo (``--target``) take these names; the
simulator must answer with the one the resource extracts from, so that the data is the target's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

TinyTargetName = Literal["llama-tiny", "kimi-k25-tiny"]
TINY_TARGETS: tuple[str, ...] = get_args(TinyTargetName)
DEFAULT_TINY_TARGET: TinyTargetName = "llama-tiny"


def _checked(name: str) -> str:
    if name not in TINY_TARGETS:
        raise ValueError(f"unknown tiny target {name!r}; known: {', '.join(TINY_TARGETS)}")
    return name


def tiny_target_path(name: str, seed: int = 0, *, home: Path | None = None) -> Path:
    """Where the demo keeps this tiny target (the Llama at ``layout.tiny_target_dir``, the others beside it)."""
    from eagle_assets.layout import tiny_target_dir

    llama = tiny_target_dir(seed, home=home)
    return llama if _checked(name) == "llama-tiny" else llama.parent / f"tiny-kimi-k25-seed{seed}"


def build_named_tiny_target(name: str, path: str | Path, seed: int = 0) -> Path:
    """Build (or find complete) the named tiny target at ``path``; imports torch and transformers."""
    if _checked(name) == "llama-tiny":
        from eagle_assets.target.tiny import build_tiny_target

        return build_tiny_target(path, seed)
    from eagle_assets.target.tiny_kimi import build_tiny_kimi_target

    return build_tiny_kimi_target(path, seed)


def tiny_target_model_id(name: str, seed: int = 0) -> str:
    """The model id stores and exports record (the weights are a function of name and seed)."""
    if _checked(name) == "llama-tiny":
        return f"eagle-forge/tiny-kimi-seed{seed}"  # = tiny.tiny_model_id, without importing torch
    return f"eagle-forge/tiny-kimi-k25-seed{seed}"
