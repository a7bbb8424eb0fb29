"""Configuration of the simulator: the account, the provider table, latency and faults.

Everything that shapes what the simulator answers lives here as frozen dataclasses, so a test can
state its scenario in one expression and a running server can be re-pointed (faults) atomically.
"""

import ipaddress
import math
import random
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from eagle_assets.settings import tokenizer_dir
from resources.simulator.faults import FaultConfig

MODEL_SLUG = "moonshotai/kimi-k2.5"
MODEL_PERMASLUG = "moonshotai/kimi-k2.5-0127"
MODEL_NAME = "MoonshotAI: Kimi K2.5"


def per_token_string(usd_per_million: float) -> str:
    """OpenRouter prices are per-token decimal strings; Decimal avoids ``4.4999e-07`` artefacts."""
    return format(Decimal(repr(usd_per_million)) / Decimal(1_000_000), "f")


@dataclass(frozen=True)
class ProviderEndpoint:
    """One endpoint of the model as ``/endpoints`` lists it; prices in USD per million tokens.

    A provider may list several endpoints under one display name (``deepinfra/fp8`` and
    ``deepinfra/fp4``, ``fireworks`` and ``fireworks/fast``): responses name only ``name``, routing
    can tell them apart by ``tag``.
    """

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
    def prompt_price(self) -> float:
        """USD per prompt token."""
        return self.prompt_usd_per_m / 1e6

    @property
    def completion_price(self) -> float:
        """USD per completion token."""
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

    fixed_s: float | None = None
    median_s: float | None = None
    sigma: float = 0.5
    min_s: float = 0.0
    max_s: float = 120.0

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
    host: str = "127.0.0.1"
    port: int = 0  # 0 = an ephemeral port
    seed: int = 0
    credits: float = 100.0  # the account's initial limit in USD, unless the state file has one
    state_file: Path | None = None
    accepted_keys: frozenset[str] | None = None  # None = any non-empty key
    # An unlimited key: /key says limit and limit_remaining null (the account's credits still run out: 402).
    unlimited_key: bool = False
    management_keys: frozenset[str] = frozenset()  # keys /credits answers; any other key gets 403, as on OpenRouter
    # A workspace/guardrail budget in USD: once usage reaches it, requests get 403 "Budget limit exceeded".
    workspace_budget_usd: float | None = None
    # Share of prompts whose reasoning and content start with a space, as some Kimi providers send them
    # (not applied to a model-backed generator, whose text is the model's own output).
    leading_space_rate: float = 0.25
    key_label: str = "sk-or-v1-sim...sim"
    tokenizer_dir: Path = field(default_factory=tokenizer_dir)
    model_slug: str = MODEL_SLUG
    model_permaslug: str = MODEL_PERMASLUG
    providers: tuple[ProviderEndpoint, ...] = DEFAULT_PROVIDERS
    latency: LatencyConfig = field(default_factory=LatencyConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    mean_completion_tokens: int = 300
    tool_call_probability: float = 0.5
    generation_404_ms: float = 0.0  # /generation answers 404 for this long after completion
    # Answers carry ``X-Generation-Id`` (as OpenRouter's do since 2026); False: none, as older recordings.
    generation_id_header: bool = True
    # A non-streaming answer sends its head (200 and the id header) at once and pads with whitespace while
    # the model runs, as OpenRouter does; False: the whole answer at the end (no padding, no early id).
    plain_head_first: bool = True
    # Answer every chat request with a 400 of this message, as for a parameter the endpoint refuses
    # ("Reasoning is mandatory for this endpoint and cannot be disabled."); None: off. Settable at runtime.
    request_wide_400: str | None = None
    cache_size: int = 16_384  # prepared responses kept (LRU)
    max_generations_kept: int = 200_000  # /generation records kept (oldest dropped)
    backlog: int = 8192
    state_flush_interval_s: float = 0.25  # billing is written behind, at most this stale
    stream_chunks: int = 12  # content deltas per streamed part (reasoning, content)
    # Share of streams whose usage chunk repeats the finish choice (395 of 545 recorded); the rest: ``choices: []``.
    usage_chunk_with_choice_rate: float = 0.72
    processing_comment_interval_s: float = 1.0
    # A built tiny target (``eagle_assets.target.tiny``): completions are its greedy output instead of
    # templated text (``resources.simulator.model_generator``); None = ``KimiStyleGenerator``.
    tiny_target_dir: Path | None = None
    tiny_target_max_batch: int = 32  # requests decoded together in one batch

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
