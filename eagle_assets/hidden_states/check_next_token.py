"""The ``last_state_next_token`` check: the stored last state through the target's head predicts as the target does."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import pairwise

import torch

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.check_verdict import (
    Verdict,
    calibration_problem,
    failed,
    outcome,
    unreadable,
    where_of,
)
from eagle_assets.hidden_states.fidelity import (
    NextTokenFigures,
    ShardCalibration,
    head_predictions,
    pick_positions,
    proportion_se,
)
from eagle_assets.hidden_states.fidelity_spec import NEXT_TOKEN, FidelityConfig
from eagle_assets.hidden_states.store_format import dtype_name
from eagle_assets.hidden_states.store_shard import StoreShard, rows_at


def spread_positions(shard: StoreShard, config: FidelityConfig, key: str) -> list[tuple[int, int]]:
    mask = shard.tensor("loss_mask").numpy()
    masks = [mask[a:b] for a, b in pairwise(shard.tensor("sample_offsets").tolist())]
    return pick_positions(masks, config.positions, config.seed, key, "spread")


def _paired_bounds(
    v: Verdict,
    paired: NextTokenFigures,
    consistency: float,
    deviation: float,
    calib: ShardCalibration,
    config: FidelityConfig,
    store_dtype: str,
) -> None:
    """The store against the target at the same positions: each bound is what the calibration sample allows a
    correct store (its size, through the standard error of a share; its noise floor), never looser than the
    fraction ``config.fraction`` of the target's figure.

    Paired, so much tighter than comparing two means: a last state one layer short, or a pre-norm state read as
    post-norm, keeps ~98-100% of the top-1s of the tiny target and its mean log-probability within 0.02, but moves
    the log-probability of each position by 15-30 times the noise floor.
    """
    f, n, target = config.fraction, paired.n, calib.target
    dc = calib.dtype_consistency
    se_a, se_c = proportion_se(target.agreement, n), proportion_se(dc, n)
    source = f"the target run in full on {len(calib.samples)} calibration samples" + (
        " (through the engine's log-probabilities)" if calib.source != "hf" else ""
    )
    agreement_floor = max(f * target.agreement, target.agreement - (1.0 - dc) - 3 * se_a)
    v.at_least(
        "top-1 agreement",
        paired.agreement,
        agreement_floor,
        f"{target.agreement:.4f} of {source}, less what rounding to {store_dtype} flips ({1.0 - dc:.4f}) and 3 "
        f"standard errors of {n} positions ({se_a:.4f}); at least {f} × it",
    )
    v.at_least(
        "top-1 consistency with the target",
        consistency,
        max(f * dc, dc - 3 * se_c),
        f"{dc:.4f}, what rounding to {store_dtype} leaves, less 3 standard errors of {n} positions ({se_c:.4f})",
    )
    margin = config.logprob_margin
    v.at_most(
        "mean log-prob off the target's by",
        abs(paired.mean_logprob - target.mean_logprob),
        margin,
        f"ln(1/{f}) either way of {target.mean_logprob:.4f}, {source}",
    )
    if calib.logprob_noise is None:
        v.failures.append("the calibration has no log-prob noise floor (made by an older version): re-materialize")
        return
    v.at_most(
        "log-prob deviation from the target, mean over positions,",
        deviation,
        config.deviation_factor * calib.logprob_noise,
        f"{config.deviation_factor:g} × {calib.logprob_noise:.4f}, what half an ulp of {store_dtype} moves them",
    )


def check_next_token(
    shard: StoreShard,
    head: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device | str,
    calib: ShardCalibration | None,
    config: FidelityConfig,
    partition: str,
    spread: Sequence[tuple[int, int]],
) -> CheckOutcome:
    where = where_of(partition, shard.name)
    damage = shard.damage()
    if damage:
        return unreadable(NEXT_TOKEN, where, damage)
    if "last" not in shard.meta.features:
        return failed(NEXT_TOKEN, where, "the store keeps no last hidden state to check")
    last_shape = shard.header("last")["last"]["shape"]
    if last_shape[1:] != [shard.meta.hidden_size]:
        return failed(NEXT_TOKEN, where, f"last has shape {last_shape}, expected [tokens, {shard.meta.hidden_size}]")
    problem = calibration_problem(shard, calib)
    if problem or calib is None:
        return failed(NEXT_TOKEN, where, problem or "no calibration")
    v = Verdict()
    offsets = shard.tensor("sample_offsets").tolist()
    ids = shard.tensor("input_ids").to(torch.int64)
    target = calib.target
    cal_rows = rows_at(shard, offsets, calib.positions)
    cal_next = torch.tensor(calib.next_ids)
    top1, logprob = head_predictions(head, shard.rows("last", cal_rows), cal_next, device=device)
    groups = [i for i, _ in calib.positions]
    paired = NextTokenFigures.of(top1, logprob, cal_next, groups)
    consistency = float((top1 == torch.tensor(calib.target_top1)).double().mean())
    deviation = float((logprob.double() - torch.tensor(calib.target_logprob, dtype=torch.float64)).abs().mean())
    _paired_bounds(v, paired, consistency, deviation, calib, config, dtype_name(shard.meta.dtype))
    f = config.fraction
    spread_rows = rows_at(shard, offsets, spread)
    spread_next = ids[rows_at(shard, offsets, spread, shift=1)] if spread else torch.empty(0, dtype=torch.long)
    s_top1, s_logprob = head_predictions(head, shard.rows("last", spread_rows), spread_next, device=device)
    wide = NextTokenFigures.of(s_top1, s_logprob, spread_next, [i for i, _ in spread])
    if wide.n:
        se_a = math.sqrt(wide.agreement_se**2 + target.agreement_se**2)
        se_lp = math.sqrt(wide.logprob_se**2 + target.logprob_se**2)
        v.at_least(
            f"top-1 agreement over {wide.n} positions of the whole shard",
            wide.agreement,
            f * target.agreement - 3 * se_a,
            f"{f} × {target.agreement:.4f} − 3 standard errors ({se_a:.4f})",
        )
        v.at_least(
            f"mean log-prob over {wide.n} positions of the whole shard",
            wide.mean_logprob,
            target.mean_logprob - config.logprob_margin - 3 * se_lp,
            f"{target.mean_logprob:.4f} − ln(1/{f}) − 3 standard errors ({se_lp:.4f})",
        )
    v.metadata.update(
        agreement=round(paired.agreement, 6),
        mean_logprob=round(paired.mean_logprob, 6),
        consistency=round(consistency, 6),
        logprob_deviation=round(deviation, 6),
        logprob_noise=round(calib.logprob_noise, 6) if calib.logprob_noise is not None else None,
        calibration_source=calib.source,
        target_agreement=round(target.agreement, 6),
        target_mean_logprob=round(target.mean_logprob, 6),
        dtype_consistency=round(calib.dtype_consistency, 6),
        calibration_positions=paired.n,
        shard_agreement=round(wide.agreement, 6) if wide.n else None,
        shard_mean_logprob=round(wide.mean_logprob, 6) if wide.n else None,
        shard_positions=wide.n,
    )
    ok = (
        f"top-1 agreement {paired.agreement:.4f} (target {target.agreement:.4f}), consistency {consistency:.4f}, "
        f"mean log-prob {paired.mean_logprob:.4f} (target {target.mean_logprob:.4f}), log-prob deviation "
        f"{deviation:.4f} (noise floor {calib.logprob_noise or 0.0:.4f}); whole shard "
        f"{wide.agreement:.4f} / {wide.mean_logprob:.4f} over {wide.n} positions"
    )
    return outcome(NEXT_TOKEN, where, v, ok)
