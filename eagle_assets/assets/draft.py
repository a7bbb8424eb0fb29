"""The EAGLE-3 draft model and its acceptance-length benchmark, materialized on the GPU host.

Training runs as a Dagster Pipes subprocess (``eagle_assets.draft.pipes_train``, under ``torchrun`` for several
GPUs): a crash of the trainer cannot take the step's process with it, DDP gets its own process group, and loss,
accuracy and throughput stream back. A run's directory is named by its inputs (the shards' fingerprints, the target,
the training config), so re-materializing the same inputs resumes from the last checkpoint.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from eagle_assets.assets.draft_benchmark import BenchmarkConfig
from eagle_assets.assets.draft_online import TrainInputs, features_metadata, online_inputs, tree_bytes, with_online_data
from eagle_assets.assets.failures import fail, project_errors_fail
from eagle_assets.assets.hidden_state_checks import fidelity_failures
from eagle_assets.corpus.tokenized_schema import EOT_ID
from eagle_assets.draft.run_config import (
    DraftRunConfig,
    EmbeddingsSpec,
    ExportSpec,
    StoreData,
    TargetSpec,
    TrainConfig,
    TrainKnobs,
    VocabSpec,
)
from eagle_assets.durable_files import publishing_directory
from eagle_assets.errors import ConfigError
from eagle_assets.k8s_placement import gpu_step_tags
from eagle_assets.keys import BENCHMARK_KEY, DRAFT_GROUP, DRAFT_KEY, DRAFT_TAGS, GPU_POOL, HIDDEN_STATES_KEY
from eagle_assets.layout import draft_runs_dir, hidden_states_root, latest_export_dir
from eagle_assets.settings import REPO_ROOT
from eagle_assets.shard_partitions import train_partitions
from resources.serving.resource import ServingEngineResource
from resources.target.resource import TargetModelResource


class DraftTrainConfig(dg.Config, TrainKnobs):
    """The trainer's knobs (``TrainKnobs``, written there once) plus the platform's, made into the run file by
    ``train_run_config``. They also name the run directory (``run_identity``): a renamed field or changed default
    starts a new run instead of resuming."""

    draft_vocab_size: int = Field(
        default=32000, ge=16, description="reduced draft vocabulary (most frequent corpus tokens)"
    )
    max_length: int = Field(default=4096, ge=0, description="truncate samples (0: never)")
    # A re-materialization resumes from the last checkpoint, so the platform keeps some on the way (the trainer's
    # default: only at the end).
    checkpoint_every: int = Field(default=200, ge=0, description="steps between checkpoints (0: only at the end)")
    log_every: int = Field(default=10, ge=1)
    nproc_per_node: int = Field(default=0, ge=0, description="DDP processes (0: one per visible GPU, at least one)")
    features: Literal["offline", "online"] = Field(
        default="offline",
        description="offline: train on the hidden-state stores (written once, read every epoch); online: the target "
        "computes each batch's features while the draft trains, no store (docs/draft-and-benchmark.md)",
    )
    online_prefetch: int = Field(default=2, ge=1, description="online: global batches of features computed ahead")


# The defaults above are sized for a real target (Kimi: 32k draft vocabulary, long samples, many GPUs).
# The tiny target of the embedded default learns in minutes on 2 CPU cores with these instead. ttt_steps 4: the
# benchmark drafts 4 tokens, and unrolling the 3 deeper ones cost a third of each step (measured on the demo's
# corpus, 6 epochs, 324 steps: tau 3.38 with 4 steps in 324 CPU-s, 3.32 with 7 in ~480; 3 or 4 epochs of 7 steps fell to
# 2.29 and 2.80).
TINY_TARGET_TRAIN_CONFIG: dict[str, object] = {
    "draft_vocab_size": 4096,
    "epochs": 6,
    "batch_size": 8,
    "lr": 5e-3,
    "warmup_ratio": 0.05,
    "ttt_steps": 4,
    "max_length": 512,
    "checkpoint_every": 50,
    "log_every": 10,
}
TINY_TARGET_BENCHMARK_CONFIG: dict[str, object] = {
    "num_prompts": 16,
    "max_new_tokens": 48,
    "num_steps": 4,
    "num_draft_tokens": 5,
}


def training_run_config(tiny_target: bool) -> dict[str, object]:
    """What the training sensor launches with: the tiny sizing for the tiny target, else the defaults."""
    if not tiny_target:
        return {}
    return {
        "ops": {
            "draft_model": {"config": TINY_TARGET_TRAIN_CONFIG},
            "draft_benchmark": {"config": TINY_TARGET_BENCHMARK_CONFIG},
        }
    }


def run_identity(model_id: str, shards: dict[str, str], config: DraftTrainConfig) -> str:
    # The prefetch depth changes no number, and an offline run is named as before the online mode existed, so
    # runs from then still resume; an online run (its shards named by the corpus files) carries its mode.
    exclude = {"online_prefetch"} | ({"features"} if config.features == "offline" else set())
    blob = json.dumps(
        {"target": model_id, "shards": shards, "train": config.model_dump(exclude=exclude)}, sort_keys=True
    )
    return hashlib.blake2b(blob.encode(), digest_size=8).hexdigest()


def publish_export(export: Path, latest: Path) -> None:
    """``latest/export`` := a copy of the run's export (``export-vllm``, a symlink to it, keeps the former vLLM-only
    path working), published as a new version: a crash leaves the previous one, an engine still loading it keeps it."""
    with publishing_directory(latest) as staged:
        shutil.copytree(export, staged / "export")
        (staged / "export-vllm").symlink_to("export", target_is_directory=True)


def train_run_config(
    config: DraftTrainConfig, model_dir: Path, keys: list[str], layers: list[int], out: Path
) -> DraftRunConfig:
    """The run file of ``draft_model``: the user's knobs go to the trainer by name, the rest is the platform's."""
    return DraftRunConfig(
        seed=config.seed,
        target=TargetSpec(path=str(model_dir), last_kind="post_norm"),
        draft_vocab_size=config.draft_vocab_size,
        aux_layer_ids=layers,
        embeddings=EmbeddingsSpec(kind="target"),
        vocab=VocabSpec(kind="from_data", force_ids=[EOT_ID]),
        data=StoreData(
            kind="store",
            path=str(hidden_states_root()),
            reader="eagle_assets.hidden_states.store_set:StoreSet",
            reader_kwargs={"partitions": keys},
            max_length=config.max_length or None,
        ),
        train=TrainConfig(**{name: getattr(config, name) for name in TrainKnobs.model_fields}),
        output_dir=str(out),
        export=ExportSpec(dtype="bfloat16"),
        log_every=config.log_every,
    )


def training_command(config_path: Path, nproc: int) -> list[str]:
    """The training process, or ``torchrun`` over ``nproc`` of them. torchrun's logs go beside the run's config:
    left to itself it makes a ``torchelastic_*`` folder in /tmp for every launch and never removes it."""
    module = ["-m", "eagle_assets.draft.pipes_train", "--config", str(config_path)]
    if nproc <= 1:
        return [sys.executable, *module]
    logs = f"--log-dir={config_path.parent / 'torchrun-logs'}"
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", logs, *module]


def training_processes(nproc_per_node: int, gpus: int, features: str, backend: str) -> int:
    """How many training processes to start (0: one per visible GPU, at least one), or why not: with online
    features from vLLM, every torchrun rank would start an engine of its own holding the whole target at its
    tensor-parallel size (8 engines of Kimi K2.5 on 8 GPUs that hold one), so that run trains in one process."""
    nproc = nproc_per_node or max(1, gpus)
    if nproc > 1 and features == "online" and backend == "vllm":
        raise ConfigError(
            f"features: online with the vLLM backend trains in one process, not {nproc}: each torchrun rank would "
            "start a vLLM engine of the whole target of its own. Set nproc_per_node: 1 (the engine's "
            "tensor_parallel_size spreads the target over the GPUs), or train offline from the hidden_states "
            "stores under torchrun."
        )
    return nproc


@dg.asset(
    key=DRAFT_KEY,
    deps=[dg.AssetDep(HIDDEN_STATES_KEY, partition_mapping=dg.AllPartitionMapping())],
    group_name=DRAFT_GROUP,
    pool=GPU_POOL,
    tags=DRAFT_TAGS,
    op_tags={**DRAFT_TAGS, **gpu_step_tags()},
    kinds={"pytorch", "safetensors"},
    description="The EAGLE-3 draft trained on the train split's hidden states (Pipes subprocess, torchrun for "
    "several GPUs), exported as one folder (export/) that SGLang and vLLM both load.",
)
def draft_model(
    context: dg.AssetExecutionContext,
    config: DraftTrainConfig,
    target: TargetModelResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
) -> dg.MaterializeResult:
    online = config.features == "online"
    import torch

    with project_errors_fail():  # a refused configuration, before anything is read or started
        nproc = training_processes(config.nproc_per_node, torch.cuda.device_count(), config.features, target.backend)
    inputs = online_inputs(context, target) if online else offline_inputs(context)
    out = draft_runs_dir() / run_identity(target.model_id(), inputs.shards, config)
    out.mkdir(parents=True, exist_ok=True)
    cfg = train_run_config(config, target.model_dir(), inputs.keys, inputs.layers, out)
    if online:  # the corpus's token rows; the target computes their features as the draft trains
        cfg, inputs = with_online_data(cfg, inputs, target, out, config.max_length, config.online_prefetch)
    (out / "run.json").write_text(cfg.model_dump_json(indent=2))
    context.log.info(
        f"training ({config.features} features) in {out} on {nproc} process(es): {inputs.samples} samples, "
        f"{inputs.tokens} tokens"
    )
    before = tree_bytes(hidden_states_root())
    completed = pipes_subprocess_client.run(
        command=training_command(out / "run.json", nproc), context=context, cwd=str(REPO_ROOT)
    )
    reported = training_report(completed.get_materialize_result(), out)
    written = tree_bytes(hidden_states_root()) - before
    latest = latest_export_dir()
    publish_export(out / "export", latest)
    # What the export found about how the engines will serve it (eagle_assets/draft/export.py), in the UI.
    forge = json.loads((latest / "export" / "config.json").read_text()).get("eagle_forge", {})
    for warning in forge.get("warnings", []):
        context.log.warning(f"export {latest / 'export'}: {warning}")
    return dg.MaterializeResult(
        metadata={
            **reported,
            **features_metadata(config.features, written, reported),
            "run_dir": dg.MetadataValue.path(str(out)),
            "export": dg.MetadataValue.path(str(latest / "export")),
            "export_warnings": dg.MetadataValue.json(forge.get("warnings", [])),
            "embedding_served_by": dg.MetadataValue.json(forge.get("embedding_served_by", {})),
            "train_samples": dg.MetadataValue.int(inputs.samples),
            "train_tokens": dg.MetadataValue.int(inputs.tokens),
            ("corpus_shards" if online else "hidden_state_shards"): dg.MetadataValue.json(inputs.shards),
            "processes": dg.MetadataValue.int(nproc),
        }
    )


def training_report(result: dg.MaterializeResult, out: Path) -> dict[str, Any]:
    """The metadata the training process reported through Pipes. Without it the run would end green with a draft
    that shows no steps, loss or curves (Dagster's Pipes session does not fail when the report never arrives), so
    the materialization fails instead, before the export is published as the latest."""
    reported = dict(result.metadata or {})
    if "steps" not in reported:
        raise fail(
            f"training in {out} ended without its report reaching Dagster (no steps, loss or curves): the export "
            "is not published; the training process's output is in this step's stdout and stderr"
        )
    return reported


def offline_inputs(context: dg.AssetExecutionContext) -> TrainInputs:
    """Every train shard's store, materialized and through its fidelity checks: refused otherwise."""
    from eagle_assets.hidden_states.store_set import StoreSet

    keys = train_partitions(context.instance)
    done = context.instance.get_materialized_partitions(HIDDEN_STATES_KEY)
    missing = [k for k in keys if k not in done]
    if not keys or missing:
        raise fail(f"hidden states missing for {missing or 'every train shard'}: materialize hidden_states first")
    unchecked = fidelity_failures(context.instance, keys)
    if unchecked:
        raise fail(
            "hidden states of "
            + "; ".join(f"{k}: {why}" for k, why in unchecked.items())
            + " — not training on them: fix the extraction and re-materialize those shards"
        )
    with project_errors_fail("hidden-state store not usable: "):  # a StoreError: final for this run
        store = StoreSet(hidden_states_root(), partitions=keys)
    layers = list(store.meta.layers.hf_indices)
    return TrainInputs(keys, store.fingerprints(), layers, len(store), store.n_tokens)


@dg.asset(
    key=BENCHMARK_KEY,
    deps=[DRAFT_KEY],
    group_name=DRAFT_GROUP,
    pool=GPU_POOL,
    tags=DRAFT_TAGS,
    op_tags={**DRAFT_TAGS, **gpu_step_tags()},
    kinds={"pytorch"},
    description="Acceptance length of the exported draft. In process (the default; the tiny target): a greedy "
    "speculative-decoding loop on held-out prompts against an untrained draft. Through SGLang or vLLM (the serving "
    "resource): MT-Bench, GSM8K, HumanEval and held-out prompts as the anchors report them (τ, per-position "
    "acceptance, tokens/s with and without the draft, speedup), beside the published figures.",
)
def draft_benchmark(
    context: dg.AssetExecutionContext,
    config: BenchmarkConfig,
    target: TargetModelResource,
    serving: ServingEngineResource,
) -> dg.MaterializeResult:
    from eagle_assets.assets.draft_benchmark import run_inprocess, run_serving

    export = latest_export_dir() / "export"
    if not (export / "config.json").is_file():
        raise fail(f"no exported draft at {export}: materialize draft_model first")
    if serving.serves:
        return run_serving(context, config, target, serving, export)
    return run_inprocess(context, config, target, export)
