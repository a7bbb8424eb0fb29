"""Start the bundled simulator on loopback when the embedded default needs it.

Each Dagster step runs in its own process, so the simulator must be a process of its own that
outlives them (its credit balance is shared by every step). The first step to need it spawns it,
detached, under a file lock so that concurrent steps do not race; the others find it answering.
"""

import fcntl
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

from eagle_assets import settings

DEMO_FLAGS = [
    "--latency-lognormal",
    "0.4",
    "0.5",
    "--fault",
    "rate_limit=0.02",
    "--fault",
    "server_error=0.01",
    "--fault",
    "whitespace_padding=0.2",
    "--fault",
    "disallowed_provider=0.01",
]


def _health_url(base_url: str) -> str:
    u = urlparse(base_url)
    return f"{u.scheme}://{u.hostname}:{u.port}/health"


def is_up(base_url: str, timeout_s: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(_health_url(base_url), timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def ensure_embedded_simulator(base_url: str, wait_s: float = 30.0) -> None:
    u = urlparse(base_url)
    if u.hostname not in ("127.0.0.1", "localhost") or u.port is None:
        raise ValueError(f"the embedded simulator runs on 127.0.0.1 with an explicit port, not {base_url}")
    if is_up(base_url):
        return
    state = settings.forge_home() / "simulator"
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "spawn.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_up(base_url):
            return
        cmd = [
            sys.executable,
            "-m",
            "resources.simulator",
            "--host",
            "127.0.0.1",
            "--port",
            str(u.port),
            "--state-file",
            str(state / "state.json"),
            "--credits",
            os.environ.get("EAGLE_FORGE_SIM_CREDITS", "100"),
            *DEMO_FLAGS,
        ]
        log = open(state / "simulator.log", "ab")  # noqa: SIM115 (handed to the child)
        subprocess.Popen(
            cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(settings.REPO_ROOT)
        )
        deadline = time.monotonic() + wait_s
        while not is_up(base_url):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded simulator did not come up at {base_url}; see {state / 'simulator.log'}"
                )
            time.sleep(0.1)
