"""``generation_plan``: what the datasets' token targets will cost, shown before the money is spent.

An asset rather than a step of each generation partition: a plan is one decision over all datasets against one
budget, seen in the UI and remade on purpose (a top-up, a new ``on_overrun``); each partition reads the recorded
decision (``plan.plan_gate``). This module gathers the inputs, as docs/generation-and-budget.md says.
"""

import asyncio
import math
from collections.abc import Callable
from typing import Any

import dagster as dg
from pydantic import Field

from eagle_assets.assets.account_observation import account_observation
from eagle_assets.assets.failures import fail
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.account_snapshot import AccountSnapshot
from eagle_assets.generation.partition_runs import (
    account_snapshot,
    generation_settings,
    open_ledger,
    preflight,
    prompt_estimator,
    run_partitions,
)
from eagle_assets.generation.plan import (
    OVERRUN_CHOICES,
    PROPOSAL_RULES,
    DatasetInput,
    EndpointPrice,
    LengthStats,
    Money,
    Plan,
    choose_length_stats,
    make_plan,
    price_model,
    requests_needed,
    tail_reserve_usd,
)
from eagle_assets.generation.plan_file import write_plan
from eagle_assets.generation.plan_inputs import JournalFacts, latency_estimate
from eagle_assets.generation.plan_queue import DatasetQueue, dataset_queue
from eagle_assets.generation.plan_report import plan_markdown
from eagle_assets.generation.runner import PartitionJob, format_duration
from eagle_assets.keys import GENERATION_GROUP, GENERATION_POOL, PLAN_KEY, stage_tags
from eagle_assets.layout import dataset_cache_dir, journal_path, plan_path
from resources.openrouter.resource import OpenRouterResource


class GenerationPlanConfig(dg.Config):
    on_overrun: str = Field(
        "wait",
        description="When the targets do not fit the money: wait (generation refuses to start until the plan is"
        " re-made), scale_down (generation uses the proposed targets) or proceed (spend until the money runs out)",
    )
    proposal: str = Field("proportional", description="Targets scale_down uses: equal or proportional")
    pilot_prompts: int = Field(
        200,
        ge=0,
        description="Per dataset without answers of its own: prompts bought now to measure answer lengths (kept as"
        " data; 0: no pilot)",
    )
    prior_mean_tokens: float = Field(3000.0, gt=0, description="Answer length assumed when nothing is measured")
    prior_sd_tokens: float = Field(2000.0, ge=0)
    prior_mean_error: float = Field(0.5, ge=0, description="How far off the prior's mean may be (fraction, 1 sigma)")
    prior_seconds_per_answer: float = Field(90.0, gt=0, description="Latency assumed when none is measured")


def enough_answers(config: GenerationPlanConfig, openrouter: OpenRouterResource) -> int:
    """A dataset's own answers are enough from admission's ``min_samples``, or the pilot's size if smaller."""
    min_samples = generation_settings(openrouter).admission.min_samples
    return min(min_samples, config.pilot_prompts) if config.pilot_prompts else min_samples


def queue_of(spec: DatasetSpec) -> DatasetQueue:
    return dataset_queue(spec, dataset_cache_dir(), journal_path)


def _allowed_prices(openrouter: OpenRouterResource, log: Any, with_tools: bool) -> list[EndpointPrice]:
    async def table() -> list[EndpointPrice]:
        async with openrouter.client() as client:
            t = await openrouter.provider_table(client, log, with_tools)
            return [EndpointPrice(e.provider_name, e.prompt_price, e.completion_price) for e in t.allowed]

    openrouter.ensure_server()
    return asyncio.run(table())


