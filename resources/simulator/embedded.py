"""Start the bundled simulator on loopback when the embedded default needs it.

Each Dagster step runs in its own process, so the simulator must be a process of its own that
outlives them (its credit balance is shared by every step). The first step to need it spawns it,
detached, under a file lock so that concurrent steps do not race; the others find it answering.

By default it answers with the tiny target's own greedy output (``--tiny-target-seed``: the child
builds ``default_tiny_target_dir(seed)`` if missing, the same model the target resource uses), so
the training data is what the target really generates. ``EAGLE_FORGE_SIM_GENERATOR=kimi-style``
switches back to the templated text; ``EAGLE_FORGE_SIM_TINY_TARGET_SEED`` picks the seed (default 0).
"""

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

from eagle_assets import settings
from eagle_assets.durable_files import directory_lock

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


GENERATORS = ("tiny-target", "kimi-style")


def generator_flags() -> list[str]:
    """Simulator flags for ``EAGLE_FORGE_SIM_GENERATOR`` (tiny-target by default)."""
    choice = os.environ.get("EAGLE_FORGE_SIM_GENERATOR", "").strip().lower() or GENERATORS[0]
    if choice == "kimi-style":
        return []
    if choice == "tiny-target":
        seed = int(os.environ.get("EAGLE_FORGE_SIM_TINY_TARGET_SEED", "0"))
        # Built by the child, not here: this runs in every Dagster step and must not import torch.
        return ["--tiny-target-seed", str(seed)]
    raise ValueError(f"EAGLE_FORGE_SIM_GENERATOR must be one of {', '.join(GENERATORS)}, not {choice!r}")


def ensure_embedded_simulator(base_url: str, wait_s: float | None = None) -> None:
    """Start the simulator unless it answers; ``wait_s`` defaults to 30 s (120 s with the tiny target)."""
    u = urlparse(base_url)
    if u.hostname not in ("127.0.0.1", "localhost") or u.port is None:
        raise ValueError(f"the embedded simulator runs on 127.0.0.1 with an explicit port, not {base_url}")
    if is_up(base_url):
        return
    gen_flags = generator_flags()
    if wait_s is None:
        wait_s = 120.0 if gen_flags else 30.0  # importing torch and loading the model take a while
    state = settings.forge_home() / "simulator"
    with directory_lock(state, "spawn.lock"):
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
            *gen_flags,
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
