"""Every name the pipeline's parts find each other by: asset keys, groups, pools, tags, the corpus-shard partitions.

One home, so that a sensor or an asset refers to another asset by its key (or runs in its pool, or reads its
tags) without importing that asset's module: the modules that define assets import this one and no other
asset module, and a sensor imports this one and no asset module at all (``tests/packaging/test_keys_and_layout``).
Paths are in ``layout``; which environment is read is in ``settings``.
"""

import dagster as dg

# --- groups (the stage tag of a step is its group: ``stage_tags``) ---------------------------------------------
GENERATION_GROUP = "generation"  # the plan, the account and the generated datasets
TOKENS_GROUP = "tokens"
CORPUS_GROUP = "corpus"
HIDDEN_STATES_GROUP = "hidden_states"
DRAFT_GROUP = "draft"

# --- asset keys --------------------------------------------------------------------------------------------------
ACCOUNT_KEY = dg.AssetKey(["openrouter_account"])
PLAN_KEY = dg.AssetKey(["generation_plan"])
GENERATED_PREFIX = "generated"  # ``generated/<dataset>``
TOKENIZED_PREFIX = "tokenized"  # ``tokenized/<dataset>``
CORPUS_KEY = dg.AssetKey(["corpus"])
HIDDEN_STATES_KEY = dg.AssetKey(["hidden_states"])
DRAFT_KEY = dg.AssetKey(["draft_model"])
BENCHMARK_KEY = dg.AssetKey(["draft_benchmark"])


def generated_asset_key(dataset: str) -> dg.AssetKey:
    return dg.AssetKey([GENERATED_PREFIX, dataset])


def tokenized_asset_key(dataset: str) -> dg.AssetKey:
    return dg.AssetKey([TOKENIZED_PREFIX, dataset])


# --- partitions --------------------------------------------------------------------------------------------------
CORPUS_SHARDS_NAME = "corpus_shard"  # the definition's name, typed str (``.name`` is optional in dagster)
CORPUS_SHARDS = dg.DynamicPartitionsDefinition(name=CORPUS_SHARDS_NAME)  # the hidden-state partitions

# --- concurrency pools (their limits: ``instance.POOL_LIMITS``, ``deploy/dagster.yaml``) --------------------------
GENERATION_POOL = "openrouter"  # every step that buys answers: the plan's pilot and the generated datasets
GPU_POOL = "gpu"  # hidden states and training: each wants every GPU of the host

# --- tags --------------------------------------------------------------------------------------------------------
STAGE_TAG = "eagle-forge/stage"
DATASET_TAG = "eagle-forge/dataset"
RUNS_ON_TAG = "eagle-forge/runs-on"
TRIGGER_TAG = "eagle-forge/trigger"  # run tag: which sensor asked for the run
POOL_TAG = "eagle-forge/pool"  # run tag: the pool the run's steps wait on (``deploy/dagster.yaml`` limits runs by it)
K8S_CONFIG_TAG = "dagster-k8s/config"  # op tag read by dagster-k8s (its value: ``k8s_placement``)
GPU_HOST = "gpu-host"


def stage_tags(group: str, dataset: str | None = None) -> dict[str, str]:
    """An asset's tags: its stage (its group's name) and, for a per-dataset asset, the dataset."""
    return {STAGE_TAG: group} if dataset is None else {STAGE_TAG: group, DATASET_TAG: dataset}


HIDDEN_STATES_TAGS = {RUNS_ON_TAG: GPU_HOST, STAGE_TAG: HIDDEN_STATES_GROUP}
DRAFT_TAGS = {RUNS_ON_TAG: GPU_HOST, STAGE_TAG: DRAFT_GROUP}
TOPUP_RUN_TAGS = {TRIGGER_TAG: "credits-topup", POOL_TAG: GENERATION_POOL}  # the credits sensor's runs
TRAINING_RUN_TAGS = {TRIGGER_TAG: "hidden_states", POOL_TAG: GPU_POOL}  # the training sensor's runs
