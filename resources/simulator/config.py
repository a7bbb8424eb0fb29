"""Configuration of the simulator: the account, the provider table, latency and faults.

Frozen dataclasses, so a test states its scenario in one expression and a running server is re-pointed
(faults) atomically.
"""

import dataclasses
import ipaddress
import math
import random
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import orjson

from eagle_assets.settings import DEFAULT_SIM_PORT
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.simulator.faults import FaultConfig
from resources.simulator.flags import Alias, flag, flags_of, group

MODEL_SLUG = "moonshotai/kimi-k2.5"
MODEL_PERMASLUG = "moonshotai/kimi-k2.5-0127"
MODEL_NAME = "MoonshotAI: Kimi K2.5"
DEFAULT_PORT = DEFAULT_SIM_PORT  # where a process listens unless told: where the Dagster resource looks


def per_token_string(usd_per_million: float) -> str:
    """OpenRouter prices are per-token decimal strings; Decimal avoids ``4.4999e-07`` artefacts."""
    return format(Decimal(repr(usd_per_million)) / Decimal(1_000_000), "f")


@dataclass(frozen=True)
class ProviderEndpoint:
    """One endpoint of the model as ``/endpoints`` lists it; prices in USD per million tokens. A provider
    may list several under one display name: responses name only ``name``, routing tells them apart by ``tag``."""

    name: str  # display name, what responses put in ``provider``
    slug: str  # lower-case provider slug, what ``ignore``/``only`` name
    quantization: str | None  # None: /endpoints says null
    prompt_usd_per_m: float
    completion_usd_per_m: float
    context_length: int = 262_144
    max_completion_tokens: int = 262_144
    status: int = 0  # 0 serving; negative: degraded or down (never routed to)
    uptime_last_30m: float = 99.5
    endpoint_tag: str = ""  # "" = ``slug/quantization`` (or the bare slug when the quantization is null)
    supported_parameters: tuple[str, ...] | None = None  # None = SUPPORTED_PARAMETERS

    def __post_init__(self) -> None:
        if self.supported_parameters is not None and not isinstance(self.supported_parameters, tuple):
            object.__setattr__(self, "supported_parameters", tuple(self.supported_parameters))  # from JSON lists

    @property
    def tag(self) -> str:
        if self.endpoint_tag:
            return self.endpoint_tag
        return f"{self.slug}/{self.quantization}" if self.quantization else self.slug

    @property
    def parameters(self) -> tuple[str, ...]:
        return SUPPORTED_PARAMETERS if self.supported_parameters is None else self.supported_parameters

    @property
    def prompt_price(self) -> float:  # USD per token
        return self.prompt_usd_per_m / 1e6

    @property
    def completion_price(self) -> float:
        return self.completion_usd_per_m / 1e6


SUPPORTED_PARAMETERS: tuple[str, ...] = (
    "max_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "reasoning",
    "include_reasoning",
    "stop",
    "response_format",
    "structured_outputs",
    "seed",
)

# Shaped like the real listing of moonshotai/kimi-k2.5: display names as OpenRouter spells them
# ("BaseTen"), one provider with an allowed and a disallowed endpoint (DeepInfra fp8/fp4), bare tags
# (``fireworks``, ``fireworks/fast``), a null and an "unknown" quantization, an endpoint that is down
# (status -5, and the cheapest: it must never be priced or routed to) and one that lacks ``top_p``.
DEFAULT_PROVIDERS: tuple[ProviderEndpoint, ...] = (
    ProviderEndpoint("Moonshot AI", "moonshotai", "int4", 0.60, 2.50),
    ProviderEndpoint("Chutes", "chutes", "int4", 0.45, 2.00),
    ProviderEndpoint(
        "SiliconFlow",
        "siliconflow",
        "int4",
        0.50,
        2.20,
        supported_parameters=tuple(p for p in SUPPORTED_PARAMETERS if p != "top_p"),
    ),
    ProviderEndpoint("Parasail", "parasail", "int4", 0.55, 2.80),
    ProviderEndpoint("DeepInfra", "deepinfra", "fp8", 0.50, 2.40),
    ProviderEndpoint("DeepInfra", "deepinfra", "fp4", 0.40, 1.90),
    ProviderEndpoint("Fireworks", "fireworks", "fp4", 0.40, 1.80, endpoint_tag="fireworks"),
    ProviderEndpoint("Fireworks", "fireworks", "fp4", 0.60, 2.40, endpoint_tag="fireworks/fast"),
    ProviderEndpoint("BaseTen", "baseten", "fp4", 0.42, 1.90),
    ProviderEndpoint("Novita", "novita", None, 0.38, 1.70),
    ProviderEndpoint("AtlasCloud", "atlas-cloud", "unknown", 0.44, 2.10),
    ProviderEndpoint("Together", "together", "fp8", 0.30, 1.50, status=-5, uptime_last_30m=0.0),
)


