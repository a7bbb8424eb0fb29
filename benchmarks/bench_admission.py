"""Admission benchmark: production ratios through ``dagster asset materialize`` against the simulator.

Production: max_tokens 16,384 against answers of ~3,000 tokens, 10M output tokens per dataset, $100,
2000 in flight. ``--scale`` (default 10) divides the tokens and the dollars: max_tokens 1,638, mean
answer 300, a 1M-token budget, a $10 budget; the simulator answers after a fixed latency (2 s).
Two phases, each with a fresh home, ledger, Dagster instance and simulator process:

- tokens:  one dataset (``--token-datasets N``: N at once, one process each) with the token budget,
           dollars not binding; nothing is known of its answers (its first wave holds max_tokens each);
- fresh:   the same, one dataset alone, after another dataset of the same model has ``--seed-answers``
           (2000) answers in the ledger: its first wave starts from those (measured without them);
- dollars: one dataset with the dollar budget, tokens not binding.

Printed per phase: peak and mean in flight (the simulator's own count, sampled every 40 ms) over the
busy time and until 95% of the run's requests were sent (the last 5% of the budget: every request
costs the same in expectation); the generation's wall time (first request to last answer) against
the ideal at 2000 in flight, ``ceil(answers / 2000) × latency``; the
overshoot in tokens and dollars; the fraction of the budget spent. The goals (issue 15): mean in
flight ≥ 1,800 until the last 5%, wall ≤ 1.5× ideal, dollar overshoot 0, token overshoot ≤ 1%; (issue
20) a fresh dataset alone, seeded by another of its model: wall ≤ 1.5× ideal, token overshoot ≤ 1%.

    python benchmarks/bench_admission.py                    # scale 10: 1M tokens, $10 (tokens, fresh, dollars)
    python benchmarks/bench_admission.py --phases dollars --mode hard   # the worst-case baseline
    python benchmarks/bench_admission.py --token-datasets 8 --phases tokens   # B1–B8 at once
    python benchmarks/bench_admission.py --phases fresh --latency 8 --token-shortfall 0.05   # no last round
    python benchmarks/bench_admission.py --ledger both   # each phase on SQLite, then on PostgreSQL (pgserver)
    python benchmarks/bench_admission.py --ledger both --repeat 3 --phases dollars   # alternated, noise averaged
"""

import argparse
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.generation.admission import AdmissionPolicy  # noqa: E402
from eagle_assets.generation.ledger import BudgetLedger  # noqa: E402
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir  # noqa: E402
from resources.simulator.config import LatencyConfig, SimulatorConfig  # noqa: E402
from tests.simulator.harness import SimulatorProcess, spawn_simulator_process  # noqa: E402

PRODUCTION = {"max_tokens": 16_384, "mean_tokens": 3_000, "token_budget": 10_000_000, "usd_budget": 100.0}
SAMPLE_S = 0.04
MATERIALIZE = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_assets.definitions"]


@dataclass
class Phase:
    name: str
    datasets: list[str]
    token_budget: int
    usd_budget: float
    prompts: int
    seed_prompts: int = 0  # answered first by another dataset of the same model (not measured)
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, in flight, requests received)
    returncodes: list[int] = field(default_factory=list)
    materialize_s: float = 0.0


def write_prompts(path: Path, n: int, tag: str) -> None:
    with path.open("wb") as f:
        for i in range(n):
            row = {
                "id": f"{tag}{i:06d}",
                "messages": [{"role": "user", "content": f"Bench {tag} {i}: explain item {i}."}],
            }
            f.write(orjson.dumps(row) + b"\n")


def monitor(sim: SimulatorProcess, phase: Phase, stop: threading.Event) -> None:
    start = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(OSError):
            st = sim.stats(0)
            phase.samples.append((time.monotonic() - start, int(st["in_flight"]), int(st["requests_received"])))
        stop.wait(SAMPLE_S)


def write_datasets(phase: Phase, work: Path) -> None:
    """The phase's prompt files and the ``datasets.yaml`` naming them (the seed dataset first, when it has one)."""
    lines = ["datasets:"]
    if phase.seed_prompts:
        write_prompts(work / "SEED.jsonl", phase.seed_prompts, "SEED")
        lines.append(f"  SEED: {{path: {work / 'SEED.jsonl'}, shard_size: {phase.seed_prompts}}}")
    for d in phase.datasets:
        write_prompts(work / f"{d}.jsonl", phase.prompts, d)
        spec = f"path: {work / f'{d}.jsonl'}, shard_size: {phase.prompts}, output_token_budget: {phase.token_budget}"
        lines.append(f"  {d}: {{{spec}}}")
    (work / "datasets.yaml").write_text("\n".join(lines) + "\n")


