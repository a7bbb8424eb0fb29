"""The account's money as an observation of ``openrouter_account`` (why: ``account.py``). Not an asset module: the
assets and the sensor that record an observation import this, not ``account.py``."""

import dagster as dg

from eagle_assets.generation.account_snapshot import AccountSnapshot
from eagle_assets.keys import ACCOUNT_KEY


def account_metadata(snap: AccountSnapshot) -> dict[str, dg.MetadataValue]:
    """Numbers only where they are known: an unknown credit is left out, never plotted as zero."""
    meta: dict[str, dg.MetadataValue] = {
        "spent_usd": dg.MetadataValue.float(round(snap.spent_usd, 6)),
        "held_usd": dg.MetadataValue.float(round(snap.held_usd, 6)),
        "budget_left_usd": dg.MetadataValue.float(round(snap.budget_left_usd, 6)),
        "output_tokens": dg.MetadataValue.int(snap.output_tokens),
        "in_flight": dg.MetadataValue.int(snap.in_flight),
        "budget_usd": dg.MetadataValue.float(snap.budget_usd),
        "cap_source": dg.MetadataValue.text(snap.cap_source),
        "observed_by": dg.MetadataValue.text(snap.observed_by),
    }
    if snap.remaining_credit_usd is not None:
        meta["remaining_credit_usd"] = dg.MetadataValue.float(round(snap.remaining_credit_usd, 6))
    return meta


def account_observation(snap: AccountSnapshot) -> dg.AssetObservation:
    return dg.AssetObservation(asset_key=ACCOUNT_KEY, metadata=account_metadata(snap))
