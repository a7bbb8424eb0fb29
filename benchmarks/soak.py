"""Soak: ≥ 20,000 requests through the generation asset at 2000 in flight, mixed faults, SIGKILLs.

Loopback only and bounded in count and time. Each life of the run is a real
``dagster asset materialize`` process group, killed with SIGKILL at random moments and restarted; a
final life runs to completion. Then a 429-storm phase measures goodput against the simulator's
admitted rate. Prints: records lost, duplicated, spend against budget, output tokens against the
token budget, requests re-bought because they were in flight at a kill, goodput under the storm, and
what the ledger charged against what the simulator billed, before and after lazy settlement: during
the lives ``/generation`` answers 404 for ``generation_window_s`` (as OpenRouter's does for minutes),
so uncertain attempts and the orphans of kills stay provisionally charged; then the window closes and
one settlement pass (what the next run does at its start) looks them all up.

    python benchmarks/soak.py                       # 20,000 prompts, 5 kills
    python benchmarks/soak.py --prompts 3000 --kills 2 --concurrency 500
"""

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.generation.journal import scan  # noqa: E402
from eagle_assets.generation.ledger import BudgetLedger  # noqa: E402
from eagle_assets.generation.settlement import SettlementSchedule, settle_pending  # noqa: E402
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir  # noqa: E402
from resources.openrouter.client import OpenRouterClient  # noqa: E402
from resources.openrouter.secret import ApiKey  # noqa: E402
from resources.simulator.config import LatencyConfig, SimulatorConfig  # noqa: E402
from resources.simulator.faults import FaultConfig  # noqa: E402
from tests.simulator.harness import spawn_simulator_process  # noqa: E402

MIXED_FAULTS = {
    "rate_limit": 0.03,
    "rate_limit_no_retry_after": 0.02,
    "server_error": 0.02,
    "drop_connection": 0.01,
    "stall": 0.002,
    "error_body": 0.01,
    "finish_error": 0.01,
    "truncated_json": 0.01,
    "disallowed_provider": 0.01,
    "inflight_402": 0.005,
    "whitespace_padding": 0.1,
    "retry_after_s": 0.5,
    "stall_seconds": 30.0,
}


@dataclass
class SoakConfig:
    prompts: int = 20_000
    kills: int = 5
    concurrency: int = 2000
    latency_median_s: float = 0.6
    budget_usd: float = 100.0
    token_budget: int = 10_000_000
    max_tokens: int = 256
    request_timeout_s: float = 10.0
    storm_prompts: int = 3000
    storm_rate_per_s: float = 250.0
    seed: int = 0
    time_limit_s: float = 1500.0
    faults: dict[str, float] = field(default_factory=lambda: dict(MIXED_FAULTS))
    stream: bool = False  # responses as SSE (``EAGLE_FORGE_STREAM``)
    generation_window_s: float = 600.0  # /generation answers 404 this long after a generation, during the lives
    settle_wait_s: float = 60.0  # the settlement pass after the lives, once /generation knows them
    # The step in the CLI's own process (Dagster's in_process executor) instead of a spawned child: one Python
    # start (dagster and the definitions imported again, ~4 CPU s) less per life. The tests take it; the
    # benchmark keeps Dagster's default, as a deployment runs. A SIGKILL of the group ends both alike.
    in_process: bool = False


def _write_prompts(path: Path, n: int, tag: str) -> None:
    with path.open("wb") as f:
        for i in range(n):
            f.write(
                orjson.dumps(
                    {
                        "id": f"{tag}{i:06d}",
                        "messages": [
                            {
                                "role": "user",
                                "content": f"Soak prompt {tag} {i}: explain topic {i % 97} in a few lines.",
                            }
                        ],
                    }
                )
                + b"\n"
            )


def _journal_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _abandoned(sim: Any) -> int:
    """Requests billed although their client was gone: plain ones in full, streams for what was generated."""
    outcomes = sim.stats(0)["by_outcome"]
    return int(outcomes.get("abandoned", 0)) + int(outcomes.get("stream_abandoned", 0))


