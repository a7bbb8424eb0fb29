"""The simulator's mutable state: the account and its persistence, billing, stats, generation records.

Owned by the server's event loop; every route reads and changes it only from there (tests go through
``tests/simulator/harness.py``). Billing lives here so that every route bills by the same rule.
"""

import json
import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from eagle_assets.durable_files import atomic_write_bytes
from eagle_assets.errors import OpenRouterError, Systemic
from resources.simulator.config import ProviderEndpoint, SimulatorConfig
from resources.simulator.faults import FaultConfig, FaultPicker, TokenBucket

STATE_VERSION = 1


class StateFileError(OpenRouterError, Systemic, RuntimeError):
    """The state file exists but cannot be read: refuse to start rather than reset the balance."""


@dataclass
class Account:
    limit: float
    usage: float = 0.0

    @property
    def remaining(self) -> float:
        return self.limit - self.usage


@dataclass(slots=True)
class GenerationRecord:
    """One generation, compact: a long run keeps hundreds of thousands for /generation and stats."""

    id: str
    content_hash: str
    provider_name: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    finish_reason: str
    cost: float  # what was charged (0 when not billed)
    streamed: bool
    cancelled: bool
    latency_ms: int
    generation_ms: int
    created: float  # epoch seconds
    completed_at: float  # monotonic, for the "not found yet" window

    def api_data(self, model: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": model,
            "provider_name": self.provider_name,
            "total_cost": self.cost,
            "usage": self.cost,
            "is_byok": False,
            "upstream_inference_cost": None,
            "tokens_prompt": self.prompt_tokens,
            "tokens_completion": self.completion_tokens,
            "native_tokens_prompt": self.prompt_tokens,
            "native_tokens_completion": self.completion_tokens,
            "native_tokens_reasoning": self.reasoning_tokens,
            "native_tokens_cached": 0,
            "finish_reason": self.finish_reason,
            "native_finish_reason": self.finish_reason,
            "latency": self.latency_ms,
            "generation_time": self.generation_ms,
            "moderation_latency": 0,
            "streamed": self.streamed,
            "cancelled": self.cancelled,
            "created_at": datetime.fromtimestamp(self.created, UTC).isoformat(),
            "origin": "",
            "app_id": None,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "content_hash": self.content_hash,
            "provider": self.provider_name,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "billed": self.cost > 0,
            "streamed": self.streamed,
            "cancelled": self.cancelled,
        }


@dataclass
class SimulatorStats:
    requests_received: int = 0
    admitted: int = 0
    admit_rejected: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    billed_usd: float = 0.0
    billed_requests: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_finish_reason: Counter[str] = field(default_factory=Counter)
    by_provider: Counter[str] = field(default_factory=Counter)
    billed_by_hash: Counter[str] = field(default_factory=Counter)
    generations: list[GenerationRecord] = field(default_factory=list)


