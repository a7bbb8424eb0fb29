"""What the hidden-state fidelity checks share: their settings, the positions they look at, the figures.

Why every threshold is a fraction of what the target itself does on a calibration sample of the same shard:
docs/hidden-states.md. A *scored* position ``t`` is one whose next token is a response token (``loss_mask[t+1]``):
there the last state at ``t`` must predict ``input_ids[t+1]`` through the target's head. Every choice of positions
is seeded by the shard's key, so a rerun looks at the same ones.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_assets.durable_files import atomic_write_bytes
from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import shard_name

CALIBRATION_NAME = "fidelity_calibration.json"
CALIBRATION_FORMAT = "eagle-forge-fidelity-calibration/1"
LAST = "last"


def _rng(seed: int, shard_key: str, purpose: str) -> random.Random:
    digest = hashlib.blake2b(f"{seed}:{shard_key}:{purpose}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def scored_positions(loss_mask: Sequence[int] | np.ndarray) -> np.ndarray:
    """Positions ``t`` whose next token is a response token (what the last state at ``t`` must predict)."""
    mask = np.asarray(loss_mask, dtype=np.uint8)
    return np.flatnonzero(mask[1:] != 0)


def pick_calibration_samples(masks: Sequence[Sequence[int]], config: FidelityConfig, shard_key: str) -> list[int]:
    """Samples (indices into the shard) the target runs in full on: some with scored positions, seeded."""
    candidates = [i for i, m in enumerate(masks) if len(scored_positions(m))]
    rng = _rng(config.seed, shard_key, "calibration")
    return sorted(rng.sample(candidates, min(config.calibration_samples, len(candidates))))


def pick_positions(
    masks: Sequence[Sequence[int] | np.ndarray],
    n: int,
    seed: int,
    shard_key: str,
    purpose: str,
    samples: Sequence[int] | None = None,
) -> list[tuple[int, int]]:
    """Up to ``n`` scored positions ``(sample index, t)`` drawn uniformly among those of ``samples`` (all)."""
    pool = list(range(len(masks))) if samples is None else list(samples)
    per_sample = [scored_positions(masks[i]) for i in pool]
    counts = np.array([len(p) for p in per_sample], dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return []
    rng = _rng(seed, shard_key, purpose)
    chosen = sorted(rng.sample(range(total), min(n, total)))
    ends = np.cumsum(counts)
    out = []
    for flat in chosen:
        k = int(np.searchsorted(ends, flat, side="right"))
        start = int(ends[k] - counts[k])
        out.append((pool[k], int(per_sample[k][flat - start])))
    return out


def calibration_positions(
    masks: Sequence[Sequence[int]], config: FidelityConfig, shard_key: str
) -> dict[int, list[int]]:
    """Where a shard's calibration runs the target, whatever runs it (in process or the engine): the chosen samples
    that drew positions, in order, each with its positions. A shard with nothing to predict is refused."""
    chosen = pick_calibration_samples(masks, config, shard_key)
    if not chosen:
        raise ValueError(
            f"corpus shard {shard_key}: no sample has a response token to predict; nothing to calibrate on"
        )
    positions = pick_positions(masks, config.positions, config.seed, shard_key, "calibration-positions", chosen)
    per_sample = {i: [t for j, t in positions if j == i] for i in chosen}
    return {i: ts for i, ts in per_sample.items() if ts}


# ----------------------------------------------------------------------------------------------
# Next-token figures


@torch.no_grad()
def head_predictions(
    head: Callable[[torch.Tensor], torch.Tensor],
    last: torch.Tensor,
    next_ids: torch.Tensor,
    *,
    device: torch.device | str = "cpu",
    chunk: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 id, log-probability of the actual next token) at each row of ``last`` [n, H] through ``head``, in
    chunks: one row of log-probabilities is a vocabulary wide (163,840 floats for Kimi)."""
    top1, logprob = [], []
    for i in range(0, last.shape[0], chunk):
        logits = head(last[i : i + chunk].to(device)).float()
        lsm = torch.log_softmax(logits, dim=-1)
        ids = next_ids[i : i + chunk].to(lsm.device)
        top1.append(lsm.argmax(-1).cpu())
        logprob.append(lsm.gather(-1, ids[:, None])[:, 0].cpu())
    if not top1:
        return torch.empty(0, dtype=torch.long), torch.empty(0)
    return torch.cat(top1), torch.cat(logprob)


