"""Ledger benchmark: PostgreSQL against SQLite at 2000 requests in flight.

1. Ledger operations: 2000 reservations kept open, then chunks of 64 reserved and the 64 oldest settled,
   as the engine does (a chunk per transaction, settlements grouped per journal commit), for ``--seconds``;
   by one process, and by eight (B1–B8, 250 open each). Printed: reservations and settlements per second,
   client CPU per request (reserve + settle), and the PostgreSQL server's CPU per request.
2. Engine CPU per request: ``bench_transport``'s engine (10,000 requests at 2000 in flight against the
   simulator, journal and ledger included) with its ledger in SQLite, then in PostgreSQL.

Both servers run on this machine; PostgreSQL is a pgserver instance on a Unix socket. The goal that
matters end to end (bench_admission's mean in flight, within 5%) is measured by
``python benchmarks/bench_admission.py --ledger both``.

    python benchmarks/bench_ledger.py
    python benchmarks/bench_ledger.py --seconds 5 --engine-n 4000
"""

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.generation.ledger import BudgetLedger, ReservationRequest, Settlement  # noqa: E402
from resources.postgres.local_server import LocalPostgres, start_local_postgres  # noqa: E402

CHUNK = 64
MAX_TOKENS, PRICE, PROMPT_USD = 1638, 2.8e-6, 5e-5


def _request(dataset: str, i: int) -> ReservationRequest:
    return ReservationRequest(
        dataset, f"{dataset}/0000", f"p{i}", PROMPT_USD + MAX_TOKENS * PRICE, MAX_TOKENS, PROMPT_USD, PRICE
    )


def ledger_loop(location: str, dataset: str, open_target: int, seconds: float, out: Any) -> None:
    """Keep ``open_target`` reservations open; reserve a chunk, settle the oldest chunk, until time is up."""
    led = BudgetLedger(location)

    def chunk(start: int) -> list[ReservationRequest]:
        return [_request(dataset, start + i) for i in range(CHUNK)]

    k = 0
    pending: deque = deque()
    while len(pending) < open_target:
        granted, _ = led.reserve_many(chunk(k), budget_usd=1e9, token_budget=None)
        pending.extend(granted)
        k += CHUNK
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    reserved = settled = 0
    while time.perf_counter() - t0 < seconds:
        granted, _ = led.reserve_many(chunk(k), budget_usd=1e9, token_budget=None)
        k += CHUNK
        pending.extend(granted)
        reserved += len(granted)
        batch = [pending.popleft() for _ in range(CHUNK)]
        led.settle_many([Settlement(r, PROMPT_USD / 2 + 300 * 2e-6, 300) for r in batch])
        settled += len(batch)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    led.close()
    out.put({"reserved": reserved, "settled": settled, "wall_s": wall, "cpu_s": cpu})


def postgres_cpu(pg: LocalPostgres | None) -> float:
    """User + system CPU of the server and its backends so far (0 without a server)."""
    if pg is None:
        return 0.0
    pid = pg._server.get_pid()
    total = 0.0
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def run_ops(location: str, processes: int, seconds: float, pg: LocalPostgres | None) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    server0 = postgres_cpu(pg)
    procs = [
        ctx.Process(target=ledger_loop, args=(location, f"B{i + 1}", 2000 // processes, seconds, q))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    results = [q.get(timeout=seconds * 20 + 120) for _ in procs]
    for p in procs:
        p.join()
    server = postgres_cpu(pg) - server0
    wall = max(r["wall_s"] for r in results)
    n = sum(r["reserved"] for r in results)
    return {
        "processes": processes,
        "reservations_per_s": n / wall,
        "settlements_per_s": sum(r["settled"] for r in results) / wall,
        "client_cpu_us_per_request": 1e6 * sum(r["cpu_s"] for r in results) / n,
        "server_cpu_us_per_request": 1e6 * server / n if pg else 0.0,
    }


def run_engine(location: str | None, n: int, concurrency: int, latency: float, pg: LocalPostgres | None) -> dict:
    from benchmarks.bench_transport import start_simulator

    sim, url = start_simulator(latency)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("EAGLE_FORGE_DATABASE_URL", None)
        if location:
            env["EAGLE_FORGE_DATABASE_URL"] = location
        server0 = postgres_cpu(pg)
        out = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "bench_transport.py"),
                "--worker",
                "engine",
                "--url",
                url,
                "--n",
                str(n),
                "--concurrency",
                str(concurrency),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"engine worker failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["server_cpu_ms_per_req"] = 1000 * (postgres_cpu(pg) - server0) / r["n"] if pg else 0.0
    finally:
        sim.terminate()
        sim.wait()
    r["cpu_ms_per_req"] = 1000 * r["cpu_s"] / r["n"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="per ledger-operations run")
    ap.add_argument("--engine-n", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=2.0)
    ap.add_argument("--skip-engine", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    pg = start_local_postgres(work / "pg")
    out: dict[str, Any] = {}
    try:
        print(f"ledger operations at 2000 open, {CHUNK} per transaction, {a.seconds:g} s each:")
        for processes in (1, 8):
            for backend in ("sqlite", "postgresql"):
                loc = str(work / f"ops-{processes}.sqlite") if backend == "sqlite" else pg.create_database()
                r = run_ops(loc, processes, a.seconds, pg if backend == "postgresql" else None)
                out[f"ops/{backend}/{processes}"] = r
                print(
                    f"  {backend:>10}, {processes} process{'es' if processes > 1 else '  '}:"
                    f" {r['reservations_per_s']:8,.0f} reservations/s, {r['settlements_per_s']:8,.0f} settlements/s,"
                    f" client {r['client_cpu_us_per_request']:5.0f} µs CPU/request"
                    + (f", server {r['server_cpu_us_per_request']:4.0f} µs" if backend == "postgresql" else "")
                )
            s, p = out[f"ops/sqlite/{processes}"], out[f"ops/postgresql/{processes}"]
            print(f"    PostgreSQL/SQLite: {p['reservations_per_s'] / s['reservations_per_s']:.2f}x the rate")
        if not a.skip_engine:
            print(f"\nengine: {a.engine_n:,} requests at {a.concurrency} in flight, {a.latency:g} s latency:")
            for backend in ("sqlite", "postgresql"):
                url = None if backend == "sqlite" else pg.create_database()
                r = run_engine(url, a.engine_n, a.concurrency, a.latency, pg if url else None)
                out[f"engine/{backend}"] = r
                print(
                    f"  {backend:>10}: {r['cpu_ms_per_req']:.3f} ms client CPU/request"
                    + (f" + {r['server_cpu_ms_per_req']:.3f} ms server" if url else "")
                    + f", {r['n'] / r['wall_s']:,.0f} req/s"
                )
            s, p = out["engine/sqlite"], out["engine/postgresql"]
            print(
                f"    PostgreSQL/SQLite: {p['cpu_ms_per_req'] / s['cpu_ms_per_req']:.2f}x client CPU per request,"
                f" {(p['cpu_ms_per_req'] + p['server_cpu_ms_per_req']) / s['cpu_ms_per_req']:.2f}x with the server's"
            )
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\nresults:", json.dumps(out))


if __name__ == "__main__":
    main()