def run_pilots(
    specs: list[DatasetSpec], config: GenerationPlanConfig, openrouter: OpenRouterResource, log: Any
) -> dict[str, int]:
    """Buy ``pilot_prompts`` answers for every dataset whose own answers are too few; returns how many each got."""
    if config.pilot_prompts == 0:
        return {}
    with open_ledger(openrouter) as ledger:
        have = ledger.dataset_lengths()
    enough = enough_answers(config, openrouter)
    jobs: list[PartitionJob] = []
    wanted: dict[str, int] = {}
    for spec in specs:
        model, own = have.get(spec.name, (openrouter.model, None))
        if own is not None and model in (openrouter.model, "") and own.n >= enough:
            continue
        for shard, prompts, chains in queue_of(spec).pilot(config.pilot_prompts):
            journal = journal_path(spec.name, shard)
            jobs.append(PartitionJob(spec.name, shard, prompts, spec.output_token_budget, journal, chains=chains))
            wanted[spec.name] = wanted.get(spec.name, 0) + (len(prompts) if chains is None else chains.total)
    if not jobs:
        return {}
    log.info(f"pilot: {sum(wanted.values()):,} requests across {len(wanted)} datasets, kept as data")
    got: dict[str, int] = dict.fromkeys(wanted, 0)
    for report in run_partitions(openrouter, jobs, log):
        log.info(f"pilot {report.summary()}")
        if report.stop_reason == "fatal":
            raise fail(f"the pilot stopped: {report.stop_detail}")
        if report.stop_reason != "completed":
            log.warning(f"pilot {report.partition} stopped early ({report.stop_reason}): {report.stop_detail}")
        got[report.partition.split("/")[0]] += report.ok
    return got


def build_plan(
    specs: list[DatasetSpec],
    config: GenerationPlanConfig,
    openrouter: OpenRouterResource,
    log: Any,
    observe: Callable[[AccountSnapshot], None],
) -> Plan:
    """``observe``: receives the account's money as the plan saw it (a point on the account's curve)."""
    if config.on_overrun not in OVERRUN_CHOICES or config.proposal not in PROPOSAL_RULES:
        raise fail(
            f"on_overrun must be one of {OVERRUN_CHOICES} and proposal one of {PROPOSAL_RULES};"
            f" got {config.on_overrun!r}, {config.proposal!r}"
        )
    gen = preflight(openrouter)
    pilots = run_pilots(specs, config, openrouter, log)
    queues = {spec.name: queue_of(spec) for spec in specs}
    everyone = sum((q.facts for q in queues.values()), JournalFacts())
    with_tools = any(_has_tools(q) for q in queues.values())
    prices = price_model(_allowed_prices(openrouter, log, with_tools), everyone.providers)
    estimate = prompt_estimator(openrouter)
    with open_ledger(openrouter, gen.admission) as ledger:
        lengths = ledger.dataset_lengths()
        per_dataset = {spec.name: ledger.totals(spec.name) for spec in specs}
    prior = LengthStats.prior(
        min(config.prior_mean_tokens, float(gen.max_tokens)),
        config.prior_sd_tokens,
        config.prior_mean_error,
        f"configured prior (max_tokens {gen.max_tokens:,})"
        if config.prior_mean_tokens > gen.max_tokens
        else "configured prior",
    )
    enough = enough_answers(config, openrouter)
    inputs = []
    for spec in specs:
        queue = queues[spec.name]
        stats = choose_length_stats(
            spec.name,
            gen.model,
            lengths,
            enough,
            prior,
            finished=queue.pending == 0,
            pilot=pilots.get(spec.name, 0),
        )
        latency = latency_estimate(queue.facts, everyone, config.prior_seconds_per_answer, spec.name)
        inputs.append(dataset_input(spec, queue, stats, latency, per_dataset[spec.name], estimate, gen.max_tokens))
        log.info(
            f"plan inputs {spec.name}: {queue.pending:,} of {queue.total_requests:,} requests pending"
            f" ({len(inputs[-1].prompt_tokens):,} prompts rendered), lengths from {stats.source}"
        )
    snap = account_snapshot(openrouter, "generation_plan")
    observe(snap)
    widest = max((i.lengths for i in inputs), key=lambda s: s.mean, default=prior)
    money = Money(
        snap.budget_usd,
        snap.spent_usd,
        snap.held_usd,
        snap.remaining_credit_usd,
        snap.cap_source,
        tail_reserve_usd(gen.max_in_flight, widest, prices, gen.tail_fraction, gen.admission),
    )
    return make_plan(
        inputs,
        prices,
        money,
        gen.max_in_flight,
        config.on_overrun,
        config.proposal,
        tail_fraction=gen.tail_fraction,
    )


