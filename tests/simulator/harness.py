"""Run the simulator from tests and benchmarks: in a background thread, or as a child process.

The thread variant gives a test direct access to ``SimulatorState`` (stats, balance) while the
code under test talks real HTTP on 127.0.0.1; the process variant is for measurements and restart
tests, where the simulator must not share the client's CPU or survive only as long as it.
"""

import asyncio
import collections
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import orjson

from resources.simulator.config import SimulatorConfig, config_to_args
from resources.simulator.faults import FaultConfig
from resources.simulator.responses import ResponseGenerator
from resources.simulator.server import RunningServer, SimulatorState, start_server

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass
class SimulatorHandle:
    """A simulator serving from a background thread; mutate it only through these methods."""

    server: RunningServer
    loop: asyncio.AbstractEventLoop

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def root_url(self) -> str:
        return self.server.root_url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def state(self) -> SimulatorState:
        return self.server.state

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn`` on the server's loop, so it never races a handler (directly once it has stopped)."""
        if self.loop.is_closed() or not self.loop.is_running():
            return fn()

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def set_faults(self, faults: FaultConfig | Mapping[str, Any] | None = None, **changes: Any) -> FaultConfig:
        """Replace the fault config (a ``FaultConfig`` or mapping), or change fields of the current one."""
        if faults is None:
            new = self.state.faults.replace(**changes)
        else:
            base = faults if isinstance(faults, FaultConfig) else FaultConfig.from_mapping(faults)
            new = base.replace(**changes) if changes else base
        self.call(lambda: self.state.set_faults(new))
        return new

    def topup(self, amount_usd: float) -> None:
        self.call(lambda: self.state.topup(amount_usd))

    def set_workspace_budget(self, amount_usd: float | None) -> None:
        self.call(lambda: self.state.set_workspace_budget(amount_usd))

    def set_generation_window(self, ms: float) -> None:
        """How long /generation answers 404 after a generation completed, from now on."""
        self.call(lambda: setattr(self.state, "generation_404_ms", float(ms)))

    def set_request_wide_error(self, message: str | None, delay_s: float = 0.0) -> None:
        """Answer every chat request with a 400 of ``message`` after ``delay_s`` (None: answer normally again)."""
        if delay_s < 0:
            raise ValueError("delay_s must be >= 0")

        def apply() -> None:
            self.state.request_wide_error = message
            self.state.request_wide_delay_s = delay_s

        self.call(apply)

    def stats(self, generations_limit: int | None = None) -> dict[str, Any]:
        return self.call(lambda: self.state.snapshot(generations_limit))

    def reset_stats(self) -> None:
        self.call(self.state.reset_stats)


@contextmanager
def run_simulator_in_thread(
    config: SimulatorConfig | None = None,
    generator: ResponseGenerator | None = None,
    ready_timeout: float = 30.0,
) -> Iterator[SimulatorHandle]:
    """Serve ``config`` on 127.0.0.1 from a daemon thread for the duration of the ``with`` block."""
    config = config or SimulatorConfig()
    loop = asyncio.new_event_loop()
    ready: queue.Queue[RunningServer | BaseException] = queue.Queue()

    def target() -> None:
        asyncio.set_event_loop(loop)
        try:
            ready.put(loop.run_until_complete(start_server(config, generator)))
        except BaseException as exc:  # handed to the caller's thread
            ready.put(exc)
            loop.close()
            return
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=target, name="openrouter-simulator", daemon=True)
    thread.start()
    got = ready.get(timeout=ready_timeout)
    if isinstance(got, BaseException):
        thread.join(5)
        raise got
    handle = SimulatorHandle(got, loop)
    try:
        yield handle
    finally:
        try:
            asyncio.run_coroutine_threadsafe(got.stop(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)


# --------------------------------------------------------------------------------------------
# Child process


def _http_json(url: str, payload: Any | None = None, timeout: float = 10.0) -> Any:
    data = None if payload is None else orjson.dumps(payload)
    req = urllib.request.Request(
        url,
        data=data,
        method="GET" if data is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return orjson.loads(resp.read())


@dataclass
class SimulatorProcess:
    """A simulator child process; ``terminate()`` stops it cleanly (state file flushed)."""

    proc: subprocess.Popen[str]
    base_url: str

    @property
    def root_url(self) -> str:
        return self.base_url.rsplit("/api/v1", 1)[0]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self, generations_limit: int | None = None) -> dict[str, Any]:
        q = "" if generations_limit is None else f"?generations={generations_limit}"
        return _http_json(f"{self.root_url}/_sim/stats{q}")

    def topup(self, amount_usd: float) -> None:
        _http_json(f"{self.root_url}/_sim/topup", {"amount": amount_usd})

    def set_workspace_budget(self, amount_usd: float | None) -> None:
        _http_json(f"{self.root_url}/_sim/budget", {"amount": amount_usd})

    def set_faults(self, faults: FaultConfig | Mapping[str, Any]) -> None:
        body = faults.to_dict() if isinstance(faults, FaultConfig) else dict(faults)
        _http_json(f"{self.root_url}/_sim/faults", body)

    def set_generation_window(self, ms: float) -> None:
        _http_json(f"{self.root_url}/_sim/generation_window", {"ms": ms})

    def set_request_wide_error(self, message: str | None, delay_s: float = 0.0) -> None:
        _http_json(f"{self.root_url}/_sim/request_wide_error", {"message": message, "delay_s": delay_s})

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def kill(self) -> int:
        """A crash: no clean shutdown, the state file keeps its last flush."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def __enter__(self) -> "SimulatorProcess":
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.terminate()


def spawn_simulator_process(
    config: SimulatorConfig | Sequence[str] | None = None,
    *,
    ready_timeout: float = 30.0,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> SimulatorProcess:
    """Start ``python -m resources.simulator`` and wait for its ``SIMULATOR_URL=`` line.

    ``config`` is a ``SimulatorConfig`` (port 0 by default there) or raw CLI flags.
    """
    if config is None:
        args = config_to_args(SimulatorConfig())
    elif isinstance(config, SimulatorConfig):
        args = config_to_args(config)
    else:
        args = list(config)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), child_env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [python, "-m", "resources.simulator", *args],
        cwd=str(REPO_ROOT),
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    tail: collections.deque[str] = collections.deque(maxlen=200)

    def read_stdout(stream: Any) -> None:
        for line in stream:  # keeps draining after readiness so the child never blocks on a full pipe
            lines.put(line)
        lines.put(None)

    def read_stderr(stream: Any) -> None:
        for line in stream:
            tail.append(line)

    threading.Thread(target=read_stdout, args=(proc.stdout,), daemon=True).start()
    err_reader = threading.Thread(target=read_stderr, args=(proc.stderr,), daemon=True)
    err_reader.start()
    deadline = time.monotonic() + ready_timeout
    why = f"not ready within {ready_timeout}s"
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            why = "exited before it was ready"
            break
        if line.startswith("SIMULATOR_URL="):
            return SimulatorProcess(proc, line.strip().split("=", 1)[1])
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    err_reader.join(2)
    raise RuntimeError(f"simulator {why} (exit {proc.returncode}): {''.join(tail)[-2000:]}")
