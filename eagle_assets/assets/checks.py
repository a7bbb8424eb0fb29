"""Asset checks from the DuckDB validation outcomes: one spec per check, results with their evidence.

The checks run inside the asset's own step (specs declared on the asset): they scan the file the step has just
written, and separate check ops would cost a process start per check per partition. Blocking specs stop downstream
steps of the same run; the corpus re-validates its inputs, so a failing partition cannot slip in through another.
"""

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import dagster as dg

from eagle_assets.corpus.validation import CheckOutcome
from eagle_assets.markdown import table

GENERATED_CHECKS: dict[str, str] = {
    "unique_prompt_ids": "no prompt id appears twice",
    "allowed_providers": "every response came from a provider the policy allowed when it was bought",
    "nonempty_responses": "no response without reasoning, content or tool call",
    "finish_reasons": "every finish reason is a known one",
}
TOKENIZED_CHECKS: dict[str, str] = {
    "unique_prompt_ids": "no prompt id appears twice",
    "allowed_providers": "every sample came from an allowed provider",
    "finish_reasons": "every finish reason is a known one",
    "token_layout": "lengths agree: input_ids, loss_mask, prompt and completion",
    "end_of_turn": "exactly one <|im_end|>, at the end, in every finished sample; none in cut-off ones",
    "token_diff": "rebuilt completion tokens add up to the API's usage (relative bound)",
}


def check_specs(
    asset_key: dg.AssetKey,
    checks: dict[str, str],
    *,
    blocking: bool,
    partitions_def: dg.PartitionsDefinition | None = None,
) -> list[dg.AssetCheckSpec]:
    """``partitions_def``: results are recorded per partition (what a sensor reads back per shard, and the UI
    shows per partition). Dagster 1.13 marks that as preview; the version is pinned (< 1.14)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=dg.PreviewWarning, message=".*partitions_def on an AssetCheckSpec")
        return [
            dg.AssetCheckSpec(
                name, asset=asset_key, description=description, blocking=blocking, partitions_def=partitions_def
            )
            for name, description in checks.items()
        ]


def _value(value: Any) -> dg.MetadataValue:
    if isinstance(value, bool):
        return dg.MetadataValue.bool(value)
    if isinstance(value, int):
        return dg.MetadataValue.int(value)
    if isinstance(value, float):
        return dg.MetadataValue.float(value)
    if isinstance(value, dict | list):
        return dg.MetadataValue.json(value)
    return dg.MetadataValue.text(str(value))


def examples_markdown(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    return table(columns, [[str(r.get(c, ""))[:120] for c in columns] for r in rows])


def outcome_metadata(outcome: CheckOutcome) -> dict[str, dg.MetadataValue]:
    meta = {k: _value(v) for k, v in outcome.metadata.items()}
    meta["summary"] = dg.MetadataValue.text(outcome.summary)
    if outcome.failing_examples:
        meta["failing_examples"] = dg.MetadataValue.md(examples_markdown(outcome.failing_examples))
    return meta


def length_metadata(lengths: dict[str, float | int | str]) -> dict[str, dg.MetadataValue]:
    """Sample lengths in tokens (they size the hidden-state store and the training batches)."""
    order = ("min", "p50", "p90", "p99", "max", "mean")
    distribution = table(order, [[f"{float(lengths[k]):.0f}" for k in order]])
    return {
        "length_distribution": dg.MetadataValue.md(distribution),
        "length_p50": dg.MetadataValue.int(int(lengths["p50"])),
        "length_max": dg.MetadataValue.int(int(lengths["max"])),
    }


def check_results(
    asset_key: dg.AssetKey, outcomes: Iterable[CheckOutcome], checks: dict[str, str]
) -> list[dg.AssetCheckResult]:
    """Results for the declared checks only (an outcome without a spec would be rejected by Dagster)."""
    by_name = {o.name: o for o in outcomes}
    missing = sorted(set(checks) - set(by_name))
    if missing:
        raise ValueError(f"no outcome for declared checks {missing}")
    return [
        dg.AssetCheckResult(
            asset_key=asset_key,
            check_name=name,
            passed=by_name[name].passed,
            metadata=outcome_metadata(by_name[name]),
            description=by_name[name].summary,
        )
        for name in checks
    ]
