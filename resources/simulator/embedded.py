"""Start the bundled simulator on loopback when the embedded default needs it.

Each Dagster step runs in its own process, so the simulator is a process of its own that outlives them (its
credit balance is shared by every step): the first step to need it spawns it, detached, under a file lock so
that concurrent steps do not race; its pid goes to ``simulator.pid`` so that whoever started it (the demo)
stops exactly that process. It answers with the tiny target's own greedy output unless
``EAGLE_FORGE_SIM_GENERATOR=kimi-style``, so the training data is what the target really generates.
"""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import psutil

from eagle_assets.durable_files import atomic_write_bytes, directory_lock
from eagle_assets.errors import OpenRouterError, Systemic
from eagle_assets.layout import simulator_dir
from eagle_assets.settings import current_settings
from eagle_assets.target.tiny_targets import DEFAULT_TINY_TARGET
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir

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


def generator_flags(tiny_target: str = DEFAULT_TINY_TARGET) -> list[str]:
    """Simulator flags for ``EAGLE_FORGE_SIM_GENERATOR`` (tiny-target by default), answering with the tiny target
    named (``eagle_assets.target.tiny_targets``: the one the target resource extracts from)."""
    settings = current_settings()
    if settings.sim_generator == "kimi-style":
        return []
    # Built by the child, not here: this runs in every Dagster step and must not import torch.
    flags = ["--tiny-target-seed", str(settings.sim_tiny_target_seed)]
    return flags if tiny_target == DEFAULT_TINY_TARGET else [*flags, "--tiny-target-kind", tiny_target]


class EmbeddedSimulatorError(OpenRouterError, Systemic, RuntimeError):
    """The spawned simulator exited or never answered; the message carries its last log lines."""


def pid_file() -> Path:
    """Who the embedded simulator is: pid, its start time and port, so only that process is ever stopped."""
    return simulator_dir() / "simulator.pid"


def _log_tail(log_path: Path, offset: int, lines: int = 12) -> str:
    try:
        with log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _spawn_command(port: int, gen_flags: list[str]) -> list[str]:
    tokenizer = str(resolve_tokenizer_dir())  # resolved here: a missing tokenizer fails in this step, not a child
    return [
        sys.executable,
        "-m",
        "resources.simulator",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--state-file",
        str(simulator_dir() / "state.json"),
        "--credits",
        current_settings().sim_credits,
        "--tokenizer-dir",
        tokenizer,
        *DEMO_FLAGS,
        *gen_flags,
    ]


def ensure_embedded_simulator(
    base_url: str, wait_s: float | None = None, *, tiny_target: str = DEFAULT_TINY_TARGET
) -> int | None:
    """Start the simulator unless it answers; the pid it started (None: one was up). ``wait_s`` bounds a slow
    start only: a child that exits is reported at once, with the last lines it wrote."""
    u = urlparse(base_url)
    if u.hostname not in ("127.0.0.1", "localhost") or u.port is None:
        raise ValueError(f"the embedded simulator runs on 127.0.0.1 with an explicit port, not {base_url}")
    if is_up(base_url):
        return None
    gen_flags = generator_flags(tiny_target)
    if wait_s is None:
        wait_s = 120.0 if gen_flags else 30.0  # importing torch and loading the model take a while
    state = simulator_dir()
    with directory_lock(state, "spawn.lock"):
        if is_up(base_url):
            return None
        cmd = _spawn_command(u.port, gen_flags)
        log_path = state / "simulator.log"
        with log_path.open("ab") as log:
            offset = log.tell()
            child = subprocess.Popen(
                cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(state)
            )
        atomic_write_bytes(
            pid_file(),
            json.dumps({"pid": child.pid, "create_time": _create_time(child.pid), "port": u.port}).encode(),
        )
        deadline = time.monotonic() + wait_s
        while not is_up(base_url):
            code = child.poll()
            if code is not None:
                tail = _log_tail(log_path, offset)
                raise EmbeddedSimulatorError(
                    f"the embedded simulator exited with code {code} before answering at {base_url}; "
                    f"its last lines ({log_path}):\n{tail or '(nothing written)'}"
                )
            if time.monotonic() > deadline:
                stop_process(child.pid, None)  # our own child, not yet reaped: its pid cannot be anyone else's
                raise EmbeddedSimulatorError(
                    f"the embedded simulator did not answer at {base_url} within {wait_s:.0f}s (stopped it); "
                    f"its last lines ({log_path}):\n{_log_tail(log_path, offset) or '(nothing written)'}"
                )
            time.sleep(0.1)
        return child.pid


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def stop_process(pid: int, create_time: float | None, timeout_s: float = 10.0) -> bool:
    """SIGTERM (then SIGKILL) one process, only if it is still the one started: a recycled pid is left alone."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    except psutil.NoSuchProcess:
        return False
    return True


def stop_embedded_simulator() -> int | None:
    """Stop the simulator recorded in the pid file (it flushes its balance on SIGTERM); returns its pid."""
    path = pid_file()
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    stopped = stop_process(int(info["pid"]), info.get("create_time"))
    path.unlink(missing_ok=True)
    return int(info["pid"]) if stopped else None
