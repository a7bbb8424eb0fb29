"""Start draft training (and its benchmark) once the hidden states it needs are all materialized."""

from collections.abc import Mapping
from typing import Any

import dagster as dg

from eagle_assets.assets.hidden_state_checks import fidelity_failures
from eagle_assets.keys import BENCHMARK_KEY, CORPUS_KEY, DRAFT_KEY, HIDDEN_STATES_KEY, TRAINING_RUN_TAGS
from eagle_assets.shard_partitions import train_partitions
from sensors.training import TrainingDecision, decide_online_training, decide_training


def features_mode(run_config: Mapping[str, Any] | None) -> str:
    """``offline`` or ``online``: the ``features`` field of ``draft_model``'s config in the run config launched."""
    ops = (run_config or {}).get("ops", {})
    return str(ops.get("draft_model", {}).get("config", {}).get("features", "offline"))


def decide(instance: dg.DagsterInstance, mode: str) -> TrainingDecision:
    needed = train_partitions(instance)
    drafts = instance.fetch_materializations(DRAFT_KEY, limit=1).records
    last_draft = drafts[0].storage_id if drafts else None
    if mode == "online":
        corpus = instance.fetch_materializations(CORPUS_KEY, limit=1).records
        return decide_online_training(needed, corpus[0].storage_id if corpus else None, last_draft)
    latest = instance.get_latest_storage_id_by_partition(
        HIDDEN_STATES_KEY, dg.DagsterEventType.ASSET_MATERIALIZATION, set(needed)
    )
    unchecked = fidelity_failures(instance, [k for k in needed if k in latest])
    return decide_training(needed, latest, last_draft, unchecked)


def build_training_sensor(
    minimum_interval_seconds: int = 30, run_config: Mapping[str, Any] | None = None, with_benchmark: bool = True
) -> dg.SensorDefinition:
    """``with_benchmark``: the run ends with ``draft_benchmark`` (in process for the tiny target, else only
    when a serving backend is configured)."""
    selection = [DRAFT_KEY, BENCHMARK_KEY] if with_benchmark else [DRAFT_KEY]
    mode = features_mode(run_config)

    @dg.sensor(
        name="draft_training",
        minimum_interval_seconds=minimum_interval_seconds,
        asset_selection=dg.AssetSelection.assets(DRAFT_KEY, BENCHMARK_KEY),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Train the draft (then benchmark it) when every train shard's hidden states are materialized "
        "and have passed their fidelity checks, and some are newer than the last draft; with draft_model's "
        "features: online, when the corpus is materialized and newer than the last draft (no stores).",
    )
    def draft_training(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        decision = decide(context.instance, mode)
        if not decision.run:
            return dg.SkipReason(decision.reason)
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=decision.run_key,
                    run_config=dict(run_config or {}),
                    asset_selection=selection,
                    tags=dict(TRAINING_RUN_TAGS),
                )
            ]
        )

    return draft_training
