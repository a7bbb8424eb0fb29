"""A real ``dagster dev`` on 127.0.0.1 and a headless Chromium driven by Playwright.

Everything the server writes goes to a temporary ``EAGLE_FORGE_HOME`` and ``DAGSTER_HOME``; the simulator
gets a free port of its own. At teardown the whole ``dagster dev`` tree (its process groups) and the
detached simulator it spawned are killed, and on a failing test the page's screenshot, HTML and the
server log are kept under ``test-artifacts/browser/``.

Needs Debian's ``chromium`` (``apt-get install chromium``; ``scripts/setup.sh`` installs it where it can) and
the ``playwright`` Python package (in the ``dev`` extras); never ``playwright install``. Without Chromium (at
``EAGLE_FORGE_CHROMIUM``, default ``/usr/bin/chromium``) or Playwright these tests are skipped, with the reason
in pytest's summary; ``EAGLE_FORGE_SKIP_BROWSER=1`` skips them on purpose. ``EAGLE_FORGE_REQUIRE_BROWSER=1``
(set by ``.ci/run``) turns every such skip into a failure, so CI always runs them.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("EAGLE_FORGE_CHROMIUM", "/usr/bin/chromium")
# What this closed-network machine needs (running as root); Playwright adds --headless and a fresh
# --user-data-dir itself.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
]
CODE_LOCATION = "eagle_forge"
SERVER_START_TIMEOUT_S = 120.0
# Environment that would point the server somewhere other than the embedded default.
SCRUBBED_ENV = (
    "EAGLE_FORGE_TARGET",
    "EAGLE_FORGE_DATASETS",
    "EAGLE_FORGE_KEY_FILE",
    "EAGLE_FORGE_SIM_KEY",
    "EAGLE_FORGE_SIM_CREDITS",
    "EAGLE_FORGE_BUDGET_USD",
    "OPENROUTER_API_KEY",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class DagsterUI:
    url: str
    forge_home: Path
    dagster_home: Path
    sim_port: int
    log_path: Path
    proc: subprocess.Popen

    def graphql(self, query: str, variables: dict[str, Any] | None = None, timeout_s: float = 10.0) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out = json.loads(resp.read())
        if out.get("errors"):
            raise AssertionError(f"GraphQL errors: {out['errors']}")
        return out["data"]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no dagster dev log)"


WORKSPACE_QUERY = """
query {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
  }
}
"""


def _wait_until_loaded(ui: DagsterUI) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if ui.proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {ui.proc.returncode}:\n{ui.log_tail()}", pytrace=False)
        try:
            data = ui.graphql(WORKSPACE_QUERY, timeout_s=5.0)["workspaceOrError"]
        except (urllib.error.URLError, OSError, TimeoutError, ValueError) as e:
            last = repr(e)
        else:
            entries = {e["name"]: e for e in data.get("locationEntries", [])}
            entry = entries.get(CODE_LOCATION)
            if entry and entry["loadStatus"] == "LOADED":
                loc = entry["locationOrLoadError"] or {}
                if loc.get("__typename") == "RepositoryLocation":
                    return
                pytest.fail(f"code location {CODE_LOCATION} failed to load: {loc.get('message', loc)}", pytrace=False)
            last = json.dumps(data)[:500]
        time.sleep(0.5)
    pytest.fail(f"dagster dev not ready after {SERVER_START_TIMEOUT_S:.0f}s ({last}):\n{ui.log_tail()}", pytrace=False)


def _kill_tree(root_pid: int, grace_s: float = 10.0) -> None:
    """SIGINT (what Ctrl-C sends) to dagster dev, then SIGKILL every process group of its tree."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    gone = (psutil.NoSuchProcess, ProcessLookupError, PermissionError)
    pgids = set()
    for p in procs:
        with contextlib.suppress(*gone):
            pgids.add(os.getpgid(p.pid))
    pgids.discard(os.getpgrp())  # never our own (pytest's) group
    with contextlib.suppress(*gone):
        root.send_signal(signal.SIGINT)
    psutil.wait_procs([root], timeout=grace_s)  # dagster dev shuts its services down, then exits
    for g in pgids:  # whatever is left: run workers, compute-log tails, code servers
        with contextlib.suppress(*gone):
            os.killpg(g, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(*gone):
            p.kill()
    psutil.wait_procs(procs, timeout=5)


def _kill_by_cmdline(marker: str) -> list[int]:
    """Kill what was started with ``marker`` (a unique temp path) on its command line: the simulator,
    detached into a session of its own, and anything else left behind under the temporary home."""
    victims = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if p.pid != os.getpid() and any(marker in part for part in p.info["cmdline"] or []):
                victims.append(p)
    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(victims, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    return [p.pid for p in victims]


REQUIRE_BROWSER = "EAGLE_FORGE_REQUIRE_BROWSER"


def browser_unavailable(reason: str) -> None:
    """Skip (the reason shows in pytest's summary), or fail where these tests must run (CI sets REQUIRE_BROWSER)."""
    if os.environ.get(REQUIRE_BROWSER) == "1":
        why = f"browser tests cannot run: {reason} ({REQUIRE_BROWSER}=1: they may not be skipped here)"
        pytest.fail(why, pytrace=False)
    pytest.skip(f"browser tests skipped: {reason}")


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    if os.environ.get("EAGLE_FORGE_SKIP_BROWSER") == "1":
        browser_unavailable("EAGLE_FORGE_SKIP_BROWSER=1")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        browser_unavailable(
            f"no Chromium at {CHROMIUM}. Install it with "
            "`sudo apt-get install -y --no-install-recommends chromium` (Debian/Ubuntu; scripts/setup.sh does "
            "where it can), or point EAGLE_FORGE_CHROMIUM at a Chromium binary (never `playwright install`)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        browser_unavailable("the playwright package is missing (`pip install -c constraints.txt -e '.[dev]'`)")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium_executable: str) -> Iterator[Any]:
    # Module scope, not session: Playwright's sync API keeps an event loop running on the main thread
    # while it is open, and every later test that calls asyncio.run() would fail.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    # Dagster's "Join the community" dialog on localhost would cover the page: mark it as dismissed.
    context.add_init_script("try { localStorage.setItem('communityNux', JSON.stringify('1')) } catch (e) {}")
    context.set_default_timeout(30_000)
    pg = context.new_page()
    try:
        yield pg
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            save_debug(pg, request.node.name)
        context.close()


def save_debug(pg: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot, html = ARTIFACTS / f"{name}-failure.png", ARTIFACTS / f"{name}-failure.html"
    try:
        pg.screenshot(path=str(shot), full_page=True)
        html.write_text(pg.content())
        print(f"\nfailure screenshot: {shot}\nfailure page HTML: {html}\npage URL: {pg.url}")
    except Exception as e:  # the page may be gone; the test's own error matters more
        print(f"\ncould not save the failing page: {e!r}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="module")
def dagster_ui(chromium_executable: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterUI]:
    from eagle_assets.instance import DAGSTER_YAML

    base = tmp_path_factory.mktemp("dagster_ui")
    forge_home, dagster_home = base / "forge_home", base / "dagster_home"
    forge_home.mkdir()
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
    port, sim_port = free_port(), free_port()
    while sim_port == port:
        sim_port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    scratch = base / "tmp"  # dagster dev's code-server sockets: its killed servers left them in /tmp for good
    scratch.mkdir()
    env.update(
        TMPDIR=str(scratch),
        EAGLE_FORGE_HOME=str(forge_home),
        DAGSTER_HOME=str(dagster_home),
        EAGLE_FORGE_SIM_PORT=str(sim_port),
        EAGLE_FORGE_TARGET="simulator",
        PYTHONUNBUFFERED="1",
    )
    log_path = base / "dagster_dev.log"
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, killed as a whole at teardown
        )
    ui = DagsterUI(f"http://127.0.0.1:{port}", forge_home, dagster_home, sim_port, log_path, proc)
    try:
        _wait_until_loaded(ui)
        yield ui
    finally:
        _kill_tree(proc.pid)
        killed = _kill_by_cmdline(str(forge_home))
        if killed:
            print(f"\nkilled the simulator started under {forge_home}: pids {killed}")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            (ARTIFACTS / "dagster_dev.log").write_bytes(log_path.read_bytes())
