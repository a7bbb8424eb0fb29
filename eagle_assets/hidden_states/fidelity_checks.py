"""The hidden-state fidelity checks: a store shard against its corpus shard, the target's head and its calibration.

Three checks per store shard, each a ``CheckOutcome`` whose summary names the partition, the shard, the check and
the figure that failed (the Dagster asset checks on ``hidden_states`` are a thin layer over these):

- ``alignment``: the shard files are whole (a truncated copy is named with its bytes); the store holds exactly the
  corpus shard's samples, in order; for every sample, feature rows = input ids = loss-mask entries, the ids and the
  mask are the corpus's, and the mask covers exactly the response (``t >= prompt_len``).
- ``aux_layers``: aux is [T, 3H] and last [T, H]; no NaN or inf (every row of a shard up to
  ``full_scan_bytes``, else the sampled rows); at the calibration positions each stored slot is nearest, by its
  signature, to the layer it claims to be (a wrong or swapped layer names the layer it really is), the slots differ
  from each other and from the last state at least ``fraction`` as much as the target's own layers do (a repeated
  layer differs by 0), and their norms are recorded beside the target's.
- ``last_state_next_token``: the stored last state through the target's head (final norm first for a pre-norm
  store) at the calibration positions must reach ``fraction`` of the target's top-1 agreement with the next
  response token, of its top-1 itself (scaled by what rounding to the store dtype leaves, ``dtype_consistency``)
  and its mean log-probability less ``ln(1/fraction)``; over ``positions`` more positions spread over the whole
  shard, the same agreement and log-probability bounds less three standard errors (sampling).

Reads only what it needs: headers, the small id/mask/offset tensors, and single rows of the features (memory
mapped), so a 200 GB Kimi shard costs seconds, most of it the head's matmul (on the GPU when there is one).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.fidelity import (
    LAST,
    NextTokenFigures,
    ShardCalibration,
    head_predictions,
    mean_norm,
    mean_relative_difference,
    pick_positions,
    projection,
    proportion_se,
    read_calibration,
    relative_distance,
    signature,
    slot_names,
)
from eagle_assets.hidden_states.fidelity_spec import ALIGNMENT, AUX_LAYERS, CHECKS, NEXT_TOKEN, FidelityConfig
from eagle_assets.hidden_states.samples import HiddenStateSample, input_fingerprint
from eagle_assets.hidden_states.shard_file import read_shard_header
from eagle_assets.hidden_states.store_format import INDEX_NAME, StoreMeta, dtype_name

EAGLE3_AUX = 3


# ----------------------------------------------------------------------------------------------
# Reading one store shard


def describe_damage(path: Path) -> str | None:
    """None for a whole safetensors file, else what is wrong with it, with its bytes."""
    if not path.is_file():
        return f"{path.name} is missing"
    if read_shard_header(path) is not None:
        return None
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return f"{path.name} is damaged: its safetensors header cannot be read ({size:,} bytes on disk)"
    return f"{path.name} is truncated: {size:,} bytes on disk, its header describes {8 + n + end:,}"


@dataclass
class StoreShard:
    """One shard entry of a store's ``index.json``: its files, offsets, ids and mask, rows read on demand."""

    directory: Path
    name: str
    entry: dict[str, Any]
    meta: StoreMeta
    files: dict[str, Path] = field(default_factory=dict)  # feature → file
    _handles: dict[Path, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for fname, info in self.entry.get("files", {}).items():
            for feature in info["features"]:
                self.files[feature] = self.directory / fname

    def damage(self) -> list[str]:
        missing = [f for f in self.meta.features if f not in self.files]
        out = [f"no file holds feature {f!r} (index lists {sorted(self.files)})" for f in missing]
        for path in sorted(set(self.files.values())):
            why = describe_damage(path)
            if why:
                out.append(why)
        return out

    def _handle(self, path: Path) -> Any:
        if path not in self._handles:
            from safetensors import safe_open

            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path]

    def header(self, feature: str) -> dict[str, Any]:
        header = read_shard_header(self.files[feature])
        assert header is not None
        return header

    def tensor(self, name: str) -> torch.Tensor:
        """A small tensor of the first file (input_ids, loss_mask, sample_offsets)."""
        return self._handle(self.files["aux"]).get_tensor(name)

    def rows(self, feature: str, rows: Sequence[int]) -> torch.Tensor:
        """The given rows of a feature, in the given order, as float32 (one read per contiguous run)."""
        if not len(rows):
            return torch.empty(0, self.meta.width(feature))
        sl = self._handle(self.files[feature]).get_slice(feature)
        order = np.argsort(np.asarray(rows), kind="stable")
        sorted_rows = np.asarray(rows)[order]
        parts, start = [], 0
        for k in range(1, len(sorted_rows) + 1):
            if k == len(sorted_rows) or sorted_rows[k] != sorted_rows[k - 1] + 1:
                lo, hi = int(sorted_rows[start]), int(sorted_rows[k - 1]) + 1
                parts.append(sl[lo:hi].to(torch.float32))
                start = k
        out = torch.empty(len(rows), parts[0].shape[1])
        out[torch.as_tensor(order)] = torch.cat(parts)
        return out

    def close(self) -> None:
        self._handles.clear()


