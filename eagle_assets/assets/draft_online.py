"""``draft_model`` with ``features: online`` (docs/draft-and-benchmark.md): the draft trains on the corpus's token
rows while the target computes their features. The run's inputs are the train split's corpus shards (their file
fingerprints name the run directory), whose rows go to the trainer as ``tokens.jsonl`` in store order.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from eagle_assets.assets.failures import fail
from eagle_assets.draft.run_config import DraftRunConfig, TokensData
from eagle_assets.layout import shard_file
from eagle_assets.shard_partitions import train_partitions
from resources.target.resource import TargetModelResource


def corpus_fingerprints(keys: list[str]) -> dict[str, str]:
    """A content hash per train shard file: the online run's inputs, as the stores' fingerprints are offline's."""
    out = {}
    for key in keys:
        h = hashlib.blake2b(digest_size=16)
        with shard_file(key).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[key] = h.hexdigest()
    return out


def write_token_rows(keys: list[str], path: Path) -> tuple[int, int, int]:
    """The train shards' rows (ids and mask only) as JSON lines, in store order; (samples, tokens, longest row)."""
    import polars as pl

    samples = tokens = longest = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for key in keys:
            rows = pl.read_parquet(shard_file(key), columns=["input_ids", "loss_mask"])
            for ids, mask in rows.iter_rows():
                f.write(json.dumps({"input_ids": list(ids), "loss_mask": list(mask)}) + "\n")
                samples += 1
                tokens += len(ids)
                longest = max(longest, len(ids))
    tmp.replace(path)
    return samples, tokens, longest


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def online_data(target: TargetModelResource, tokens: Path, max_length: int, prefetch: int, longest: int) -> TokensData:
    from eagle_assets.hidden_states.store_format import dtype_name
    from resources.serving.vllm_engine import seq_len_for

    vllm = {
        "tp_size": target.tensor_parallel_size,
        "max_tokens_per_batch": target.max_tokens_per_batch,
        "max_seq_len": seq_len_for([longest]),  # the longest row the engine will see
        "dtype": target.engine_dtype(),
    }
    return TokensData.model_validate(
        {
            "kind": "tokens",
            "path": str(tokens),
            "max_length": max_length or None,
            "backend": target.backend,
            "feature_dtype": dtype_name(target.dtype()),  # the dtype the offline store would hold
            "prefetch": prefetch,
            "vllm": vllm if target.backend == "vllm" else {},
            "calibrate_in_process": target.backend == "vllm" and target.calibrate_in_process,
        }
    )


@dataclass(frozen=True)
class TrainInputs:
    """What a training run is made of, in either mode: the train partitions, their fingerprints (the run's name),
    the aux layers, and the size of the data."""

    keys: list[str]
    shards: dict[str, str]
    layers: list[int]
    samples: int = 0
    tokens: int = 0


def online_inputs(context: dg.AssetExecutionContext, target: TargetModelResource) -> TrainInputs:
    """The corpus's train shards (no stores): refused when one is missing."""
    from eagle_assets.hidden_states.layers import resolve_aux_layers
    from eagle_assets.target.architecture import read_target_dims

    keys = train_partitions(context.instance)
    missing = [k for k in keys if not shard_file(k).is_file()]
    if not keys or missing:
        raise fail(f"corpus shards missing for {missing or 'every train shard'}: materialize the corpus first")
    layers = resolve_aux_layers(read_target_dims(target.model_dir()).num_layers, target.layers())
    return TrainInputs(keys, corpus_fingerprints(keys), list(layers.hf_indices))


def with_online_data(
    cfg: DraftRunConfig, inputs: TrainInputs, target: TargetModelResource, out: Path, max_length: int, prefetch: int
) -> tuple[DraftRunConfig, TrainInputs]:
    """The run file's data section made online: ``tokens.jsonl`` written in the run directory, the target's backend,
    its dtype where the trainer runs it (bf16 on a GPU, fp32 on CPU, as the extraction loads it)."""
    samples, tokens, longest = write_token_rows(inputs.keys, out / "tokens.jsonl")
    dtype = "bfloat16" if target.torch_device().type == "cuda" else "float32"
    last_kind = "pre_norm" if target.backend == "vllm" else cfg.target.last_kind  # vLLM's is the norm's input
    cfg = cfg.model_copy(
        update={
            "data": online_data(
                target, out / "tokens.jsonl", max_length, prefetch, min(longest, max_length or longest)
            ),
            "target": cfg.target.model_copy(update={"dtype": dtype, "last_kind": last_kind}),
        }
    )
    return cfg, TrainInputs(inputs.keys, inputs.shards, inputs.layers, samples, tokens)


def features_metadata(mode: str, written: int, reported: dict[str, Any]) -> dict[str, Any]:
    """The mode, the target's and the draft's tokens/s, the bytes written under ``hidden_states/`` by this run."""
    md: dict[str, Any] = {
        "features": dg.MetadataValue.text(mode),
        "feature_bytes_written": dg.MetadataValue.int(max(0, written)),
    }
    if "tokens_per_s" in reported:
        md["draft_tokens_per_s"] = reported["tokens_per_s"]
    return md