def run_phase(
    phase: Phase, a: argparse.Namespace, scaled: dict[str, Any], work: Path, database_url: str = ""
) -> dict[str, Any]:
    """``database_url``: the ledger in that database (EAGLE_FORGE_DATABASE_URL), else in the home's SQLite file."""
    home, dagster_home = work / "home", work / "dagster_home"
    dagster_home.mkdir(parents=True)
    write_datasets(phase, work)
    sim = spawn_simulator_process(
        SimulatorConfig(
            latency=LatencyConfig.fixed(a.latency),
            mean_completion_tokens=scaled["mean_tokens"],
            credits=1e6,
            seed=a.seed,
            tokenizer_dir=resolve_tokenizer_dir(),
            backlog=8192,
        )
    )
    port = sim.base_url.split(":")[2].split("/")[0]
    env = {
        **os.environ,
        "EAGLE_FORGE_HOME": str(home),
        "EAGLE_FORGE_DATASETS": str(work / "datasets.yaml"),
        "EAGLE_FORGE_SIM_PORT": port,
        "EAGLE_FORGE_MAX_TOKENS": str(scaled["max_tokens"]),
        "EAGLE_FORGE_MAX_IN_FLIGHT": str(a.concurrency),
        "EAGLE_FORGE_BUDGET_USD": str(phase.usd_budget),
        "EAGLE_FORGE_BUDGET_MODE": a.mode,
        "EAGLE_FORGE_TOKEN_SHORTFALL": str(a.token_shortfall),
        "EAGLE_FORGE_REQUEST_TIMEOUT_S": "120",
        "DAGSTER_HOME": str(dagster_home),
        "PYTHONPATH": str(REPO),
    }
    env.pop("EAGLE_FORGE_DATABASE_URL", None)
    if database_url:
        env["EAGLE_FORGE_DATABASE_URL"] = database_url
    # Create the instance's storage once: several CLI processes racing to migrate it fail.
    subprocess.run(
        [sys.executable, "-c", "import dagster; dagster.DagsterInstance.get()"], env=env, cwd=REPO, check=True
    )
    if phase.seed_prompts:  # another dataset of the model answers first; the measurement starts after it
        seeded = subprocess.run(
            [*MATERIALIZE, "--select", "generated/SEED", "--partition", "0000"],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "SEED.log", "wb"),  # noqa: SIM115 (the child's)
            timeout=a.timeout,
        )
        if seeded.returncode:
            raise SystemExit(f"the seed dataset failed ({work / 'SEED.log'})")
        urllib.request.urlopen(urllib.request.Request(f"{sim.root_url}/_sim/reset_stats", data=b"{}"), timeout=10)
    stop = threading.Event()
    ledger_path: Path | str = database_url or home / "state" / "ledger.sqlite"
    watcher = threading.Thread(target=monitor, args=(sim, phase, stop), daemon=True)
    t0 = time.monotonic()
    watcher.start()
    try:
        procs = [
            subprocess.Popen(
                [*MATERIALIZE, "--select", f"generated/{d}", "--partition", "0000"],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=open(work / f"{d}.log", "wb"),  # noqa: SIM115 (the child's)
            )
            for d in phase.datasets
        ]
        phase.returncodes = [p.wait(timeout=a.timeout) for p in procs]
        phase.materialize_s = time.monotonic() - t0
    finally:
        stop.set()
        watcher.join()
        final = sim.stats(0)
        sim.terminate()
    return summarize(phase, a, scaled, final, ledger_path, work)