def _books(led: BudgetLedger) -> dict[str, Any]:
    """What the ledger charged, and of it what the kills' orphans cost (settled, or charged for good)."""
    kinds = led.spend_by_kind()
    return {
        "spent_usd": led.totals().usd_spent,
        "uncertain": len(led.uncertain_attempts()),
        "orphan_usd": sum(v for k, v in kinds.items() if k.startswith("orphan")),
        "orphan_worst_case_usd": kinds.get("orphan", 0.0),  # an id seen, not settled yet: worst case
        # Sent without a response head: what the admission bound held, then what the key's usage left of it.
        "orphan_headless_usd": kinds.get("orphan_headless", 0.0) + kinds.get("orphan_reconciled", 0.0),
        "by_kind": kinds,
    }


async def _settle(led: BudgetLedger, base_url: str, wait_s: float) -> Any:
    """The next run's first pass: /generation for every attempt with an id, then the ledger held against the key's
    usage counter. A real run waits ``key_usage_quiet_s`` (10 min) of quiet for the counter to catch up; the
    simulator's counter is exact at once and every life has ended, so this one does not wait."""
    async with OpenRouterClient(base_url, ApiKey("sk-or-simulator")) as client:
        schedule = SettlementSchedule(key_usage_quiet_s=0.0)
        return await settle_pending(led, client.generation, wait_s, schedule, key_info=client.key_info)


def _write_inputs(cfg: SoakConfig, work: Path) -> None:
    """The soak's prompts, the storm's, and the datasets file that names them."""
    _write_prompts(work / "soak.jsonl", cfg.prompts, "s")
    _write_prompts(work / "storm.jsonl", cfg.storm_prompts, "t")
    datasets = (
        "datasets:\n"
        f"  SOAK: {{path: {work / 'soak.jsonl'}, shard_size: {cfg.prompts}, output_token_budget: {cfg.token_budget}}}\n"
    )
    if cfg.storm_prompts:
        datasets += f"  STORM: {{path: {work / 'storm.jsonl'}, shard_size: {cfg.storm_prompts}}}\n"
    (work / "datasets.yaml").write_text(datasets)


def _start_simulator(cfg: SoakConfig, work: Path) -> Any:
    return spawn_simulator_process(
        SimulatorConfig(
            latency=LatencyConfig.lognormal(cfg.latency_median_s, 0.5, max_s=max(5.0, 4 * cfg.latency_median_s)),
            credits=10_000.0,
            seed=cfg.seed,
            faults=FaultConfig.from_mapping(cfg.faults),
            state_file=work / "sim-state.json",
            mean_completion_tokens=120,
            tokenizer_dir=resolve_tokenizer_dir(),
            generation_404_ms=cfg.generation_window_s * 1000.0,
        )
    )


@dataclass
class _Lives:
    """Where one soak runs (its home, its simulator, its clock) and how a life of it starts: a
    ``dagster asset materialize`` process group of its own, so that a SIGKILL of the group ends the whole life."""

    cfg: SoakConfig
    work: Path
    sim: Any
    start: float = field(default_factory=time.monotonic)

    @property
    def home(self) -> Path:
        return self.work / "home"

    def journal(self, dataset: str) -> Path:
        return self.home / "journal" / dataset / "0000.journal"

    def left_s(self) -> float:
        return self.cfg.time_limit_s - (time.monotonic() - self.start)

    def _env(self) -> dict[str, str]:
        cfg = self.cfg
        return {
            **os.environ,
            "EAGLE_FORGE_HOME": str(self.home),
            "EAGLE_FORGE_DATASETS": str(self.work / "datasets.yaml"),
            "EAGLE_FORGE_SIM_PORT": self.sim.base_url.split(":")[2].split("/")[0],
            "EAGLE_FORGE_MAX_TOKENS": str(cfg.max_tokens),
            "EAGLE_FORGE_MAX_IN_FLIGHT": str(cfg.concurrency),
            "EAGLE_FORGE_REQUEST_TIMEOUT_S": str(cfg.request_timeout_s),
            "EAGLE_FORGE_BUDGET_USD": str(cfg.budget_usd),
            "EAGLE_FORGE_STREAM": "1" if cfg.stream else "0",
            "DAGSTER_HOME": str(self.work / "dagster_home"),
            "PYTHONPATH": str(REPO),
        }

    def materialize(self, asset: str) -> subprocess.Popen:
        in_process = ["--config-json", '{"execution": {"config": {"in_process": {}}}}'] if self.cfg.in_process else []
        command = ["dagster", "asset", "materialize", "-m", "eagle_assets.definitions", "--select", asset]
        return subprocess.Popen(
            [sys.executable, "-m", *command, "--partition", "0000", *in_process],
            env=self._env(),
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / f"{asset.replace('/', '_')}.log", "ab"),
        )

    def run_to_end(self, asset: str, tries: int = 1) -> bool:
        """A life that is not killed; rerun up to ``tries`` times (a life may end on exhausted retries)."""
        for _ in range(tries):
            proc = self.materialize(asset)
            proc.wait(timeout=max(60.0, self.left_s()))
            if proc.returncode == 0:
                return True
        return False


