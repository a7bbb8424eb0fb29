"""What the draft and the hidden-state extraction both read of a target: its sizes, where a Hugging Face model
keeps its decoder, layers and final norm, which layer indices may feed a draft, and where the last state is taken.

Kept here, beside the targets, so that ``eagle_assets.draft`` needs nothing of ``eagle_assets.hidden_states``
(the extraction writes its capture draft with the draft's exporter; the draft reads stores only through a reader
named in its run config).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

# Where the stored last hidden state is taken: after the final norm (logits = lm_head(last)) or before it.
LAST_KINDS = ("post_norm", "pre_norm")


@dataclass(frozen=True)
class TargetDims:
    hidden_size: int
    num_layers: int
    vocab_size: int


def read_target_config(model_path: str | Path) -> dict:
    """The target's ``config.json`` as written, read without transformers: sizing a draft from it this way costs a
    training process nothing, where ``AutoConfig`` imports transformers' model modules (~5 CPU-s here)."""
    path = Path(model_path) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json in the target folder {model_path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} holds {type(cfg).__name__}, not a JSON object")
    return cfg


def read_target_dims(model_path: str | Path) -> TargetDims:
    """Hidden size / layer count from ``config.json`` (Kimi K2.5 nests them in ``text_config``)."""
    cfg = read_target_config(model_path)
    text = cfg.get("text_config", cfg)
    return TargetDims(int(text["hidden_size"]), int(text["num_hidden_layers"]), int(text["vocab_size"]))


def validate_aux_layer_ids(ids: Iterable[int], num_layers: int | None) -> tuple[int, ...]:
    """The HF indices as a tuple, or a ValueError naming what is wrong: strictly increasing (a repeated layer is a
    feature the draft never gets), each in ``1 .. N-1`` (0 is the embedding output, SGLang would need id -1; N is
    after the final norm), or only ``>= 1`` when ``num_layers`` is None (a draft config not knowing its target)."""
    idx = tuple(int(i) for i in ids)
    if not idx:
        raise ValueError("at least one aux layer is needed")
    convention = "HF output_hidden_states indices: i = input of decoder layer i"
    top = "N-1" if num_layers is None else str(num_layers - 1)
    for i in idx:
        if i < 1 or (num_layers is not None and i > num_layers - 1):
            where = "" if num_layers is None else f" of a {num_layers}-layer target"
            raise ValueError(f"aux layer index {i} outside 1..{top}{where} in {list(idx)} ({convention})")
    if list(idx) != sorted(idx):
        raise ValueError(f"aux layers must be ordered low → high, got {list(idx)} ({convention})")
    if len(set(idx)) != len(idx):
        raise ValueError(f"aux layers must differ (each layer once), got {list(idx)}: a repeated layer adds no feature")
    return idx


def decoder_of(model: nn.Module) -> nn.Module:
    get = getattr(model, "get_decoder", None)
    dec = get() if callable(get) else None
    if dec is None:
        dec = getattr(model, "model", None) or getattr(model, "transformer", None)
    if dec is None:
        raise ValueError(f"cannot find the decoder stack of {type(model).__name__}")
    return dec


def decoder_layers_of(decoder: nn.Module) -> nn.ModuleList:
    for name in ("layers", "h", "blocks"):
        mods = getattr(decoder, name, None)
        if isinstance(mods, nn.ModuleList):
            return mods
    raise ValueError(f"cannot find the decoder layers of {type(decoder).__name__} (tried layers, h, blocks)")


def final_norm_of(decoder: nn.Module) -> nn.Module:
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        mod = getattr(decoder, name, None)
        if isinstance(mod, nn.Module):
            return mod
    raise ValueError(f"cannot find the final norm of {type(decoder).__name__}")


def num_decoder_layers(model: nn.Module) -> int:
    return len(decoder_layers_of(decoder_of(model)))
