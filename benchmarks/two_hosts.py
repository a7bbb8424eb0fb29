"""Two hosts on one machine: one account, one PostgreSQL, B1–B8 split between them, one host SIGKILLed.

Each "host" is a process tree of its own (its own session, so one ``killpg`` takes all of it), with its own
scratch folder, its own ``DAGSTER_HOME`` whose ``dagster.yaml`` is ``deploy/dagster.yaml`` (dagster-postgres,
all hosts on one database), its own ``EAGLE_FORGE_HOST_ID`` (a pid space of its own: no pid means anything
across hosts, only leases do) and ``flock`` off on the journals, as on an NFS mount that does not honour it.
They share one ``EAGLE_FORGE_HOME`` and one ledger (``EAGLE_FORGE_DATABASE_URL``), and spend from one
simulated account whose in-flight requests are sampled every 50 ms.

1. Host A runs the first half of the datasets, host B the second half, under a dollar budget that binds.
   Once B has journaled ``--kill-at`` of its prompts it is SIGKILLed; host C (B's replacement) starts B's
   partitions at once: their journal leases are still B's, so C waits for them to expire and takes over.
2. The budget is raised (a top-up) and host A reruns every partition to the end.

Printed, with the goals: in flight ≤ the cap account-wide at every sample; 0 overspend (ledger and simulator
against the budget of phase 1); 0 lost (every prompt journaled once); 0 bought twice beyond the requests
that were in flight on the killed host; the killed host's leases recovered within the lease time.

    python benchmarks/two_hosts.py                       # B1–B8, 3,000 prompts each, 2000 in flight
    python benchmarks/two_hosts.py --prompts 300 --concurrency 200 --latency 0.3
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.generation.journal import scan  # noqa: E402
from eagle_assets.generation.ledger import BudgetLedger  # noqa: E402
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir  # noqa: E402
from resources.postgres.local_server import LocalPostgres, start_local_postgres  # noqa: E402
from resources.simulator.config import LatencyConfig, SimulatorConfig  # noqa: E402
from tests.simulator.harness import SimulatorProcess, spawn_simulator_process  # noqa: E402

SAMPLE_S = 0.05
MATERIALIZE = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_assets.definitions"]


@dataclass
class TwoHostConfig:
    datasets: int = 8
    prompts: int = 3000  # per dataset, one shard each
    concurrency: int = 2000
    latency_median_s: float = 1.0
    max_tokens: int = 256
    mean_tokens: int = 80
    budget_share: float = 0.6  # phase 1's budget, as a share of what every prompt would cost on average
    lease_s: float = 10.0
    kill_at: float = 0.3  # of host B's prompts journaled
    launcher: str = "cli"  # cli: one `dagster asset materialize` per partition; fork: dg.materialize in forks
    seed: int = 0
    time_limit_s: float = 1500.0


@dataclass
class Samples:
    points: list[tuple[float, int]] = field(default_factory=list)  # (t, in flight at the simulator)

    @property
    def peak(self) -> int:
        return max((n for _, n in self.points), default=0)


def write_prompts(path: Path, n: int, tag: str) -> None:
    with path.open("wb") as f:
        for i in range(n):
            row = {"id": f"{tag}-{i:06d}", "messages": [{"role": "user", "content": f"Host test {tag} {i}: explain."}]}
            f.write(orjson.dumps(row) + b"\n")


def prompt_hashes(work: Path, datasets: list[str]) -> dict[str, str]:
    """prompt id → the simulator's identity of its request (``request_content_hash``)."""
    from resources.simulator.responses import request_content_hash

    out = {}
    for d in datasets:
        for line in (work / f"{d}.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            out[row["id"]] = request_content_hash(row["messages"], None)
    return out


def journal_path(home: Path, dataset: str) -> Path:
    return home / "journal" / dataset / "0000.journal"


def journaled(home: Path, datasets: list[str]) -> int:
    total = 0
    for d in datasets:
        with contextlib.suppress(FileNotFoundError):
            total += journal_path(home, d).read_bytes().count(b"\n")
    return total


# --- a host: its process tree ----------------------------------------------------------------------
def _start_line(gate: Path | None) -> None:
    """Say this host is ready, then wait for the driver's go: hosts that start together compete from the first
    request, where one that started late would find the other had spent the budget already."""
    if gate is None:
        return
    (gate / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 600
    while not (gate / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the driver never said go")
        time.sleep(0.02)


def host_main(launcher: str, datasets: list[str], gate: Path | None = None) -> int:
    """The root of one host's process tree: each partition in a child, as a pod per run would."""
    if launcher == "cli":
        cmds = [[*MATERIALIZE, "--select", f"generated/{d}", "--partition", "0000"] for d in datasets]
        _start_line(gate)
        procs = [subprocess.Popen(cmd) for cmd in cmds]
        return max(p.wait() for p in procs)
    import dagster as dg  # loaded once, before the forks: each child starts at once

    from eagle_assets import definitions

    _start_line(gate)

    pids = []
    for d in datasets:
        pid = os.fork()
        if pid == 0:  # the child: its own instance (its own connections), one partition
            code = 1
            try:
                with dg.DagsterInstance.get() as instance:
                    asset = next(a for a in definitions.GENERATED if a.key == dg.AssetKey(["generated", d]))
                    result = dg.materialize(
                        [asset],
                        partition_key="0000",
                        instance=instance,
                        resources=definitions.default_resources(),
                        raise_on_error=False,
                    )
                    code = 0 if result.success else 2
            finally:
                os._exit(code)
        pids.append(pid)
    return max(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids)


# --- the driver --------------------------------------------------------------------------------------
class Cluster:
    def __init__(self, cfg: TwoHostConfig, work: Path, pg: LocalPostgres, sim: SimulatorProcess) -> None:
        self.cfg, self.work, self.pg, self.sim = cfg, work, pg, sim
        self.home = work / "home"
        tag = uuid.uuid4().hex[:8]  # names of their own: the server may be a test session's, shared
        self.dagster_db_name = f"dagster_two_hosts_{tag}"
        self.dagster_db = pg.create_database(self.dagster_db_name)
        self.ledger_url = pg.create_database(f"ledger_two_hosts_{tag}")
        self.budget = 0.0

    def env(self, host: str) -> dict[str, str]:
        base = self.work / "hosts" / host
        (base / "scratch").mkdir(parents=True, exist_ok=True)
        dagster_home = base / "dagster_home"
        dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
        port = self.sim.base_url.split(":")[2].split("/")[0]
        return {
            **os.environ,
            "EAGLE_FORGE_HOME": str(self.home),
            "EAGLE_FORGE_DATASETS": str(self.work / "datasets.yaml"),
            "EAGLE_FORGE_SIM_PORT": port,
            "EAGLE_FORGE_MAX_TOKENS": str(self.cfg.max_tokens),
            "EAGLE_FORGE_MAX_IN_FLIGHT": str(self.cfg.concurrency),
            "EAGLE_FORGE_REQUEST_TIMEOUT_S": "60",
            "EAGLE_FORGE_BUDGET_USD": f"{self.budget:.6f}",
            "EAGLE_FORGE_DATABASE_URL": self.ledger_url,
            "EAGLE_FORGE_HOST_ID": host,
            "EAGLE_FORGE_LEASE_S": str(self.cfg.lease_s),
            "EAGLE_FORGE_JOURNAL_FLOCK": "0",
            "TMPDIR": str(base / "scratch"),
            "DAGSTER_HOME": str(dagster_home),
            "DAGSTER_POSTGRES_HOST": "",
            "PGHOST": self.pg.socket_dir,
            "DAGSTER_POSTGRES_USER": "postgres",
            "DAGSTER_POSTGRES_PASSWORD": "",
            "DAGSTER_POSTGRES_DB": self.dagster_db_name,
            "PYTHONPATH": str(REPO),
        }

    def start_host(self, host: str, datasets: list[str], gate: Path | None = None) -> subprocess.Popen:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--host", self.cfg.launcher, ",".join(datasets)]
        if gate is not None:
            cmd += ["--gate", str(gate)]
        log = open(self.work / f"host-{host}.log", "ab")  # noqa: SIM115 (the child's)
        return subprocess.Popen(cmd, env=self.env(host), cwd=REPO, start_new_session=True, stdout=log, stderr=log)

    def owners_of(self, host: str) -> int:
        import psycopg

        with psycopg.connect(self.ledger_url) as conn:
            owners = conn.execute("SELECT COUNT(*) FROM owners WHERE host = %s", (host,)).fetchone()
            slots = conn.execute(
                "SELECT COUNT(*) FROM slots WHERE owner IN (SELECT owner FROM owners WHERE host = %s)", (host,)
            ).fetchone()
        assert owners is not None and slots is not None  # COUNT(*) always answers one row
        return int(owners[0]) + int(slots[0])

    def orphan_prompts(self, datasets: list[str]) -> list[str]:
        """Reservations charged as orphans: what a dead owner had reserved and not settled (sent, or answered
        but not yet journaled), later corrected from the journal or /generation or not."""
        import psycopg

        with psycopg.connect(self.ledger_url) as conn:
            rows = conn.execute(
                "SELECT prompt_id FROM spend WHERE (kind LIKE 'orphan%%' OR kind = 'settled_late')"
                " AND partition = ANY(%s)",
                ([f"{d}/0000" for d in datasets],),
            ).fetchall()
        return sorted(r[0] for r in rows)

    def ledger_totals(self) -> tuple[float, int]:
        import psycopg

        with psycopg.connect(self.ledger_url) as conn:
            row = conn.execute("SELECT usd_spent, in_flight FROM totals WHERE scope = 'global'").fetchone()
        return (row[0] / 1e9, int(row[1])) if row else (0.0, 0)


def _monitor(sim: SimulatorProcess, samples: Samples, stop: threading.Event) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(OSError):
            samples.points.append((time.monotonic() - t0, int(sim.stats(0)["in_flight"])))
        stop.wait(SAMPLE_S)


def _abandoned(sim: SimulatorProcess) -> int:
    outcomes = sim.stats(0)["by_outcome"]
    return int(outcomes.get("abandoned", 0)) + int(outcomes.get("stream_abandoned", 0))


def run_two_hosts(cfg: TwoHostConfig, work: Path, log=print, pg: LocalPostgres | None = None) -> dict[str, Any]:
    """``pg``: a running server to make the run's two databases on (a test session's); else one of its own."""
    if pg is not None:
        return _run_two_hosts(cfg, work, pg, log)
    # The server runs as another user when we are root (see local_server): its folder sits in /tmp directly,
    # where no one resets the modes of the folders above it (pytest makes its own base folder 0700).
    pg_dir = Path(tempfile.mkdtemp(prefix="two-hosts-pg-"))
    pg = start_local_postgres(pg_dir / "data")
    try:
        return _run_two_hosts(cfg, work, pg, log)
    finally:
        pg.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)


_INIT_INSTANCE = """
import dagster
from eagle_assets.instance import configure_pools
from eagle_assets.keys import GENERATION_POOL, GPU_POOL
instance = dagster.DagsterInstance.get()
configure_pools(instance)  # the pools with a limit of the project's (GPU_POOL)
storage = instance.event_log_storage
for pool in {GENERATION_POOL, GPU_POOL} - set(storage.get_concurrency_keys()):
    storage.initialize_concurrency_limit_to_default(pool)
instance.dispose()
"""


def _write_inputs(cfg: TwoHostConfig, work: Path, names: list[str]) -> None:
    lines = ["datasets:"]
    for d in names:
        write_prompts(work / f"{d}.jsonl", cfg.prompts, d)
        lines.append(f"  {d}: {{path: {work / f'{d}.jsonl'}, shard_size: {cfg.prompts}}}")
    (work / "datasets.yaml").write_text("\n".join(lines) + "\n")


def _start_simulator(cfg: TwoHostConfig) -> SimulatorProcess:
    return spawn_simulator_process(
        SimulatorConfig(
            latency=LatencyConfig.lognormal(cfg.latency_median_s, 0.3, max_s=4 * cfg.latency_median_s),
            mean_completion_tokens=cfg.mean_tokens,
            credits=1e6,
            seed=cfg.seed,
            tokenizer_dir=resolve_tokenizer_dir(),
            backlog=8192,
        )
    )


def _phase_one_budget(cfg: TwoHostConfig, n_datasets: int) -> float:
    """A share of what every prompt would cost on average (the cheapest allowed endpoint's prices, the mean
    length), so the budget binds before the prompts run out."""
    per_answer = cfg.mean_tokens * 2.0e-6 + 20 * 0.45e-6
    return cfg.budget_share * per_answer * cfg.prompts * n_datasets


def _start_together(cl: Cluster, sets: dict[str, list[str]]) -> list[subprocess.Popen]:
    """Hosts started at once, each held at its start line until all are ready (``_start_line``)."""
    gate = cl.work / "gate"
    gate.mkdir()
    hosts = [cl.start_host(host, datasets, gate) for host, datasets in sets.items()]
    while len(list(gate.glob("ready-*"))) < len(hosts):
        for h in hosts:
            if h.poll() is not None:
                raise RuntimeError(f"a host ended (rc {h.returncode}) before it was ready; see its log")
        time.sleep(0.05)
    (gate / "go").touch()
    return hosts


def _wait_for_kill_point(cl: Cluster, host_b: subprocess.Popen, b_sets: list[str], start: float) -> None:
    cfg = cl.cfg
    target = int(cfg.kill_at * cfg.prompts * len(b_sets))
    while journaled(cl.home, b_sets) < target:
        if host_b.poll() is not None:
            log_lines = (cl.work / "host-host-b.log").read_text(errors="replace").splitlines()
            why = [ln for ln in log_lines if "budget exhausted" in ln or "stopped:" in ln][:2]
            raise RuntimeError(f"host-b ended (rc {host_b.returncode}) before the kill point: {why}")
        if time.monotonic() - start > cfg.time_limit_s:
            raise TimeoutError("two-hosts run exceeded its time limit")
        time.sleep(0.2)


def _kill(cl: Cluster, host: subprocess.Popen, datasets: list[str]) -> dict[str, Any]:
    """SIGKILL a host's whole tree; what was in flight then, and what its journals held."""
    kill = {"in_flight": cl.sim.stats(0)["in_flight"], "abandoned_before": _abandoned(cl.sim)}
    os.killpg(host.pid, signal.SIGKILL)
    kill["at"] = time.monotonic()
    host.wait()
    kill["records"] = {d: len(scan(journal_path(cl.home, d)).records) for d in datasets}
    return kill


def _recover_leases(cl: Cluster, dead_host: str, killed_at: float) -> float | None:
    """Seconds until the dead host holds no owner and no slot. A live process gets a dead owner's slots and
    dollars back when it next asks (every lease/10 while it admits); the driver asks as such a process would,
    from a pid space of its own."""
    own_host = os.environ.get("EAGLE_FORGE_HOST_ID")
    os.environ["EAGLE_FORGE_HOST_ID"] = "observer"
    observer = BudgetLedger(cl.ledger_url, lease_s=cl.cfg.lease_s)
    try:
        while time.monotonic() - killed_at < 10 * cl.cfg.lease_s + 60:
            observer.recover_dead_owners()
            if cl.owners_of(dead_host) == 0:
                return time.monotonic() - killed_at
            time.sleep(0.05)
        return None
    finally:
        observer.close()
        if own_host is None:  # the driver may be a test's process: leave its host as it was
            os.environ.pop("EAGLE_FORGE_HOST_ID", None)
        else:
            os.environ["EAGLE_FORGE_HOST_ID"] = own_host


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _run_two_hosts(cfg: TwoHostConfig, work: Path, pg: LocalPostgres, log: Callable[[str], None]) -> dict[str, Any]:
    start = time.monotonic()
    say = log
    log = lambda msg: say(f"[{time.monotonic() - start:6.1f} s] {msg}")  # noqa: E731
    names = [f"B{i + 1}" for i in range(cfg.datasets)]
    a_sets, b_sets = names[: len(names) // 2], names[len(names) // 2 :]
    _write_inputs(cfg, work, names)
    sim = _start_simulator(cfg)
    samples, stop = Samples(), threading.Event()
    watcher = threading.Thread(target=_monitor, args=(sim, samples, stop), daemon=True)
    procs: list[subprocess.Popen] = []
    run: dict[str, Any] = {}
    try:
        cl = Cluster(cfg, work, pg, sim)
        cl.budget = _phase_one_budget(cfg, len(names))
        # Create the instance's tables and the pools' rows once: several processes migrating one fresh database,
        # or claiming a pool for the first time (Dagster inserts its default limit row), at once fail inside
        # Dagster with a unique violation (seen in CI: concurrency_limits_concurrency_key_key).
        subprocess.run([sys.executable, "-c", _INIT_INSTANCE], env=cl.env("init"), cwd=REPO, check=True)
        watcher.start()
        log(f"phase 1: budget ${cl.budget:.4f}; host-a {a_sets}, host-b {b_sets}; lease {cfg.lease_s:g} s")
        procs += _start_together(cl, {"host-a": a_sets, "host-b": b_sets})
        host_a, host_b = procs
        _wait_for_kill_point(cl, host_b, b_sets, start)
        kill = _kill(cl, host_b, b_sets)
        log(f"host-b SIGKILLed with {sum(kill['records'].values())} of its prompts journaled")
        procs.append(host_c := cl.start_host("host-c", b_sets))  # B's replacement pod
        run["leases_recovered_s"] = recovered = _recover_leases(cl, "host-b", kill["at"])
        log(f"host-b's leases recovered {recovered if recovered is not None else float('nan'):.1f} s after")
        rc_a, rc_c = host_a.wait(timeout=cfg.time_limit_s), host_c.wait(timeout=cfg.time_limit_s)
        time.sleep(1.0)
        run["abandoned_at_kill"] = _abandoned(sim) - kill["abandoned_before"]
        run["spent_phase_1_usd"], run["in_flight_open_after_phase_1"] = cl.ledger_totals()
        run["billed_phase_1_usd"] = float(sim.stats(0)["billed_usd"])
        run["journaled_phase_1"] = journaled(cl.home, names)
        spent_1 = run["spent_phase_1_usd"]
        log(f"phase 1 ended: host-a rc {rc_a}, host-c rc {rc_c}; ${spent_1:.4f} spent of ${cl.budget:.4f}")
        # Phase 2: a top-up, and one host finishes everything.
        run["budget_phase_1_usd"], cl.budget = cl.budget, cl.budget * 10
        procs.append(host_a2 := cl.start_host("host-a", names))
        rc_a2 = host_a2.wait(timeout=max(60.0, cfg.time_limit_s - (time.monotonic() - start)))
        run["returncodes"] = {"host-a": rc_a, "host-c": rc_c, "host-a (top-up)": rc_a2}
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
        _stop(procs)
        final = sim.stats(0)
        sim.terminate()
    run.update(in_flight_at_kill=int(kill["in_flight"]), b_records_at_kill=kill["records"])
    return _result(cl, names, b_sets, run, samples, final) | {"wall_s": time.monotonic() - start}


def _result(
    cl: Cluster, names: list[str], b_sets: list[str], run: dict[str, Any], samples: Samples, final: dict[str, Any]
) -> dict[str, Any]:
    """The figures ``report`` holds to their goals: the phases' own (``run``), then the books and journals."""
    cfg = cl.cfg
    spent, open_end = cl.ledger_totals()
    orphans = cl.orphan_prompts(b_sets)
    per_dataset = {}
    lost = duplicated = 0
    for d in names:
        ids = [r["prompt_id"] for r in scan(journal_path(cl.home, d)).records]
        per_dataset[d] = len(set(ids))
        lost += cfg.prompts - len(set(ids))
        duplicated += len(ids) - len(set(ids))
    twice_hashes = {h for h, n in final["billed_by_hash"].items() if n > 1}
    twice_ids = [pid for pid, h in prompt_hashes(cl.work, names).items() if h in twice_hashes]
    return {
        "config": asdict(cfg),
        **run,
        "peak_in_flight": samples.peak,
        "samples": len(samples.points),
        "samples_over_cap": sum(1 for _, n in samples.points if n > cfg.concurrency),
        "simulator_peak_in_flight": int(final["peak_in_flight"]),
        "orphaned_at_kill": len(orphans),
        "bought_twice_not_orphaned": sorted(set(twice_ids) - set(orphans)),
        "billed_more_than_once": len(twice_hashes),
        "records_lost": lost,
        "records_duplicated": duplicated,
        "records": per_dataset,
        "spent_usd": spent,
        "open_at_end": open_end,
        "billed_usd": float(final["billed_usd"]),
        "budget_stops": {
            h: "budget exhausted — " in (cl.work / f"host-{h}.log").read_text(errors="replace")
            for h in ("host-a", "host-c")
        },
    }


def report(r: dict[str, Any]) -> bool:
    """Print the figures against their goals; whether every goal was met (the script's exit status)."""
    cfg = r["config"]
    met: list[bool] = []

    def mark(ok: bool) -> str:
        met.append(ok)
        return "MET" if ok else "NOT MET"

    over = r["spent_phase_1_usd"] - r["budget_phase_1_usd"]
    no_over = over <= 1e-9 and r["billed_phase_1_usd"] <= r["budget_phase_1_usd"]
    rec = r["leases_recovered_s"]
    bound = cfg["lease_s"] * 1.1  # expiry at most one lease after the last heartbeat; asked every lease/10
    print(
        f"\ntwo hosts: {cfg['datasets']} datasets × {cfg['prompts']:,} prompts, {cfg['concurrency']} in flight"
        f" account-wide, lease {cfg['lease_s']:g} s, {r['wall_s']:.0f} s wall; exit codes {r['returncodes']}"
        f"; phase 1 ended on 'budget exhausted … resumable': {r['budget_stops']}"
    )
    print(
        f"  in flight at the simulator: peak {r['peak_in_flight']} over {r['samples']} samples,"
        f" {r['samples_over_cap']} above {cfg['concurrency']} [{mark(r['samples_over_cap'] == 0)}: ≤ the cap]"
    )
    print(
        f"  phase 1 spend: ${r['spent_phase_1_usd']:.4f} in the ledger (orphans at worst case),"
        f" ${r['billed_phase_1_usd']:.4f} billed, of a ${r['budget_phase_1_usd']:.4f} budget"
        f" [{mark(no_over)}: 0 overspend]"
    )
    lost_ok = not r["records_lost"] and not r["records_duplicated"]
    print(
        f"  lost {r['records_lost']}, duplicated in journals {r['records_duplicated']}"
        f" [{mark(lost_ok)}: 0]; every dataset {sorted(set(r['records'].values()))} records"
    )
    print(
        f"  bought twice: {r['billed_more_than_once']} prompts; host-b had {r['orphaned_at_kill']} reserved and"
        f" unsettled at the kill ({r['abandoned_at_kill']} cut mid-request, billed by the simulator)"
        f" [{mark(r['billed_more_than_once'] <= r['orphaned_at_kill'])}: none beyond those]"
    )
    if rec is None:
        met.append(False)
        print("  host-b's leases were NOT recovered [NOT MET]")
    else:
        print(
            f"  host-b's owners and slots recovered {rec:.1f} s after the kill [{mark(rec <= bound)}:"
            f" ≤ {bound:.1f} s, the lease and one check]"
        )
    return all(met)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", nargs=2, metavar=("LAUNCHER", "DATASETS"), help=argparse.SUPPRESS)
    ap.add_argument("--gate", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--mean-tokens", type=int, default=80, help="the simulator's mean answer length")
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=1.0, help="median simulator latency, seconds")
    ap.add_argument("--lease", type=float, default=10.0, help="EAGLE_FORGE_LEASE_S")
    ap.add_argument("--kill-at", type=float, default=0.3)
    ap.add_argument("--launcher", default="cli", choices=("cli", "fork"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    if a.host:
        sys.exit(host_main(a.host[0], a.host[1].split(","), a.gate))
    cfg = TwoHostConfig(
        datasets=a.datasets,
        prompts=a.prompts,
        concurrency=a.concurrency,
        latency_median_s=a.latency,
        lease_s=a.lease,
        kill_at=a.kill_at,
        launcher=a.launcher,
        max_tokens=a.max_tokens,
        mean_tokens=a.mean_tokens,
    )
    work = Path(tempfile.mkdtemp(prefix="two-hosts-"))
    try:
        r = run_two_hosts(cfg, work)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(r, indent=2))
    all_met = report(r)
    if a.keep:
        print(f"  work folder: {work}")
    if not all_met:
        sys.exit("FAILED: a goal was not met")


if __name__ == "__main__":
    main()
