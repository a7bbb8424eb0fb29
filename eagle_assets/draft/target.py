"""What the draft needs from a Hugging Face target: aux features, the last hidden state, its frozen head.

Layer convention (the project's canonical one, see ``eagle_assets/hidden_states/layers.py``): an aux
layer id is an index into HF's ``output_hidden_states`` tuple (0 = embeddings, i = input of decoder
layer i). The last hidden state is HF's ``hidden_states[-1]``, i.e. *after* the final norm for
Llama-style models, so the target's logits are ``lm_head(last)``; a store that keeps the pre-norm
state needs ``norm`` too (``TargetHead(last_kind="pre_norm")``).

Everything here is a plain callable so the trainer can also take the hidden-state developer's
``TargetHead`` or anything else mapping ``last -> logits``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eagle_assets.draft.model import RMSNorm


def cache_kwarg(model: nn.Module) -> str:
    """transformers 5.x names the KV-cache argument ``cache``; earlier versions ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(output: Any) -> Any:
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions (negative ``crop`` means "remove n" in every 4.x/5.x version)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def make_cache(model: nn.Module) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x
        return DynamicCache()


@torch.no_grad()
def hf_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    aux_layer_ids: Sequence[int],
    *,
    cache: Any = None,
    position_ids: torch.Tensor | None = None,
    with_logits: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(logits or None, aux [B,T,n_aux*H], last [B,T,H]) for ``input_ids`` [B,T], optionally with a KV cache."""
    kwargs: dict[str, Any] = {"input_ids": input_ids, "output_hidden_states": True}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if cache is not None:
        kwargs[cache_kwarg(model)] = cache
        kwargs["use_cache"] = True
    else:
        kwargs["use_cache"] = False
    runner = model if with_logits else model.get_decoder()
    out = runner(**kwargs)
    hs = out.hidden_states
    aux = torch.cat([hs[i] for i in aux_layer_ids], dim=-1)
    return (out.logits if with_logits else None), aux, hs[-1]


class HFTargetFeatures:
    """Online features: ``features(input_ids [B,T]) -> (aux, last)`` from the decoder alone (no lm_head)."""

    def __init__(self, model: nn.Module, aux_layer_ids: Sequence[int]):
        self.model = model
        self.aux_layer_ids = tuple(aux_layer_ids)

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, aux, last = hf_forward(self.model, input_ids, self.aux_layer_ids, with_logits=False)
        return aux, last


def hf_target_head(model: nn.Module) -> nn.Module:
    """The model's own ``lm_head``: exactly the target's logits from its post-norm last hidden state."""
    return model.get_output_embeddings()


class TargetHead(nn.Module):
    """Frozen ``lm_head`` (and final norm for pre-norm stores) of the target, loaded without the model."""

    def __init__(self, lm_head_weight: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-6):
        super().__init__()
        self.lm_head = nn.Linear(lm_head_weight.shape[1], lm_head_weight.shape[0], bias=False)
        self.norm: RMSNorm | None = None
        with torch.no_grad():
            self.lm_head.weight.copy_(lm_head_weight)
            if norm_weight is not None:
                self.norm = RMSNorm(norm_weight.numel(), eps)
                self.norm.weight.copy_(norm_weight)
        self.requires_grad_(False)

    def forward(self, last: torch.Tensor) -> torch.Tensor:
        h = self.norm(last) if self.norm is not None else last
        return self.lm_head(h.to(self.lm_head.weight.dtype))


def load_checkpoint_tensor(path: str | Path, suffixes: Sequence[str]) -> torch.Tensor | None:
    """First tensor whose name equals or ends with one of ``suffixes`` in a local safetensors checkpoint."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {path}")
    for suffix in suffixes:
        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for key in sorted(handle.keys(), key=len):
                    if key == suffix or key.endswith("." + suffix):
                        return handle.get_tensor(key)
    return None


def load_target_embeddings(path: str | Path) -> torch.Tensor:
    weight = load_checkpoint_tensor(path, ("model.embed_tokens.weight", "embed_tokens.weight"))
    if weight is None:
        raise KeyError(f"no embed_tokens.weight in {path}")
    return weight


def load_target_head(path: str | Path, last_kind: str = "post_norm") -> TargetHead:
    config = json.loads((Path(path) / "config.json").read_text())
    text = config.get("text_config", config)
    weight = load_checkpoint_tensor(path, ("lm_head.weight",))
    if weight is None and text.get("tie_word_embeddings", config.get("tie_word_embeddings")):
        weight = load_target_embeddings(path)
    if weight is None:
        raise KeyError(f"no lm_head.weight in {path}")
    norm = None
    if last_kind == "pre_norm":
        norm = load_checkpoint_tensor(path, ("model.norm.weight",))
        if norm is None:
            raise KeyError(f"no model.norm.weight in {path}")
    elif last_kind != "post_norm":
        raise ValueError("last_kind must be 'post_norm' or 'pre_norm'")
    return TargetHead(weight, norm, float(text.get("rms_norm_eps", 1e-6)))
