"""A tiny Kimi K2.5 target: the real release's architecture at toy size, built locally from a seed.

The tiny Llama (``tiny.py``) exercises the pipeline; this one exercises the real target's *shape* wherever the
target is loaded or read: ``kimi_k25`` (transformers' own classes), a vision tower and projector around a
``deepseek_v3`` text model with multi-head latent attention (keys and values of different widths in the KV cache,
interleaved RoPE) and mixture of experts with a shared expert after a dense first layer, untied embeddings, and the
checkpoint laid out as the release is (``language_model.model.…``, per-expert tensors).

Sizes: ``TinyKimiSpec`` (7 layers: aux [2, 3, 4], as for the tiny Llama). Weights: the tiny Llama's recipe and
reasons (``tiny.init_weights``). Measured on random plain-word prompts (seed 0): mean entropy 2.2 nats, mean top-1
probability 0.47, the greedy next token equals the one-token-context prediction 47% of the time and changes in 3%
of cases when only the first prompt token changes (the tiny Llama: 2.6, 0.4, 45%, 12%).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle_assets.target.tiny import (
    KIMI_BOS_ID,
    KIMI_EOS_ID,
    KIMI_PAD_ID,
    KIMI_VOCAB_SIZE,
    finish_tiny_model,
    publish_tiny_model,
)

KIMI_MEDIA_PAD_ID = 163_605  # <|media_pad|>: the release's image_token_id


@dataclass(frozen=True)
class TinyKimiSpec:
    """Everything that determines the tiny Kimi K2.5 target's weights; recorded next to them."""

    seed: int = 0
    hidden_size: int = 64
    num_hidden_layers: int = 7
    num_attention_heads: int = 4
    q_lora_rank: int = 32
    kv_lora_rank: int = 16
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    intermediate_size: int = 128  # the dense first layer's MLP
    moe_intermediate_size: int = 32
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    routed_scaling_factor: float = 2.827  # the release's
    vision_hidden_size: int = 32
    vision_layers: int = 1
    max_position_embeddings: int = 4096
    vocab_size: int = KIMI_VOCAB_SIZE
    embed_std: float = 1.0
    proj_gain: float = 0.3
    logit_std: float = 6.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    text_safe_output: bool = True

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps({"kimi_k25": asdict(self)}, sort_keys=True).encode()).hexdigest()[:16]


def tiny_kimi_config(spec: TinyKimiSpec) -> Any:
    from transformers.models.kimi_k25 import Kimi_K25Config

    text = {
        "model_type": "deepseek_v3",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_attention_heads,
        "n_shared_experts": spec.n_shared_experts,
        "n_routed_experts": spec.n_routed_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "routed_scaling_factor": spec.routed_scaling_factor,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "first_k_dense_replace": spec.first_k_dense_replace,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
        "rope_interleave": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "num_mtp_layers": 0,  # the release ships no MTP layers in its HF checkpoint
        "tie_word_embeddings": False,
        "bos_token_id": KIMI_BOS_ID,
        "eos_token_id": KIMI_EOS_ID,
        "pad_token_id": KIMI_PAD_ID,
    }
    vision = {
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": 2 * spec.vision_hidden_size,
        "num_attention_heads": 2,
        "num_hidden_layers": spec.vision_layers,
        "patch_size": 14,
        "pos_emb_height": 8,
        "pos_emb_width": 8,
        "pos_emb_time": 4,
    }
    return Kimi_K25Config(
        text_config=text,
        vision_config=vision,
        projection_hidden_size=spec.vision_hidden_size,
        image_token_id=KIMI_MEDIA_PAD_ID,
        tie_word_embeddings=False,
    )


def make_tiny_kimi_target(spec: TinyKimiSpec | None = None) -> Any:
    """Build the ``Kimi_K25ForConditionalGeneration`` in memory (float32, eval mode)."""
    from transformers.models.kimi_k25 import Kimi_K25ForConditionalGeneration

    spec = spec or TinyKimiSpec()
    return finish_tiny_model(Kimi_K25ForConditionalGeneration(tiny_kimi_config(spec)), spec)


# The release's latent widths (``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64): the only ones vLLM's CPU MLA kernel
# takes (its cache rows are 576 wide), so the tiny text target below runs in vLLM's CPU build.
VLLM_CPU_KIMI_SPEC = TinyKimiSpec(kv_lora_rank=512, qk_rope_head_dim=64)


def make_tiny_kimi_text_target(spec: TinyKimiSpec | None = None) -> Any:
    """The tiny Kimi K2.5's text model alone, as a ``DeepseekV3ForCausalLM`` (float32, eval mode): what vLLM's
    ``kimi_k25`` wraps, under the names vLLM's ``deepseek_v3`` loader reads. The whole tiny Kimi cannot load in
    vLLM (its ``kimi_k25`` loader expects the release's checkpoint names and image processor), so this is the
    target's architecture (MLA, the MoE's sigmoid router with its correction bias) through the real engine."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    spec = spec or VLLM_CPU_KIMI_SPEC
    text = tiny_kimi_config(spec).text_config.to_dict()
    text = {k: v for k, v in text.items() if k not in ("model_type", "architectures", "transformers_version")}
    # The release's router; transformers' DeepseekV3 always routes so, vLLM only when the config says it.
    text.update(topk_method="noaux_tc", scoring_func="sigmoid")
    return finish_tiny_model(DeepseekV3ForCausalLM(DeepseekV3Config(**text)), spec)


def build_tiny_kimi_text_target(path: str | Path, spec: TinyKimiSpec | None = None) -> Path:
    """Save the tiny Kimi K2.5 text target to ``path`` unless a complete copy of the same spec is there."""
    spec = spec or VLLM_CPU_KIMI_SPEC
    return publish_tiny_model(path, _TextSpec(spec), lambda s: make_tiny_kimi_text_target(s.spec), spec.seed)


@dataclass(frozen=True)
class _TextSpec:
    """A spec of the text model alone: its own fingerprint, so a folder of the whole tiny Kimi is never taken for it."""

    spec: TinyKimiSpec

    @property
    def seed(self) -> int:
        return self.spec.seed

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps({"kimi_k25_text": asdict(self.spec)}).encode()).hexdigest()[:16]


def build_tiny_kimi_target(path: str | Path, seed: int = 0, spec: TinyKimiSpec | None = None) -> Path:
    """Save the tiny Kimi K2.5 target to ``path`` unless a complete copy of the same spec is there (published whole)."""
    return publish_tiny_model(path, spec or TinyKimiSpec(seed=seed), make_tiny_kimi_target, seed)
