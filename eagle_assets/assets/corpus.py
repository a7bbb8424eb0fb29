"""The merged training corpus: every tokenized partition of B1–B8, validated, deduplicated, shuffled, split.

It re-runs the blocking checks over each dataset as a whole before merging: a partition whose checks
failed in another run (or were never run) must not reach training, and the token-count bar is an
aggregate over a dataset, not over one shard. Its shards become the partitions of the hidden-state
asset (dynamic partitions, since their number follows from the data).
"""

from collections.abc import Sequence
from pathlib import Path

import dagster as dg
from pydantic import Field

from eagle_assets.assets.checks import TOKENIZED_CHECKS, length_metadata
from eagle_assets.assets.failures import fail
from eagle_assets.corpus.merge import MergeConfig, merge_corpus
from eagle_assets.corpus.validation import (
    DEFAULT_TOKEN_DIFF_BOUND,
    CheckOutcome,
    length_distribution,
    run_tokenized_checks,
)
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.partition_sidecars import read_allowed_providers
from eagle_assets.k8s_placement import cpu_step_tags
from eagle_assets.keys import CORPUS_GROUP, CORPUS_KEY, stage_tags, tokenized_asset_key
from eagle_assets.layout import corpus_dir, shard_partition_key, tokenized_path
from eagle_assets.markdown import table
from eagle_assets.shard_partitions import sync_shard_partitions
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource


class CorpusConfig(dg.Config):
    seed: int = Field(0, description="shuffle seed: the same inputs and seed give the same shards")
    eval_fraction: float = Field(0.05, ge=0.0, lt=1.0, description="share of samples held out for evaluation")
    max_samples_per_shard: int = Field(50_000, ge=1)
    max_tokens_per_shard: int = Field(16_000_000, ge=1)
    token_diff_bound: float = Field(DEFAULT_TOKEN_DIFF_BOUND, ge=0.0, description="|Σ diff| / Σ API tokens per dataset")
    allow_missing_partitions: bool = Field(
        False, description="merge what is there when some shards are not tokenized yet (default: refuse)"
    )


def _failed(outcomes: Sequence[CheckOutcome]) -> list[str]:
    return [f"{o.name}: {o.summary}" for o in outcomes if o.name in TOKENIZED_CHECKS and not o.passed]


def build_corpus_asset(datasets: Sequence[DatasetSpec]) -> dg.AssetsDefinition:
    @dg.asset(
        key=CORPUS_KEY,
        deps=[dg.AssetDep(tokenized_asset_key(s.name), partition_mapping=dg.AllPartitionMapping()) for s in datasets],
        group_name=CORPUS_GROUP,
        kinds={"parquet", "duckdb"},
        tags=stage_tags(CORPUS_GROUP),
        op_tags=cpu_step_tags(),  # a pod on a CPU node under dagster-k8s (k8s_placement)
        description="All tokenized partitions, re-validated per dataset, deduplicated, shuffled with a fixed seed, "
        "split train/eval and written in shards (the hidden-state partitions).",
    )
    def corpus(
        context: dg.AssetExecutionContext, config: CorpusConfig, duckdb: DuckDBResource, openrouter: OpenRouterResource
    ) -> dg.MaterializeResult:
        db = duckdb.settings()
        sources: list[Path] = []
        missing: list[str] = []
        problems: list[str] = []
        tokens: dict[str, float] = {}
        diffs: dict[str, float] = {}
        for spec in datasets:
            files = [tokenized_path(spec.name, k) for k in spec.shard_keys()]
            missing += [f"{spec.name}/{f.stem}" for f in files if not f.is_file()]
            present = [f for f in files if f.is_file()]
            if not present:
                continue
            allowed = sorted({p for f in present for p in read_allowed_providers(spec.name, f.stem)})
            outcomes = run_tokenized_checks(present, allowed, config.token_diff_bound, db)
            problems += [f"{spec.name}: {p}" for p in _failed(outcomes)]
            by_name = {o.name: o for o in outcomes}
            tokens[spec.name] = float(by_name["length_distribution"].metadata["total_tokens"])
            diffs[spec.name] = float(by_name["token_diff"].metadata["relative_diff"])
            sources += present
        if missing and not config.allow_missing_partitions:
            raise fail(
                f"{len(missing)} tokenized partitions missing ({', '.join(missing[:12])}"
                f"{' …' if len(missing) > 12 else ''}): materialize them (or set allow_missing_partitions)"
            )
        if problems:
            raise fail("blocking checks fail, nothing merged:\n" + "\n".join(problems))
        if not sources:
            raise fail("no tokenized partitions to merge")
        merge = MergeConfig(
            seed=config.seed,
            eval_fraction=config.eval_fraction,
            max_samples_per_shard=config.max_samples_per_shard,
            max_tokens_per_shard=config.max_tokens_per_shard,
        )
        # Its single-writer lease goes in the ledger the resource names, as the spend below is read from it.
        result = merge_corpus(sources, corpus_dir(), merge, lease_location=openrouter.ledger_location())
        index = result.index
        keys = [shard_partition_key(e["file"]) for split in index["splits"].values() for e in split["shards"]]
        sync_shard_partitions(context.instance, keys)
        context.log.info(
            f"corpus {'unchanged' if result.skipped else 'written'}: {index['counts']['samples']} samples, "
            f"{index['counts']['tokens']} tokens in {len(keys)} shards"
        )
        spend = dataset_spend_usd(list(tokens), openrouter.ledger_location())
        return dg.MaterializeResult(metadata=corpus_metadata(index, tokens, diffs, missing, spend))

    return corpus


