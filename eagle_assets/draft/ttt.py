"""Training-time test (TTT): the draft unrolled K steps on its own hidden states, as it runs at inference.

Alignment (``T`` tokens ``x_0..x_{T-1}``, target features ``f_t`` computed from ``x_0..x_t``, target
logits ``z_t`` predicting ``x_{t+1}``), for step ``k = 0..K-1`` and sequence index ``t``:

====================  =============================================================
hidden input          ``fc(f_t)`` at k = 0, else the step k-1 output at index t
token input           ``x_{t+1+k}`` (ids shifted left by 1+k, zero-filled)
position (RoPE)       ``t + k``
target distribution   ``softmax(z_{t+1+k}[t2d])`` (it predicts ``x_{t+2+k}``)
loss mask             ``loss_mask[t+2+k]`` × ``t2d[argmax z_{t+1+k}]``
====================  =============================================================

So at step 0 the hidden state of position t with the embedding of token t+1 predicts token t+2, and each step
moves the whole sequence one token further. The loss mask is taken at the *predicted* token (an assistant token is
what the draft will be asked to guess); the references differ on this by one or two positions, at turn boundaries.

Attention at step k, query index t: the step-0 keys at ``s <= t`` (causal) and, from each step ``1..k``, only the key
at t (the diagonal): what the draft sees when it drafts k tokens after position t at inference.
``step_attention_mask`` spells the mask out; ``attn_impl="eager"`` computes it without materialising it, ``"sdpa"``
passes it to ``scaled_dot_product_attention`` over the steps' concatenated KV (memory-efficient kernels on GPU).

Loss per step: soft cross-entropy ``-Σ p log q`` over masked positions, divided by a per-step denominator (the local
count of loss-masked positions, or the trainer's global counts, so that data-parallel and accumulated batches weigh
every token equally), weighted ``0.8^k``. Accuracy per step: ``d2t(argmax draft) == argmax z`` over loss-masked
positions (a target top-1 outside the draft vocabulary is a miss, as it is a rejection at inference).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagle_assets.draft.model import Eagle3Draft, repeat_kv

# The target's head as the loss sees it: any `last -> logits` (target.TargetHead, the model's own lm_head, a test head).
HeadFn = Callable[[torch.Tensor], torch.Tensor]
ATTN_IMPLS = ("eager", "sdpa")


def shift_left(x: torch.Tensor, n: int, fill: int | float | bool = 0) -> torch.Tensor:
    """``y[:, t] = x[:, t + n]``, ``fill`` past the end (dim 1)."""
    if n == 0:
        return x
    t = x.shape[1]
    pad = torch.full((x.shape[0], min(n, t), *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, n:], pad], dim=1)


def step_attention_mask(seq_len: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool [T, (step+1)*T]: which keys (step-major: all of step 0, then step 1...) step ``step`` queries see."""
    t = torch.arange(seq_len, device=device)
    blocks = [t[None, :] <= t[:, None]] + [t[None, :] == t[:, None]] * step
    return torch.cat(blocks, dim=1)


def _attend_eager(q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> torch.Tensor:
    groups = q.shape[1] // keys[0].shape[1]
    t = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    k0, v0 = repeat_kv(keys[0], groups), repeat_kv(values[0], groups)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    scores += [(q * repeat_kv(k, groups)).sum(-1, keepdim=True) * scale for k in keys[1:]]
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :t] @ v0
    for j, v in enumerate(values[1:]):
        out = out + probs[..., t + j : t + j + 1] * repeat_kv(v, groups)
    return out


