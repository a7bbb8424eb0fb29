"""Drive the real generation runner against the simulator over real HTTP on 127.0.0.1."""

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.estimate import tokenizer_estimator
from eagle_assets.generation.journal import read_records
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.runner import GenerationSettings, PartitionJob, PartitionReport, PartitionRunner
from eagle_assets.generation.settlement import SettlementSchedule
from eagle_assets.generation.turn_chains import TurnChains
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.openrouter.client import OpenRouterClient
from resources.openrouter.providers import ProviderPolicy, ProviderTable, parse_endpoints
from resources.openrouter.secret import ApiKey
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.simulator.harness import SimulatorHandle, run_simulator_in_thread

MODEL = "moonshotai/kimi-k2.5"


def make_prompts(n: int, tag: str = "p", tools: bool = False) -> list[Prompt]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Question {tag}-{i}: explain item {i} briefly."}]
        t = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}] if tools else None
        out.append(Prompt(f"{tag}{i:05d}", msgs, t, i + 1, i))
    return out


@dataclass
class Harness:
    sim: SimulatorHandle
    tmp: Path

    @property
    def ledger_path(self) -> Path:
        return self.tmp / "ledger.sqlite"

    def journal(self, shard: str = "0000") -> Path:
        return self.tmp / "journal" / f"{shard}.journal"

    def run(
        self,
        prompts: list[Prompt],
        *,
        budget: float = 100.0,
        token_budget: int = 10**9,
        max_tokens: int = 256,
        max_in_flight: int = 64,
        policy: ProviderPolicy | None = None,
        key: str = "sk-test",
        max_attempts: int = 8,
        shard: str = "0000",
        dataset: str = "T1",
        timeout_s: float = 2.0,
        key_poll_s: float = 0.2,
        model: str = MODEL,
        sampling: dict | None = None,
        stream: bool = False,
        idle_s: float = 1.0,
        settlement: SettlementSchedule | None = None,
        chains: TurnChains | None = None,
        **settings_kw: Any,
    ) -> PartitionReport:
        settings = GenerationSettings(
            model=model,
            max_tokens=max_tokens,
            sampling=sampling or {},
            stream=stream,
            stream_idle_timeout_s=idle_s,
            budget_usd=budget,
            max_in_flight=max_in_flight,
            retry=RetryPolicy(max_attempts=max_attempts, base_delay_s=0.01, max_delay_s=0.1, retry_after_cap_s=0.2),
            progress_interval_s=0.5,
            key_poll_interval_s=key_poll_s,
            commit_interval_s=0.01,
            settlement=settlement or SettlementSchedule(first_lookup_s=0.05, loop_interval_s=0.1, final_wait_s=3.0),
            **settings_kw,
        )
        job = PartitionJob(dataset, shard, prompts, token_budget, self.journal(shard), chains)
        estimator = tokenizer_estimator(load_kimi_tokenizer(resolve_tokenizer_dir()))
        lines: list[str] = []

        async def go() -> PartitionReport:
            ledger = BudgetLedger(self.ledger_path)
            try:
                async with OpenRouterClient(
                    self.sim.base_url, ApiKey(key), max_connections=max_in_flight, request_timeout_s=timeout_s
                ) as client:
                    requested = ("max_tokens", *(sampling or {}))
                    table = ProviderTable(
                        parse_endpoints(await client.endpoints(MODEL)), policy or ProviderPolicy(), requested
                    )
                    table.require_allowed()
                    lines.append(table.render())
                    runner = PartitionRunner(job, client, ledger, table, settings, estimator, emit=lines.append)
                    return await runner.run()
            finally:
                ledger.close()

        report = asyncio.run(go())
        report.log_lines = lines  # type: ignore[attr-defined]
        return report

    def records(self, shard: str = "0000") -> list[dict]:
        return read_records(self.journal(shard))

    def ledger(self) -> BudgetLedger:
        return BudgetLedger(self.ledger_path)

    def ledger_totals(self):
        led = BudgetLedger(self.ledger_path)
        try:
            return led.totals()
        finally:
            led.close()


def sim_config(**kw) -> SimulatorConfig:
    kw.setdefault("latency", LatencyConfig.fixed(0.005))
    kw.setdefault("mean_completion_tokens", 60)
    kw.setdefault("tokenizer_dir", resolve_tokenizer_dir())
    return SimulatorConfig(**kw)


@pytest.fixture
def harness(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    marker = request.node.get_closest_marker("sim")
    cfg = sim_config(**(marker.kwargs if marker else {}))
    with run_simulator_in_thread(cfg) as sim:
        yield Harness(sim, tmp_path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sim(**config): SimulatorConfig overrides for the harness fixture")