def _kill_once(lives: _Lives, threshold: int) -> tuple[set[str], dict[str, Any]]:
    """A life SIGKILLed once ``threshold`` records are journaled: the ids journaled by then, and the kill's figures."""
    journal = lives.journal("SOAK")
    proc = lives.materialize("generated/SOAK")
    while proc.poll() is None and _journal_lines(journal) < threshold:
        if lives.left_s() < 0:
            raise TimeoutError("soak exceeded its time limit")
        time.sleep(0.25)
    if proc.poll() not in (None, 0):
        tail = (lives.work / "generated_SOAK.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the materialization failed before the kill point:\n{tail}")
    pre = _abandoned(lives.sim)  # abandoned requests billed before this kill
    in_flight = lives.sim.stats(0)["in_flight"]
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.5)  # let the simulator notice the dropped connections and bill them
    at_kill = {r["prompt_id"] for r in scan(journal).records}
    billed = _abandoned(lives.sim) - pre
    return at_kill, {"at_records": len(at_kill), "in_flight_at_kill": in_flight, "billed_abandoned": billed}


def _settled_books(lives: _Lives) -> dict[str, Any]:
    """The ledger's books before lazy settlement (what the lives charged while /generation did not know their
    attempts) and after the next run's first settlement pass, once it does."""
    led = BudgetLedger(lives.home / "state" / "ledger.sqlite")
    try:
        before = _books(led)
        lives.sim.set_generation_window(0)  # indexed by now: the next run's first settlement pass finds them
        tally = asyncio.run(_settle(led, lives.sim.base_url, lives.cfg.settle_wait_s))
        after = _books(led)
        return {
            "before": before,
            "after": after,
            "tally": tally,
            "totals": led.totals(),
            "soak_tokens": led.totals("SOAK").tokens_spent,
        }
    finally:
        led.close()


