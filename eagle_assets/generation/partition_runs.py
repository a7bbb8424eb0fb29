"""Partition runs through the OpenRouter resource: its configuration turned into the engine's settings, the
ledger and the tokenizer opened, the runner started; and the account's money and the providers' own counts.
The assets, the plan and the credits sensor call these with the resource Dagster gave them.
"""

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from eagle_assets.generation.account_snapshot import AccountSnapshot, take_snapshot
from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.estimate import tokenizer_estimator
from eagle_assets.generation.ledger import AccountSettings, BudgetLedger
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.runner import (
    GenerationSettings,
    PartitionJob,
    PartitionReport,
    PartitionRunner,
    PromptTokenEstimator,
)
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from resources.openrouter.account import read_account_cap
from resources.openrouter.resource import OpenRouterResource

RunLog = logging.Logger | Any  # a logger, or Dagster's context.log
NATIVE_COUNT_LOOKUPS = 16  # /generation lookups at once when fetching native counts


def generation_settings(openrouter: OpenRouterResource) -> GenerationSettings:
    """The engine's settings from the resource's configuration, field by field (validated on construction)."""
    return GenerationSettings(
        model=openrouter.model,
        max_tokens=openrouter.max_tokens,
        budget_usd=openrouter.budget_usd,
        sampling=openrouter.sampling(),
        max_in_flight=openrouter.max_in_flight,
        min_in_flight=openrouter.min_in_flight,
        retry=RetryPolicy(
            max_attempts=openrouter.max_attempts,
            max_congestion_waits=openrouter.max_congestion_waits,
            base_delay_s=openrouter.retry_base_delay_s,
            max_delay_s=openrouter.retry_max_delay_s,
        ),
        key_poll_interval_s=openrouter.key_poll_interval_s,
        progress_interval_s=openrouter.progress_interval_s,
        account_observe_interval_s=openrouter.account_observe_interval_s,
        stream=openrouter.stream,
        stream_idle_timeout_s=openrouter.stream_idle_timeout_s,
        admission=AdmissionPolicy(
            mode=openrouter.budget_mode,
            overspend_probability=openrouter.overspend_probability,
            token_overshoot=openrouter.token_overshoot,
            token_shortfall=openrouter.token_shortfall,
        ),
        tail_fraction=openrouter.budget_tail_fraction,
        breaker_threshold=openrouter.breaker_threshold,
        reask_skipped=openrouter.reask_skipped,
        others_stall_s=openrouter.others_stall_s,
    )


def preflight(openrouter: OpenRouterResource) -> GenerationSettings:
    """Fail on configuration errors before anything can be spent: the engine's settings, then the key."""
    settings = generation_settings(openrouter)
    openrouter.preflight()
    return settings


@contextmanager
def open_ledger(
    openrouter: OpenRouterResource, policy: AdmissionPolicy | None = None, spends: bool = False
) -> Iterator[BudgetLedger]:
    """The budget ledger where the resource says it lives, closed on the way out. ``spends``: a run, whose
    budget and in-flight cap must agree with the other live runs' (``AccountSettingsConflict``)."""
    account = AccountSettings(openrouter.budget_usd, openrouter.max_in_flight) if spends else None
    ledger = BudgetLedger(openrouter.ledger_location(), policy=policy, account=account)
    try:
        yield ledger
    finally:
        ledger.close()


def prompt_estimator(openrouter: OpenRouterResource) -> PromptTokenEstimator:
    """Prompt-token estimates from the Kimi tokenizer the resource names."""
    return tokenizer_estimator(load_kimi_tokenizer(openrouter.tokenizer_location()))


def account_snapshot(openrouter: OpenRouterResource, observed_by: str) -> AccountSnapshot:
    """The key's remaining credit (read now) and the ledger's spend, held dollars and tokens."""
    openrouter.ensure_server()

    async def read_cap() -> tuple[float | None, str]:
        async with openrouter.client() as client:
            cap, _ = await read_account_cap(client)
            return cap.remaining_usd, cap.source

    remaining, source = asyncio.run(read_cap())
    with open_ledger(openrouter, generation_settings(openrouter).admission) as ledger:
        return take_snapshot(
            ledger,
            openrouter.budget_usd,
            remaining_at_poll=remaining,
            spent_at_poll=ledger.totals().usd_spent,
            cap_source=source,
            observed_by=observed_by,
        )


def native_completion_counts(openrouter: OpenRouterResource, generation_ids: dict[str, str]) -> dict[str, int]:
    """prompt id → ``native_tokens_completion`` from ``/generation`` (free calls; a 404 is retried briefly,
    since OpenRouter needs a moment to index a finished generation, then skipped)."""
    if not generation_ids:
        return {}
    openrouter.ensure_server()

    async def fetch_all() -> dict[str, int]:
        out: dict[str, int] = {}
        gate = asyncio.Semaphore(NATIVE_COUNT_LOOKUPS)
        async with openrouter.client() as client:

            async def one(prompt_id: str, gen_id: str) -> None:
                async with gate:
                    for attempt in range(3):
                        data = await client.generation(gen_id)
                        if data is not None and data.get("native_tokens_completion") is not None:
                            out[prompt_id] = int(data["native_tokens_completion"])
                            return
                        await asyncio.sleep(0.5 * (attempt + 1))

            await asyncio.gather(*(one(p, g) for p, g in generation_ids.items()))
        return out

    return asyncio.run(fetch_all())


def run_partition(
    openrouter: OpenRouterResource,
    job: PartitionJob,
    log: RunLog,
    observe: Callable[[AccountSnapshot], None] | None = None,
) -> PartitionReport:
    """``observe``: receives the account's money every ``account_observe_interval_s`` and at the end."""
    settings = preflight(openrouter)
    openrouter.ensure_server()
    return asyncio.run(_run(openrouter, settings, job, log, observe))


def run_partitions(openrouter: OpenRouterResource, jobs: list[PartitionJob], log: RunLog) -> list[PartitionReport]:
    """Several partitions at once in one event loop (a plan's pilots: one wave for every dataset)."""
    settings = preflight(openrouter)
    openrouter.ensure_server()

    async def all_of() -> list[PartitionReport]:
        return list(await asyncio.gather(*(_run(openrouter, settings, job, log) for job in jobs)))

    return asyncio.run(all_of()) if jobs else []


async def _run(
    openrouter: OpenRouterResource,
    settings: GenerationSettings,
    job: PartitionJob,
    log: RunLog,
    observe: Callable[[AccountSnapshot], None] | None = None,
) -> PartitionReport:
    estimate = prompt_estimator(openrouter)
    with open_ledger(openrouter, spends=True) as ledger:
        log.info(f"budget ledger: {ledger.location}")
        if ledger.account_change:
            log.warning(ledger.account_change)
        async with openrouter.client() as client:
            table = await openrouter.provider_table(client, log, any(p.tools for p in job.prompts))
            runner = PartitionRunner(job, client, ledger, table, settings, estimate, emit=log.info, observe=observe)
            return await runner.run()