def _attend_sdpa(q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> torch.Tensor:
    groups = q.shape[1] // keys[0].shape[1]
    k = repeat_kv(torch.cat(list(keys), dim=2), groups)
    v = repeat_kv(torch.cat(list(values), dim=2), groups)
    mask = step_attention_mask(q.shape[2], len(keys) - 1, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class TTTAttention:
    """Collects each step's keys/values and attends with the TTT mask; one instance per unrolled sequence."""

    def __init__(self, impl: str = "eager"):
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {impl!r}")
        self.impl = impl
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys.append(k)
        self.values.append(v)
        fn = _attend_sdpa if self.impl == "sdpa" else _attend_eager
        return fn(q, self.keys, self.values)


def resolve_attn_impl(impl: str, device: torch.device) -> str:
    """``auto``: explicit-mask SDPA on GPU (memory-efficient kernels), the cheaper eager form on CPU."""
    if impl == "auto":
        return "sdpa" if device.type == "cuda" else "eager"
    return impl


@torch.no_grad()
def target_distribution(
    last: torch.Tensor,
    target_head: HeadFn,
    used_ids: torch.Tensor,
    chunk_tokens: int = 1024,
    needed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax of the target logits over the draft vocabulary [B,T,N] fp32, target top-1 [B,T]).

    Chunked so that only ``chunk_tokens`` × V logits exist at a time (V = 163,840 for Kimi). ``needed``
    (``needed_target_positions``) limits the vocabulary-wide head, which dominates a CPU step, to the positions a
    TTT step reads; the others (prompt and padding, most of a batch) get zeros, never read.
    """
    b, t, h = last.shape
    n = used_ids.numel()
    flat = last.reshape(b * t, h)
    rows = None if needed is None else needed.reshape(b * t).nonzero().squeeze(1)
    if rows is not None:
        flat = flat[rows]
    if isinstance(target_head, torch.nn.Module):  # a store may hold bf16 features for an fp32 head (or vice versa)
        param = next(target_head.parameters(), None)
        if param is not None and param.is_floating_point():
            flat = flat.to(param.dtype)
    probs, tops = [], []
    top_and_columns = getattr(target_head, "top_and_columns", None)  # target.TargetHead: skips all-zero head rows
    for i in range(0, flat.shape[0], chunk_tokens):
        if top_and_columns is not None:
            top_i, used = top_and_columns(flat[i : i + chunk_tokens], used_ids)
        else:
            logits = target_head(flat[i : i + chunk_tokens]).float()
            top_i, used = logits.argmax(-1), logits[:, used_ids]
        tops.append(top_i)
        probs.append(torch.softmax(used, dim=-1))
    p = torch.cat(probs) if probs else last.new_zeros(0, n, dtype=torch.float32)
    top = torch.cat(tops) if tops else torch.zeros(0, dtype=torch.int64, device=last.device)
    if rows is None:  # every position (an empty batch views as its empty shape)
        return p.view(b, t, n), top.view(b, t)
    full_p = last.new_zeros(b * t, n, dtype=torch.float32)
    full_top = torch.zeros(b * t, dtype=torch.int64, device=last.device)
    full_p[rows], full_top[rows] = p, top
    return full_p.view(b, t, n), full_top.view(b, t)


def needed_target_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions whose target distribution a TTT step reads: step k at t reads t+1+k, weighted by mask[t+2+k]."""
    return shift_left(loss_mask.to(torch.bool), 1, False)


@dataclass
class TTTOutput:
    loss: torch.Tensor  # differentiable scalar: Σ_k w^k · loss_sum_k / denominator_k
    loss_sum: torch.Tensor  # [K] detached Σ over masked positions of the soft cross-entropy
    correct: torch.Tensor  # [K] loss-masked positions where d2t(argmax draft) == argmax target
    count: torch.Tensor  # [K] loss-masked positions (accuracy denominator)


def loss_mask_counts(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Loss-masked positions per TTT step ([K] float64), from the mask alone (known before any forward)."""
    m = loss_mask.to(torch.bool)
    return torch.stack([shift_left(m, 2 + k, False).sum() for k in range(steps)]).to(torch.float64)


def ttt_forward(
    model: Eagle3Draft,
    aux: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    target_p: torch.Tensor,
    target_top: torch.Tensor,
    *,
    steps: int = 7,
    step_weight: float = 0.8,
    denominators: torch.Tensor | None = None,
    attn_impl: str = "eager",
    return_logits: bool = False,
) -> TTTOutput | tuple[TTTOutput, list[torch.Tensor]]:
    """Unroll the draft ``steps`` times over a right-padded batch (see the module docstring for alignment).

    ``target_p``/``target_top`` are ``target_distribution`` of the *unshifted* sequence; this function
    applies the per-step shifts. Right padding needs no attention mask: causal and diagonal keys of a
    real position are never padding.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    b, t = input_ids.shape
    lm = loss_mask.to(torch.bool)
    n = target_p.shape[-1]
    tp = torch.cat([target_p, target_p.new_zeros(b, steps, n)], dim=1)
    top = torch.cat([target_top, target_top.new_zeros(b, steps)], dim=1)
    counts = loss_mask_counts(lm, steps).to(target_p.device)
    denom = counts.clamp_min(1.0) if denominators is None else denominators.to(target_p.device)

    hidden = model.project(aux)
    attend = TTTAttention(attn_impl)
    base = torch.arange(t, device=input_ids.device)
    total = hidden.new_zeros((), dtype=torch.float32)
    loss_sums, corrects, all_logits = [], [], []
    flat_tp, flat_top = tp.reshape(b * (t + steps), n), top.reshape(b * (t + steps))
    for k in range(steps):
        ids_k = shift_left(input_ids, 1 + k)
        hidden = model.step_hidden(hidden, ids_k, base + k, attend)
        # The head, the softmax and the loss only at the positions the loss reads (step k at t reads t+2+k's
        # mask): prompt and padding positions are most of a batch, and the head is vocabulary-wide. The same
        # sums as over every position with zero weights, in another order.
        lm_k = shift_left(lm, 2 + k, False)
        at = lm_k.reshape(b * t).nonzero().squeeze(1)
        src = (at // t) * (t + steps) + at % t + 1 + k  # index t+1+k of row at // t in the padded tp/top
        top_k = flat_top[src]
        logits = model.logits(hidden.reshape(b * t, -1)[at])
        logp = torch.log_softmax(logits.float(), dim=-1)
        ce = -(flat_tp[src] * logp).sum(-1)
        s = (ce * model.t2d[top_k]).sum()
        total = total + (step_weight**k) * s / denom[k]
        with torch.no_grad():
            pred = model.to_target_ids(logits.argmax(-1))
            corrects.append((pred == top_k).sum())
            loss_sums.append(s.detach())
        if return_logits:
            all_logits.append(model.logits(hidden))
    out = TTTOutput(
        loss=total,
        loss_sum=torch.stack(loss_sums).to(torch.float64),
        correct=torch.stack(corrects).to(torch.float64),
        count=counts,
    )
    return (out, all_logits) if return_logits else out


def step_accuracies(correct: Sequence[float], count: Sequence[float]) -> list[float]:
    return [float(c) / float(n) if float(n) > 0 else 0.0 for c, n in zip(correct, count, strict=True)]


def simulated_acceptance(acc: Sequence[float]) -> float:
    """Σ_k Π_{j≤k} acc_j: expected accepted draft tokens per round if step accuracies were independent.

    The acceptance length τ (tokens per target forward) is one more than this (the bonus token).
    """
    total, prod = 0.0, 1.0
    for a in acc:
        prod *= float(a)
        total += prod
    return total
