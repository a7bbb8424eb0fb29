"""Hidden-state stores: the target's three auxiliary features (and last state) for every corpus token.

One store per corpus shard (``hidden_states/<shard>``), skipped when complete, so a re-run resumes. These steps
need the target and its accelerators: tagged and pooled (``gpu``, one at a time per host) so the rest of the
pipeline runs anywhere. Each ends with the three blocking fidelity checks (docs/hidden-states.md).
"""

import time
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from eagle_assets.assets.failures import fail, project_errors_fail
from eagle_assets.assets.hidden_state_checks import (
    FidelityCheckConfig,
    fidelity_check_results,
    fidelity_check_specs,
    fidelity_metadata,
)
from eagle_assets.corpus.validation import CheckOutcome
from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
from eagle_assets.k8s_placement import gpu_step_tags
from eagle_assets.keys import (
    CORPUS_KEY,
    CORPUS_SHARDS,
    GPU_POOL,
    HIDDEN_STATES_GROUP,
    HIDDEN_STATES_KEY,
    HIDDEN_STATES_TAGS,
)
from eagle_assets.layout import handoff_dir, shard_file, store_dir
from resources.target.resource import TargetModelResource

GiB = 1 << 30


def _progress_logger(context: dg.AssetExecutionContext, every_s: float = 10.0):
    last = [0.0]

    def report(p) -> None:  # a hidden_states.pipeline.Progress
        now = time.monotonic()
        if p.event == "shard" or now - last[0] >= every_s:
            last[0] = now
            context.log.info(
                f"{p.tokens_done}/{p.tokens_total} tokens ({p.fraction:.0%}), {p.tokens_per_s:.0f} tokens/s"
            )

    return report


@dg.asset(
    key=HIDDEN_STATES_KEY,
    deps=[CORPUS_KEY],
    partitions_def=CORPUS_SHARDS,
    group_name=HIDDEN_STATES_GROUP,
    pool=GPU_POOL,
    tags=HIDDEN_STATES_TAGS,
    op_tags={**HIDDEN_STATES_TAGS, **gpu_step_tags()},
    kinds={"pytorch", "safetensors"},
    check_specs=fidelity_check_specs(CORPUS_SHARDS),
    description="Per corpus shard: the target's low/mid/high auxiliary hidden states and last hidden state "
    "for every token, as safetensors shards with an index (bf16 by default), checked against the target run in "
    "full (blocking). Runs on the GPU host.",
)
def hidden_states(
    context: dg.AssetExecutionContext, config: FidelityCheckConfig, target: TargetModelResource
) -> dg.MaterializeResult:
    from eagle_assets.hidden_states.store_space import check_disk, estimate_store_bytes
    from eagle_assets.target.architecture import read_target_dims

    key = context.partition_key
    source = shard_file(key)
    if not source.is_file():
        raise fail(f"corpus shard {key} ({source}) does not exist: re-materialize the corpus")
    rows = pl.read_parquet(source, columns=["prompt_id", "input_ids", "loss_mask", "prompt_len"])
    n_tokens = int(rows["input_ids"].list.len().sum())
    model_dir = target.model_dir()
    dims = read_target_dims(model_dir)
    n_aux = len(target.layers() or (0, 0, 0))
    need = estimate_store_bytes(n_tokens, dims.hidden_size, n_aux=n_aux, dtype_bytes=target.dtype().itemsize)
    out = store_dir(key)
    reserve = int(target.reserve_disk_gb * GiB)
    with project_errors_fail():  # an InsufficientDiskError: final for this run
        check_disk(out, need, reserve_bytes=reserve)
    context.log.info(
        f"{key}: {len(rows)} samples, {n_tokens} tokens → about {need / GiB:.3f} GiB "
        f"({n_tokens} × ({n_aux} aux + last) × {dims.hidden_size} × {target.dtype().itemsize} B) in {out}"
    )
    samples = [{"sample_id": r[0], "input_ids": r[1], "loss_mask": r[2]} for r in rows.iter_rows()]
    fidelity = config.fidelity()
    progress = _progress_logger(context)
    started = time.monotonic()
    if target.backend == "hf":
        skipped, tokens_per_s = extract_partition_hf(key, samples, out, model_dir, target, fidelity, progress, reserve)
    else:
        skipped, tokens_per_s = extract_partition_vllm(
            key, samples, out, model_dir, dims.num_layers, target, fidelity, progress, reserve
        )
    elapsed = time.monotonic() - started
    checked = time.monotonic()
    outcomes = check_partition(key, samples, rows["prompt_len"].to_list(), out, model_dir, target, fidelity)
    return dg.MaterializeResult(
        check_results=fidelity_check_results(context, outcomes),
        metadata={
            **fidelity_metadata(outcomes),
            "fidelity_seconds": dg.MetadataValue.float(round(time.monotonic() - checked, 2)),
            "store": dg.MetadataValue.path(str(out)),
            "samples": dg.MetadataValue.int(len(rows)),
            "tokens": dg.MetadataValue.int(n_tokens),
            "estimated_gib": dg.MetadataValue.float(round(need / GiB, 4)),
            "hidden_size": dg.MetadataValue.int(dims.hidden_size),
            "target": dg.MetadataValue.text(target.model_id()),
            "backend": dg.MetadataValue.text(target.backend),
            "already_complete": dg.MetadataValue.bool(bool(skipped)),
            "tokens_per_s": dg.MetadataValue.float(round(tokens_per_s, 1)),
            "seconds": dg.MetadataValue.float(round(elapsed, 2)),
        },
    )


