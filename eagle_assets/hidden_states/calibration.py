"""The target run in full on a few samples of a shard: what the fidelity checks hold a store to (docs/hidden-states.md).

Independent of the extraction on purpose: the extractor hooks layers and skips ``lm_head``; this runs the model's
own forward with ``output_hidden_states=True`` (logits only at the scored positions), so a capture bug (a shifted
position, a wrong or repeated layer, a last state the head does not read) makes the store disagree with this record
instead of agreeing with itself. A store of a target too large for this process is calibrated through its engine
(``calibration_engine.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

from eagle_assets.hidden_states.fidelity import (
    LAST,
    Calibration,
    FidelityConfig,
    NextTokenFigures,
    ShardCalibration,
    calibrate_shards,
    calibration_positions,
    head_predictions,
    logprob_noise,
    mean_norm,
    pairwise_differences,
    precision_eps,
    projection,
    signature,
    slot_names,
)
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.samples import HiddenStateSample, input_fingerprint
from eagle_assets.hidden_states.store_format import dtype_name
from eagle_assets.target.architecture import decoder_of, final_norm_of, num_decoder_layers

if TYPE_CHECKING:  # only a type here: transformers is imported where a model is loaded
    from transformers import PreTrainedModel


@torch.inference_mode()
def _full_run(
    model: nn.Module, ids: Sequence[int], positions: Sequence[int], last_kind: str
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The model's own forward on one sample: (state at the input of decoder layer j for j in 0..N-1, the last
    state as the store keeps it, the model's logits), each at ``positions`` only ([P, H], [P, H], [P, V])."""
    device = next(model.parameters()).device
    decoder = decoder_of(model)
    seen: dict[str, torch.Tensor] = {}
    hook = None
    if last_kind == "pre_norm":

        def grab(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            seen["pre_norm"] = args[0] if args else kwargs["hidden_states"]

        hook = final_norm_of(decoder).register_forward_pre_hook(grab, with_kwargs=True)
    index = torch.tensor(list(positions), device=device)
    try:
        out = model(
            input_ids=torch.tensor([list(ids)], device=device),
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=index,  # the head runs on these positions only, not on the whole vocabulary × length
        )
    finally:
        if hook is not None:
            hook.remove()
    hs = out.hidden_states
    last = seen["pre_norm"] if last_kind == "pre_norm" else hs[-1]
    pick = [h[0].index_select(0, index) for h in hs[:-1]]
    return pick, last[0].index_select(0, index), out.logits[0]


@torch.inference_mode()
def calibrate_shard(
    model: PreTrainedModel,
    layers: AuxLayers,
    samples: Sequence[HiddenStateSample],
    shard: str,
    key: str,
    *,
    store_dtype: torch.dtype,
    last_kind: str = "post_norm",
    config: FidelityConfig | None = None,
) -> ShardCalibration:
    """Run the target in full on the calibration samples of one shard and record what the checks compare with."""
    config = config or FidelityConfig()
    per_sample = calibration_positions([list(s.loss_mask) for s in samples], config, key)
    head = model.get_output_embeddings()
    n_layers = num_decoder_layers(model)
    if n_layers != layers.num_layers:
        raise ValueError(f"the store's aux layers are for {layers.num_layers} layers, the target has {n_layers}")
    names = [str(j) for j in range(n_layers)] + [LAST]
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    next_ids: list[int] = []
    groups: list[int] = []
    top1_parts, logprob_parts = [], []
    for i, ts in per_sample.items():
        states, last, logits = _full_run(model, samples[i].input_ids, ts, last_kind)
        for j, h in enumerate(states):
            rows[str(j)].append(h.float().cpu())
        rows[LAST].append(last.float().cpu())
        nxt = torch.tensor([int(samples[i].input_ids[t + 1]) for t in ts])
        lsm = torch.log_softmax(logits.float(), dim=-1).cpu()
        top1_parts.append(lsm.argmax(-1))
        logprob_parts.append(lsm.gather(-1, nxt[:, None])[:, 0])
        next_ids += nxt.tolist()
        groups += [i] * len(ts)
    stacked = {name: torch.cat(parts) for name, parts in rows.items()}
    ids = torch.tensor(next_ids)
    top1, logprob = torch.cat(top1_parts), torch.cat(logprob_parts)
    weight = head.weight
    final = final_norm_of(decoder_of(model)) if last_kind == "pre_norm" else None

    def logits_of(x: torch.Tensor) -> torch.Tensor:
        x = x.to(weight.dtype)
        return head(final(x) if final is not None else x)

    # The best a correct store can do: the true last state, rounded to the store dtype, through the same head.
    top1_rounded, _ = head_predictions(logits_of, stacked[LAST].to(store_dtype), ids, device=weight.device)
    eps = precision_eps(store_dtype, next(model.parameters()).dtype)
    noise = logprob_noise(
        logits_of, stacked[LAST], ids, eps, config.seed, logits_dtype=weight.dtype, device=weight.device
    )
    proj = projection(stacked[LAST].shape[1], config.signature_dims, config.seed)
    sig_rows = slice(0, config.signature_positions)
    slots = slot_names(layers.n_aux)
    slot_rows = [stacked[str(j)] for j in layers.hf_indices] + [stacked[LAST]]
    return ShardCalibration(
        shard=shard,
        key=key,
        input_fingerprint=input_fingerprint(samples),
        samples=[samples[i].sample_id for i in sorted(set(groups))],
        positions=[(i, t) for i, ts in per_sample.items() for t in ts],
        next_ids=next_ids,
        target_top1=top1.tolist(),
        target_logprob=logprob.tolist(),
        target=NextTokenFigures.of(top1, logprob, ids, groups),
        dtype_consistency=float((top1_rounded == top1).double().mean()),
        hf_indices=list(layers.hf_indices),
        norms={name: mean_norm(r) for name, r in stacked.items()},
        signatures={name: signature(r[sig_rows], proj).tolist() for name, r in stacked.items()},
        distinct=pairwise_differences(slots, slot_rows),
        logprob_noise=noise,
        source="hf",
    )


def calibrate_store(
    model: PreTrainedModel,
    shards: Sequence[tuple[str, Sequence[HiddenStateSample]]],
    layers: AuxLayers,
    *,
    model_id: str,
    store_dtype: torch.dtype,
    last_kind: str = "post_norm",
    config: FidelityConfig | None = None,
) -> Calibration:
    """The calibration file of a store: one record per corpus shard, in the store's shard order."""
    config = config or FidelityConfig()
    one = partial(calibrate_shard, model, layers, store_dtype=store_dtype, last_kind=last_kind, config=config)
    return Calibration(model_id, dtype_name(store_dtype), last_kind, config, calibrate_shards(shards, one))
