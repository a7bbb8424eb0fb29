"""The OpenRouter resource: configuration, the key, the provider policy and an HTTP client.

It runs nothing: ``eagle_assets.generation.partition_runs`` takes it as an argument (imports never go back), and
state shared across step processes (dollars spent, reservations) lives in the ledger, never in this object.
"""

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dagster import ConfigurableResource
from pydantic import Field

from eagle_assets.budget_mode import BudgetMode
from eagle_assets.layout import ledger_path as default_ledger_path
from eagle_assets.settings import current_settings
from eagle_assets.target.tiny_targets import DEFAULT_TINY_TARGET, TinyTargetName
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.openrouter.client import OpenRouterClient
from resources.openrouter.providers import (
    DEFAULT_IGNORED,
    DEFAULT_QUANTIZATIONS,
    ProviderPolicy,
    ProviderTable,
    parse_endpoints,
)
from resources.openrouter.secret import ApiKey, MissingApiKeyError, load_api_key

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
# Request fields that are not model parameters: require_parameters never asks an endpoint for them.
_NOT_PARAMETERS = frozenset({"usage", "transforms", "models", "route", "user", "stream", "provider", "plugins"})
SIMULATOR_KEY = "sk-or-simulator"


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


class OpenRouterResource(ConfigurableResource):
    """Everything a run is configured with, in one place so that the launchpad shows it all; the budget's fields
    become the engine's settings in ``partition_runs.generation_settings``."""

    base_url: str = Field(
        default="https://openrouter.ai/api/v1", description="API root, e.g. a local simulator or SGLang"
    )
    model: str = Field(default="moonshotai/kimi-k2.5", description="Model slug to request")
    api_key_file: str = Field(default="/tmp/or-key.txt", description="File holding the API key (preferred)")
    api_key_env: str = Field(default="OPENROUTER_API_KEY", description="Environment variable with the key")
    allow_missing_key_on_loopback: bool = Field(
        default=True, description="A loopback simulator needs no real key: use a placeholder when none is configured"
    )
    max_tokens: int = Field(default=16384, description="max_tokens per request (also the reservation's worst case)")
    temperature: float | None = Field(
        default=None,
        description="Sent only when set (else the provider's default): with require_parameters every endpoint that"
        " does not list it is dropped, and Moonshot's own endpoint may list neither temperature nor top_p",
    )
    top_p: float | None = Field(default=None, description="Sent only when set (see temperature)")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra request fields (e.g. reasoning)")
    quantizations: list[str] = Field(default_factory=lambda: list(DEFAULT_QUANTIZATIONS))
    ignore_providers: list[str] = Field(default_factory=lambda: list(DEFAULT_IGNORED))
    sort: str | None = "price"
    require_parameters: bool = Field(
        default=True,
        description="Route only to endpoints that support every sent parameter (temperature, top_p, tools...)",
    )
    trust_unknown_quantization: list[str] = Field(
        default_factory=list,
        description="Provider slugs whose endpoints may serve although /endpoints gives their quantization as"
        " unknown or null (rejected by default: nobody can say what weights they run)",
    )
    stream: bool = Field(
        default=False,
        description="Stream responses (SSE): the generation id arrives with the first chunk and stalls are"
        " caught by stream_idle_timeout_s",
    )
    stream_idle_timeout_s: float = Field(default=60.0, description="Abandon a stream with no data event for this long")
    max_in_flight: int = Field(default=2000, description="Upper bound of concurrent requests (AIMD adapts below it)")
    min_in_flight: int = 4
    budget_usd: float = Field(default=100.0, description="Dollar budget across all runs (persisted ledger)")
    budget_mode: BudgetMode = Field(
        default="statistical",
        description="statistical: the requests in flight hold n·μ + z·σ·√n of the budget from the measured answer"
        " lengths (passed with probability below overspend_probability per run); hard: each holds its worst case"
        " (max_tokens at the dearest price), never passed, at a fraction of the concurrency",
    )
    overspend_probability: float = Field(
        default=1e-6, description="statistical mode: chance per run of passing budget_usd"
    )
    token_overshoot: float = Field(
        default=0.01, description="A dataset's output-token budget is a target: allowed overshoot, as a fraction of it"
    )
    token_shortfall: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="A dataset may end this share of its token target short rather than start one more round of"
        " requests for the rest (a round trip of the slowest answer when it runs alone); 0: reach the target",
    )
    others_stall_s: float = Field(
        default=1800.0,
        gt=0,
        description="Refused while only other runs' requests hold the budget, a run waits for them to settle; this"
        " long without a change in what they hold (a live host whose requests hang), it stops as the budget would",
    )
    budget_tail_fraction: float = Field(
        default=0.1,
        ge=0.0,
        lt=1.0,
        description="At the end of the dollar budget, start no wave smaller than this share of max_in_flight: the"
        " rest of the budget stays for the next run (0: spend it all, in ever smaller waves)",
    )
    ledger_path: str = Field(
        default="", description="Ledger SQLite file; default $EAGLE_FORGE_HOME/state/ledger.sqlite"
    )
    database_url: str = Field(
        default="",
        description="Ledger database shared by several hosts (postgresql://user@host/db; pass it as an EnvVar,"
        " or keep the password in PGPASSWORD/.pgpass); empty = $EAGLE_FORGE_DATABASE_URL, else ledger_path",
    )
    tokenizer_path: str = Field(
        default="",
        description="Kimi tokenizer for prompt-cost estimates: a folder, a Hub repo id (moonshotai/Kimi-K2.5) or"
        " 'bundled'; empty = $EAGLE_FORGE_TOKENIZER, else the copy inside the package",
    )
    request_timeout_s: float = 600.0
    max_attempts: int = Field(
        default=10, description="Failed attempts (5xx, timeouts, torn bodies...) allowed per prompt"
    )
    breaker_threshold: int = Field(
        default=8,
        ge=0,
        description="This many skips (400/403, not moderation or guardrails) of one class and message with no"
        " success between stop the run as a request-wide error, journaling none of them (four times as many once"
        " the partition has a success); the first wave stays at this many requests until as many answers or a"
        " success came back (0: off)",
    )
    reask_skipped: bool = Field(
        default=False,
        description="Ask every journaled skip again (after changing the request: model, parameters, routing)",
    )
    max_congestion_waits: int = Field(
        default=200, description="429/in-flight-402/503 waits per prompt (pacing, not failure)"
    )
    retry_base_delay_s: float = 0.5
    retry_max_delay_s: float = 60.0
    progress_interval_s: float = 5.0
    account_observe_interval_s: float = Field(
        default=10.0, gt=0, description="How often a generation run records the account's money (openrouter_account)"
    )
    native_count_sample: int = Field(
        default=32,
        ge=0,
        description="per partition, kept responses whose native token counts are fetched from /generation",
    )
    key_poll_interval_s: float = 15.0
    start_embedded_simulator: bool = Field(
        default=False, description="Start the bundled simulator at base_url (loopback only) if nothing answers there"
    )
    simulator_tiny_target: TinyTargetName = Field(
        default=DEFAULT_TINY_TARGET,
        description="the tiny target the started simulator answers with: the target resource's tiny_target",
    )

    # --- pieces ------------------------------------------------------------------------------
    def api_key(self) -> ApiKey:
        try:
            return load_api_key(self.api_key_file, self.api_key_env)
        except MissingApiKeyError:
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

    def sampling(self) -> dict[str, Any]:
        """The sampling fields every request sends: temperature and top_p where set, then ``extra_body``."""
        fields: dict[str, Any] = {
            k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p)) if v is not None
        }
        fields.update(self.extra_body)
        return fields

    def tokenizer_location(self) -> str | Path:
        """The Kimi tokenizer for prompt-cost estimates: this resource's, else the environment's or the bundled one."""
        return self.tokenizer_path or resolve_tokenizer_dir()

    def ledger_file(self) -> Path:
        return Path(self.ledger_path) if self.ledger_path else default_ledger_path()

    def ledger_location(self) -> str | Path:
        """The database URL (this resource's, else the environment's), else the SQLite file."""
        return self.database_url.strip() or current_settings().database_url or self.ledger_file()

    def client(self) -> OpenRouterClient:
        return OpenRouterClient(
            self.base_url,
            self.api_key(),
            max_connections=self.max_in_flight,
            request_timeout_s=self.request_timeout_s,
        )

    def requested_parameters(self, with_tools: bool) -> tuple[str, ...]:
        """The parameters every request sends, which require_parameters makes endpoints support."""
        names = {"max_tokens", *(k for k in self.sampling() if k not in _NOT_PARAMETERS)}
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
        """Fail before anything is spent on a key that cannot be read (``partition_runs.preflight`` checks more)."""
        self.api_key()

    def ensure_server(self) -> None:
        """Start the bundled simulator at ``base_url`` if so configured and nothing answers there."""
        if not self.start_embedded_simulator:
            return
        if not is_loopback(self.base_url):
            raise ValueError(f"start_embedded_simulator needs a loopback base_url, got {self.base_url}")
        from resources.simulator.embedded import ensure_embedded_simulator

        ensure_embedded_simulator(self.base_url, tiny_target=self.simulator_tiny_target)
