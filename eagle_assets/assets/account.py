"""The OpenRouter account as an observable source asset: its money, observed while it is spent.

Dagster draws every numeric metadata entry of an asset's observations as a plot over time (the
asset page's Metadata section, Plots view), so the account's remaining credit, the ledger's spend,
held dollars and output tokens become curves. Observations come from four places: this asset's own
observe step ("Observe" in the UI), the credits sensor on each evaluation, the generation plan (the
money before any spend), and every generation run every ``account_observe_interval_s``
(``context.log_event``) — so the curve moves while a run is going.
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
