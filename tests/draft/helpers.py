"""Tiny models and data for the draft tests (small vocabularies: every test must run in seconds on 2 cores)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from eagle_assets.draft.model import Eagle3Config, Eagle3Draft
from eagle_assets.draft.target import cache_kwarg, hf_forward
from eagle_assets.target.tiny import KIMI_EOS_ID

TINY_VOCAB = 512
TINY_LAYERS = 4
TINY_AUX = (1, 2, 3)  # HF output_hidden_states indices; the default [2, N//2, N-3] needs N >= 7


def tiny_llama(
    seed: int = 0, vocab: int = TINY_VOCAB, hidden: int = 64, layers: int = TINY_LAYERS, heads: int = 4
) -> LlamaForCausalLM:
    """Random Llama with an LM-like output distribution (same recipe as eagle_assets/target/tiny.py).

    HF's default init gives near-flat logits, which makes greedy outputs and acceptance meaningless:
    embeddings std 1, projections 0.3/sqrt(fan_in), lm_head std 6/sqrt(H).
    """
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,  # 2: head_dim 32, which vLLM's CPU attention takes (16 it does not)
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("lm_head.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (6.0 / math.sqrt(hidden)))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 / math.sqrt(p.shape[1])))
    return model.eval()


def draft_for(target: LlamaForCausalLM, draft_vocab: int = 256, seed: int = 0, **overrides) -> Eagle3Draft:
    cfg = Eagle3Config.from_target(target.config, draft_vocab, TINY_AUX, **overrides)
    torch.manual_seed(seed)
    weight = target.get_input_embeddings().weight
    assert isinstance(weight, torch.Tensor)  # a Parameter; a Module's attributes are typed Tensor | Module
    return Eagle3Draft(cfg, weight.detach().clone())


def small_config(**overrides: Any) -> Eagle3Config:
    values: dict[str, Any] = dict(
        hidden_size=32,
        intermediate_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        target_vocab_size=128,
        draft_vocab_size=64,
        aux_layer_ids=(1, 2, 3),
    )
    values.update(overrides)
    return Eagle3Config(**values)


@torch.no_grad()
def batch_greedy(model: Any, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of equal-length prompts in one batch (no EOS): [B, P + new_tokens]."""
    out = model.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out


class HFTargetFeatures:
    """Online features: ``features(input_ids [B,T]) -> (aux, last)`` from the decoder alone (no lm_head)."""

    def __init__(self, model: PreTrainedModel, aux_layer_ids: Sequence[int]):
        self.model = model
        self.aux_layer_ids = tuple(aux_layer_ids)

    def __call__(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, aux, last = hf_forward(self.model, input_ids, self.aux_layer_ids)
        return aux, last


def hf_target_head(model: PreTrainedModel) -> nn.Module:
    """The model's own ``lm_head``: exactly the target's logits from its post-norm last hidden state."""
    return model.get_output_embeddings()


@torch.inference_mode()
def generate_greedy(
    model: Any,
    input_ids: torch.Tensor | list[int],
    max_new_tokens: int,
    eos_id: int | None = KIMI_EOS_ID,
) -> list[int]:
    """Greedy continuation of one sequence with a KV cache; returns the new ids (eos included).

    A hand-written loop rather than ``model.generate`` so that the behaviour is pinned here
    (no generation-config defaults, no sampling flags) and the speculative-decoding tests can
    compare against exactly this procedure.
    """
    device = next(model.parameters()).device
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise ValueError("generate_greedy takes one sequence")
        ids = ids[0]
    if ids.numel() == 0:
        raise ValueError("generate_greedy needs at least one input token")
    out: list[int] = []
    cache = DynamicCache()
    step_input = ids[None, :]
    position = torch.arange(ids.numel(), device=device)[None, :]
    for _ in range(max_new_tokens):
        logits = model(
            input_ids=step_input, use_cache=True, position_ids=position, **{cache_kwarg(model): cache}
        ).logits
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if eos_id is not None and nxt == eos_id:
            break
        step_input = torch.tensor([[nxt]], device=device)
        position = position[:, -1:] + 1
    return out


def trained_draft(target: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int) -> Eagle3Draft:
    """A draft trained online (features from the target) on the target's own greedy continuations of ``prompts``."""
    from eagle_assets.draft.data import TokenDataset
    from eagle_assets.draft.train import TrainConfig, Trainer
    from eagle_assets.draft.vocab import vocab_from_samples

    seqs = batch_greedy(target, prompts, new_tokens)
    n = prompts.shape[1] + new_tokens
    rows = [{"input_ids": s, "loss_mask": torch.arange(n) >= prompts.shape[1]} for s in seqs]
    data = TokenDataset(rows)
    draft = draft_for(target, draft_vocab=256)
    draft.set_vocab(vocab_from_samples(data, target.config.vocab_size, 256))
    # 60 steps at 1e-2 reach tau 2.33 on the held-out prompts (150 at 3e-3: 2.46) for 40% of the CPU.
    cfg = TrainConfig(lr=1e-2, batch_size=8, max_steps=60, epochs=100, ttt_steps=4, warmup_ratio=0.05)
    Trainer(draft, data, hf_target_head(target), cfg, features=HFTargetFeatures(target, TINY_AUX)).train()
    return draft.eval()