def _storm(lives: _Lives) -> dict[str, Any]:
    """Phase 2, a 429 storm: goodput is kept responses per second over the rate the simulator admits."""
    cfg = lives.cfg
    out: dict[str, Any] = {
        "records": 0,
        "ok": True,
        "span_s": float("nan"),
        "admitted_rate_per_s": cfg.storm_rate_per_s,
        "goodput_fraction": float("nan"),
        "steady_goodput_fraction": float("nan"),
    }
    if not cfg.storm_prompts:
        return out
    rate = cfg.storm_rate_per_s
    lives.sim.set_faults(
        FaultConfig(admit_rate_per_s=rate, admit_burst=rate / 10, admit_retry_after=True, retry_after_s=0.5)
    )
    out["ok"] = lives.run_to_end("generated/STORM")
    recs = scan(lives.journal("STORM")).records
    out["records"] = len(recs)
    if recs:
        span = max(r["at"] for r in recs) - min(r["at"] - r.get("latency_s", 0.0) for r in recs)
        out["span_s"], out["goodput_fraction"] = span, len(recs) / span / rate
        # Steady state: completions between the 10th and 90th percentile, without ramp-up and tail.
        ends = sorted(r["at"] for r in recs)
        lo, hi = ends[len(ends) // 10], ends[len(ends) * 9 // 10]
        if hi > lo:
            out["steady_goodput_fraction"] = (len(ends) * 9 // 10 - len(ends) // 10) / (hi - lo) / rate
    return out


def _settlement_figures(books: dict[str, Any]) -> dict[str, Any]:
    before, after, tally = books["before"], books["after"], books["tally"]
    return {
        "charged_before_usd": before["spent_usd"],
        "charged_after_usd": after["spent_usd"],
        "uncertain_before": before["uncertain"],
        "uncertain_after": after["uncertain"],
        "resolved": tally.resolved,
        "kill_cost_before_usd": before["orphan_usd"],
        "kill_cost_after_usd": after["orphan_usd"],
        "kill_cost_at_worst_case_after_usd": after["orphan_worst_case_usd"],
        "kill_cost_headless_before_usd": before["orphan_headless_usd"],
        "kill_cost_headless_after_usd": after["orphan_headless_usd"],
        "key_usage_refunded_usd": tally.key_check.refunded_usd if tally.key_check else None,
        "by_kind_after": after["by_kind"],
    }


def run_soak(cfg: SoakConfig, work: Path, log=print) -> dict[str, Any]:
    """The lives (SIGKILLed at random record counts, then one run to the end), the books before and after
    settlement, then the storm; the result is what ``broken_guarantees`` and the printout read."""
    start = time.monotonic()
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    _write_inputs(cfg, work)
    lives = _Lives(cfg, work, _start_simulator(cfg, work), start)
    rng = random.Random(cfg.seed)
    thresholds = sorted(rng.sample(range(int(cfg.prompts * 0.05), int(cfg.prompts * 0.9)), cfg.kills))
    kills: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    lost = 0
    try:
        for threshold in thresholds:
            at_kill, kill = _kill_once(lives, threshold)
            lost += len(seen_ids - at_kill)
            seen_ids |= at_kill
            kills.append(kill)
            log(f"kill {len(kills)}: {kill['at_records']} records journaled, {kill['in_flight_at_kill']} in flight")
        final_ok = lives.run_to_end("generated/SOAK", tries=3)
        result = scan(lives.journal("SOAK"))
        ids = [r["prompt_id"] for r in result.records]
        lost += len(seen_ids - set(ids))
        books = _settled_books(lives)
        stats = lives.sim.stats(0)
        recent = lives.sim.stats(200)["generations"]
        storm = _storm(lives)
    finally:
        lives.sim.terminate()
    return {
        "config": asdict(cfg),
        "final_run_ok": final_ok,
        "prompts": cfg.prompts,
        "records": len(set(ids)),
        "records_lost": lost + (cfg.prompts - len(set(ids))),
        "records_duplicated": len(ids) - len(set(ids)),
        "torn_bytes_dropped_last_scan": result.dropped_bytes,
        "requests_sent_to_simulator": stats["requests_received"],
        "streamed_share_of_last_200": sum(g["streamed"] for g in recent) / max(1, len(recent)),
        "spent_usd": books["totals"].usd_spent,
        "budget_usd": cfg.budget_usd,
        "simulator_billed_usd": stats["billed_usd"],
        "settlement": _settlement_figures(books),
        "output_tokens": books["soak_tokens"],
        "token_budget": cfg.token_budget,
        "kills": kills,
        "rebought_in_flight_at_kills": sum(k["billed_abandoned"] for k in kills),
        "storm": storm,
        "wall_s": time.monotonic() - lives.start,
    }


def broken_guarantees(r: dict[str, Any], cfg: SoakConfig) -> list[str]:
    """What the run promised and did not keep (empty: all kept), for the exit status of a long run."""
    st = r["settlement"]
    checks = {
        "the final life completed": r["final_run_ok"],
        "no record lost": r["records_lost"] == 0,
        "no record duplicated": r["records_duplicated"] == 0,
        "billed <= charged <= budget": r["simulator_billed_usd"] <= r["spent_usd"] + 1e-9 <= cfg.budget_usd + 1e-9,
        "output tokens within the token budget": r["output_tokens"] <= cfg.token_budget,
        "re-bought only what was in flight at the kills": r["rebought_in_flight_at_kills"]
        <= cfg.kills * cfg.concurrency,
        "no attempt left uncertain after settlement": st["uncertain_after"] == 0,
        "settled books within 5% of the bill": st["charged_after_usd"] <= 1.05 * r["simulator_billed_usd"] + 1e-6,
        "the storm completed": r["storm"]["ok"] and r["storm"]["records"] == cfg.storm_prompts,
    }
    return [name for name, kept in checks.items() if not kept]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--storm-prompts", type=int, default=3000)
    ap.add_argument("--storm-rate", type=float, default=250.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--latency",
        type=float,
        default=0.6,
        help="median answer latency, s (lognormal; the request timeout grows with it). At 0.6 s a kill finds many"
        " requests whose response head has not arrived yet (their ids unknown: charged for good, at what the"
        " admission bound held for them in statistical mode, at worst case in hard mode);"
        " OpenRouter's answers for a 1T model take tens of seconds, which makes that window a small share",
    )
    ap.add_argument("--stream", action="store_true", help="stream responses (SSE)")
    ap.add_argument("--json", action="store_true", help="print the raw result as JSON")
    a = ap.parse_args()
    cfg = SoakConfig(
        prompts=a.prompts,
        kills=a.kills,
        concurrency=a.concurrency,
        storm_prompts=a.storm_prompts,
        storm_rate_per_s=a.storm_rate,
        seed=a.seed,
        stream=a.stream,
        latency_median_s=a.latency,
        request_timeout_s=max(10.0, 8 * a.latency),
    )
    with tempfile.TemporaryDirectory(prefix="eagle-soak-") as tmp:
        r = run_soak(cfg, Path(tmp))
    if a.json:
        print(json.dumps(r, indent=2))
    print(
        f"\nsoak{' (streaming)' if cfg.stream else ''}: {r['prompts']:,} prompts,"
        f" {r['requests_sent_to_simulator']:,} requests, {len(r['kills'])} SIGKILLs,"
        f" {r['wall_s']:.0f}s wall, final run {'ok' if r['final_run_ok'] else 'FAILED'}"
    )
    print(f"  records lost:        {r['records_lost']}   (must be 0)")
    print(f"  records duplicated:  {r['records_duplicated']}   (must be 0)")
    print(
        f"  spend:               ${r['spent_usd']:.4f} of ${r['budget_usd']:.2f} budget"
        f" (simulator billed ${r['simulator_billed_usd']:.4f})"
    )
    st, billed = r["settlement"], r["simulator_billed_usd"]

    def vs(usd: float) -> str:
        return f"${usd:.4f} ({100 * (usd / billed - 1):+.1f}% vs billed)" if billed else f"${usd:.4f}"

    print(
        f"  charged vs billed:   before lazy settlement {vs(st['charged_before_usd'])}, {st['uncertain_before']}"
        f" attempts uncertain; after {vs(st['charged_after_usd'])}, {st['uncertain_after']} left"
        f" ({st['resolved']} settled from /generation)"
    )
    print(
        f"  what the kills cost: ${st['kill_cost_before_usd']:.4f} charged for requests in flight at them before"
        f" settlement, ${st['kill_cost_after_usd']:.4f} after; of it, sent without a response head:"
        f" ${st['kill_cost_headless_before_usd']:.4f} (what the admission bound held), then"
        f" ${st['kill_cost_headless_after_usd']:.4f} once held against the key's usage counter"
        f" (${st['key_usage_refunded_usd'] or 0.0:.4f} given back)"
    )
    print(f"  output tokens:       {r['output_tokens']:,} of {r['token_budget']:,} token budget")
    print(
        f"  re-bought at kills:  {r['rebought_in_flight_at_kills']} requests "
        f"(in flight at each kill: {[k['in_flight_at_kill'] for k in r['kills']]})"
    )
    s = r["storm"]
    print(
        f"  429 storm goodput:   {100 * s['goodput_fraction']:.1f}% of the admitted"
        f" {s['admitted_rate_per_s']:.0f} req/s ({s['records']} responses in {s['span_s']:.1f}s, ramp-up and tail"
        f" included); steady state {100 * s['steady_goodput_fraction']:.1f}%"
    )
    if broken := broken_guarantees(r, cfg):
        sys.exit(f"FAILED: {'; '.join(broken)}")


if __name__ == "__main__":
    main()
