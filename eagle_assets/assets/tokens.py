"""Tokenized partitions: the exact token ids of every generated response, per dataset × shard."""

from pathlib import Path

import dagster as dg

from eagle_assets import settings
from eagle_assets.assets.generation import generated_asset_key, partition_paths
from eagle_assets.corpus.tokenize_partition import tokenize_generated
from eagle_assets.corpus.tokenized_schema import write_tokenized
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer

TOKENS_GROUP = "tokens"


def tokenized_asset_key(dataset: str) -> dg.AssetKey:
    return dg.AssetKey(["tokenized", dataset])


def tokenized_path(dataset: str, shard: str) -> Path:
    return settings.forge_home() / "tokenized" / dataset / f"{shard}.parquet"


def build_tokenized_asset(spec: DatasetSpec, partitions_def: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    @dg.asset(
        key=tokenized_asset_key(spec.name),
        deps=[generated_asset_key(spec.name)],
        group_name=TOKENS_GROUP,
        partitions_def=partitions_def,
        kinds={"parquet"},
        tags={"eagle-forge/stage": "tokens", "eagle-forge/dataset": spec.name},
        description=f"{spec.name}: exact Kimi token ids, loss masks and API token-count differences per shard.",
    )
    def _tokenized(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        shard = context.partition_key
        generated = partition_paths(spec.name, shard)[1]
        if not generated.is_file():
            raise dg.Failure(
                description=f"no generated data for {spec.name}/{shard} at {generated}: "
                "materialize the generation partition first",
                allow_retries=False,
            )
        rows, summary = tokenize_generated(generated, spec.name, shard, load_kimi_tokenizer(settings.tokenizer_dir()))
        out = tokenized_path(spec.name, shard)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_tokenized(out, rows)
        return dg.MaterializeResult(
            metadata={
                "path": dg.MetadataValue.path(str(out)),
                "samples": dg.MetadataValue.int(summary.samples),
                "tokens": dg.MetadataValue.int(summary.tokens),
                "completion_tokens": dg.MetadataValue.int(summary.completion_tokens),
                "api_completion_tokens": dg.MetadataValue.int(summary.api_completion_tokens),
                "token_count_relative_diff": dg.MetadataValue.float(summary.relative_diff),
                "samples_with_token_diff": dg.MetadataValue.int(summary.nonzero_diffs),
            }
        )

    return _tokenized
