"""The EAGLE-3 draft: ``fc`` over the target's aux features, one Llama decoder layer, ``norm``, ``lm_head``.

Parameter and buffer names are those of the engines' ``LlamaForCausalLMEagle3`` checkpoints, so ``export.py`` writes
the state dict as is. One draft step, for a hidden state ``h`` (``fc(aux)`` at step 0, the previous step's output
later) and the embedding ``e`` of the next token::

    x   = [input_layernorm(e); hidden_norm(h)]          # 2H wide: q/k/v take 2H inputs
    h'  = h + o_proj(attn(x))                           # residual is the *un-normalised* h
    h'' = h' + mlp(post_attention_layernorm(h'))
    out = h''                -> next step's hidden state (pre-norm, as the engines pass it on)
    logits = lm_head(norm(h''))

RoPE and RMSNorm follow HF Llama (rotate-half RoPE, fp32 RMS statistics), as the engines do. Attention is an
``attend(q, k, v)`` callable: training (``ttt.py``) and the inference cache (``DraftKVCache``) mask differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eagle_assets.draft.vocab import DraftVocab
from eagle_assets.target.architecture import validate_aux_layer_ids

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Both engines' LlamaForCausalLMEagle3 hard-code fc as Linear(3 * target_hidden_size -> hidden_size).
N_AUX_LAYERS = 3


@dataclass(frozen=True)
class Eagle3Config:
    """Shape of the draft. ``aux_layer_ids`` are HF ``output_hidden_states`` indices (see ``export.py``)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]
    target_hidden_size: int = 0  # 0: same as hidden_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    max_position: int = 4096
    target_num_layers: int = 0  # 0: unknown; recorded for the engines' layer-id conventions
    save_embeddings: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))
        if self.target_hidden_size == 0:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("RoPE needs an even head_dim")
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError("draft_vocab_size must be in [1, target_vocab_size]")
        if len(self.aux_layer_ids) != N_AUX_LAYERS:
            raise ValueError(
                f"EAGLE-3 takes exactly {N_AUX_LAYERS} auxiliary target layers (low, middle, high), got "
                f"{len(self.aux_layer_ids)}: {list(self.aux_layer_ids)}. SGLang's and vLLM's LlamaForCausalLMEagle3 "
                f"build fc with {N_AUX_LAYERS} x target_hidden_size inputs, so any other count exports a draft "
                "that fails to load (fc shape mismatch)"
            )
        # The same rule as the hidden-state store (sorted, each once, 1..N-1): a draft trained or exported with
        # (3, 3, 3), (4, 3, 2) or (-1, 3, 5) would be served features it never saw.
        validate_aux_layer_ids(self.aux_layer_ids, self.target_num_layers or None)
        if self.target_hidden_size != self.hidden_size and not self.save_embeddings:
            raise ValueError(
                f"target_hidden_size {self.target_hidden_size} != hidden_size {self.hidden_size}: the draft's "
                "embedding cannot be the target's, and SGLang does not share it in that case, so it must be "
                "exported: set save_embeddings=True"
            )

    @property
    def aux_width(self) -> int:
        return len(self.aux_layer_ids) * self.target_hidden_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Eagle3Config:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        draft_vocab_size: int,
        aux_layer_ids: tuple[int, ...] | None = None,
        **overrides: Any,
    ) -> Eagle3Config:
        """Size the draft from the target's config (an HF config object or a parsed ``config.json``, a wrapper's
        ``text_config``), as the reference drafts do. An MLA target's (DeepSeek-V3, Kimi K2/K2.5) head width is its
        ``v_head_dim``: transformers' ``head_dim`` there is the RoPE sub-dimension (64), while the published Kimi-K2
        EAGLE-3 drafts (SpecForge ``configs/kimi-k2-eagle3.json``, AQ-MedAI/Kimi-K2-Instruct-eagle3) use 64 x 128.
        """
        cfg = _field(target_config, "text_config") or target_config
        n_layers = int(_field(cfg, "num_hidden_layers"))
        hidden = int(_field(cfg, "hidden_size"))
        heads = int(_field(cfg, "num_attention_heads"))
        head_dim = int(_field(cfg, "v_head_dim") if _is_mla(cfg) else _field(cfg, "head_dim") or hidden // heads)
        rope = _field(cfg, "rope_parameters") or {}
        theta = float(_field(cfg, "rope_theta") or rope.get("rope_theta") or 10_000.0)
        values: dict[str, Any] = {
            "hidden_size": hidden,
            "intermediate_size": int(_field(cfg, "intermediate_size")),
            "num_heads": heads,
            "num_kv_heads": int(_field(cfg, "num_key_value_heads") or heads),
            "head_dim": head_dim,
            "target_vocab_size": int(_field(cfg, "vocab_size")),
            "draft_vocab_size": draft_vocab_size,
            "aux_layer_ids": aux_layer_ids or (2, n_layers // 2, n_layers - 3),
            "target_hidden_size": hidden,
            "rms_norm_eps": float(_field(cfg, "rms_norm_eps") or 1e-6),
            "rope_theta": theta,
            "max_position": int(_field(cfg, "max_position_embeddings") or 4096),
            "target_num_layers": n_layers,
        }
        values.update(overrides)
        return cls(**values)


def _field(cfg: Any, name: str) -> Any:
    """``cfg[name]`` for a parsed config.json, ``cfg.name`` for an HF config object; None when absent."""
    if isinstance(cfg, Mapping):
        return cfg.get(name)
    return getattr(cfg, name, None)


def _is_mla(cfg: Any) -> bool:
    """DeepSeek-V2/V3-style multi-head latent attention (Kimi K2 / K2.5 included)."""
    return _field(cfg, "kv_lora_rank") is not None and _field(cfg, "v_head_dim") is not None


class RMSNorm(nn.Module):
    """HF Llama RMSNorm: statistics in fp32, weight applied in the input dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., T, head_dim] for integer positions (any leading shape)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim)
    )
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, d]; cos/sin [T, d] or [B, T, d]."""
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + _rotate_half(x) * sin


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, kv_heads, T, d] → [B, kv_heads*groups, T, d]; query head h uses kv head h // groups (HF order)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class Eagle3Attention(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.q_proj = nn.Linear(2 * h, config.num_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, config.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, config.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, k, v)  # [B, heads, T, d]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class Eagle3MLP(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.self_attn = Eagle3Attention(config)
        self.mlp = Eagle3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, emb: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)
        h = hidden + self.self_attn(x, cos, sin, attend)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(nn.Module):
    """The draft model. ``embed_tokens`` is the target's matrix, frozen and not saved unless configured."""

    d2t: torch.Tensor  # registered buffers (declared: a Module's attribute is otherwise typed Tensor | Module)
    t2d: torch.Tensor

    def __init__(self, config: Eagle3Config, embed_weight: torch.Tensor | None = None, init_std: float = 0.02):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.target_vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(config.aux_width, config.hidden_size, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        # The id maps are checked element by element, so they are built on the CPU even under a ``meta``
        # default device (a Kimi-sized draft is shape-checked there without allocating its 5 GB).
        with torch.device("cpu"):
            vocab = DraftVocab.identity(config.draft_vocab_size, config.target_vocab_size)
            d2t, t2d = vocab.d2t, vocab.t2d
        self.register_buffer("d2t", d2t.to(self.fc.weight.device))
        self.register_buffer("t2d", t2d.to(self.fc.weight.device))
        self._init_weights(init_std)
        if embed_weight is not None:
            self.load_embeddings(embed_weight)

    @torch.no_grad()
    def _init_weights(self, std: float) -> None:
        # HF Llama's scheme (normal(0, 0.02), norms at 1) so a fresh draft starts like the references'.
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name != "embed_tokens.weight":
                p.normal_(0.0, std)

    @torch.no_grad()
    def load_embeddings(self, weight: torch.Tensor) -> None:
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(f"embedding {tuple(weight.shape)} != {tuple(self.embed_tokens.weight.shape)}")
        self.embed_tokens.weight.copy_(weight)

    @torch.no_grad()
    def set_vocab(self, vocab: DraftVocab) -> None:
        if vocab.size != self.config.draft_vocab_size or vocab.target_vocab_size != self.config.target_vocab_size:
            raise ValueError("vocabulary map does not fit the model's draft/target vocabulary sizes")
        self.d2t.copy_(vocab.d2t)
        self.t2d.copy_(vocab.t2d)

    @property
    def vocab(self) -> DraftVocab:
        return DraftVocab.from_d2t(self.d2t.cpu(), self.config.target_vocab_size)

    def used_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in draft order."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """Target features [.., n_aux*H_target] → the draft's step-0 hidden state."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def step(
        self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: (hidden [B,T,H], ids [B,T], positions [T] or [B,T]) → (next hidden, draft logits)."""
        out = self.step_hidden(hidden, input_ids, positions, attend)
        return out, self.logits(out)

    def step_hidden(
        self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend
    ) -> torch.Tensor:
        """``step`` without the head: the next hidden state only (training computes logits where a loss reads them)."""
        emb = self.embed_tokens(input_ids).to(hidden.dtype)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, hidden.dtype)
        return self.midlayer(emb, hidden, cos, sin, attend)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of step outputs ([..., H] → [..., N])."""
        return self.lm_head(self.norm(hidden))

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything that is trained or identifies the vocabulary; the frozen embedding only if configured."""
        sd = self.state_dict()
        if not self.config.save_embeddings:
            sd.pop("embed_tokens.weight", None)
        return sd

    def load_checkpoint_state_dict(self, sd: Mapping[str, torch.Tensor]) -> None:
        missing, unexpected = self.load_state_dict(dict(sd), strict=False)
        missing = [k for k in missing if k != "embed_tokens.weight"]
        if missing or unexpected:
            raise KeyError(f"draft state dict mismatch: missing {missing}, unexpected {unexpected}")


class DraftKVCache:
    """Inference-time KV cache of one draft layer: plain causal attention over everything appended."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[2])

    def crop(self, length: int) -> None:
        if self.k is not None and self.v is not None:  # set together by attend
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        past = len(self)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        groups = q.shape[1] // k.shape[1]
        tq, tk = q.shape[2], self.k.shape[2]
        allowed = torch.arange(tk, device=q.device)[None, :] <= (past + torch.arange(tq, device=q.device))[:, None]
        kk, vv = repeat_kv(self.k, groups), repeat_kv(self.v, groups)
        scores = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ vv
