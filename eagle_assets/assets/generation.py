"""Datasets B1–B8 as generated-response assets, one per dataset, partitioned by shard.

One asset per dataset (not a static × dynamic grid) because every dataset has its own number of
shards; a backfill of "failed and missing" then re-runs exactly the shards left.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from eagle_assets.assets.account_observation import account_observation
from eagle_assets.assets.checks import GENERATED_CHECKS, check_results, check_specs
from eagle_assets.assets.dataset_metadata import input_metadata
from eagle_assets.assets.failures import fail, project_errors_fail
from eagle_assets.corpus.validation import run_generated_checks
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.partition_fence import PartitionFence
from eagle_assets.generation.partition_inputs import partition_inputs
from eagle_assets.generation.partition_output import write_partition_parquet
from eagle_assets.generation.partition_runs import native_completion_counts, open_ledger, run_partition
from eagle_assets.generation.partition_sidecars import read_native_counts, record_allowed_providers, write_native_counts
from eagle_assets.generation.plan import plan_gate
from eagle_assets.generation.plan_file import read_plan
from eagle_assets.generation.runner import PartitionJob, PartitionReport
from eagle_assets.generation.shard_identity import ShardIdentity, check_shard_identity
from eagle_assets.k8s_placement import cpu_step_tags
from eagle_assets.keys import GENERATION_GROUP, GENERATION_POOL, PLAN_KEY, generated_asset_key, stage_tags
from eagle_assets.layout import dataset_cache_dir, partition_paths
from eagle_assets.markdown import table
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource

MAX_LOGGED_PROBLEMS = 20


def fetch_native_counts(
    parquet: Path,
    dataset: str,
    shard: str,
    openrouter: OpenRouterResource,
    before_write: Callable[[], None],
) -> int:
    """The provider's own completion counts for a sample of kept responses, beside the partition.
    ``before_write``: the partition fence's check, right before the sidecar is replaced."""
    import polars as pl

    have = read_native_counts(dataset, shard)
    frame = pl.read_parquet(parquet, columns=["prompt_id", "generation_id"]).drop_nulls()
    wanted = {p: g for p, g in zip(frame["prompt_id"], frame["generation_id"], strict=True) if p not in have}
    room = max(0, openrouter.native_count_sample - len(have))
    picked = dict(sorted(wanted.items())[:room])
    if picked:
        have.update(native_completion_counts(openrouter, picked))
        before_write()
        write_native_counts(dataset, shard, have)
    return len(have)


@contextmanager
def partition_outputs_fence(openrouter: OpenRouterResource, key: str) -> Iterator[PartitionFence]:
    """The partition's lease again, for publishing what the run journaled: the runner gave its lease back when
    it stopped, and a host that lost it (declared dead while paused) must not overwrite the parquet or the
    sidecars of the run that took the partition over (``PartitionBusyError``, ``FenceLostError``)."""
    with open_ledger(openrouter) as ledger, ledger.partition_fence(key) as fence:
        yield fence


def record_providers_fenced(fence: PartitionFence, dataset: str, shard: str, names: list[str]) -> list[str]:
    """The providers sidecar (merged with earlier runs'), replaced only while the fence's token is current."""
    fence.check()
    return record_allowed_providers(dataset, shard, names)


def write_parquet_fenced(fence: PartitionFence, journal: Path, parquet: Path) -> int:
    """The partition's parquet from its journal, replaced only while the fence's token is current; its rows."""
    fence.check()
    return write_partition_parquet(journal, parquet)


