"""Stages 1 and 2 of ``scripts/device_check.py``: the tiny target, and the corpus it writes for the later stages.

Why it is a module of its own: the runbook outgrew one file, and this is what every later stage reads. The corpus
is random prompts continued greedily by the tiny target itself (``make_corpus``), checked against a cache-free
recompute (``check_greedy_paths``; ``greedy_no_cache`` is also the speculative-output check's reference). ``Sizes``
lives here, with the corpus that is the first stage it scales, so that imports go one way: ``device_check`` imports
this module, which imports ``device_check_report`` and nothing of the runbook's script.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from device_check_report import Check, Report


@dataclass(frozen=True)
class Sizes:
    """How much work each stage does; the CUDA defaults fit ~1 minute of an H200 after CUDA starts."""

    train_samples: int
    eval_prompts: int
    prompt_len: tuple[int, ...]
    response_len: tuple[int, int]
    train_steps: int
    draft_vocab: int
    max_new_tokens: int


SIZES = {
    "cuda": Sizes(256, 16, (16, 24, 32, 48), (48, 128), 300, 4096, 48),
    "cpu": Sizes(48, 6, (16, 24, 32), (32, 64), 40, 2048, 32),
}


# ----------------------------------------------------------------------------------------------
# 1. The tiny target


def build_target(work: Path, safe_output: bool, name: str = "llama-tiny") -> Path:
    """The tiny Llama, or the tiny Kimi K2.5 (kimi_k25 around DeepSeek-V3: MLA, MoE; ``target/tiny_kimi.py``)."""
    if name == "kimi-k25-tiny":
        from eagle_assets.target.tiny_kimi import TinyKimiSpec, build_tiny_kimi_target

        return build_tiny_kimi_target(work / "target", spec=TinyKimiSpec(seed=0, text_safe_output=safe_output))
    from eagle_assets.target.tiny import TinyTargetSpec, build_tiny_target

    return build_tiny_target(work / "target", spec=TinyTargetSpec(seed=0, text_safe_output=safe_output))


# ----------------------------------------------------------------------------------------------
# 2. The corpus: random prompts, the target's own greedy continuations


@torch.inference_mode()
def greedy_batch(model: Any, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuations of equal-length prompts [B, P] → [B, new_tokens], one KV cache for the batch.

    Batched (no padding needed at equal lengths) because one sequence at a time costs a kernel-launch-bound forward
    per token per sample on a GPU; the cache argument is spelt as ``draft.target`` spells it for this transformers.
    """
    from eagle_assets.draft.target import cache_kwarg, make_cache

    cache = make_cache(model)
    kw = {cache_kwarg(model): cache, "use_cache": True}
    b, p = prompts.shape
    logits = model(input_ids=prompts, logits_to_keep=1, **kw).logits
    nxt = logits[:, -1].argmax(-1)
    out = [nxt]
    for pos in range(p, p + new_tokens - 1):
        position = torch.full((b, 1), pos, dtype=torch.long, device=prompts.device)
        nxt = model(input_ids=nxt[:, None], position_ids=position, **kw).logits[:, -1].argmax(-1)
        out.append(nxt)
    return torch.stack(out, dim=1)


@torch.inference_mode()
def greedy_no_cache(model: Any, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The reference: the whole sequence through the model at every step (no cache to get wrong)."""
    device = next(model.parameters()).device
    ids = list(prompt)
    for _ in range(new_tokens):
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def random_prompts(n: int, length: int, rng: torch.Generator) -> torch.Tensor:
    """[BOS] + ordinary ids (below the Kimi specials, which start at 163,584)."""
    from eagle_assets.target.tiny import KIMI_BOS_ID

    body = torch.randint(0, KIMI_BOS_ID, (n, length - 1), generator=rng)
    return torch.cat([torch.full((n, 1), KIMI_BOS_ID), body], dim=1)


@dataclass
class Corpus:
    samples: list[dict[str, Any]]  # sample_id, input_ids, loss_mask (as the corpus shard's rows)
    prompt_lens: list[int]
    eval_prompts: list[list[int]]


def make_corpus(model: Any, sizes: Sizes, device: torch.device) -> Corpus:
    rng = torch.Generator().manual_seed(1234)
    cut = random.Random(1234)
    groups = len(sizes.prompt_len)
    per_group = math.ceil(sizes.train_samples / groups)
    samples: list[dict[str, Any]] = []
    prompt_lens: list[int] = []
    lo, hi = sizes.response_len
    for length in sizes.prompt_len:
        prompts = random_prompts(per_group, length, rng)
        responses = greedy_batch(model, prompts.to(device), hi).cpu()
        for prompt, response in zip(prompts.tolist(), responses.tolist(), strict=True):
            if len(samples) == sizes.train_samples:
                break
            r = cut.randint(lo, hi)
            samples.append(
                {
                    "sample_id": f"s{len(samples):05d}",
                    "input_ids": prompt + response[:r],
                    "loss_mask": [0] * len(prompt) + [1] * r,
                }
            )
            prompt_lens.append(len(prompt))
    eval_prompts = random_prompts(sizes.eval_prompts, sizes.prompt_len[0], torch.Generator().manual_seed(99)).tolist()
    return Corpus(samples, prompt_lens, eval_prompts)


def check_greedy_paths(model: Any, corpus: Corpus, report: Report) -> None:
    """The tests' ``generate_greedy`` reference loop and the batched loop against a
    cache-free recompute: a KV-cache argument this transformers ignores would decode each token without context."""
    from tests.draft.helpers import generate_greedy

    n = 16
    worst = {"generate_greedy": n, "batched": n}
    for s, p in zip(corpus.samples[:2], corpus.prompt_lens[:2], strict=True):
        prompt, given = s["input_ids"][:p], s["input_ids"][p : p + n]
        ref = greedy_no_cache(model, prompt, n)
        for name, got in (("generate_greedy", generate_greedy(model, prompt, n, eos_id=None)), ("batched", given)):
            same = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), len(ref))
            worst[name] = min(worst[name], same)
    ok = all(v == n for v in worst.values())
    report.check(
        Check(
            "greedy_kv_cache",
            ok,
            f"first {n} greedy tokens equal to a cache-free recompute on 2 prompts: "
            + ", ".join(f"{k} {v}/{n}" for k, v in worst.items()),
            {"agreeing_prefix": worst},
        )
    )