def open_store_shards(store_dir: str | Path) -> tuple[StoreMeta, list[StoreShard]]:
    directory = Path(store_dir)
    doc = json.loads((directory / INDEX_NAME).read_text())
    meta = StoreMeta.from_index(doc)
    shards = [StoreShard(directory, name, entry, meta) for name, entry in sorted(doc.get("shards", {}).items())]
    return meta, shards


# ----------------------------------------------------------------------------------------------
# The checks


def _where(partition: str, shard: str) -> str:
    return f"hidden_states {partition} {shard}"


@dataclass
class _Verdict:
    """Named figures with their thresholds; every one that falls short becomes a line of the summary."""

    failures: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def at_least(self, what: str, value: float, threshold: float, derivation: str) -> None:
        if not value >= threshold:  # NaN fails too
            self.failures.append(f"{what} {value:.4f} < {threshold:.4f} ({derivation})")

    def at_most(self, what: str, value: float, threshold: float, derivation: str) -> None:
        if not value <= threshold:  # NaN fails too
            self.failures.append(f"{what} {value:.4f} > {threshold:.4f} ({derivation})")


def _outcome(name: str, where: str, verdict: _Verdict, ok: str) -> CheckOutcome:
    if verdict.failures:
        summary = f"{where}: {name} FAILED: " + "; ".join(verdict.failures)
        verdict.metadata["failures"] = list(verdict.failures)
        return CheckOutcome(name, False, summary, verdict.metadata)
    return CheckOutcome(name, True, f"{where}: {name} passed: {ok}", verdict.metadata)


def _unreadable(name: str, where: str, why: Sequence[str]) -> CheckOutcome:
    return CheckOutcome(name, False, f"{where}: {name} FAILED: cannot read the shard: " + "; ".join(why), {})


def _no_calibration(name: str, where: str, why: str) -> CheckOutcome:
    return CheckOutcome(name, False, f"{where}: {name} FAILED: {why}", {})