def extract_partition_hf(
    key: str,
    samples: list[dict[str, Any]],
    out: Path,
    model_dir: Path,
    target: TargetModelResource,
    fidelity: FidelityConfig,
    progress: Any,
    reserve: int,
) -> tuple[int, float]:
    """The store through the Hugging Face model in this process, then its calibration: (shards skipped, tokens/s)."""
    from eagle_assets.hidden_states.extract_hf import extract_hf

    model = load_model(model_dir, target)
    report = extract_hf(
        model,
        {key: samples},
        out,
        model_id=target.model_id(),
        layers=target.layers(),
        dtype=target.dtype(),
        max_tokens_per_batch=target.max_tokens_per_batch,
        progress=progress,
        reserve_bytes=reserve,
    )
    calibrate_partition(model, key, samples, out, target, fidelity)
    del model
    return report.shards_skipped, report.tokens_per_s


def extract_partition_vllm(
    key: str,
    samples: list[dict[str, Any]],
    out: Path,
    model_dir: Path,
    num_layers: int,
    target: TargetModelResource,
    fidelity: FidelityConfig,
    progress: Any,
    reserve: int,
) -> tuple[int, float]:
    """The store through one vLLM engine in one pass, then its calibration (the target in this process, or the same
    engine): (shards skipped, tokens/s). The disk check and resume come first: a finished or refused partition
    starts no engine."""
    from eagle_assets.hidden_states.extract_vllm import VLLMEngineConfig, VLLMFeatureClient, extract_vllm
    from eagle_assets.hidden_states.layers import resolve_aux_layers
    from resources.serving.vllm_engine import seq_len_for

    config = VLLMEngineConfig(
        model_path=str(model_dir),
        layers=resolve_aux_layers(num_layers, target.layers()),
        tp_size=target.tensor_parallel_size,
        max_seq_len=seq_len_for(len(s["input_ids"]) for s in samples),
        max_tokens_per_batch=target.max_tokens_per_batch,
        dtype=target.engine_dtype(),
        scratch_dir=str(handoff_dir(key)),
    )
    client = VLLMFeatureClient(config, out_dtype=target.dtype())
    try:
        report = extract_vllm(
            {key: samples},
            out,
            config,
            model_id=target.model_id(),
            dtype=target.dtype(),
            client=client,
            progress=progress,
            reserve_bytes=reserve,
        )
        if target.calibrate_in_process:
            client.close()  # the engine's memory back before the target loads here
            calibrate_partition(load_model(model_dir, target), key, samples, out, target, fidelity)
        else:
            calibrate_through_engine(client, key, samples, out, model_dir, target, fidelity)
    finally:
        client.close()
    return report.shards_skipped, report.tokens_per_s


def calibrate_through_engine(
    client: Any,
    key: str,
    samples: list[dict[str, Any]],
    out: Path,
    model_dir: Path,
    target: TargetModelResource,
    fidelity: FidelityConfig,
) -> None:
    """The calibration from the extraction's engine (its own prompt log-probabilities), skipped when current: for
    a target that cannot run in this process."""
    from eagle_assets.draft.target import load_target_head
    from eagle_assets.hidden_states.calibration_engine import calibration_is_current
    from eagle_assets.hidden_states.fidelity import Calibration, calibrate_shards, read_calibration, write_calibration
    from eagle_assets.hidden_states.samples import as_sample
    from eagle_assets.hidden_states.store_format import dtype_name

    shards = [(key, [as_sample(s) for s in samples])]
    if calibration_is_current(read_calibration(out), shards, fidelity):  # a finished partition: no engine
        return
    records = calibrate_shards(
        shards, client.calibrator(load_target_head(model_dir, "pre_norm"), target.dtype(), fidelity)
    )
    write_calibration(out, Calibration(target.model_id(), dtype_name(target.dtype()), "pre_norm", fidelity, records))


def load_model(model_dir: Path, target: TargetModelResource) -> Any:
    import torch

    from eagle_assets.target.loader import load_target

    device = target.torch_device()
    return load_target(model_dir, device, torch.bfloat16 if device.type == "cuda" else torch.float32)


def calibrate_partition(
    model: Any,
    key: str,
    samples: list[dict[str, Any]],
    out: Path,
    target: TargetModelResource,
    fidelity: FidelityConfig,
) -> None:
    """The target run in full on a few of the shard's samples, recorded beside the store (what the checks use)."""
    from eagle_assets.hidden_states.calibration import calibrate_store
    from eagle_assets.hidden_states.fidelity import write_calibration
    from eagle_assets.hidden_states.samples import as_sample
    from eagle_assets.hidden_states.store import HiddenStateStore

    store = HiddenStateStore(out)
    calibration = calibrate_store(
        model,
        [(key, [as_sample(s) for s in samples])],
        store.layers,
        model_id=target.model_id(),
        store_dtype=store.meta.dtype,
        last_kind=store.meta.last_kind,
        config=fidelity,
    )
    write_calibration(out, calibration)


def check_partition(
    key: str,
    samples: list[dict[str, Any]],
    prompt_lens: list[int],
    out: Path,
    model_dir: Path,
    target: TargetModelResource,
    fidelity: FidelityConfig,
) -> list[CheckOutcome]:
    """The three fidelity checks of this partition's store, with the target's own head (as training loads it)."""
    from eagle_assets.draft.target import load_target_head
    from eagle_assets.hidden_states.fidelity_checks import CorpusShard, run_fidelity_checks
    from eagle_assets.hidden_states.samples import as_sample
    from eagle_assets.hidden_states.store import HiddenStateStore

    device = target.torch_device()
    head = load_target_head(model_dir, HiddenStateStore(out).meta.last_kind).to(device)
    corpus = CorpusShard(key, [as_sample(s) for s in samples], prompt_lens)
    return run_fidelity_checks(out, [corpus], head, partition=key, device=device, config=fidelity)