def summarize(
    phase: Phase,
    a: argparse.Namespace,
    scaled: dict[str, Any],
    final: dict[str, Any],
    ledger_path: Path | str,
    work: Path,
) -> dict[str, Any]:
    busy = [t for t, n, _ in phase.samples if n > 0]
    t_start, t_end = (busy[0] - SAMPLE_S / 2, busy[-1] + SAMPLE_S / 2) if busy else (0.0, 0.0)
    # "Until the last 5% of the budget": until 95% of the run's requests had been sent (each costs the same
    # in expectation), i.e. the bulk, without the last requests that only fit one by one.
    sent = int(final["requests_received"])
    t95 = next((t for t, _, received in phase.samples if received >= 0.95 * sent), t_end)

    def mean_in_flight(lo: float, hi: float) -> float:
        window = [n for t, n, _ in phase.samples if lo <= t <= hi]
        return sum(window) / len(window) if window else 0.0

    answers = int(final["billed_requests"])
    wall = t_end - t_start
    ideal = math.ceil(answers / a.concurrency) * a.latency
    led = BudgetLedger(ledger_path, policy=AdmissionPolicy(mode=a.mode))
    try:
        spent = led.totals().usd_spent
        produced = {d: led.totals(d).tokens_spent for d in phase.datasets}
        mean_len = {d: led.length_moments(d).mean for d in phase.datasets}
    finally:
        led.close()
    out: dict[str, Any] = {
        "phase": phase.name,
        "ledger": "postgresql" if isinstance(ledger_path, str) else "sqlite",
        "mode": a.mode,
        "returncodes": phase.returncodes,
        "answers": answers,
        "peak_in_flight": int(final["peak_in_flight"]),
        "mean_in_flight_busy": mean_in_flight(t_start, t_end),
        "mean_in_flight_until_95": mean_in_flight(t_start, t95),
        "t95_s": t95 - t_start,
        "wall_s": wall,
        "ideal_s": ideal,
        "wall_over_ideal": wall / ideal if ideal else float("inf"),
        "materialize_s": phase.materialize_s,
        "spent_usd": spent,
        "billed_usd": float(final["billed_usd"]),
        "mean_answer_tokens": mean_len,
    }
    if phase.name == "dollars":
        out["usd_overshoot"] = max(0.0, spent - phase.usd_budget)
        out["budget_spent"] = spent / phase.usd_budget
    else:
        worst = max(produced.values()) - phase.token_budget
        out["token_overshoot"] = worst
        out["token_overshoot_pct"] = 100 * worst / phase.token_budget
        out["budget_spent"] = min(produced.values()) / phase.token_budget
        out["produced"] = produced
    (work / "result.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    (work / "samples.json").write_bytes(orjson.dumps(phase.samples))
    return out


def report(r: dict[str, Any], a: argparse.Namespace) -> None:
    goal_mean = r["mean_in_flight_until_95"] >= 0.9 * a.concurrency
    goal_wall = r["wall_over_ideal"] <= 1.5
    print(f"\n== {r['phase']} ({r['mode']}, ledger on {r['ledger']}), exit codes {r['returncodes']}")
    if r["phase"] == "fresh":
        print(f"  seeded by {a.seed_answers} answers of another dataset of the same model")
    print(
        f"  in flight: peak {r['peak_in_flight']}, mean {r['mean_in_flight_until_95']:.0f} until 95% of the requests"
        " were sent"
        f" (t = {r['t95_s']:.1f} s) [{'MET' if goal_mean else 'NOT MET'}: >= {0.9 * a.concurrency:.0f}],"
        f" {r['mean_in_flight_busy']:.0f} over the busy time"
    )
    print(
        f"  wall {r['wall_s']:.1f} s for {r['answers']} answers vs ideal {r['ideal_s']:.1f} s"
        f" at {a.concurrency} in flight"
        f" = {r['wall_over_ideal']:.2f}x [{'MET' if goal_wall else 'NOT MET'}: <= 1.5x];"
        f" materialize {r['materialize_s']:.1f} s in all"
    )
    means = ", ".join(f"{d} {m:.0f}" for d, m in r["mean_answer_tokens"].items())
    if r["phase"] == "dollars":
        ok = r["usd_overshoot"] == 0
        print(
            f"  spent ${r['spent_usd']:.4f} (simulator billed ${r['billed_usd']:.4f}) = {100 * r['budget_spent']:.2f}%"
            f" of the budget; overshoot ${r['usd_overshoot']:.4f} [{'MET' if ok else 'NOT MET'}: 0];"
            f" mean answer {means} tokens"
        )
    else:
        ok = r["token_overshoot_pct"] <= 1.0
        produced = ", ".join(f"{d} {v:,}" for d, v in r["produced"].items())
        print(
            f"  produced {produced} tokens; overshoot {r['token_overshoot']:+,} ({r['token_overshoot_pct']:+.2f}%)"
            f" [{'MET' if ok else 'NOT MET'}: <= 1%]; {100 * r['budget_spent']:.2f}% of the budget reached;"
            f" mean answer {means} tokens"
        )


def compare(name: str, runs: dict[str, list[dict[str, Any]]], repeat: int) -> None:
    """PostgreSQL against SQLite: the mean in flight until 95% (the goal: no more than 5% lower)."""

    def avg(backend: str, key: str) -> float:
        return sum(r[key] for r in runs[backend]) / len(runs[backend])

    s_mean, p_mean = avg("sqlite", "mean_in_flight_until_95"), avg("postgresql", "mean_in_flight_until_95")
    ratio = p_mean / s_mean
    print(
        f"\n  {name}, {repeat} run(s) each: mean in flight until 95% {p_mean:.0f} on PostgreSQL vs"
        f" {s_mean:.0f} on SQLite = {ratio:.3f} [{'MET' if ratio >= 0.95 else 'NOT MET'}: >= 0.95];"
        f" wall {avg('postgresql', 'wall_over_ideal'):.2f}x vs {avg('sqlite', 'wall_over_ideal'):.2f}x ideal"
    )


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=10.0, help="divide production tokens and dollars by this")
    ap.add_argument("--latency", type=float, default=2.0, help="fixed simulator latency, seconds")
    ap.add_argument("--concurrency", type=int, default=2000, help="EAGLE_FORGE_MAX_IN_FLIGHT")
    ap.add_argument("--phases", default="tokens,fresh,dollars")
    ap.add_argument("--seed-answers", type=int, default=2000, help="fresh phase: answers of the other dataset")
    ap.add_argument("--mode", default="statistical", choices=("statistical", "hard"))
    ap.add_argument(
        "--token-shortfall",
        type=float,
        default=0.0,
        help="share of a token target a run may leave rather than start a last round for it (0: reach it)",
    )
    ap.add_argument("--token-datasets", type=int, default=1, help="datasets generated at once in the token phase")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, ledgers, result.json)")
    ap.add_argument(
        "--ledger",
        default="sqlite",
        choices=("sqlite", "postgresql", "both"),
        help="where the ledger lives; postgresql starts a local server (pgserver); both: each phase on each",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per phase and ledger, alternated between ledgers")
    return ap.parse_args()


def main() -> None:
    a = _args()
    scaled = {
        "max_tokens": round(PRODUCTION["max_tokens"] / a.scale),
        "mean_tokens": round(PRODUCTION["mean_tokens"] / a.scale),
        "token_budget": round(PRODUCTION["token_budget"] / a.scale),
        "usd_budget": PRODUCTION["usd_budget"] / a.scale,
    }
    # Enough prompts that the budget, not the prompts, ends each phase (answers cost ~$0.0006 at scale 10).
    per_answer_usd = scaled["mean_tokens"] * 2.2e-6 * 0.9
    phases = {
        "tokens": Phase(
            "tokens",
            [f"TOK{i + 1}" for i in range(a.token_datasets)],
            scaled["token_budget"],
            1e6,
            int(2 * scaled["token_budget"] / scaled["mean_tokens"]),
        ),
        "fresh": Phase(
            "fresh",
            ["FRESH"],
            scaled["token_budget"],
            1e6,
            int(2 * scaled["token_budget"] / scaled["mean_tokens"]),
            seed_prompts=a.seed_answers,
        ),
        "dollars": Phase(
            "dollars", ["USD"], 10**13, scaled["usd_budget"], int(1.5 * scaled["usd_budget"] / per_answer_usd)
        ),
    }
    print(
        f"scale 1/{a.scale:g}: max_tokens {scaled['max_tokens']}, mean answer {scaled['mean_tokens']} tokens,"
        f" token budget {scaled['token_budget']:,}, dollar budget ${scaled['usd_budget']:.2f};"
        f" {a.concurrency} in flight, fixed latency {a.latency:g} s, budget mode {a.mode},"
        f" token shortfall {a.token_shortfall:g}"
    )
    backends = ["sqlite", "postgresql"] if a.ledger == "both" else [a.ledger]
    pg = None
    if "postgresql" in backends:
        from resources.postgres.local_server import start_local_postgres

        pg_dir = Path(tempfile.mkdtemp(prefix="bench-admission-pg-"))
        pg = start_local_postgres(pg_dir / "data")
    results = []
    try:
        for name in a.phases.split(","):
            runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
            for backend in [b for _ in range(a.repeat) for b in backends]:
                work = Path(tempfile.mkdtemp(prefix=f"bench-admission-{name}-"))
                url = pg.create_database() if pg is not None and backend == "postgresql" else ""
                fresh = Phase(**{**phases[name].__dict__, "samples": [], "returncodes": []})
                r = run_phase(fresh, a, scaled, work, url)
                results.append(r)
                runs[backend].append(r)
                report(r, a)
                if a.keep:
                    print(f"  work folder: {work}")
                else:
                    shutil.rmtree(work, ignore_errors=True)
            if len(backends) == 2:
                compare(name, runs, a.repeat)
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg_dir, ignore_errors=True)
    print("\nresults:", orjson.dumps(results).decode())


if __name__ == "__main__":
    main()