@dataclass(frozen=True)
class LatencyConfig:
    """Time to answer a request: none, a fixed delay, or a clipped lognormal around a median."""

    fixed_s: float | None = field(default=None, metadata=flag("--latency-fixed", "a fixed latency", metavar="SECONDS"))
    median_s: float | None = field(default=None, metadata=flag("--latency-median", "median of a lognormal latency"))
    sigma: float = field(default=0.5, metadata=flag("--latency-sigma", "sigma of a lognormal latency"))
    min_s: float = field(default=0.0, metadata=flag("--latency-min", "lowest lognormal latency"))
    max_s: float = field(default=120.0, metadata=flag("--latency-max", "highest lognormal latency"))

    def __post_init__(self) -> None:
        if self.fixed_s is not None and self.median_s is not None:
            raise ValueError("latency is either fixed or lognormal, not both")
        if (self.fixed_s or 0) < 0 or (self.median_s is not None and self.median_s <= 0) or self.sigma < 0:
            raise ValueError("latency values must be non-negative (median positive)")

    @classmethod
    def fixed(cls, seconds: float) -> "LatencyConfig":
        return cls(fixed_s=seconds)

    @classmethod
    def lognormal(cls, median_s: float, sigma: float, min_s: float = 0.0, max_s: float = 120.0) -> "LatencyConfig":
        return cls(median_s=median_s, sigma=sigma, min_s=min_s, max_s=max_s)

    def draw(self, rng: random.Random) -> float:
        if self.median_s is not None:
            value = self.median_s * math.exp(rng.gauss(0.0, self.sigma))
            return min(self.max_s, max(self.min_s, value))
        return self.fixed_s or 0.0


def providers_from_json(raw: str) -> tuple[ProviderEndpoint, ...]:
    """``--providers-json``: a JSON list of endpoints (unknown keys ignored, so a listing can be pasted)."""
    names = {f.name for f in dataclasses.fields(ProviderEndpoint)}
    return tuple(ProviderEndpoint(**{k: v for k, v in item.items() if k in names}) for item in orjson.loads(raw))


def providers_to_json(providers: tuple[ProviderEndpoint, ...]) -> str:
    return orjson.dumps([dataclasses.asdict(p) for p in providers]).decode()


