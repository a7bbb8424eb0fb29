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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.check_alignment import check_alignment
from eagle_assets.hidden_states.check_aux_layers import check_aux_layers
from eagle_assets.hidden_states.check_next_token import check_next_token, spread_positions
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
        return [CheckOutcome(name, False, f"hidden_states {partition}: {name} FAILED: {why}", {}) for name in CHECKS]
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
