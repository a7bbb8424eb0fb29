"""The OpenRouter account as an observable source asset: its money, observed while it is spent.

Dagster plots every numeric metadata entry of an asset's observations over time, so the credit, the spend, held
dollars and output tokens become curves. Observations come from this asset's observe step, the credits sensor,
the generation plan, and every generation run every ``account_observe_interval_s``: the curve moves during a run.
"""

import warnings

import dagster as dg

from eagle_assets.assets.account_observation import account_metadata
from eagle_assets.generation.partition_runs import account_snapshot
from eagle_assets.keys import ACCOUNT_KEY, GENERATION_GROUP
from resources.openrouter.resource import OpenRouterResource


def _account_asset() -> dg.SourceAsset:
    # observable_source_asset is marked beta in Dagster 1.13: said once here, not on every import of the code.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.observable_source_asset(
            key=ACCOUNT_KEY,
            group_name=GENERATION_GROUP,
            description="The OpenRouter key's remaining credit and the budget ledger's spend, held dollars and"
            " output tokens. Observed by every generation run (every account_observe_interval_s) and by the"
            " credits_topup_backfill sensor; the metadata's Plots view shows spend over time.",
        )
        def openrouter_account(openrouter: OpenRouterResource) -> dg.ObserveResult:
            snap = account_snapshot(openrouter, "observe openrouter_account")
            return dg.ObserveResult(metadata=account_metadata(snap))

    return openrouter_account


openrouter_account = _account_asset()