def is_loopback_host(host: str) -> bool:
    """The simulator must never listen beyond this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SimulatorConfig:
    """Everything a simulator serves by; each field is also its command-line flag (``resources.simulator.flags``)."""

    host: str = field(default="127.0.0.1", metadata=flag(help="loopback only: 127.x, localhost or ::1"))
    # A test's config takes any free port; a process listens where the Dagster resource looks for it.
    port: int = field(default=0, metadata=flag(help="0 = an ephemeral port", cli_default=DEFAULT_PORT))
    seed: int = field(default=0, metadata=flag(help="seeds faults, latency and the templated text"))
    credits: float = field(
        default=100.0, metadata=flag(help="the account's initial limit in USD, unless the state file has one")
    )
    state_file: Path | None = field(default=None, metadata=flag(help="JSON file keeping the balance across restarts"))
    accepted_keys: frozenset[str] | None = field(
        default=None, metadata=flag("--key", "accepted API key (repeatable; default: any non-empty key)")
    )
    unlimited_key: bool = field(
        default=False,
        metadata=flag(help="/key says limit and limit_remaining null (the account's credits still run out: 402)"),
    )
    management_keys: frozenset[str] = field(
        default=frozenset(),
        metadata=flag("--management-key", "a key /credits answers (repeatable); any other gets 403, as on OpenRouter"),
    )
    workspace_budget_usd: float | None = field(
        default=None,
        metadata=flag("--workspace-budget", "a workspace/guardrail budget in USD: once usage reaches it, 403"),
    )
    leading_space_rate: float = field(
        default=0.25,
        metadata=flag(
            help="share of prompts whose reasoning and content start with a space, as some Kimi providers send them"
            " (not applied to a model-backed generator, whose text is the model's own output)"
        ),
    )
    key_label: str = field(default="sk-or-v1-sim...sim", metadata=flag(help="the label /key shows"))
    tokenizer_dir: Path = field(
        default_factory=resolve_tokenizer_dir,
        metadata=flag(
            help="folder or Hub repo id (default: $EAGLE_FORGE_TOKENIZER, else bundled)",
            parse=resolve_tokenizer_dir,
            show=str,
        ),
    )
    model_slug: str = field(default=MODEL_SLUG, metadata=flag(help="the model id a request must name"))
    model_permaslug: str = field(default=MODEL_PERMASLUG, metadata=flag(help="the model id answers carry"))
    providers: tuple[ProviderEndpoint, ...] = field(
        default=DEFAULT_PROVIDERS,
        metadata=flag(
            "--providers-json",
            "JSON list of ProviderEndpoint objects replacing the defaults",
            parse=providers_from_json,
            show=providers_to_json,
        ),
    )
    latency: LatencyConfig = field(
        default_factory=LatencyConfig,
        metadata=group(
            aliases=(
                Alias(
                    "--latency-lognormal",
                    ("median_s", "sigma"),
                    "a lognormal latency around MEDIAN seconds",
                    ("MEDIAN", "SIGMA"),
                ),
            )
        ),
    )
    faults: FaultConfig = field(
        default_factory=FaultConfig,
        metadata=group("--fault", "a FaultConfig field, e.g. rate_limit=0.05 or stall_seconds=5"),
    )
    mean_completion_tokens: int = field(default=300, metadata=flag(help="mean length of a templated completion"))
    tool_call_probability: float = field(default=0.5, metadata=flag(help="share of templated answers with tools"))
    generation_404_ms: float = field(
        default=0.0, metadata=flag(help="/generation answers 404 for this long after completion")
    )
    generation_id_header: bool = field(
        default=True,
        metadata=flag(
            "--no-generation-id-header",
            "answer without X-Generation-Id, as older recordings (OpenRouter's answers carry it since 2026)",
        ),
    )
    plain_head_first: bool = field(
        default=True,
        metadata=flag(
            "--plain-body-at-end",
            "non-streaming answers come whole at the end (no early head, no whitespace padding); by default the"
            " head (200 and the id header) goes at once and whitespace pads while the model runs, as on OpenRouter",
        ),
    )
    request_wide_400: str | None = field(
        default=None,
        metadata=flag(
            help="answer every chat request with a 400 of this message, as for a parameter the endpoint refuses"
            ' ("Reasoning is mandatory for this endpoint and cannot be disabled."); settable at runtime',
            metavar="MESSAGE",
        ),
    )
    request_wide_400_delay_s: float = field(
        default=0.0,
        metadata=flag(
            help="seconds before that 400 is sent (a refusal that comes only after routing); settable at runtime",
            metavar="SECONDS",
        ),
    )
    cache_size: int = field(default=16_384, metadata=flag(help="prepared responses kept (LRU)"))
    max_generations_kept: int = field(default=200_000, metadata=flag(help="/generation records kept (oldest dropped)"))
    backlog: int = field(default=8192, metadata=flag(help="the listening socket's backlog"))
    state_flush_interval_s: float = field(
        default=0.25, metadata=flag("--state-flush-interval", "billing is written behind, at most this stale")
    )
    stream_chunks: int = field(default=12, metadata=flag(help="content deltas per streamed part (reasoning, content)"))
    usage_chunk_with_choice_rate: float = field(
        default=0.72,
        metadata=flag(
            help="share of streams whose usage chunk repeats the finish choice (395 of 545 recorded); the rest send"
            " choices: []"
        ),
    )
    processing_comment_interval_s: float = field(
        default=1.0, metadata=flag("--processing-comment-interval", "seconds between keep-alives while generating")
    )
    tiny_target_dir: Path | None = field(
        default=None,
        metadata=flag(
            "--tiny-target",
            "answer with the greedy output of the tiny target at DIR (eagle_assets.target.tiny; built there when"
            " --tiny-target-seed is given) instead of templated text",
            metavar="DIR",
        ),
    )
    tiny_target_max_batch: int = field(default=32, metadata=flag(help="requests decoded together in one batch"))

    def __post_init__(self) -> None:
        if not is_loopback_host(self.host):
            raise ValueError(f"the simulator only listens on loopback, not {self.host!r}")
        if self.mean_completion_tokens < 1:
            raise ValueError("mean_completion_tokens must be >= 1")
        if not self.providers:
            raise ValueError("at least one provider endpoint is needed")
        if self.tiny_target_max_batch < 1:
            raise ValueError("tiny_target_max_batch must be >= 1")
        if not 0.0 <= self.leading_space_rate <= 1.0:
            raise ValueError("leading_space_rate must be in [0, 1]")
        if not 0.0 <= self.usage_chunk_with_choice_rate <= 1.0:
            raise ValueError("usage_chunk_with_choice_rate must be in [0, 1]")
        if self.request_wide_400_delay_s < 0:
            raise ValueError("request_wide_400_delay_s must be >= 0")


def config_to_args(config: SimulatorConfig) -> list[str]:
    """Flags that make ``python -m resources.simulator`` serve by ``config`` (settings at their default left out)."""
    return flags_of(config)
