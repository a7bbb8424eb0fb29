"""Calibration through the SGLang engine: the target run in full where it cannot run in this process (Kimi, tp=8).

The engine that extracted a store scores its own input: each actual next token's log-probability and its own
top-1, the HF calibration's figures from the target's own forward and head (fields used and what this cannot
verify: docs/hidden-states.md, "SGLang stores: calibrated through the engine"). Wire details the docs leave out:
``input_token_logprobs`` are tuples from ``Engine.generate``, lists over HTTP, and entry 0 is None (the scheduler
pads ``[None] + values[:-1]``), so the last state at ``t`` is scored by entry ``t + 1``; ``input_top_logprobs[i][0]``
is the target's top-1 prediction of token ``i``. The log-probabilities and the returned last state come from one
forward, so a capture returning another state than the head reads is refused (``CalibrationMismatchError``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
from eagle_assets.hidden_states.sglang_wire import features_from_response
from eagle_assets.hidden_states.store_format import shard_name

SGLANG_SOURCE = "sglang"
Generate = Callable[..., Any]  # ``Engine.generate(**request)``


class CalibrationResponseError(TargetError, RuntimeError):
    """The engine's answer to a calibration request lacks the log-probabilities or is misaligned with the input."""


class CalibrationMismatchError(TargetError, RuntimeError):
    """The engine's returned last state does not reproduce the engine's own log-probabilities through the head."""


def build_calibration_request(batch: Sequence[HiddenStateSample]) -> dict[str, Any]:
    """One ``generate`` call scoring every input token of ``batch`` (see the module docstring for each field)."""
    return {
        "input_ids": [list(map(int, s.input_ids)) for s in batch],
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 1,
        "return_hidden_states": True,
    }


def scored_by_engine(
    response: Mapping[str, Any], sample: HiddenStateSample, positions: Sequence[int]
) -> tuple[list[int], list[float]]:
    """(the engine's top-1, its log-probability of the actual next token) at each position ``t`` of ``sample``."""
    meta = response.get("meta_info")
    if not isinstance(meta, Mapping) or "input_token_logprobs" not in meta or "input_top_logprobs" not in meta:
        raise CalibrationResponseError(
            f"sample {sample.sample_id}: no meta_info.input_token_logprobs / input_top_logprobs: send "
            "return_logprob=true, logprob_start_len=0, top_logprobs_num=1"
        )
    tokens, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    n = len(sample.input_ids)
    if len(tokens) != n or len(tops) != n:
        raise CalibrationResponseError(
            f"sample {sample.sample_id}: {len(tokens)} input log-probs and {len(tops)} top lists for {n} input "
            "tokens (logprob_start_len not 0? a cached prefix?)"
        )
    if tokens[0][0] is not None:
        raise CalibrationResponseError(
            f"sample {sample.sample_id}: the first input token has a log-prob; this SGLang pads it with None, so "
            "entries would be misaligned by one position"
        )
    top1, logprob = [], []
    for t in positions:
        entry, top = tokens[t + 1], tops[t + 1]
        if int(entry[1]) != int(sample.input_ids[t + 1]):
            raise CalibrationResponseError(
                f"sample {sample.sample_id}: input log-prob {t + 1} is for token {entry[1]}, the input has "
                f"{sample.input_ids[t + 1]}"
            )
        if not top:
            raise CalibrationResponseError(f"sample {sample.sample_id}: no top log-prob at input position {t + 1}")
        top1.append(int(top[0][1]))
        logprob.append(float(entry[0]))
    return top1, logprob


def calibrate_shard_engine(
    generate: Generate,
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
    """One store shard's calibration from the ``last`` engine: one request for the calibration samples.

    ``head`` is the target's head as the checks load it (``load_target_head``); ``compute_dtype`` is what the
    engine computes in (bf16 for Kimi), which bounds how precise a stored state can be.
    """
    config = config or FidelityConfig()
    per_sample = calibration_positions([list(s.loss_mask) for s in samples], config, key)
    asked = list(per_sample)
    answers = generate(**build_calibration_request([samples[i] for i in asked]))
    if isinstance(answers, Mapping):
        answers = [answers]
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
        last_parts.append(features_from_response(answer, samples[i], hidden_size)[torch.tensor(ts)])
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
            "layer? a pre-norm state?); no calibration is written"
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
        source=SGLANG_SOURCE,
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
