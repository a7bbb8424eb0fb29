"""The ``aux_layers`` check: shapes, finiteness, and each stored slot nearest to the layer it claims."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.check_verdict import (
    Verdict,
    calibration_problem,
    outcome,
    unreadable,
    where_of,
)
from eagle_assets.hidden_states.fidelity import (
    LAST,
    ShardCalibration,
    mean_norm,
    pairwise_differences,
    projection,
    relative_distance,
    signature,
    slot_names,
)
from eagle_assets.hidden_states.fidelity_spec import AUX_LAYERS, FidelityConfig
from eagle_assets.hidden_states.store_format import StoreMeta, dtype_name
from eagle_assets.hidden_states.store_shard import StoreShard, rows_at

EAGLE3_AUX = 3


def _scan_finite(shard: StoreShard, rows: Sequence[int], full: bool) -> dict[str, int]:
    """Non-finite values per feature: every row of the shard (``full``), else the given rows."""
    out = {}
    total = int(shard.tensor("sample_offsets")[-1].item())
    for feature in shard.meta.features:
        bad = 0
        if full:
            sl = shard._handle(shard.files[feature]).get_slice(feature)
            for lo in range(0, total, 4096):
                bad += int((~torch.isfinite(sl[lo : min(lo + 4096, total)].to(torch.float32))).sum())
        else:
            bad = int((~torch.isfinite(shard.rows(feature, rows))).sum())
        out[feature] = bad
    return out


def check_aux_layers(
    shard: StoreShard,
    calib: ShardCalibration | None,
    config: FidelityConfig,
    partition: str,
    extra_rows: Sequence[int] = (),
) -> CheckOutcome:
    where = where_of(partition, shard.name)
    damage = shard.damage()
    if damage:
        return unreadable(AUX_LAYERS, where, damage)
    v = Verdict()
    meta = shard.meta
    h, n_aux = meta.hidden_size, meta.layers.n_aux
    offsets = shard.tensor("sample_offsets").tolist()
    t_total = offsets[-1]
    v.failures.extend(_shape_failures(shard, t_total))
    misshapen = bool(v.failures)  # a slot cut at the wrong width cannot be compared with any layer
    problem = calibration_problem(shard, calib)
    cal_rows = rows_at(shard, offsets, calib.positions) if calib is not None and not problem else []
    feature_bytes = sum(p.stat().st_size for p in set(shard.files.values()))
    full = feature_bytes <= config.full_scan_bytes
    bad = _scan_finite(shard, [*cal_rows, *extra_rows], full)
    scanned = f"all {t_total} rows" if full else f"{len(cal_rows) + len(extra_rows)} sampled rows"
    v.metadata["non_finite"] = bad
    v.metadata["finite_scan"] = scanned
    for feature, count in bad.items():
        if count:
            v.failures.append(f"{count} NaN/inf values in {feature} ({scanned})")
    if problem or calib is None:
        v.failures.append(problem or "no calibration")
        return outcome(AUX_LAYERS, where, v, "")
    if misshapen:
        return outcome(AUX_LAYERS, where, v, "")
    if list(meta.layers.hf_indices) != list(calib.hf_indices):
        v.failures.append(f"the store claims layers {list(meta.layers.hf_indices)}, calibrated {calib.hf_indices}")
    names = slot_names(n_aux)
    aux = shard.rows("aux", cal_rows)
    slots = [aux[:, k * h : (k + 1) * h] for k in range(n_aux)]
    if "last" in meta.features:
        slots.append(shard.rows("last", cal_rows))
    else:
        names = names[:-1]
    distinct = pairwise_differences(names, slots)
    norms = {name: round(mean_norm(rows), 4) for name, rows in zip(names, slots, strict=False)}
    if not calib.has_layer_references:
        return _unreferenced_aux(v, where, distinct, norms, calib, config, meta, scanned)
    claimed = [str(j) for j in meta.layers.hf_indices] + [LAST]
    _identify_slots(v, names, slots, claimed, calib, config, h)
    v.metadata["norms"] = norms
    v.metadata["target_norms"] = {n: round(calib.norms[c], 4) for n, c in zip(names, claimed, strict=False)}
    for pair, value in distinct.items():  # at least a fraction of how much the target's own layers differ
        if (ref := calib.distinct.get(pair)) is not None:
            v.at_least(
                f"slots {pair} differ by", value, config.fraction * ref, f"{config.fraction} × the target's {ref:.4f}"
            )
    v.metadata["distinct"] = {pair: round(value, 6) for pair, value in distinct.items()}
    ok = f"layers {list(meta.layers.hf_indices)} + last identified, distinct, finite ({scanned}); norms " + ", ".join(
        f"{k} {x:.2f}" for k, x in norms.items()
    )
    return outcome(AUX_LAYERS, where, v, ok)


def _shape_failures(shard: StoreShard, t_total: int) -> list[str]:
    """Three aux slots of H and a last state of H per token: what an EAGLE-3 draft's fc takes."""
    meta = shard.meta
    h, n_aux = meta.hidden_size, meta.layers.n_aux
    failures = []
    if n_aux != EAGLE3_AUX:
        failures.append(f"{n_aux} aux layers stored, an EAGLE-3 draft takes exactly {EAGLE3_AUX} (fc is [3H → H])")
    aux_shape = shard.header("aux")["aux"]["shape"]
    if aux_shape != [t_total, n_aux * h]:
        failures.append(f"aux has shape {aux_shape}, expected [{t_total}, {n_aux * h}] = [tokens, {n_aux} × {h}]")
    if "last" in meta.features and shard.header("last")["last"]["shape"] != [t_total, h]:
        failures.append(f"last has shape {shard.header('last')['last']['shape']}, expected [{t_total}, {h}]")
    return failures


