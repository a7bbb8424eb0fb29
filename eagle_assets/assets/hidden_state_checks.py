"""The hidden-state fidelity checks in Dagster: blocking check specs on ``hidden_states``, their results and status.

They run inside the ``hidden_states`` step, where the target is loaded anyway, so a failing shard stops the rest
of that run; the draft usually trains in a run of its own, so the sensor and ``draft_model`` read the checks'
latest results per partition (``fidelity_failures``) and refuse shards that did not pass.
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from eagle_assets.assets.checks import check_results, check_specs, examples_markdown
from eagle_assets.corpus.validation import CheckOutcome
from eagle_assets.hidden_states.fidelity_spec import CHECKS, FidelityConfig
from eagle_assets.keys import HIDDEN_STATES_KEY


class FidelityCheckConfig(dg.Config):
    """How much of each shard the fidelity checks look at, and how close to the target run in full it must be."""

    fidelity_positions: int = Field(256, ge=1, description="scored positions per shard (calibration and spread)")
    calibration_samples: int = Field(4, ge=1, description="samples the target runs in full on, per shard")
    fidelity_fraction: float = Field(
        0.9, gt=0, lt=1, description="a store figure must reach this fraction of the target's (log-probs: + ln f)"
    )

    fidelity_deviation_factor: float = Field(
        4.0,
        ge=1,
        description="a store's per-position log-prob deviation from the target may reach this many times the "
        "calibration's noise floor (half an ulp of the store precision)",
    )
    allow_unreferenced_aux: bool = Field(
        False,
        description="engine-calibrated stores (calibrate_in_process false): accept aux layers whose identity cannot be "
        "verified (the engine gives no "
        "per-layer reference); recorded in the check's summary and metadata. False: the aux check fails for them",
    )

    def fidelity(self) -> FidelityConfig:
        return FidelityConfig(
            positions=self.fidelity_positions,
            calibration_samples=self.calibration_samples,
            fraction=self.fidelity_fraction,
            deviation_factor=self.fidelity_deviation_factor,
            allow_unreferenced_aux=self.allow_unreferenced_aux,
        )


def fidelity_check_specs(partitions_def: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    return check_specs(HIDDEN_STATES_KEY, CHECKS, blocking=True, partitions_def=partitions_def)


def fidelity_check_results(
    context: dg.AssetExecutionContext, outcomes: Sequence[CheckOutcome]
) -> list[dg.AssetCheckResult]:
    """Results for the specs, each outcome's summary in the run log (errors for failures) and the UI."""
    for o in outcomes:
        (context.log.info if o.passed else context.log.error)(o.summary)
    if not all(o.passed for o in outcomes):
        context.log.error(
            "the store failed its fidelity checks and is kept for inspection; once the cause is fixed, delete it "
            "and re-materialize the partition (a complete store is otherwise skipped, not recomputed)"
        )
    return check_results(HIDDEN_STATES_KEY, outcomes, CHECKS)


def fidelity_metadata(outcomes: Sequence[CheckOutcome]) -> dict[str, dg.MetadataValue]:
    """The checks' headline figures on the materialization itself (a table in the UI, numbers for plots)."""
    by = {o.name: o for o in outcomes}
    meta: dict[str, dg.MetadataValue] = {}
    nt = by.get("last_state_next_token")
    figures = nt.metadata if nt is not None else {}
    names = ("agreement", "target_agreement", "mean_logprob", "target_mean_logprob", "consistency")
    for name in (*names, "logprob_deviation", "logprob_noise"):
        value = figures.get(name)
        if isinstance(value, int | float):
            meta[f"fidelity_{name}"] = dg.MetadataValue.float(float(value))
    rows: list[dict[str, Any]] = [
        {"check": o.name, "passed": "yes" if o.passed else "NO", "summary": o.summary.split(": ", 2)[-1]}
        for o in outcomes
    ]
    meta["fidelity_checks"] = dg.MetadataValue.md(examples_markdown(rows))
    meta["fidelity_passed"] = dg.MetadataValue.bool(all(o.passed for o in outcomes))
    return meta


def fidelity_failures(instance: dg.DagsterInstance, partitions: Sequence[str]) -> dict[str, str]:
    """Partitions whose fidelity checks did not all pass on their latest materialization, and why.

    A partition checked on an older materialization only, or never checked, counts as not passed: a store
    re-extracted behind the checks' back is not trusted until they run on it.
    """
    from dagster._core.event_api import PartitionKeyFilter
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    if not partitions:
        return {}
    keys = [dg.AssetCheckKey(HIDDEN_STATES_KEY, name) for name in CHECKS]
    infos = instance.event_log_storage.get_asset_check_partition_info(keys, partition_keys=list(partitions))
    status = {(i.check_key.name, i.partition_key): i for i in infos}
    failures: dict[str, str] = {}
    for partition in partitions:
        reasons = []
        for key in keys:
            info = status.get((key.name, partition))
            if info is None:
                reasons.append(f"{key.name} never ran")
            elif not info.is_current:
                reasons.append(f"{key.name} not run on the latest materialization")
            elif info.latest_execution_status != AssetCheckExecutionRecordStatus.SUCCEEDED:
                record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
                    [key], partition_filter=PartitionKeyFilter(key=partition)
                ).get(key)
                evaluation = record.event.asset_check_evaluation if record and record.event else None
                reasons.append(first_failure(key.name, evaluation.description if evaluation is not None else None))
        if reasons:
            failures[partition] = "; ".join(reasons)
    return failures


def first_failure(check: str, summary: str | None) -> str:
    """``<check> FAILED: <its first failing figure>`` (+ how many more) from an outcome's summary."""
    text = (summary or "").split(f"{check} FAILED: ", 1)[-1] if summary else "failed"
    items = text.split("; ")
    more = f" (+{len(items) - 1} more)" if len(items) > 1 else ""
    return f"{check} FAILED: {items[0]}{more}"


def check_summaries(result: dg.ExecuteInProcessResult) -> list[tuple[bool, str]]:
    """(passed, summary) of every check evaluated in an in-process run (what the demo prints)."""
    out = []
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            data = event.asset_check_evaluation_data
            out.append((bool(data.passed), data.description or data.check_name))
    return out