def check_alignment(
    shard: StoreShard, samples: Sequence[HiddenStateSample], prompt_lens: Sequence[int], partition: str
) -> CheckOutcome:
    where = _where(partition, shard.name)
    damage = shard.damage()
    if damage:
        return CheckOutcome(ALIGNMENT, False, f"{where}: {ALIGNMENT} FAILED: " + "; ".join(damage), {})
    v = _Verdict()
    ids_store = shard.tensor("input_ids").to(torch.int64)
    mask_store = shard.tensor("loss_mask").to(torch.int64)
    offsets = shard.tensor("sample_offsets").tolist()
    t_total = offsets[-1] if offsets else 0
    for feature, width in ((f, shard.meta.width(f)) for f in shard.meta.features):
        shape = shard.header(feature)[feature]["shape"]
        if shape != [t_total, width]:
            v.failures.append(f"{feature} has shape {shape}, the sample offsets need [{t_total}, {width}]")
    if len(ids_store) != t_total or len(mask_store) != t_total:
        v.failures.append(f"{len(ids_store)} input ids and {len(mask_store)} mask entries for {t_total} feature rows")
    stored_ids = list(shard.entry.get("sample_ids", []))
    corpus_ids = [s.sample_id for s in samples]
    if stored_ids != corpus_ids:
        diff = next((k for k, (a, b) in enumerate(zip(stored_ids, corpus_ids, strict=False)) if a != b), None)
        v.failures.append(
            f"{len(stored_ids)} samples stored, {len(corpus_ids)} in the corpus shard"
            + (
                f"; first difference at sample {diff}: {stored_ids[diff]!r} vs {corpus_ids[diff]!r}"
                if diff is not None
                else ""
            )
        )
    if shard.entry.get("input_fingerprint") != input_fingerprint(samples):
        v.failures.append("the store was computed from other inputs than the corpus shard now holds (fingerprint)")
    bad_rows = bad_ids = bad_mask = bad_response = 0
    examples: list[str] = []
    for i, s in enumerate(samples[: len(offsets) - 1]):
        start, end = offsets[i], offsets[i + 1]
        n, corpus_mask = len(s.input_ids), list(s.loss_mask)
        if end - start != n or len(corpus_mask) != n:
            bad_rows += 1
            examples.append(f"{s.sample_id}: {end - start} rows, {n} ids, {len(corpus_mask)} mask entries")
            continue
        if ids_store[start:end].tolist() != list(s.input_ids):
            bad_ids += 1
            examples.append(f"{s.sample_id}: stored input ids differ from the corpus's")
        stored_mask = mask_store[start:end].tolist()
        if stored_mask != corpus_mask:
            bad_mask += 1
            examples.append(f"{s.sample_id}: stored loss mask differs from the corpus's")
        response = [int(t >= prompt_lens[i]) for t in range(n)]
        if stored_mask != response:
            bad_response += 1
            examples.append(
                f"{s.sample_id}: mask covers {sum(stored_mask)} tokens, the response is {n - prompt_lens[i]} "
                f"(prompt_len {prompt_lens[i]})"
            )
    for count, what in (
        (bad_rows, "feature rows ≠ input ids ≠ loss mask"),
        (bad_ids, "input ids not the corpus's"),
        (bad_mask, "loss mask not the corpus's"),
        (bad_response, "loss mask not exactly the response"),
    ):
        if count:
            v.failures.append(f"{count} of {len(samples)} samples with {what}")
    if examples:
        v.failures.append("e.g. " + "; ".join(examples[:3]))
    v.metadata.update(samples=len(samples), tokens=t_total, misaligned_samples=bad_rows + bad_ids + bad_mask)
    return _outcome(ALIGNMENT, where, v, f"{len(samples)} samples, {t_total} tokens, masks exactly on the responses")


def _calibration_problem(shard: StoreShard, calib: ShardCalibration | None) -> str | None:
    if calib is None:
        return (
            f"no calibration recorded for {shard.name}: the target was never run in full on it (both extraction "
            "backends calibrate each shard; re-materialize the partition)"
        )
    if calib.input_fingerprint != shard.entry.get("input_fingerprint"):
        return f"the calibration of {shard.name} was made on other inputs than the store holds: re-materialize"
    return None