def _identify_slots(
    v: Verdict,
    names: Sequence[str],
    slots: Sequence[torch.Tensor],
    claimed: Sequence[str],
    calib: ShardCalibration,
    config: FidelityConfig,
    h: int,
) -> None:
    """Each slot must be nearest, by its signature, to the layer it claims, and close to it."""
    proj = projection(h, len(calib.signatures[LAST][0]), config.seed)
    refs = {layer: torch.tensor(ref, dtype=torch.float64) for layer, ref in calib.signatures.items()}
    # How far each true layer is from its nearest other one: a stored slot must sit within half of that of
    # the layer it claims, the target's own resolution (adjacent layers of the tiny target differ by ~3%).
    separation = {a: min(relative_distance(refs[b], refs[a]) for b in refs if b != a) for a in refs if len(refs) > 1}
    nearest_found: dict[str, str] = {}
    for name, rows, want in zip(names, slots, claimed, strict=False):
        sig = signature(rows[: len(refs[want])], proj)
        dist = {layer: relative_distance(sig, ref) for layer, ref in refs.items()}
        nearest = min(dist, key=dist.__getitem__)
        nearest_found[name] = nearest
        v.metadata[f"{name}_distance_to_claimed"] = round(dist[want], 6)
        said = "the last state" if want == LAST else f"layer {want}"
        if nearest != want:
            far = dist[nearest] > separation.get(nearest, math.inf) / 2
            found = "matches no layer of the target (nearest" if far else "is nearest to"
            label = "the last state" if nearest == LAST else f"layer {nearest}"
            v.failures.append(
                f"slot {name} claims {said} but {found} {label}{')' if far else ''}: relative signature distance "
                f"{dist[nearest]:.4f} to it, {dist[want]:.4f} to the claimed one"
            )
        elif dist[want] > separation.get(want, math.inf) / 2:
            v.failures.append(
                f"slot {name} is {dist[want]:.4f} from {said}, more than half its distance to the nearest other "
                f"layer ({separation[want]:.4f}): not that layer's states"
            )
    v.metadata["nearest_layers"] = nearest_found


def _unreferenced_aux(
    v: Verdict,
    where: str,
    distinct: dict[str, float],
    norms: dict[str, float],
    calib: ShardCalibration,
    config: FidelityConfig,
    meta: StoreMeta,
    scanned: str,
) -> CheckOutcome:
    """Against a calibration with no per-layer reference (an engine's), which layer a slot holds cannot be
    told: that fails unless ``allow_unreferenced_aux``, and either way the slots must not repeat one another (closer
    than one ulp of the store dtype) and the summary says the identity was not verified."""
    reason = (
        f"the calibration ({calib.source}) has no per-layer reference, so which layer each slot holds is not verified"
    )
    v.metadata["layer_identity"] = "not verified: " + reason
    if not config.allow_unreferenced_aux:
        v.failures.append(
            reason + " (verify the capture once with `python -m eagle_assets.hidden_states.extract_vllm parity` "
            "on a target that fits one GPU, then opt out explicitly with allow_unreferenced_aux=true)"
        )
    ulp = float(torch.finfo(meta.dtype).eps)
    rounded = {pair: round(value, 6) for pair, value in distinct.items()}
    for pair, value in rounded.items():
        v.at_least(f"slots {pair} differ by", value, ulp, f"one ulp of {dtype_name(meta.dtype)}")
    v.metadata.update(distinct=rounded, norms=norms, allow_unreferenced_aux=config.allow_unreferenced_aux)
    ok = (
        f"layers {list(meta.layers.hf_indices)} + last: identity NOT verified (allow_unreferenced_aux; {reason}); "
        f"distinct, finite ({scanned}); norms " + ", ".join(f"{k} {x:.2f}" for k, x in norms.items())
    )
    return outcome(AUX_LAYERS, where, v, ok)
