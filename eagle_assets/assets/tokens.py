"""Tokenized partitions: the exact token ids of every generated response, per dataset × shard."""

import dagster as dg

from eagle_assets.assets.checks import TOKENIZED_CHECKS, check_results, check_specs, length_metadata
from eagle_assets.assets.failures import fail
from eagle_assets.corpus.tokenize_partition import tokenize_generated
from eagle_assets.corpus.tokenized_schema import write_tokenized
from eagle_assets.corpus.validation import run_tokenized_checks
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.partition_sidecars import read_allowed_providers, read_native_counts
from eagle_assets.k8s_placement import cpu_step_tags
from eagle_assets.keys import TOKENS_GROUP, generated_asset_key, stage_tags, tokenized_asset_key
from eagle_assets.layout import generated_path, tokenized_path
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource


def build_tokenized_asset(spec: DatasetSpec, partitions_def: dg.PartitionsDefinition | None) -> dg.AssetsDefinition:
    @dg.asset(
        key=tokenized_asset_key(spec.name),
        deps=[generated_asset_key(spec.name)],
        group_name=TOKENS_GROUP,
        partitions_def=partitions_def,
        kinds={"parquet", "duckdb"},
        check_specs=check_specs(tokenized_asset_key(spec.name), TOKENIZED_CHECKS, blocking=True),
        tags=stage_tags(TOKENS_GROUP, spec.name),
        op_tags=cpu_step_tags(),  # a pod on a CPU node under dagster-k8s (k8s_placement)
        description=f"{spec.name}: exact Kimi token ids, loss masks and API token-count differences per shard.",
    )
    def _tokenized(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
        shard = context.partition_key
        generated = generated_path(spec.name, shard)
        if not generated.is_file():
            raise fail(
                f"no generated data for {spec.name}/{shard} at {generated}: materialize the generation partition first"
            )
        rows, summary = tokenize_generated(
            generated,
            spec.name,
            shard,
            load_kimi_tokenizer(resolve_tokenizer_dir()),
            native_counts=read_native_counts(spec.name, shard),
        )
        out = tokenized_path(spec.name, shard)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_tokenized(out, rows)
        db = duckdb.settings()
        outcomes = run_tokenized_checks(out, read_allowed_providers(spec.name, shard), settings=db)
        lengths = next(o for o in outcomes if o.name == "length_distribution").metadata
        return dg.MaterializeResult(
            check_results=check_results(context.asset_key, outcomes, TOKENIZED_CHECKS),
            metadata={
                **length_metadata(lengths),
                "path": dg.MetadataValue.path(str(out)),
                "samples": dg.MetadataValue.int(summary.samples),
                "tokens": dg.MetadataValue.int(summary.tokens),
                "completion_tokens": dg.MetadataValue.int(summary.completion_tokens),
                "api_completion_tokens": dg.MetadataValue.int(summary.api_completion_tokens),
                "token_count_relative_diff": dg.MetadataValue.float(summary.relative_diff),
                "samples_with_token_diff": dg.MetadataValue.int(summary.nonzero_diffs),
                "prompt_tokens": dg.MetadataValue.int(summary.prompt_tokens),
                "api_prompt_tokens": dg.MetadataValue.int(summary.api_prompt_tokens),
                "prompt_token_relative_diff": dg.MetadataValue.float(summary.prompt_relative_diff),
                "samples_with_prompt_token_diff": dg.MetadataValue.int(summary.prompt_nonzero_diffs),
                "samples_with_native_count": dg.MetadataValue.int(
                    sum(r["native_completion_tokens"] is not None for r in rows)
                ),
            },
        )

    return _tokenized