def _rows_at(shard: StoreShard, offsets: Sequence[int], positions: Sequence[tuple[int, int]], shift: int = 0):
    return [offsets[i] + t + shift for i, t in positions]


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
    where = _where(partition, shard.name)
    damage = shard.damage()
    if damage:
        return _unreadable(AUX_LAYERS, where, damage)
    v = _Verdict()
    meta = shard.meta
    h, n_aux = meta.hidden_size, meta.layers.n_aux
    offsets = shard.tensor("sample_offsets").tolist()
    t_total = offsets[-1]
    if n_aux != EAGLE3_AUX:
        v.failures.append(f"{n_aux} aux layers stored, an EAGLE-3 draft takes exactly {EAGLE3_AUX} (fc is [3H → H])")
    aux_shape = shard.header("aux")["aux"]["shape"]
    if aux_shape != [t_total, n_aux * h]:
        v.failures.append(f"aux has shape {aux_shape}, expected [{t_total}, {n_aux * h}] = [tokens, {n_aux} × {h}]")
    if "last" in meta.features and shard.header("last")["last"]["shape"] != [t_total, h]:
        v.failures.append(f"last has shape {shard.header('last')['last']['shape']}, expected [{t_total}, {h}]")
    misshapen = bool(v.failures)  # a slot cut at the wrong width cannot be compared with any layer
    problem = _calibration_problem(shard, calib)
    cal_rows = _rows_at(shard, offsets, calib.positions) if calib is not None and not problem else []
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
        return _outcome(AUX_LAYERS, where, v, "")
    if misshapen:
        return _outcome(AUX_LAYERS, where, v, "")
    if list(meta.layers.hf_indices) != list(calib.hf_indices):
        v.failures.append(f"the store claims layers {list(meta.layers.hf_indices)}, calibrated {calib.hf_indices}")
    names = slot_names(n_aux)
    aux = shard.rows("aux", cal_rows)
    slots = [aux[:, k * h : (k + 1) * h] for k in range(n_aux)]
    if "last" in meta.features:
        slots.append(shard.rows("last", cal_rows))
    else:
        names = names[:-1]
    if not calib.has_layer_references:
        return _unreferenced_aux(v, where, names, slots, calib, config, meta, scanned)
    claimed = [str(j) for j in meta.layers.hf_indices] + [LAST]
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
    norms = {name: round(mean_norm(rows), 4) for name, rows in zip(names, slots, strict=False)}
    v.metadata["norms"] = norms
    v.metadata["target_norms"] = {n: round(calib.norms[c], 4) for n, c in zip(names, claimed, strict=False)}
    distinct = {}
    for a in range(len(slots)):
        for b in range(a + 1, len(slots)):
            pair = f"{names[a]}~{names[b]}"
            value = mean_relative_difference(slots[a], slots[b])
            distinct[pair] = round(value, 6)
            ref = calib.distinct.get(pair)
            if ref is not None:
                v.at_least(
                    f"slots {pair} differ by",
                    value,
                    config.fraction * ref,
                    f"{config.fraction} × the target's {ref:.4f}",
                )
    v.metadata["distinct"] = distinct
    ok = f"layers {list(meta.layers.hf_indices)} + last identified, distinct, finite ({scanned}); norms " + ", ".join(
        f"{k} {x:.2f}" for k, x in norms.items()
    )
    return _outcome(AUX_LAYERS, where, v, ok)


def _unreferenced_aux(
    v: _Verdict,
    where: str,
    names: Sequence[str],
    slots: Sequence[torch.Tensor],
    calib: ShardCalibration,
    config: FidelityConfig,
    meta: StoreMeta,
    scanned: str,
) -> CheckOutcome:
    """Aux layers against a calibration with no per-layer reference (the SGLang engine's): which layer a slot
    holds cannot be told. Without ``allow_unreferenced_aux`` that fails; with it, the slots are still checked
    not to repeat one another (closer than one ulp of the store dtype), their norms are recorded, and the
    summary and metadata say the layers' identity was not verified."""
    reason = (
        f"the calibration ({calib.source}) has no per-layer reference, so which layer each slot holds is not verified"
    )
    v.metadata["layer_identity"] = "not verified: " + reason
    if not config.allow_unreferenced_aux:
        v.failures.append(
            reason + " (verify the capture once with `python -m eagle_assets.hidden_states.extract_sglang parity` "
            "on a target that fits one GPU, then opt out explicitly with allow_unreferenced_aux=true)"
        )
    ulp = float(torch.finfo(meta.dtype).eps)
    distinct = {}
    for a in range(len(slots)):
        for b in range(a + 1, len(slots)):
            pair = f"{names[a]}~{names[b]}"
            distinct[pair] = round(mean_relative_difference(slots[a], slots[b]), 6)
            v.at_least(f"slots {pair} differ by", distinct[pair], ulp, f"one ulp of {dtype_name(meta.dtype)}")
    norms = {name: round(mean_norm(rows), 4) for name, rows in zip(names, slots, strict=False)}
    v.metadata.update(distinct=distinct, norms=norms, allow_unreferenced_aux=config.allow_unreferenced_aux)
    ok = (
        f"layers {list(meta.layers.hf_indices)} + last: identity NOT verified (allow_unreferenced_aux; {reason}); "
        f"distinct, finite ({scanned}); norms " + ", ".join(f"{k} {x:.2f}" for k, x in norms.items())
    )
    return _outcome(AUX_LAYERS, where, v, ok)


def spread_positions(shard: StoreShard, config: FidelityConfig, key: str) -> list[tuple[int, int]]:
    masks = []
    offsets = shard.tensor("sample_offsets").tolist()
    mask = shard.tensor("loss_mask").numpy()
    for i in range(len(offsets) - 1):
        masks.append(mask[offsets[i] : offsets[i + 1]])
    return pick_positions(masks, config.positions, config.seed, key, "spread")


