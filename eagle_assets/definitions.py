"""The one Definitions object: every asset, check, resource and sensor of the pipeline.

The embedded default needs no key and no GPU: the OpenRouter resource points at the bundled simulator on loopback
(started on demand) and the target is the tiny model built locally. The variables that switch to the real API or
a serving engine (``EAGLE_FORGE_TARGET``, ``EAGLE_FORGE_SERVING*``): docs/configuration.md.
"""

from typing import cast

import dagster as dg

from eagle_assets.assets.account import openrouter_account
from eagle_assets.assets.corpus import build_corpus_asset
from eagle_assets.assets.draft import draft_benchmark, draft_model, training_run_config
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.hidden_states import hidden_states
from eagle_assets.assets.plan import build_plan_asset
from eagle_assets.assets.tokens import build_tokenized_asset
from eagle_assets.benchmarks.reference import reference_benchmark_config
from eagle_assets.datasets.config import load_datasets
from eagle_assets.k8s_placement import executor_from_env
from eagle_assets.settings import check_environment
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.configured import openrouter_from_env
from resources.serving.resource import ServingEngineResource, serving_from_env
from resources.target.resource import TargetModelResource
from resources.target.training_pipes import training_pipes_client
from sensors.credits_sensor import build_credits_sensor
from sensors.training_sensor import build_training_sensor

check_environment()  # an EAGLE_FORGE_* name that is no setting (a typo) fails the load instead of being ignored
DATASETS = load_datasets()
GENERATED = [build_generated_asset(spec) for spec in DATASETS.values()]
TOKENIZED = [
    build_tokenized_asset(spec, g.partitions_def) for spec, g in zip(DATASETS.values(), GENERATED, strict=True)
]
CORPUS = build_corpus_asset(list(DATASETS.values()))
PLAN = build_plan_asset(list(DATASETS.values()))


TARGET = TargetModelResource()
SERVING = serving_from_env()  # EAGLE_FORGE_SERVING*: the engine the training sensor's runs benchmark through


def sensor_run_config(tiny_target: bool, serving: ServingEngineResource) -> dict[str, object]:
    """The training sensor's run config: the tiny sizing for the tiny target, except that a run benchmarked
    through a serving engine gets the references' settings (steps/topk/draft tokens, full sets, default max
    tokens), so that its figures can stand beside the published ones."""
    config = training_run_config(tiny_target=tiny_target)
    if serving.serves:
        ops = cast(dict[str, object], config.setdefault("ops", {}))  # training_run_config's shape
        ops["draft_benchmark"] = {"config": reference_benchmark_config()}
    return config


def training_sensor(target: TargetModelResource, serving: ServingEngineResource) -> dg.SensorDefinition:
    """The real target is benchmarked only through a serving engine (it does not fit one process)."""
    tiny = not target.path
    return build_training_sensor(run_config=sensor_run_config(tiny, serving), with_benchmark=tiny or serving.serves)


def default_resources() -> dict[str, object]:
    return {
        "openrouter": openrouter_from_env(),
        "duckdb": DuckDBResource(),
        "target": TARGET,
        "serving": SERVING,
        "pipes_subprocess_client": training_pipes_client(),
    }


defs = dg.Definitions(
    assets=[openrouter_account, PLAN, *GENERATED, *TOKENIZED, CORPUS, hidden_states, draft_model, draft_benchmark],
    resources=default_resources(),
    executor=executor_from_env(),  # EAGLE_FORGE_EXECUTOR=k8s: a pod per step (deploy/k8s)
    sensors=[
        build_credits_sensor(GENERATED),
        training_sensor(TARGET, SERVING),
    ],
)