def report_metadata(report: PartitionReport) -> dict[str, dg.MetadataValue]:
    meta: dict[str, dg.MetadataValue] = {
        "prompts_total": dg.MetadataValue.int(report.total),
        "prompts_done": dg.MetadataValue.int(report.done),
        "new_this_run": dg.MetadataValue.int(report.ok),
        "truncated_length": dg.MetadataValue.int(report.truncated),
        "skipped_400_403": dg.MetadataValue.int(report.skipped),
        "skips_asked_again": dg.MetadataValue.int(report.reasked_skips),
        "request_wide_skips_not_journaled": dg.MetadataValue.int(report.request_wide_skips),
        "failed_retries_exhausted": dg.MetadataValue.int(report.failed),
        "output_tokens_this_run": dg.MetadataValue.int(report.output_tokens),
        "spent_usd_this_run": dg.MetadataValue.float(round(report.spent_usd, 6)),
        "discarded_usd_disallowed_provider": dg.MetadataValue.float(round(report.discarded_usd, 6)),
        # Attempts that may have been billed: charged provisionally, settled from /generation when it knows.
        "uncertain_usd_this_run": dg.MetadataValue.float(round(report.uncertain_usd, 6)),
        "uncertain_attempts_pending": dg.MetadataValue.int(report.uncertain_pending),
        "settled_earlier_usd": dg.MetadataValue.float(round(report.settled_earlier_usd, 6)),
        "requests": dg.MetadataValue.int(report.requests),
        "requests_per_s": dg.MetadataValue.float(round(report.requests / max(report.elapsed_s, 1e-9), 2)),
        "peak_in_flight": dg.MetadataValue.int(report.peak_in_flight),
        "stop_reason": dg.MetadataValue.text(report.stop_reason),
        "errors": dg.MetadataValue.md(
            table(("error class", "count"), sorted(report.errors.items())) if report.errors else "none"
        ),
        "providers": dg.MetadataValue.md(providers_table(report) if report.providers else "none this run"),
    }
    if report.output_tokens:
        meta["usd_per_m_output_tokens"] = dg.MetadataValue.float(
            round(1e6 * report.spent_usd / report.output_tokens, 4)
        )
    return meta


def providers_table(report: PartitionReport) -> str:
    """Per provider: responses kept, their output tokens and dollars, and dollars per million output tokens
    (prompts included: what a million output tokens cost at that provider, all in)."""
    rows = []
    for name, count in report.providers.most_common():
        tokens, usd = report.provider_tokens[name], report.provider_usd[name]
        per_m = f"{1e6 * usd / tokens:.2f}" if tokens else "—"
        rows.append((name, count, f"{tokens:,}", f"{usd:.6f}", per_m))
    return table(("provider", "responses kept", "output tokens", "$", "$/M output tokens"), rows)


def run_generation(
    context: dg.AssetExecutionContext, spec: DatasetSpec, openrouter: OpenRouterResource, duckdb: DuckDBResource
) -> dg.MaterializeResult:
    shard = context.partition_key
    inputs = partition_inputs(spec, shard, dataset_cache_dir(), context.log.info)
    problems = inputs.shard.problems
    context.log.info(
        f"{spec.name}/{shard}: {inputs.source.description}, format {inputs.format.describe()},"
        f" regenerate={inputs.mode}: {len(inputs.shard.conversations)} of {inputs.shard.rows} rows usable,"
        f" {inputs.requests} requests; whole set {inputs.scan.usable:,} of {inputs.scan.rows:,} usable"
        f" (rejected: {inputs.scan.rejected_text()})"
    )
    for p in problems[:MAX_LOGGED_PROBLEMS]:
        context.log.warning(f"skipping unusable prompt row {p}")
    if len(problems) > MAX_LOGGED_PROBLEMS:
        context.log.warning(f"... and {len(problems) - MAX_LOGGED_PROBLEMS} more unusable rows in this shard")
    journal, _ = partition_paths(spec.name, shard)
    check_shard_identity(
        journal, ShardIdentity(inputs.scan.rows, spec.shard_size, spec.order, spec.seed, inputs.source.description)
    )
    with project_errors_fail():  # a PlanRefusal: final for this run
        gate = plan_gate(read_plan(), spec.name, spec.output_token_budget)
    context.log.info(gate.note)
    job = PartitionJob(spec.name, shard, inputs.prompts, gate.token_target, journal, chains=inputs.chains)
    report = run_partition(
        openrouter, job, context.log, observe=lambda snap: context.log_event(account_observation(snap))
    )
    context.log.info(report.summary())
    with partition_outputs_fence(openrouter, job.key) as fence:
        return publish_generation(context, spec, openrouter, duckdb, report, fence, input_metadata(inputs))


