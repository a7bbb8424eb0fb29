"""Transport benchmark: 2000 requests in flight against the simulator, client CPU per request.

Each client runs in a fresh subprocess so that its CPU time (user + system, from getrusage) and peak
RSS are its own; the simulator runs in another process with a fixed latency, so the ideal wall time
is ``ceil(n / concurrency) * latency``. Printed: CPU ms per request, throughput as a fraction of
ideal, peak memory, and each baseline's ratio against the eagle-forge engine measured in this run.

    python benchmarks/bench_transport.py                 # engine 10k requests, baselines 2k
    python benchmarks/bench_transport.py --quick         # smaller, for a smoke run
    python benchmarks/bench_transport.py --variants engine,engine-stream   # plain vs streaming (SSE)

With a fixed latency every slot's requests come back in synchronized waves of 2000, and one event
loop handles a wave serially (~0.5 s of CPU here). The engine keeps the waves spread (its slow start
opens 2000 requests over about one wave's CPU) and sends each slot's next request in the same task
step that handles its answer, so a wave does not queue behind itself; the fraction of ideal still
grows with the latency. ``--latency 4`` is the demanding case. Imports are loaded before the clock.
"""

import argparse
import asyncio
import importlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MAX_TOKENS = 64
PAYLOAD: dict[str, Any] = {
    "model": "moonshotai/kimi-k2.5",
    "max_tokens": MAX_TOKENS,
    "messages": [{"role": "user", "content": "benchmark prompt"}],
}


def _payload(i: int) -> dict[str, Any]:
    return {**PAYLOAD, "messages": [{"role": "user", "content": f"benchmark prompt {i % 500}"}]}


def _set_max_tokens(n: int) -> None:
    """Longer answers (``--max-tokens``) make streams denser: more chunks per request, same latency."""
    PAYLOAD["max_tokens"] = n


async def _drive(n: int, concurrency: int, send) -> int:
    sem = asyncio.Semaphore(concurrency)
    ok = 0

    async def one(i: int) -> None:
        nonlocal ok
        async with sem:
            if await send(_payload(i)):
                ok += 1

    await asyncio.gather(*(one(i) for i in range(n)))
    return ok


async def run_aiohttp(url: str, n: int, c: int) -> int:
    from resources.openrouter.client import OpenRouterClient
    from resources.openrouter.secret import ApiKey

    async with OpenRouterClient(url, ApiKey("sk-bench"), max_connections=c) as client:

        async def send(p: dict[str, Any]) -> bool:
            return (await client.chat_completion(p)).status == 200

        return await _drive(n, c, send)


async def run_httpx(url: str, n: int, c: int, transport: str = "native") -> int:
    import httpx

    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    kw: dict[str, Any] = {"limits": limits, "timeout": httpx.Timeout(600.0)}
    if transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        # Its default pool holds 100 connections: give it the same 2000 as everyone else.
        kw = {"transport": AiohttpTransport(limits=limits), "timeout": httpx.Timeout(600.0)}
    async with httpx.AsyncClient(headers={"Authorization": "Bearer sk-bench"}, **kw) as client:

        async def send(p: dict[str, Any]) -> bool:
            r = await client.post(f"{url}/chat/completions", json=p)
            r.read()
            return r.status_code == 200

        return await _drive(n, c, send)


async def run_openai(url: str, n: int, c: int) -> int:
    import httpx2  # the openai client's HTTP library (openai 2 builds on httpx2, not httpx)
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http = DefaultAsyncHttpxClient(limits=httpx2.Limits(max_connections=c, max_keepalive_connections=c))
    client = AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0, http_client=http, timeout=600.0)

    async def send(p: dict[str, Any]) -> bool:
        await client.chat.completions.create(**p)
        return True

    try:
        return await _drive(n, c, send)
    finally:
        await client.close()


async def run_engine(url: str, n: int, c: int, stream: bool = False) -> int:
    """The full generation engine: reservations, classification, journal fsync, ledger settlement.

    ``stream``: the same through ``stream: true`` (SSE reassembled per request, stall detection on).
    """
    from eagle_assets.datasets.prompts import Prompt
    from eagle_assets.generation.ledger import BudgetLedger
    from eagle_assets.generation.runner import GenerationSettings, PartitionJob, PartitionRunner
    from resources.openrouter.client import OpenRouterClient
    from resources.openrouter.providers import ProviderPolicy, ProviderTable, parse_endpoints
    from resources.openrouter.secret import ApiKey

    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    prompts = [Prompt(f"p{i}", _payload(i)["messages"], None, i, i) for i in range(n)]
    job = PartitionJob("BENCH", "0000", prompts, 10**12, tmp / "j.journal")
    ledger = BudgetLedger(os.environ.get("EAGLE_FORGE_DATABASE_URL") or tmp / "ledger.sqlite")  # bench_ledger
    settings = GenerationSettings(
        model="moonshotai/kimi-k2.5",
        max_tokens=MAX_TOKENS,
        budget_usd=10**6,
        max_in_flight=c,
        progress_interval_s=3600,
        key_poll_interval_s=3600,
        stream=stream,
    )
    try:
        async with OpenRouterClient(url, ApiKey("sk-bench"), max_connections=c) as client:
            table = ProviderTable(parse_endpoints(await client.endpoints("moonshotai/kimi-k2.5")), ProviderPolicy())
            runner = PartitionRunner(job, client, ledger, table, settings, lambda p: 16, emit=lambda s: None)
            report = await runner.run()
    finally:
        ledger.close()
        shutil.rmtree(tmp, ignore_errors=True)  # a journal of every request: nothing to keep
    return report.ok