def _paired_bounds(
    v: _Verdict,
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
    where = _where(partition, shard.name)
    damage = shard.damage()
    if damage:
        return _unreadable(NEXT_TOKEN, where, damage)
    if "last" not in shard.meta.features:
        return _no_calibration(NEXT_TOKEN, where, "the store keeps no last hidden state to check")
    last_shape = shard.header("last")["last"]["shape"]
    if last_shape[1:] != [shard.meta.hidden_size]:
        why = f"last has shape {last_shape}, expected [tokens, {shard.meta.hidden_size}]"
        return CheckOutcome(NEXT_TOKEN, False, f"{where}: {NEXT_TOKEN} FAILED: {why}", {})
    problem = _calibration_problem(shard, calib)
    if problem or calib is None:
        return _no_calibration(NEXT_TOKEN, where, problem or "no calibration")
    v = _Verdict()
    offsets = shard.tensor("sample_offsets").tolist()
    ids = shard.tensor("input_ids").to(torch.int64)
    target = calib.target
    cal_rows = _rows_at(shard, offsets, calib.positions)
    cal_next = torch.tensor(calib.next_ids)
    top1, logprob = head_predictions(head, shard.rows("last", cal_rows), cal_next, device=device)
    groups = [i for i, _ in calib.positions]
    paired = NextTokenFigures.of(top1, logprob, cal_next, groups)
    consistency = float((top1 == torch.tensor(calib.target_top1)).double().mean())
    deviation = float((logprob.double() - torch.tensor(calib.target_logprob, dtype=torch.float64)).abs().mean())
    _paired_bounds(v, paired, consistency, deviation, calib, config, dtype_name(shard.meta.dtype))
    f = config.fraction
    spread_rows = _rows_at(shard, offsets, spread)
    spread_next = ids[_rows_at(shard, offsets, spread, shift=1)] if spread else torch.empty(0, dtype=torch.long)
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
    return _outcome(NEXT_TOKEN, where, v, ok)


@dataclass(frozen=True)
class CorpusShard:
    """What the checks need of a corpus shard: its samples (ids, masks) and each sample's prompt length."""

    key: str
    samples: Sequence[HiddenStateSample]
    prompt_lens: Sequence[int]


def run_fidelity_checks(
    store_dir: str | Path,
    corpus: Sequence[CorpusShard],
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    partition: str,
    device: torch.device | str = "cpu",
    config: FidelityConfig | None = None,
) -> list[CheckOutcome]:
    """The three checks over every shard of a store (``corpus[k]`` is store shard k), one outcome per check."""
    config = config or FidelityConfig()
    _, shards = open_store_shards(store_dir)
    calibration = read_calibration(store_dir)
    by_check: dict[str, list[CheckOutcome]] = {name: [] for name in CHECKS}
    if len(shards) != len(corpus):
        why = f"the store holds {len(shards)} shards, the corpus {len(corpus)}"
        return [CheckOutcome(name, False, f"hidden_states {partition}: {name} FAILED: {why}", {}) for name in CHECKS]
    for shard, source in zip(shards, corpus, strict=True):
        calib = calibration.shards.get(shard.name) if calibration is not None else None
        try:
            by_check[ALIGNMENT].append(check_alignment(shard, source.samples, source.prompt_lens, partition))
            spread = spread_positions(shard, config, source.key) if not shard.damage() else []
            offsets = shard.tensor("sample_offsets").tolist() if not shard.damage() else []
            by_check[AUX_LAYERS].append(
                check_aux_layers(shard, calib, config, partition, _rows_at(shard, offsets, spread))
            )
            by_check[NEXT_TOKEN].append(check_next_token(shard, head, device, calib, config, partition, spread))
        finally:
            shard.close()
    return [merge_outcomes(name, outcomes) for name, outcomes in by_check.items()]


def merge_outcomes(name: str, outcomes: Sequence[CheckOutcome]) -> CheckOutcome:
    """One outcome per check for a whole store: failed if any shard failed, every failing shard's summary."""
    if len(outcomes) == 1:
        return outcomes[0]
    failed = [o for o in outcomes if not o.passed]
    chosen = failed or list(outcomes)
    metadata: dict[str, float | int | str] = {f"{i}": o.summary for i, o in enumerate(outcomes)}
    return CheckOutcome(name, not failed, " | ".join(o.summary for o in chosen), metadata)