def publish_generation(
    context: dg.AssetExecutionContext,
    spec: DatasetSpec,
    openrouter: OpenRouterResource,
    duckdb: DuckDBResource,
    report: PartitionReport,
    fence: PartitionFence,
    inputs_meta: dict[str, dg.MetadataValue],
) -> dg.MaterializeResult:
    """Judge the run's stop, then publish the partition's files while holding its fence."""
    shard = context.partition_key
    journal, parquet = partition_paths(spec.name, shard)
    allowed = record_providers_fenced(fence, spec.name, shard, report.allowed_providers)
    meta = {**inputs_meta, **report_metadata(report)}
    if report.stop_reason in ("budget", "credits"):
        raise fail(
            f"budget exhausted — {report.done} of {report.total} prompts done, resumable "
            f"({report.stop_detail}). Top up or raise budget_usd, then re-materialize this partition.",
            meta,
        )
    if report.stop_reason in ("fatal", "no_success"):
        raise fail(f"generation stopped: {report.stop_detail}", meta)
    if report.stop_reason == "failures":
        raise fail(f"{report.stop_detail} ({report.done} of {report.total} done)", meta)
    if report.stop_reason not in ("completed", "tokens"):
        # A StopReason new to this asset must not pass as success; the journal keeps what was bought.
        raise fail(
            f"generation stopped for a reason this asset does not handle ({report.stop_reason!r}):"
            f" {report.stop_detail or 'no detail'} ({report.done} of {report.total} done)",
            meta,
        )
    meta["rows"] = dg.MetadataValue.int(rows := write_parquet_fenced(fence, journal, parquet))
    if rows == 0:
        raise fail(
            f"{spec.name}/{shard}: all {report.total} requests ended without an answer to keep"
            f" (errors: {dict(report.errors) or 'none'}); nothing to train on",
            meta,
        )
    meta["path"] = dg.MetadataValue.path(str(parquet))
    fetched = fetch_native_counts(parquet, spec.name, shard, openrouter, before_write=fence.check)
    meta["native_counts_fetched"] = dg.MetadataValue.int(fetched)
    outcomes = run_generated_checks(parquet, allowed, duckdb.settings())
    return dg.MaterializeResult(
        metadata=meta, check_results=check_results(context.asset_key, outcomes, GENERATED_CHECKS)
    )


def build_generated_asset(spec: DatasetSpec) -> dg.AssetsDefinition:
    @dg.asset(
        key=generated_asset_key(spec.name),
        group_name=GENERATION_GROUP,
        partitions_def=dg.StaticPartitionsDefinition(spec.shard_keys()),
        pool=GENERATION_POOL,
        deps=[PLAN_KEY],
        check_specs=check_specs(generated_asset_key(spec.name), GENERATED_CHECKS, blocking=False),
        kinds={"openrouter", "parquet"},
        tags=stage_tags(GENERATION_GROUP, spec.name),
        op_tags=cpu_step_tags(),  # a pod on a CPU node under dagster-k8s (k8s_placement)
        description=f"{spec.name}: target-model responses for {spec.source_label}"
        f"{' (' + spec.description + ')' if spec.description else ''}, {spec.shard_size} prompts/shard.",
    )
    def _generated(
        context: dg.AssetExecutionContext, openrouter: OpenRouterResource, duckdb: DuckDBResource
    ) -> dg.MaterializeResult:
        return run_generation(context, spec, openrouter, duckdb)

    return _generated