VARIANTS = {
    "engine": run_engine,
    "engine-stream": lambda u, n, c: run_engine(u, n, c, stream=True),
    "aiohttp": run_aiohttp,
    "httpx": run_httpx,
    "openai": run_openai,
    "httpx-aiohttp": lambda u, n, c: run_httpx(u, n, c, transport="aiohttp"),
}


# What each variant imports, loaded before the clock starts: Python's import time (~0.3 s for the engine)
# is not transport work, and it would weigh 1.5% against a 20 s ideal.
PREIMPORTS = {
    "engine": ("eagle_assets.generation.runner", "eagle_assets.datasets.prompts", "resources.openrouter.client"),
    "engine-stream": ("eagle_assets.generation.runner", "eagle_assets.datasets.prompts", "resources.openrouter.client"),
    "aiohttp": ("resources.openrouter.client",),
    "httpx": ("httpx",),
    "openai": ("openai", "httpx"),
    "httpx-aiohttp": ("httpx", "httpx_aiohttp"),
}


def worker(variant: str, url: str, n: int, c: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    for module in PREIMPORTS.get(variant, ()):
        importlib.import_module(module)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    ok = asyncio.run(VARIANTS[variant](url, n, c))
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(
        json.dumps(
            {"variant": variant, "n": n, "ok": ok, "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": r1.ru_maxrss / 1024}
        )
    )


def start_simulator(latency: float, stream_chunks: int = 12) -> tuple[subprocess.Popen, str]:
    # Imported here: a worker measures its own RSS and must not carry the simulator's modules.
    from resources.simulator.config import LatencyConfig, SimulatorConfig, config_to_args

    config = SimulatorConfig(
        port=0, credits=1_000_000, latency=LatencyConfig.fixed(latency), stream_chunks=stream_chunks
    )
    cmd = [sys.executable, "-m", "resources.simulator", *config_to_args(config)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("SIMULATOR_URL="):
            return proc, line.strip().split("=", 1)[1]
    raise RuntimeError("simulator did not start")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--url")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--baseline-n", type=int, default=2_000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=8.0)
    ap.add_argument("--variants", default="engine,engine-stream,aiohttp,httpx-aiohttp,httpx,openai")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=64, help="per request (longer answers, denser streams)")
    ap.add_argument("--stream-chunks", type=int, default=12, help="simulator: stream deltas per reasoning/content")
    return ap.parse_args()


def main() -> None:
    a = _args()
    _set_max_tokens(a.max_tokens)
    if a.worker:
        worker(a.worker, a.url, a.n, a.concurrency)
        return
    if a.quick:
        a.n, a.baseline_n, a.concurrency, a.latency = 2000, 500, 500, 1.0
    import psutil

    sim, url = start_simulator(a.latency, a.stream_chunks)
    sim_proc = psutil.Process(sim.pid)
    results = {}
    try:
        for v in a.variants.split(","):
            n = a.n if v in ("engine", "engine-stream", "aiohttp") else a.baseline_n
            sim_cpu0 = sum(sim_proc.cpu_times()[:2])
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    v,
                    "--url",
                    url,
                    "--n",
                    str(n),
                    "--concurrency",
                    str(a.concurrency),
                    "--max-tokens",
                    str(a.max_tokens),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            if out.returncode != 0:
                print(f"{v}: failed\n{out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["server_cpu_ms_per_req"] = 1000 * (sum(sim_proc.cpu_times()[:2]) - sim_cpu0) / r["n"]
            ideal = math.ceil(r["n"] / a.concurrency) * a.latency
            r["cpu_ms_per_req"] = 1000 * r["cpu_s"] / r["n"]
            r["throughput_frac"] = ideal / r["wall_s"]
            r["req_per_s"] = r["n"] / r["wall_s"]
            results[v] = r
            print(
                f"{v:>14}: {r['n']:>6} req ({r['ok']} ok) | {r['cpu_ms_per_req']:6.2f} ms CPU/req | "
                f"{r['req_per_s']:7.1f} req/s = {100 * r['throughput_frac']:5.1f}% of ideal "
                f"({a.concurrency}/{a.latency:g}s) | peak RSS {r['peak_rss_mb']:.0f} MB | "
                f"simulator {r['server_cpu_ms_per_req']:.2f} ms CPU/req",
                flush=True,
            )
    finally:
        sim.terminate()
    base = results.get("engine")
    if base:
        print("\nratios against the engine (CPU per request, higher = costlier than the engine):")
        for v, r in results.items():
            if v != "engine":
                print(
                    f"  {v:>14}: {r['cpu_ms_per_req'] / base['cpu_ms_per_req']:6.1f}x CPU/req, "
                    f"{r['throughput_frac'] / base['throughput_frac']:5.2f}x throughput fraction"
                )
        streamed = results.get("engine-stream")
        if streamed:
            ratio = streamed["cpu_ms_per_req"] / base["cpu_ms_per_req"]
            print(
                f"\nstreaming vs plain: {streamed['cpu_ms_per_req']:.2f} vs {base['cpu_ms_per_req']:.2f} ms CPU/req"
                f" ({ratio:.2f}x), {100 * streamed['throughput_frac']:.1f}% vs {100 * base['throughput_frac']:.1f}%"
                " of ideal"
            )
        verdict = base["cpu_ms_per_req"] < 1.5 and base["throughput_frac"] >= 0.95
        print(
            f"\ntarget (< 1.5 ms CPU/req, >= 95% of ideal): {'MET' if verdict else 'NOT MET'} "
            f"({base['cpu_ms_per_req']:.2f} ms, {100 * base['throughput_frac']:.1f}%)"
        )


if __name__ == "__main__":
    main()