class SimulatorState:
    """Everything mutable: account, faults, stats, generations. Owned by the server's event loop."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.account = Account(limit=config.credits)
        self.stats = SimulatorStats()
        self.generations: OrderedDict[str, GenerationRecord] = OrderedDict()
        self.picker = FaultPicker(config.faults, config.seed)
        self.latency_rng = random.Random(config.seed * 104729 + 3)
        self.bucket: TokenBucket | None = None
        self.workspace_budget: float | None = config.workspace_budget_usd
        self.generation_404_ms = config.generation_404_ms  # changeable at runtime (``/_sim/generation_window``)
        self.request_wide_error: str | None = config.request_wide_400  # ``/_sim/request_wide_error``
        self.request_wide_delay_s = config.request_wide_400_delay_s
        self.faults = config.faults
        self.set_faults(config.faults)
        self._dirty = False
        self.stopping = False  # set before shutdown cancels handlers: those are not abandoned by a client
        if config.state_file is not None:
            self._load(Path(config.state_file))

    def set_faults(self, faults: FaultConfig) -> None:
        self.faults = faults
        self.picker.configure(faults)
        rate = faults.admit_rate_per_s
        self.bucket = TokenBucket(rate, faults.admit_burst) if rate is not None else None

    def topup(self, amount_usd: float) -> None:
        if amount_usd <= 0:
            raise ValueError("top-up amount must be positive")
        self.account.limit += amount_usd
        self._dirty = True
        self.flush()

    def key_data(self) -> dict[str, Any]:
        a = self.account
        unlimited = self.config.unlimited_key
        return {
            "label": self.config.key_label,
            "limit": None if unlimited else a.limit,
            "limit_remaining": None if unlimited else a.remaining,
            "limit_reset": None,
            "usage": a.usage,
            "usage_daily": a.usage,
            "usage_weekly": a.usage,
            "usage_monthly": a.usage,
            "byok_usage": 0,
            "is_free_tier": False,
            "is_management_key": False,
            "is_provisioning_key": False,
            "include_byok_in_limit": False,
            "rate_limit": {"requests": -1, "interval": "10s", "note": "This field is deprecated and safe to ignore."},
        }

    def set_workspace_budget(self, amount_usd: float | None) -> None:
        """Raise (or lift, with None) the workspace budget that answers 403 once usage reaches it."""
        self.workspace_budget = amount_usd

    def record_generation(
        self,
        gen_id: str,
        content_hash: str,
        provider: ProviderEndpoint,
        prompt_tokens: int,
        completion_tokens: int,
        reasoning_tokens: int,
        finish_reason: str,
        *,
        billed: bool,
        streamed: bool,
        cancelled: bool,
        started: float,
        generation_s: float,
    ) -> float:
        """Store the generation and bill it when ``billed``; returns the cost charged (0 if not)."""
        cost = prompt_tokens * provider.prompt_price + completion_tokens * provider.completion_price
        charged = cost if billed and completion_tokens > 0 else 0.0
        st = self.stats
        if charged:
            self.account.usage += charged
            st.billed_usd += charged
            st.billed_requests += 1
            st.billed_by_hash[content_hash] += 1
            self._dirty = True
        now = time.monotonic()
        rec = GenerationRecord(
            gen_id,
            content_hash,
            provider.name,
            prompt_tokens,
            completion_tokens,
            reasoning_tokens,
            finish_reason,
            charged,
            streamed,
            cancelled,
            round((now - started) * 1000),
            round(generation_s * 1000),
            time.time(),
            now,
        )
        keep = self.config.max_generations_kept
        self.generations[gen_id] = rec
        if len(self.generations) > keep:
            self.generations.popitem(last=False)
        st.generations.append(rec)
        if len(st.generations) > keep:
            del st.generations[: max(1, keep // 10)]
        st.by_finish_reason[finish_reason] += 1
        st.by_provider[provider.name] += 1
        return charged

    def _load(self, path: Path) -> None:
        if not path.exists():
            self._dirty = True  # write the initial balance so that a restart finds it
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self.account.limit = float(data["limit"])
            self.account.usage = float(data["usage"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateFileError(f"cannot read simulator state file {path}: {exc}") from exc

    def flush(self) -> None:
        path = self.config.state_file
        if path is None or not self._dirty:
            return
        self._dirty = False
        payload = {
            "version": STATE_VERSION,
            "limit": self.account.limit,
            "usage": self.account.usage,
            "billed_requests_since_start": self.stats.billed_requests,
            "saved_at": datetime.now(UTC).isoformat(),
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(Path(path), orjson.dumps(payload, option=orjson.OPT_INDENT_2))

    def reset_stats(self) -> None:
        in_flight = self.stats.in_flight
        self.stats = SimulatorStats(in_flight=in_flight, peak_in_flight=in_flight)

    def snapshot(self, generations_limit: int | None = None) -> dict[str, Any]:
        st = self.stats
        gens = (
            st.generations
            if generations_limit is None
            else st.generations[-generations_limit:]
            if generations_limit
            else []
        )
        return {
            "requests_received": st.requests_received,
            "admitted": st.admitted,
            "admit_rejected": st.admit_rejected,
            "in_flight": st.in_flight,
            "peak_in_flight": st.peak_in_flight,
            "by_outcome": dict(st.by_outcome),
            "by_status": dict(st.by_status),
            "by_finish_reason": dict(st.by_finish_reason),
            "by_provider": dict(st.by_provider),
            "billed_usd": st.billed_usd,
            "billed_requests": st.billed_requests,
            "billed_by_hash": dict(st.billed_by_hash),
            "hashes_billed_more_than_once": sorted(h for h, n in st.billed_by_hash.items() if n > 1),
            "credits": {"limit": self.account.limit, "usage": self.account.usage, "remaining": self.account.remaining},
            "faults": self.faults.to_dict(),
            "generations": [g.summary() for g in gens],
        }
