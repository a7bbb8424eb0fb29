"""The one Definitions object: every asset, resource and sensor of the pipeline.

The embedded default needs no key and no GPU: the OpenRouter resource points at the bundled
simulator on loopback (started on demand). Set ``EAGLE_FORGE_TARGET=openrouter`` to spend real
money through the real API, with the key in ``/tmp/or-key.txt`` or ``$OPENROUTER_API_KEY``.
"""

import dagster as dg

from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.tokens import build_tokenized_asset
from eagle_assets.datasets.config import load_datasets
from resources.openrouter.configured import openrouter_from_env
from sensors.credits_sensor import build_credits_sensor

DATASETS = load_datasets()
GENERATED = [build_generated_asset(spec) for spec in DATASETS.values()]
TOKENIZED = [
    build_tokenized_asset(spec, g.partitions_def) for spec, g in zip(DATASETS.values(), GENERATED, strict=True)
]

defs = dg.Definitions(
    assets=[*GENERATED, *TOKENIZED],
    resources={"openrouter": openrouter_from_env()},
    sensors=[build_credits_sensor(GENERATED)],
)
