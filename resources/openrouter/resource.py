"""The OpenRouter resource: configuration, the key, the provider policy and the run of one partition.

It is deliberately thin: everything that decides (classification, backoff, budget, journal) is
plain Python under ``eagle_assets.generation`` and ``resources.openrouter``. State that must be
shared across step processes (dollars spent, in-flight reservations) lives in the ledger file,
never in this object.
"""

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dagster import ConfigurableResource
from pydantic import Field

from eagle_assets import settings as forge_settings
from eagle_assets.budget_mode import BudgetMode
from eagle_assets.generation.account_snapshot import AccountSnapshot, take_snapshot
from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.estimate import tokenizer_estimator
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.runner import GenerationSettings, PartitionJob, PartitionReport, PartitionRunner
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from resources.openrouter.account import read_account_cap
from resources.openrouter.client import OpenRouterClient
from resources.openrouter.providers import (
    DEFAULT_IGNORED,
    DEFAULT_QUANTIZATIONS,
    ProviderPolicy,
    ProviderTable,
    parse_endpoints,
)
from resources.openrouter.secret import ApiKey, load_api_key

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
# Request fields that are not model parameters: require_parameters never asks an endpoint for them.
_NOT_PARAMETERS = frozenset({"usage", "transforms", "models", "route", "user", "stream", "provider", "plugins"})
SIMULATOR_KEY = "sk-or-simulator"


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


