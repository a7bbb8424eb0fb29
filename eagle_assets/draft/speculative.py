"""Greedy speculative decoding with chain drafting: the real acceptance length of a draft against its target.

Per round, with ``L`` tokens so far (the last one, ``b``, not yet run through the target):

1. the draft, whose cache holds positions ``0..L-2`` built from *target* features, proposes K tokens
   autoregressively from its own hidden states (its output at ``L-2`` gives ``d_1``; each further
   step feeds the previous output hidden state and token at the next position);
2. the target runs ``[b, d_1..d_K]`` at positions ``L-1..L-1+K`` in one forward (KV cache), giving
   its greedy tokens ``g_0..g_K`` and aux features;
3. the longest prefix with ``d_j == g_{j-1}`` is accepted, plus the bonus token ``g_n``; the target
   cache is cropped to the accepted positions, the draft's speculative entries are dropped and its
   cache is extended with the target features of the accepted positions.

So the output is the target's greedy decode (up to floating-point differences between a one-token and a
(K+1)-token forward, which the tests check do not flip a token on CPU fp32). τ is the mean of ``n + 1`` over
verification rounds (prefill not counted), from the raw matches even in a round that ``max_new_tokens`` or EOS
cut; ``position_accept_rate[j]`` is P(draft token j+1 accepted | tokens 1..j accepted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from eagle_assets.draft.model import DraftKVCache, Eagle3Draft
from eagle_assets.draft.target import crop_cache, hf_forward, make_cache

if TYPE_CHECKING:  # only a type here: transformers is imported where a model is loaded
    from transformers import PreTrainedModel


class _Rounds:
    accepted: list[int]  # accepted draft tokens per verification round
    num_draft_tokens: int

    @property
    def tau(self) -> float:
        return sum(n + 1 for n in self.accepted) / len(self.accepted) if self.accepted else 0.0

    @property
    def position_accept_rate(self) -> list[float]:
        rates = []
        for j in range(self.num_draft_tokens):
            reached = sum(1 for n in self.accepted if n >= j)
            rates.append(sum(1 for n in self.accepted if n > j) / reached if reached else 0.0)
        return rates


@dataclass
class SpeculativeResult(_Rounds):
    tokens: list[int]  # new tokens (EOS included when hit)
    accepted: list[int]
    num_draft_tokens: int


@dataclass
class AcceptanceStats(_Rounds):
    num_draft_tokens: int
    accepted: list[int] = field(default_factory=list)
    new_tokens: int = 0


def _extend(
    draft: Eagle3Draft, cache: DraftKVCache, aux: torch.Tensor, next_tokens: Sequence[int], start: int
) -> tuple[torch.Tensor, int]:
    """Add positions ``start..`` (target features + the token after each); returns last hidden, next draft token."""
    device = draft.fc.weight.device
    hidden = draft.project(aux[None].to(device))
    ids = torch.tensor([list(next_tokens)], device=device)
    pos = torch.arange(start, start + len(next_tokens), device=device)
    out, logits = draft.step(hidden, ids, pos, cache.attend)
    return out[:, -1:], int(draft.to_target_ids(logits[0, -1].argmax()))


@torch.inference_mode()
def speculative_generate(
    target: PreTrainedModel,
    draft: Eagle3Draft,
    input_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    *,
    num_draft_tokens: int = 4,
    eos_id: int | None = None,
    aux_layer_ids: Sequence[int] | None = None,
) -> SpeculativeResult:
    """Greedy-decode ``max_new_tokens`` from one prompt with the draft proposing ``num_draft_tokens`` per round."""
    if num_draft_tokens < 1:
        raise ValueError("num_draft_tokens must be >= 1")
    layers = tuple(aux_layer_ids or draft.config.aux_layer_ids)
    device = next(target.parameters()).device
    prompt = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1).tolist()
    if not prompt:
        raise ValueError("empty prompt")
    result = SpeculativeResult([], [], num_draft_tokens)
    if max_new_tokens <= 0:
        return result
    k = num_draft_tokens
    cache: Any = make_cache(target)
    logits, aux, _ = hf_forward(target, torch.tensor([prompt], device=device), layers, cache=cache)
    b = int(logits[0, -1].argmax())
    result.tokens.append(b)
    if b == eos_id or max_new_tokens == 1:
        return result
    dcache = DraftKVCache()
    hidden, tok = _extend(draft, dcache, aux[0], [*prompt[1:], b], 0)
    length = len(prompt) + 1  # tokens so far; the last (b) has not been through the target
    ddev = draft.fc.weight.device
    while True:
        drafts = [tok]
        h = hidden
        for j in range(1, k):
            pos = torch.tensor([length - 2 + j], device=ddev)
            h, lg = draft.step(h, torch.tensor([[drafts[-1]]], device=ddev), pos, dcache.attend)
            drafts.append(int(draft.to_target_ids(lg[0, -1].argmax())))
        pos = torch.arange(length - 1, length + k, device=device)[None]
        logits, aux, _ = hf_forward(
            target, torch.tensor([[b, *drafts]], device=device), layers, cache=cache, position_ids=pos
        )
        greedy = logits[0].argmax(-1).tolist()
        n = 0
        while n < k and drafts[n] == greedy[n]:
            n += 1
        result.accepted.append(n)
        new = [*drafts[:n], greedy[n]]
        for t in new:
            result.tokens.append(t)
            if t == eos_id or len(result.tokens) >= max_new_tokens:
                return result
        crop_cache(cache, length + n)
        dcache.crop(length - 1)
        hidden, tok = _extend(draft, dcache, aux[0, : n + 1], new, length - 1)
        b = new[-1]
        length += n + 1


def evaluate_acceptance(
    target: PreTrainedModel,
    draft: Eagle3Draft,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    num_draft_tokens: int = 4,
    eos_id: int | None = None,
) -> AcceptanceStats:
    """Acceptance statistics over several prompts (one sequence at a time)."""
    stats = AcceptanceStats(num_draft_tokens)
    was_training = draft.training
    draft.eval()
    try:
        for p in prompts:
            r = speculative_generate(target, draft, p, max_new_tokens, num_draft_tokens=num_draft_tokens, eos_id=eos_id)
            stats.accepted.extend(r.accepted)
            stats.new_tokens += len(r.tokens)
    finally:
        draft.train(was_training)
    return stats
