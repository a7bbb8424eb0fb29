"""The hidden-state fidelity checks: a store shard against its corpus shard, the target's head and its calibration.

Three checks per store shard (what each holds a store to: docs/hidden-states.md), each a ``CheckOutcome`` whose
summary names the partition, the shard, the check and the failing figure. Only headers, the small id/mask/offset
tensors and single memory-mapped feature rows are read, so a 200 GB Kimi shard costs seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.check_alignment import check_alignment
from eagle_assets.hidden_states.check_aux_layers import check_aux_layers
from eagle_assets.hidden_states.check_next_token import check_next_token, spread_positions
from eagle_assets.hidden_states.check_verdict import failed
from eagle_assets.hidden_states.fidelity import read_calibration
from eagle_assets.hidden_states.fidelity_spec import ALIGNMENT, AUX_LAYERS, CHECKS, NEXT_TOKEN, FidelityConfig
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_shard import open_store_shards, rows_at


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
        return [failed(name, f"hidden_states {partition}", why) for name in CHECKS]
    for shard, source in zip(shards, corpus, strict=True):
        calib = calibration.shards.get(shard.name) if calibration is not None else None
        try:
            by_check[ALIGNMENT].append(check_alignment(shard, source.samples, source.prompt_lens, partition))
            spread = spread_positions(shard, config, source.key) if not shard.damage() else []
            offsets = shard.tensor("sample_offsets").tolist() if not shard.damage() else []
            by_check[AUX_LAYERS].append(
                check_aux_layers(shard, calib, config, partition, rows_at(shard, offsets, spread))
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