class OpenRouterResource(ConfigurableResource):
    """Talks to OpenRouter (or any OpenAI-compatible server) under a provider policy and a budget."""

    base_url: str = Field("https://openrouter.ai/api/v1", description="API root, e.g. a local simulator or SGLang")
    model: str = Field("moonshotai/kimi-k2.5", description="Model slug to request")
    api_key_file: str = Field("/tmp/or-key.txt", description="File holding the API key (preferred)")
    api_key_env: str = Field("OPENROUTER_API_KEY", description="Environment variable with the key")
    allow_missing_key_on_loopback: bool = Field(
        True, description="A loopback simulator needs no real key: use a placeholder when none is configured"
    )
    max_tokens: int = Field(16384, description="max_tokens per request (also the reservation's worst case)")
    temperature: float | None = Field(
        None,
        description="Sent only when set (else the provider's default): with require_parameters every endpoint that"
        " does not list it is dropped, and Moonshot's own endpoint may list neither temperature nor top_p",
    )
    top_p: float | None = Field(None, description="Sent only when set (see temperature)")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra request fields (e.g. reasoning)")
    quantizations: list[str] = Field(default_factory=lambda: list(DEFAULT_QUANTIZATIONS))
    ignore_providers: list[str] = Field(default_factory=lambda: list(DEFAULT_IGNORED))
    sort: str | None = "price"
    require_parameters: bool = Field(
        True, description="Route only to endpoints that support every sent parameter (temperature, top_p, tools...)"
    )
    trust_unknown_quantization: list[str] = Field(
        default_factory=list,
        description="Provider slugs whose endpoints may serve although /endpoints gives their quantization as"
        " unknown or null (rejected by default: nobody can say what weights they run)",
    )
    stream: bool = Field(
        False,
        description="Stream responses (SSE): the generation id arrives with the first chunk and stalls are"
        " caught by stream_idle_timeout_s",
    )
    stream_idle_timeout_s: float = Field(60.0, description="Abandon a stream with no data event for this long")
    max_in_flight: int = Field(2000, description="Upper bound of concurrent requests (AIMD adapts below it)")
    min_in_flight: int = 4
    budget_usd: float = Field(100.0, description="Dollar budget across all runs (persisted ledger)")
    budget_mode: BudgetMode = Field(
        "statistical",
        description="statistical: the requests in flight hold n·μ + z·σ·√n of the budget from the measured answer"
        " lengths (passed with probability below overspend_probability per run); hard: each holds its worst case"
        " (max_tokens at the dearest price), never passed, at a fraction of the concurrency",
    )
    overspend_probability: float = Field(1e-6, description="statistical mode: chance per run of passing budget_usd")
    token_overshoot: float = Field(
        0.01, description="A dataset's output-token budget is a target: allowed overshoot, as a fraction of it"
    )
    budget_tail_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="At the end of the dollar budget, start no wave smaller than this share of max_in_flight: the"
        " rest of the budget stays for the next run (0: spend it all, in ever smaller waves)",
    )
    ledger_path: str = Field("", description="Ledger SQLite file; default $EAGLE_FORGE_HOME/state/ledger.sqlite")
    database_url: str = Field(
        "",
        description="Ledger database shared by several hosts (postgresql://user@host/db; pass it as an EnvVar,"
        " or keep the password in PGPASSWORD/.pgpass); empty = $EAGLE_FORGE_DATABASE_URL, else ledger_path",
    )
    tokenizer_path: str = Field(
        "",
        description="Kimi tokenizer for prompt-cost estimates: a folder, a Hub repo id (moonshotai/Kimi-K2.5) or"
        " 'bundled'; empty = $EAGLE_FORGE_TOKENIZER, else the copy inside the package",
    )
    request_timeout_s: float = 600.0
    max_attempts: int = Field(10, description="Failed attempts (5xx, timeouts, torn bodies...) allowed per prompt")
    breaker_threshold: int = Field(
        8,
        ge=0,
        description="This many skips (400/403) of one class and message with no success between stop the run as a"
        " request-wide error, journaling none of them; the first wave waits for a success up to this many (0: off)",
    )
    breaker_probe_s: float = Field(1.0, ge=0, description="How long the first wave stays at breaker_threshold requests")
    reask_skipped: bool = Field(
        False, description="Ask every journaled skip again (after changing the request: model, parameters, routing)"
    )
    max_congestion_waits: int = Field(200, description="429/in-flight-402/503 waits per prompt (pacing, not failure)")
    retry_base_delay_s: float = 0.5
    retry_max_delay_s: float = 60.0
    progress_interval_s: float = 5.0
    account_observe_interval_s: float = Field(
        10.0, gt=0, description="How often a generation run records the account's money (openrouter_account)"
    )
    native_count_sample: int = Field(
        32, ge=0, description="per partition, kept responses whose native token counts are fetched from /generation"
    )
    key_poll_interval_s: float = 15.0
    start_embedded_simulator: bool = Field(
        False, description="Start the bundled simulator at base_url (loopback only) if nothing answers there"
    )

    # --- pieces ------------------------------------------------------------------------------
    def api_key(self) -> ApiKey:
        try:
            return load_api_key(self.api_key_file, self.api_key_env)
        except Exception:
            if self.allow_missing_key_on_loopback and is_loopback(self.base_url):
                return ApiKey(SIMULATOR_KEY)
            raise

    def policy(self) -> ProviderPolicy:
        return ProviderPolicy(
            tuple(self.quantizations),
            tuple(self.ignore_providers),
            self.sort,
            self.require_parameters,
            tuple(self.trust_unknown_quantization),
        )

    def generation_settings(self) -> GenerationSettings:
        sampling: dict[str, Any] = {
            k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p)) if v is not None
        }
        sampling.update(self.extra_body)
        return GenerationSettings(
            model=self.model,
            max_tokens=self.max_tokens,
            budget_usd=self.budget_usd,
            sampling=sampling,
            max_in_flight=self.max_in_flight,
            min_in_flight=self.min_in_flight,
            retry=RetryPolicy(
                max_attempts=self.max_attempts,
                max_congestion_waits=self.max_congestion_waits,
                base_delay_s=self.retry_base_delay_s,
                max_delay_s=self.retry_max_delay_s,
            ),
            key_poll_interval_s=self.key_poll_interval_s,
            progress_interval_s=self.progress_interval_s,
            account_observe_interval_s=self.account_observe_interval_s,
            stream=self.stream,
            stream_idle_timeout_s=self.stream_idle_timeout_s,
            admission=AdmissionPolicy(
                mode=self.budget_mode,
                overspend_probability=self.overspend_probability,
                token_overshoot=self.token_overshoot,
            ),
            tail_fraction=self.budget_tail_fraction,
            breaker_threshold=self.breaker_threshold,
            probe_window_s=self.breaker_probe_s,
            reask_skipped=self.reask_skipped,
        )

    def ledger_file(self) -> Path:
        return Path(self.ledger_path) if self.ledger_path else forge_settings.ledger_path()

    def ledger_location(self) -> str | Path:
        """The database URL (this resource's, else the environment's), else the SQLite file."""
        return self.database_url.strip() or forge_settings.database_url() or self.ledger_file()

    def client(self) -> OpenRouterClient:
        return OpenRouterClient(
            self.base_url,
            self.api_key(),
            max_connections=self.max_in_flight,
            request_timeout_s=self.request_timeout_s,
        )

    def requested_parameters(self, with_tools: bool) -> tuple[str, ...]:
        """The parameters every request sends, which require_parameters makes endpoints support."""
        names = {"max_tokens", *(k for k in self.generation_settings().sampling if k not in _NOT_PARAMETERS)}
        if with_tools:
            names.add("tools")
        return tuple(sorted(names))

    async def provider_table(
        self, client: OpenRouterClient, log: logging.Logger | Any, with_tools: bool = False
    ) -> ProviderTable:
        table = ProviderTable(
            parse_endpoints(await client.endpoints(self.model)), self.policy(), self.requested_parameters(with_tools)
        )
        log.info(f"endpoints of {self.model}:\n{table.render()}")
        for endpoint, missing in table.removed_by_require_parameters():
            log.warning(
                f"require_parameters removes {endpoint.provider_name} [{endpoint.tag or endpoint.slug}] from routing:"
                f" it does not list {', '.join(missing)}, which every request sends (unset the parameter, or set"
                " require_parameters false to let providers ignore what they do not support)"
            )
        table.require_allowed()
        return table

    def preflight(self) -> None:
        """Fail on configuration errors before anything can be spent."""
        self.generation_settings()
        self.api_key()

    def available_usd(self) -> float:
        """Dollars that could be spent now: the account cap in force (the key's limit, else the account's
        credits where /credits answers), capped by the budget's headroom."""
        return self.account_snapshot("available_usd").available_usd

    def account_snapshot(self, observed_by: str) -> AccountSnapshot:
        """The key's remaining credit (read now) and the ledger's spend, held dollars and tokens."""
        self.ensure_server()

        async def read_cap() -> tuple[float | None, str]:
            async with self.client() as client:
                cap, _ = await read_account_cap(client)
                return cap.remaining_usd, cap.source

        remaining, source = asyncio.run(read_cap())
        ledger = BudgetLedger(self.ledger_location(), policy=self.generation_settings().admission)
        try:
            spent = ledger.totals().usd_spent
            return take_snapshot(
                ledger,
                self.budget_usd,
                remaining_at_poll=remaining,
                spent_at_poll=spent,
                cap_source=source,
                observed_by=observed_by,
            )
        finally:
            ledger.close()

    def native_completion_counts(self, generation_ids: dict[str, str], attempts: int = 3) -> dict[str, int]:
        """prompt id → ``native_tokens_completion`` from ``/generation`` (free calls; a 404 is retried briefly,
        since OpenRouter needs a moment to index a finished generation, then skipped)."""
        if not generation_ids:
            return {}
        self.ensure_server()

        async def fetch_all() -> dict[str, int]:
            out: dict[str, int] = {}
            gate = asyncio.Semaphore(16)
            async with self.client() as client:

                async def one(prompt_id: str, gen_id: str) -> None:
                    async with gate:
                        for attempt in range(attempts):
                            data = await client.generation(gen_id)
                            if data is not None and data.get("native_tokens_completion") is not None:
                                out[prompt_id] = int(data["native_tokens_completion"])
                                return
                            await asyncio.sleep(0.5 * (attempt + 1))

                await asyncio.gather(*(one(p, g) for p, g in generation_ids.items()))
            return out

        return asyncio.run(fetch_all())

    # --- one partition -----------------------------------------------------------------------
    def run_partition(
        self,
        job: PartitionJob,
        log: logging.Logger | Any,
        observe: Callable[[AccountSnapshot], None] | None = None,
    ) -> PartitionReport:
        """``observe``: receives the account's money every ``account_observe_interval_s`` and at the end."""
        self.preflight()
        self.ensure_server()
        return asyncio.run(self._run(job, log, observe))

    def run_partitions(self, jobs: list[PartitionJob], log: logging.Logger | Any) -> list[PartitionReport]:
        """Several partitions at once in one event loop (a plan's pilots: one wave for every dataset)."""
        self.preflight()
        self.ensure_server()

        async def all_of() -> list[PartitionReport]:
            return list(await asyncio.gather(*(self._run(job, log) for job in jobs)))

        return asyncio.run(all_of()) if jobs else []

    def ensure_server(self) -> None:
        if not self.start_embedded_simulator:
            return
        if not is_loopback(self.base_url):
            raise ValueError(f"start_embedded_simulator needs a loopback base_url, got {self.base_url}")
        from resources.simulator.embedded import ensure_embedded_simulator

        ensure_embedded_simulator(self.base_url)

    async def _run(
        self, job: PartitionJob, log: logging.Logger | Any, observe: Callable[[AccountSnapshot], None] | None = None
    ) -> PartitionReport:
        tokenizer = load_kimi_tokenizer(self.tokenizer_path or forge_settings.tokenizer_dir())
        ledger = BudgetLedger(self.ledger_location())
        log.info(f"budget ledger: {ledger.location}")
        try:
            async with self.client() as client:
                table = await self.provider_table(client, log, any(p.tools for p in job.prompts))
                runner = PartitionRunner(
                    job,
                    client,
                    ledger,
                    table,
                    self.generation_settings(),
                    tokenizer_estimator(tokenizer),
                    emit=log.info,
                    observe=observe,
                )
                return await runner.run()
        finally:
            ledger.close()
