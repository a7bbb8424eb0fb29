"""Fixtures shared across test folders: a real PostgreSQL (from the pgserver wheel) and ledger locations.

The server starts once per session (about 3 s here, as root or not: see ``resources.postgres.local_server``);
each test gets a database of its own, dropped afterwards.

The session's ``EAGLE_FORGE_HOME`` is a temporary folder of its own (tests that need another set theirs): code
that takes a lease or writes state without being given a home would otherwise write into the checkout's (or the
user's) ``.eagle_forge``, and a test must leave nothing behind.

``scripts/test.sh`` runs the suite on pytest-xdist workers (``-n 3 --dist loadgroup``): each worker is a process
of its own, so each has its own session home, PostgreSQL server (its own data folder and socket) and session
fixtures; simulators and servers take free ports. See ``pytest_collection_modifyitems`` for how work is dealt.

``TEST_CPU_LOG=<file>`` appends, per test, the CPU seconds it cost (this process's user + system, and that of
the children it waited for: subprocesses, spawned workers, servers it stopped), because wall times under a
loaded 2-core machine say little about what a test costs. Not an ``EAGLE_FORGE_`` name: those are settings.
"""

import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from resources.postgres.local_server import LocalPostgres, start_local_postgres

# CI (``.ci/run`` sets TEST_HYPOTHESIS=ci) draws the same examples on every run, so a red CI means the change broke
# something, not that this run's draw hit an old gap; a plain run draws new ones each time, which is where such gaps
# are found (a message's text parts joining into ``<|im_end|>``, a ``--`` flag value). Loaded before any test module
# builds its ``settings``. Not an ``EAGLE_FORGE_`` name: those are settings.
hypothesis_settings.register_profile("ci", derandomize=True)
if os.environ.get("TEST_HYPOTHESIS") == "ci":
    hypothesis_settings.load_profile("ci")

# Torch on one thread in every test process and every process a test starts (they inherit the environment; set
# before anything imports torch). The suite runs 3 xdist workers on 2 cores: a second intra-op thread only spins at
# each barrier, waiting for a core another worker holds. Measured here: the draft benchmark step 18 -> 3 CPU-s, a
# Pipes training subprocess 24 -> 13 CPU-s, with no test slower.
os.environ["OMP_NUM_THREADS"] = "1"

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="eagle-forge-tests-home-"))
os.environ["EAGLE_FORGE_HOME"] = str(_SESSION_HOME)


def _join_work_unit(item: pytest.Item, unit: str) -> None:
    """Put ``item`` in xdist's work unit ``unit``: ``--dist loadgroup`` hands out each ``<nodeid>@<unit>`` together.

    xdist (3.8) would do this for an ``xdist_group`` mark by setting ``item._nodeid``, which pytest 9.2 no longer
    reads (the id is ``item._id``, a NodeId), so the mark alone is ignored there: set the id here, either way.
    Only the dealing depends on it; on a pytest where neither works every test is still run, on its own."""
    new = f"{item.nodeid}@{unit}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(new)
    else:
        item._nodeid = new


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers only (a plain ``pytest`` keeps the file order):

    - the tests of a module that use a module-scoped fixture (a trained draft, a ``dagster dev``, a tiny target's
      features) form one work unit, so one worker builds it once instead of every worker building its own;
    - the modules that start a real vLLM engine (``pytest.mark.vllm``) form one unit, so one worker imports vLLM
      (~6 CPU-s a process here) and holds an engine at a time;
    - ``slow`` tests (and the units that hold one) are dealt first, then the other units, then single tests, so
      no worker starts a minute-long test when the others are done.

    Every worker sorts the same collection the same way, as xdist requires.
    """
    if not hasattr(config, "workerinput"):
        return
    units: dict[int, str] = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if item.get_closest_marker("vllm"):
            units[id(item)] = "vllm-engines"
        elif any(d and d[-1].scope == "module" for d in defs):
            units[id(item)] = item.nodeid.split("::")[0]
    slow_units = {units.get(id(i)) for i in items if i.get_closest_marker("slow")} - {None}

    def rank(item: pytest.Item) -> int:
        unit = units.get(id(item))
        return 0 if item.get_closest_marker("slow") or unit in slow_units else 1 if unit else 2

    items.sort(key=rank)
    if config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False):
        for item in items:
            if id(item) in units:
                _join_work_unit(item, units[id(item)])


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``TEST_CPU_LOG`` set: one line per test (setup, call and teardown),
    ``<cpu s>\t<node id>\t<xdist worker>\t<end time>``.

    A module-scoped fixture's cost lands on the test that built it, and threads other tests left running are
    counted where they run; sorting the file (``sort -rn``) shows where the suite's CPU goes."""
    log = os.environ.get("TEST_CPU_LOG")
    before = _cpu_seconds() if log else 0.0
    yield
    if log:
        with open(log, "a") as f:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            f.write(f"{_cpu_seconds() - before:.2f}\t{item.nodeid}\t{worker}\t{time.time():.1f}\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def local_postgres() -> Iterator[LocalPostgres]:
    # A short folder of its own: the server's Unix socket lives in it, and socket paths are short.
    base = Path(tempfile.mkdtemp(prefix="efpg-"))
    pg = start_local_postgres(base / "data")
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_pg_database(local_postgres: LocalPostgres) -> Iterator[Callable[[], str]]:
    """Call it for the URL of a new empty database; all are dropped after the test."""
    made: list[str] = []

    def make() -> str:
        url = local_postgres.create_database()
        made.append(url.split("/")[3].split("?")[0])
        return url

    yield make
    for name in made:
        local_postgres.drop_database(name)


LEDGER_BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=LEDGER_BACKENDS)
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str | Path]:
    """``ledger_at(name)``: where ledger ``name`` lives on this backend (a SQLite file, or its own database)."""
    if request.param == "sqlite":
        return lambda name="ledger": tmp_path / f"{name}.sqlite"
    make = request.getfixturevalue("fresh_pg_database")
    urls: dict[str, str] = {}

    def at(name: str = "ledger") -> str:
        if name not in urls:
            urls[name] = make()
        return urls[name]

    return at