def dataset_spend_usd(names: Sequence[str], location: str | Path) -> dict[str, float]:
    """What the ledger at ``location`` (the OpenRouter resource's: its database URL, else the environment's, else
    the SQLite file) says each dataset cost; nothing when there is no SQLite file yet."""
    if isinstance(location, Path) and not location.is_file():
        return {}
    ledger = BudgetLedger(location)
    try:
        return {n: ledger.totals(n).usd_spent for n in names}
    finally:
        ledger.close()


def corpus_metadata(
    index: dict, tokens: dict[str, float], diffs: dict[str, float], missing: list[str], spend: dict[str, float]
) -> dict[str, dg.MetadataValue]:
    from eagle_assets.plots import bar_chart_md  # matplotlib: only in the step that draws

    counts, splits = index["counts"], index["splits"]
    rows = [(n, int(tokens[n]), f"{diffs[n]:.5%}", f"{spend.get(n, 0.0):.4f}") for n in sorted(tokens)]
    lengths = _corpus_lengths(index)
    meta: dict[str, dg.MetadataValue] = {
        "path": dg.MetadataValue.path(str(corpus_dir())),
        "samples": dg.MetadataValue.int(counts["samples"]),
        "tokens": dg.MetadataValue.int(counts["tokens"]),
        "loss_tokens": dg.MetadataValue.int(counts["loss_tokens"]),
        "duplicates_removed": dg.MetadataValue.int(counts["duplicate_prompt_id"] + counts["duplicate_input_ids"]),
        "train_samples": dg.MetadataValue.int(splits["train"]["samples"]),
        "eval_samples": dg.MetadataValue.int(splits["eval"]["samples"]),
        "shards": dg.MetadataValue.int(sum(len(s["shards"]) for s in splits.values())),
        "missing_partitions": dg.MetadataValue.int(len(missing)),
        "datasets": dg.MetadataValue.md(table(("dataset", "tokens", "token count diff vs API", "spent USD"), rows)),
        "tokens_per_dataset": dg.MetadataValue.md(bar_chart_md(tokens, "tokens per dataset", "tokens")),
        "plan_key": dg.MetadataValue.text(index["plan_key"]),
    }
    if spend:
        meta["dollars_per_dataset"] = dg.MetadataValue.md(bar_chart_md(spend, "dollars per dataset", "USD"))
    if lengths:
        meta.update(length_metadata(lengths))
    return meta


def _corpus_lengths(index: dict) -> dict[str, float | int | str]:
    files = [corpus_dir() / e["file"] for s in index["splits"].values() for e in s["shards"]]
    return length_distribution(files).metadata if files else {}
