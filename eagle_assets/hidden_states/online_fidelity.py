"""The fidelity gate of an online run: the three blocking checks on the first batches of the feature stream.

Online there is no store, so the offline checks (thresholds and messages; partition ``online``) run on the stream
before the first optimizer step: its first ``gate_rows`` rows become a one-shard scratch store in the run's own
folder (never under ``hidden_states/``), calibrated as the backend's offline store would be, checked, and removed,
pass or fail. Its size: docs/draft-and-benchmark.md.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eagle_assets.draft.online_stream import Prefetched
from eagle_assets.errors import TargetError
from eagle_assets.hidden_states.fidelity import Calibrate, Calibration, write_calibration
from eagle_assets.hidden_states.fidelity_checks import CorpusShard, run_fidelity_checks
from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
from eagle_assets.hidden_states.pipeline import run_extraction
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import StoreMeta, dtype_name, shard_name

ONLINE_PARTITION = "online"
SCRATCH_SHARD = shard_name(0)


class OnlineFidelityError(TargetError, RuntimeError):
    """The online feature stream failed a fidelity check: the run stopped before its first optimizer step."""


def stream_samples(first: Sequence[Prefetched]) -> tuple[list[HiddenStateSample], list[dict[str, torch.Tensor]]]:
    """The rows of the stream's first batches, each once (by dataset index), with its own unpadded features."""
    samples, feats, seen = [], [], set()
    for item in first:
        for rows, batch in zip(item.rows, item.batches, strict=True):
            for b, index in enumerate(rows):
                if index in seen:
                    continue
                seen.add(index)
                n = int(batch["lengths"][b])
                ids, mask = batch["input_ids"][b, :n], batch["loss_mask"][b, :n]
                samples.append(HiddenStateSample(f"row-{index}", ids.tolist(), mask.to(torch.int64).tolist()))
                feats.append({"aux": batch["aux"][b, :n], "last": batch["last"][b, :n]})
    return samples, feats


def prompt_length(sample: HiddenStateSample) -> int:
    """Where the response starts: the first masked token (a training row's mask is the response's)."""
    mask = list(sample.loss_mask)
    return mask.index(1) if 1 in mask else len(mask)


def fidelity_gate(
    meta: StoreMeta,
    calibrate: Calibrate,
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    config: FidelityConfig,
    scratch_root: Path,
    device: torch.device | str,
) -> Callable[[Sequence[Prefetched]], dict[str, Any]]:
    """``gate(first batches)`` for ``OnlineFeatureStream``: the three checks, or ``OnlineFidelityError``."""

    def gate(first: Sequence[Prefetched]) -> dict[str, Any]:
        samples, feats = stream_samples(first)
        by_id = {s.sample_id: f for s, f in zip(samples, feats, strict=True)}

        def replay(batch: Sequence[HiddenStateSample]) -> list[dict[str, torch.Tensor]]:
            return [{k: v.to(meta.dtype) for k, v in by_id[s.sample_id].items()} for s in batch]

        scratch_root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="online-fidelity-", dir=scratch_root))
        try:
            run_extraction({ONLINE_PARTITION: samples}, scratch, meta, replay, check_space=False)
            records = {SCRATCH_SHARD: calibrate(samples, SCRATCH_SHARD, ONLINE_PARTITION)}
            calibration = Calibration(meta.model_id, dtype_name(meta.dtype), meta.last_kind, config, records)
            write_calibration(scratch, calibration)
            corpus = CorpusShard(ONLINE_PARTITION, samples, [prompt_length(s) for s in samples])
            outcomes = run_fidelity_checks(
                scratch, [corpus], head, partition=ONLINE_PARTITION, device=device, config=config
            )
            scratch_bytes = sum(p.stat().st_size for p in scratch.rglob("*") if p.is_file())
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        failed = [o for o in outcomes if not o.passed]
        if failed:
            raise OnlineFidelityError(
                f"the online feature stream failed {len(failed)} fidelity check(s) on its first {len(samples)} "
                "rows, before the first optimizer step: " + " | ".join(o.summary for o in failed)
            )
        return {
            "fidelity": {o.name: o.summary for o in outcomes},
            "fidelity_rows": len(samples),
            "fidelity_scratch_bytes": scratch_bytes,
        }

    return gate
