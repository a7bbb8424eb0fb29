"""After generation stopped on money, watch the credits and backfill exactly what is left.

One ``RunRequest`` per failed or missing generation partition (a single-run backfill would fail whole on one
failure), launched only when the available dollars went up. Every evaluation also records the account's money,
so its plot keeps moving between runs (a top-up shows as a step up).
"""

import dagster as dg

from eagle_assets.assets.account_observation import account_observation
from eagle_assets.generation.partition_runs import account_snapshot
from eagle_assets.keys import TOPUP_RUN_TAGS
from resources.openrouter.resource import OpenRouterResource
from sensors.topup import CreditsCursor, decide


def pending_partitions(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> list[str]:
    """Partitions that are failed or were never materialized (in-progress ones are left alone)."""
    partitions_def = asset.partitions_def
    assert partitions_def is not None
    keys = partitions_def.get_partition_keys(dynamic_partitions_store=instance)
    status = instance.get_status_by_partition(asset.key, keys, partitions_def) or {}
    return [k for k in keys if status.get(k) in (None, dg.AssetPartitionStatus.FAILED)]


def build_credits_sensor(
    generation_assets: list[dg.AssetsDefinition],
    min_increase_usd: float = 0.5,
    min_remaining_usd: float = 0.5,
) -> dg.SensorDefinition:
    @dg.sensor(
        name="credits_topup_backfill",
        minimum_interval_seconds=30,
        asset_selection=dg.AssetSelection.assets(*generation_assets),
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="When credits are topped up (or the budget raised) after a budget stop, launch one run per "
        "failed or missing generation partition.",
    )
    def credits_topup_backfill(context: dg.SensorEvaluationContext, openrouter: OpenRouterResource):
        snapshot = account_snapshot(openrouter, "sensor credits_topup_backfill")
        observed = [account_observation(snapshot)]
        pending = {a.key: pending_partitions(context.instance, a) for a in generation_assets}
        count = sum(len(v) for v in pending.values())
        cursor = CreditsCursor.loads(context.cursor)
        if count == 0:
            context.update_cursor(CreditsCursor(cursor.last_remaining, cursor.epoch).dumps())
            return dg.SensorResult(skip_reason="every generation partition is materialized", asset_events=observed)
        decision = decide(cursor, snapshot.available_usd, count, min_increase_usd, min_remaining_usd)
        context.update_cursor(decision.cursor.dumps())
        if not decision.launch:
            return dg.SensorResult(skip_reason=decision.reason, asset_events=observed)
        context.log.info(decision.reason)
        runs = [
            dg.RunRequest(
                run_key=f"topup-{decision.cursor.epoch}:{key.to_user_string()}:{p}",
                asset_selection=[key],
                partition_key=p,
                tags=dict(TOPUP_RUN_TAGS),
            )
            for key, parts in pending.items()
            for p in parts
        ]
        return dg.SensorResult(run_requests=runs, asset_events=observed)

    return credits_topup_backfill