def clustered_mean(values: Sequence[float] | np.ndarray, groups: Sequence[int]) -> tuple[float, float]:
    """Mean and its standard error, with positions of one sample counted as one cluster (they are correlated)."""
    v = np.asarray(values, dtype=np.float64)
    g = np.asarray(groups)
    n = len(v)
    if n == 0:
        return float("nan"), float("nan")
    mean = float(v.mean())
    iid = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    labels = np.unique(g)
    if len(labels) < 2:
        return mean, iid
    resid = np.array([(v[g == lab] - mean).sum() for lab in labels])
    cluster = math.sqrt(float((resid**2).sum()) * len(labels) / (len(labels) - 1)) / n
    return mean, max(iid, cluster)


def proportion_se(p: float, n: int) -> float:
    """Standard error of a share ``p`` of ``n`` positions, never below that of one position in ``n`` going the other
    way: a share measured at exactly 1.0 (the tiny target on its own answers) still allows for one flip."""
    if n < 1:
        return float("nan")
    floor = (1.0 / n) * (1.0 - 1.0 / n)
    return math.sqrt(max(p * (1.0 - p), floor) / n)


def precision_eps(*dtypes: torch.dtype) -> float:
    """Machine epsilon of the coarsest of ``dtypes``: a store is no more precise than its dtype, nor than the
    dtype the target computed its states in (a bf16 GPU forward stored as float32 still carries bf16 noise)."""
    return max(float(torch.finfo(d).eps) for d in dtypes)


