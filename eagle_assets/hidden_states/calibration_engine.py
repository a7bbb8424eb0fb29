"""Calibration through the engine that extracted the store: the target run in full where it cannot run in this
process (Kimi K2.5, tp=8).

The engine scores its own input: each actual next token's log-probability and its own top-1 (vLLM's
``prompt_logprobs``), the figures the HF calibration takes from the target's own forward and head (what this cannot
verify: docs/hidden-states.md, "Engine stores: calibrated through the engine"). The log-probabilities and the
returned last state come from one forward, so a capture returning another state than the head reads is refused
(``CalibrationMismatchError``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from eagle_assets.errors import TargetError
from eagle_assets.hidden_states.fidelity import (
    LAST,
    Calibration,
    FidelityConfig,
    NextTokenFigures,
    ShardCalibration,
    calibration_positions,
    head_predictions,
    logprob_noise,
    mean_norm,
    precision_eps,
    projection,
    signature,
)
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.samples import HiddenStateSample, input_fingerprint
from eagle_assets.hidden_states.store_format import shard_name

ENGINE_SOURCE = "vllm"


class CalibrationResponseError(TargetError, RuntimeError):
    """The engine's answer to a calibration request lacks the log-probabilities or is misaligned with the input."""


class CalibrationMismatchError(TargetError, RuntimeError):
    """The engine's returned last state does not reproduce the engine's own log-probabilities through the head."""


@dataclass(frozen=True)
class EngineScore:
    """One prompt as the engine saw it: its last state per token ``[L, H]``, and for each input token ``i >= 1``
    the engine's top-1 prediction of it and its log-probability (entry 0, which nothing predicts, is ``None``)."""

    last: torch.Tensor
    top1: Sequence[int | None]
    logprob: Sequence[float | None]


Score = Callable[[Sequence[HiddenStateSample]], list[EngineScore]]


def scored_by_engine(
    score: EngineScore, sample: HiddenStateSample, positions: Sequence[int]
) -> tuple[list[int], list[float]]:
    """(the engine's top-1, its log-probability of the actual next token) at each position ``t`` of ``sample``."""
    n = len(sample.input_ids)
    if len(score.top1) != n or len(score.logprob) != n or score.last.shape[0] != n:
        raise CalibrationResponseError(
            f"sample {sample.sample_id}: {len(score.logprob)} input log-probs and {score.last.shape[0]} states for "
            f"{n} input tokens (a cached prefix?)"
        )
    top1, logprob = [], []
    for t in positions:
        top, lp = score.top1[t + 1], score.logprob[t + 1]
        if top is None or lp is None:
            raise CalibrationResponseError(f"sample {sample.sample_id}: no log-prob at input position {t + 1}")
        top1.append(int(top))
        logprob.append(float(lp))
    return top1, logprob


def calibrate_shard_engine(
    score: Score,
    layers: AuxLayers,
    head: Callable[[torch.Tensor], torch.Tensor],
    samples: Sequence[HiddenStateSample],
    shard: str,
    key: str,
    *,
    hidden_size: int,
    store_dtype: torch.dtype,
    compute_dtype: torch.dtype = torch.bfloat16,
    config: FidelityConfig | None = None,
) -> ShardCalibration:
    """One store shard's calibration from the extraction's engine: one request for the calibration samples.

    ``head`` is the target's head as the checks load it (``load_target_head``); ``compute_dtype`` is what the
    engine computes in (bf16 for Kimi), which bounds how precise a stored state can be. ``head`` reads the state the
    engine returns (vLLM's is the final norm's input: ``load_target_head(path, "pre_norm")``).
    """
    config = config or FidelityConfig()
    per_sample = calibration_positions([list(s.loss_mask) for s in samples], config, key)
    asked = list(per_sample)
    answers = score([samples[i] for i in asked])
    if len(answers) != len(asked):
        raise CalibrationResponseError(f"{len(answers)} answers for {len(asked)} calibration prompts")
    top1: list[int] = []
    logprob: list[float] = []
    next_ids: list[int] = []
    groups: list[int] = []
    last_parts = []
    for i, answer in zip(asked, answers, strict=True):
        ts = per_sample[i]
        t1, lp = scored_by_engine(answer, samples[i], ts)
        top1 += t1
        logprob += lp
        next_ids += [int(samples[i].input_ids[t + 1]) for t in ts]
        groups += [i] * len(ts)
        if answer.last.shape[-1] != hidden_size:
            raise CalibrationResponseError(f"states {answer.last.shape[-1]} wide, the target's are {hidden_size}")
        last_parts.append(answer.last.float()[torch.tensor(ts)])
    last = torch.cat(last_parts)
    ids, top1_t, lp_t = torch.tensor(next_ids), torch.tensor(top1), torch.tensor(logprob)
    rounded_top1, own_lp = head_predictions(head, last.to(store_dtype), ids)
    eps = precision_eps(store_dtype, compute_dtype)
    noise = logprob_noise(head, last, ids, eps, config.seed, logits_dtype=compute_dtype)
    own = float((own_lp.double() - lp_t.double()).abs().mean())
    if not own <= config.deviation_factor * noise:
        raise CalibrationMismatchError(
            f"shard {shard} ({key}): the engine's returned last state, through the target's head, is off the "
            f"engine's own log-probabilities by {own:.4f} per position, more than {config.deviation_factor:g} × "
            f"the noise floor {noise:.4f}: the engine returns a state other than the one its head reads (another "
            "layer? the wrong side of the final norm?); no calibration is written"
        )
    proj = projection(hidden_size, config.signature_dims, config.seed)
    return ShardCalibration(
        shard=shard,
        key=key,
        input_fingerprint=input_fingerprint(samples),
        samples=[samples[i].sample_id for i in asked],
        positions=[(i, t) for i in asked for t in per_sample[i]],
        next_ids=next_ids,
        target_top1=top1,
        target_logprob=logprob,
        target=NextTokenFigures.of(top1_t, lp_t, ids, groups),
        dtype_consistency=float((rounded_top1 == top1_t).double().mean()),
        hf_indices=list(layers.hf_indices),
        norms={LAST: mean_norm(last)},
        signatures={LAST: signature(last[: config.signature_positions], proj).tolist()},
        distinct={},
        logprob_noise=noise,
        source=ENGINE_SOURCE,
    )


def calibration_is_current(
    existing: Calibration | None, shards: Sequence[tuple[str, Sequence[HiddenStateSample]]], config: FidelityConfig
) -> bool:
    """Whether a calibration already on disk covers these shards' inputs with these settings (a resumed pass
    with nothing left to do then starts no engine)."""
    if existing is None or existing.config != config or len(existing.shards) != len(shards):
        return False
    return all(
        (rec := existing.shards.get(shard_name(i))) is not None and rec.input_fingerprint == input_fingerprint(s)
        for i, (_, s) in enumerate(shards)
    )
