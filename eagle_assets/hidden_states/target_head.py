"""The target's frozen output head: stored ``last`` hidden state → the target's logits.

The store keeps one H-wide vector per token instead of vocabulary-sized logits (7168 vs 163,840
numbers for Kimi K2.5); the trainer recomputes the logits with the target's own ``lm_head`` (and
its final norm when the store holds the pre-norm state). Loading only these two tensors from the
checkpoint costs ~2.3 GB in bf16 for Kimi K2.5 instead of the whole model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from eagle_assets.hidden_states.store import LAST_KINDS, HiddenStateStore


class RMSNormHead(nn.Module):
    """Llama/DeepSeek RMSNorm, computed the way their HF implementations do (fp32 inside)."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class TargetHead(nn.Module):
    """``logits = lm_head(last)`` (post-norm store) or ``lm_head(norm(last))`` (pre-norm store)."""

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
    def from_model(cls, model: nn.Module, last_kind: str = "post_norm") -> TargetHead:
        """Share the loaded model's own modules (exactly the same arithmetic as its forward)."""
        from eagle_assets.hidden_states.extract_hf import _decoder, _final_norm

        head = model.get_output_embeddings()
        norm = _final_norm(_decoder(model)) if last_kind == "pre_norm" else None
        obj = cls(head.weight.detach(), norm=norm, last_kind=last_kind)
        obj.lm_head = head
        return obj

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        last_kind: str = "post_norm",
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> TargetHead:
        """Read only ``lm_head`` (+ final norm) from a local safetensors checkpoint."""
        from safetensors import safe_open

        root = Path(path)
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors files in {root}")
        config = json.loads((root / "config.json").read_text())
        text_cfg = config.get("text_config", config)

        def find(suffixes: tuple[str, ...]) -> torch.Tensor | None:
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    keys = sorted(h.keys(), key=len)
                    for suffix in suffixes:
                        for k in keys:
                            if k == suffix or k.endswith("." + suffix):
                                return h.get_tensor(k)
            return None

        weight = find(("lm_head.weight",))
        if weight is None and text_cfg.get("tie_word_embeddings", config.get("tie_word_embeddings")):
            weight = find(("embed_tokens.weight",))
        if weight is None:
            raise KeyError(f"no lm_head.weight in {root}")
        norm = None
        if last_kind == "pre_norm":
            nw = find(("model.norm.weight",))
            if nw is None:
                raise KeyError(f"no model.norm.weight in {root}")
            norm = RMSNormHead(nw, float(text_cfg.get("rms_norm_eps", 1e-6)))
        head = cls(weight, norm=norm, last_kind=last_kind)
        return head.to(device=device, dtype=dtype) if dtype is not None else head.to(device)

    @classmethod
    def for_store(cls, store: HiddenStateStore, model_path: str | Path, **kwargs: object) -> TargetHead:
        return cls.from_pretrained(model_path, store.meta.last_kind, **kwargs)  # type: ignore[arg-type]

    def forward(self, last: torch.Tensor) -> torch.Tensor:
        h = self.norm(last) if self.norm is not None else last
        return self.lm_head(h.to(self.lm_head.weight.dtype))


def target_logits(last: torch.Tensor, head: TargetHead) -> torch.Tensor:
    """The target's logits at every stored position, from the stored last hidden state."""
    with torch.no_grad():
        return head(last)