@torch.no_grad()
def logprob_noise(
    head: Callable[[torch.Tensor], torch.Tensor],
    last: torch.Tensor,
    next_ids: torch.Tensor,
    eps: float,
    seed: int,
    *,
    logits_dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> float:
    """Mean |change| of the actual next tokens' log-probabilities when every element of the true last state is
    moved by up to half an ulp (relative ``eps / 2``, uniform, seeded): the per-position deviation one rounding to
    the store's precision causes, i.e. the noise floor a correct store sits at. A perturbation rather than a
    rounding, so it is not zero when the state was computed in the store dtype already. The logits are rounded to
    ``logits_dtype``, what the target's head computes them in (an engine's lm_head runs in bf16), since the target's
    log-probabilities carry that rounding and the checks' fp32 head does not."""
    if last.shape[0] == 0:
        return float("nan")
    gen = torch.Generator().manual_seed(seed)
    x = last.to(torch.float32)
    noise = (torch.rand(x.shape, generator=gen, dtype=torch.float32) * 2.0 - 1.0) * (eps / 2.0)
    _, base = head_predictions(head, x, next_ids, device=device)

    def rounded(h: torch.Tensor) -> torch.Tensor:
        return head(h).to(logits_dtype)

    _, moved = head_predictions(rounded, x * (1.0 + noise), next_ids, device=device)
    return float((moved.double() - base.double()).abs().mean())


@dataclass(frozen=True)
class NextTokenFigures:
    """Top-1 agreement with the actual next tokens and their mean log-probability, with standard errors."""

    n: int
    agreement: float
    mean_logprob: float
    agreement_se: float
    logprob_se: float

    @classmethod
    def of(
        cls, top1: torch.Tensor, logprob: torch.Tensor, next_ids: torch.Tensor, groups: Sequence[int]
    ) -> NextTokenFigures:
        hits = (top1 == next_ids.cpu()).double().numpy()
        a, a_se = clustered_mean(hits, groups)
        lp, lp_se = clustered_mean(logprob.double().numpy(), groups)
        return cls(len(hits), a, lp, a_se, lp_se)


# ----------------------------------------------------------------------------------------------
# Layer signatures: a few random projections per position, enough to tell layers apart


def projection(hidden: int, dims: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(hidden, dims, generator=gen, dtype=torch.float64) / math.sqrt(hidden)


def signature(rows: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    return rows.to(torch.float64) @ proj


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||: 0 for the same layer, about 1 for unrelated states."""
    denom = float(torch.linalg.vector_norm(b.to(torch.float64)))
    return float(torch.linalg.vector_norm(a.to(torch.float64) - b.to(torch.float64))) / max(denom, 1e-30)


def mean_norm(rows: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(rows.to(torch.float64), dim=-1).mean())


def mean_relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over rows of ||a_t - b_t|| / ||b_t||: how far apart two layers are, position by position."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    diff = torch.linalg.vector_norm(a64 - b64, dim=-1)
    ref = torch.linalg.vector_norm(b64, dim=-1).clamp_min(1e-30)
    return float((diff / ref).mean())


def pairwise_differences(names: Sequence[str], rows: Sequence[torch.Tensor]) -> dict[str, float]:
    """``"a~b"``: the mean relative difference of every pair of slots, in slot order."""
    return {
        f"{names[a]}~{names[b]}": mean_relative_difference(rows[a], rows[b])
        for a in range(len(rows))
        for b in range(a + 1, len(rows))
    }


def slot_names(n_aux: int) -> list[str]:
    """The store's feature slots: aux layers low → high, then the last state."""
    names = {3: ["low", "mid", "high"]}.get(n_aux, [f"aux{i}" for i in range(n_aux)])
    return [*names, LAST]


# ----------------------------------------------------------------------------------------------
# The calibration record


@dataclass(frozen=True)
class ShardCalibration:
    """What the target run in full did on a calibration sample of one store shard (see ``calibration.py``)."""

    shard: str  # store shard name, "shard-00000"
    key: str  # corpus shard key
    input_fingerprint: str
    samples: list[str]  # sample ids the target ran on
    positions: list[tuple[int, int]]  # scored (sample index in the shard, t)
    next_ids: list[int]
    target_top1: list[int]
    target_logprob: list[float]
    target: NextTokenFigures
    dtype_consistency: float  # share of positions whose top-1 survives rounding the true last state to the store dtype
    hf_indices: list[int]  # the aux layers the store should hold
    norms: dict[str, float]  # mean norm at the positions: every HF index "0".."N-1" and "last"
    signatures: dict[str, list[list[float]]]  # same keys: [signature_positions][signature_dims]
    distinct: dict[str, float]  # "low~mid", ..., "high~last": mean relative difference of the true layers
    logprob_noise: float | None = None  # mean |Δ log-prob| half an ulp of the store precision causes (noise floor)
    source: str = "hf"  # "hf": the model run in full in-process; "vllm": the engine's prompt log-probabilities

    @property
    def has_layer_references(self) -> bool:
        """Whether every aux layer the store should hold has a signature to be identified by (an engine
        calibration has the last state's only)."""
        return all(str(j) in self.signatures for j in self.hf_indices)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["positions"] = [list(p) for p in self.positions]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardCalibration:
        fields = dict(d)
        fields["positions"] = [(int(i), int(t)) for i, t in d["positions"]]
        fields["target"] = NextTokenFigures(**d["target"])
        return cls(**fields)


@dataclass(frozen=True)
class Calibration:
    """One store's calibration file: the target, the settings, one record per store shard."""

    model_id: str
    store_dtype: str
    last_kind: str
    config: FidelityConfig
    shards: dict[str, ShardCalibration]

    def to_json(self) -> bytes:
        doc = {
            "format": CALIBRATION_FORMAT,
            "model_id": self.model_id,
            "store_dtype": self.store_dtype,
            "last_kind": self.last_kind,
            "config": self.config.to_dict(),
            "shards": {k: v.to_dict() for k, v in sorted(self.shards.items())},
        }
        return (json.dumps(doc, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Calibration:
        d = json.loads(raw)
        if d.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"not a fidelity calibration (format {d.get('format')!r})")
        return cls(
            model_id=d["model_id"],
            store_dtype=d["store_dtype"],
            last_kind=d["last_kind"],
            config=FidelityConfig(**d["config"]),
            shards={k: ShardCalibration.from_dict(v) for k, v in d["shards"].items()},
        )


Calibrate = Callable[[Sequence[HiddenStateSample], str, str], ShardCalibration]  # (samples, shard name, corpus key)


def calibrate_shards(
    shards: Sequence[tuple[str, Sequence[HiddenStateSample]]], calibrate: Calibrate
) -> dict[str, ShardCalibration]:
    """One record per corpus shard, named as the store names its shards."""
    return {shard_name(i): calibrate(samples, shard_name(i), key) for i, (key, samples) in enumerate(shards)}


def write_calibration(store_dir: str | Path, calibration: Calibration) -> Path:
    path = Path(store_dir) / CALIBRATION_NAME
    atomic_write_bytes(path, calibration.to_json())
    return path


def read_calibration(store_dir: str | Path) -> Calibration | None:
    path = Path(store_dir) / CALIBRATION_NAME
    if not path.is_file():
        return None
    return Calibration.from_json(path.read_bytes())