def dataset_input(
    spec: DatasetSpec,
    queue: DatasetQueue,
    stats: LengthStats,
    latency: tuple[float, str],
    done: Any,
    estimate: Callable[[Any], int],
    max_tokens: int,
) -> DatasetInput:
    """``done``: the ledger's totals for the dataset (spend so far)."""
    left = spec.output_token_budget - done.tokens_spent
    need = requests_needed(stats, left, queue.pending)
    counted = queue.prompt_tokens(max(1, need) if queue.pending else 0, estimate, stats.mean)
    if queue.pending and not counted:
        raise fail(
            f"{spec.name}: {queue.pending:,} requests pending by the journals, but no shard yields"
            " one to ask (the source changed since its scan?)"
        )
    return DatasetInput(
        spec.name,
        spec.output_token_budget,
        done.tokens_spent,
        done.usd_spent,
        queue.pending,
        counted,
        stats,
        latency[0],
        latency[1],
        max_tokens,
    )


def _has_tools(queue: DatasetQueue) -> bool:
    """Whether the dataset's first pending request declares tools (routing then needs endpoints with tools)."""
    first = next(queue.requests(), None)
    return bool(first and first.prompt.tools)


def plan_metadata(plan: Plan) -> dict[str, dg.MetadataValue]:
    from eagle_assets.plots import plan_cost_md  # matplotlib: loaded by the step, not by every code server

    total = plan.total_usd
    costs = {d.name: (d.usd.expected, d.usd.low, d.usd.high) for d in plan.datasets}
    return {
        "plan": dg.MetadataValue.md(plan_markdown(plan)),
        "cost_plot": dg.MetadataValue.md(plan_cost_md(costs, plan.money.available_usd, "generation plan")),
        "decision": dg.MetadataValue.text(plan.decision),
        "fits": dg.MetadataValue.bool(plan.fits),
        "projected_usd": dg.MetadataValue.float(round(total.expected, 4)),
        "projected_usd_high": dg.MetadataValue.float(round(total.high, 4)),
        "available_usd": dg.MetadataValue.float(round(plan.money.available_usd, 4)),
        "projected_output_tokens": dg.MetadataValue.int(math.floor(plan.total_tokens.expected)),
        "projected_requests": dg.MetadataValue.int(math.floor(plan.total_requests.expected)),
        "projected_wall": dg.MetadataValue.text(format_duration(plan.wall_s)),
        "path": dg.MetadataValue.path(str(plan_path())),
    }


def build_plan_asset(specs: list[DatasetSpec]) -> dg.AssetsDefinition:
    @dg.asset(
        key=PLAN_KEY,
        group_name=GENERATION_GROUP,
        pool=GENERATION_POOL,  # a pilot buys answers like any generation step
        kinds={"openrouter"},
        tags=stage_tags(GENERATION_GROUP),
        description="Before any spend: requests, output and prompt tokens, dollars (with intervals) and wall time per"
        " dataset against the key's remaining credit and the budget; proposes targets that fit when they do not."
        " on_overrun (config) decides whether generation waits, scales down or proceeds.",
    )
    def generation_plan(
        context: dg.AssetExecutionContext, config: GenerationPlanConfig, openrouter: OpenRouterResource
    ) -> dg.MaterializeResult:
        plan = build_plan(
            specs, config, openrouter, context.log, observe=lambda snap: context.log_event(account_observation(snap))
        )
        path = write_plan(plan.to_json())
        context.log.info(f"generation plan ({path}): {plan.summary()}")
        return dg.MaterializeResult(metadata=plan_metadata(plan))

    return generation_plan
