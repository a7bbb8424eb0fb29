"""Start a serving engine, wait until it is healthy, stop it: each step fails loudly with the server's own words.

Most failures (a draft folder the engine refuses, too little GPU memory, a port in use) show only in the
server's log, so every failure here quotes that log's last lines. The server runs in a session of its own so
that stopping it stops the workers it forks (one per GPU) too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

from resources.serving.errors import ServerStartError

LOG_TAIL_LINES = 40


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(the log is empty)"


def health_status(url: str, timeout_s: float = 5.0) -> int | None:
    """The HTTP status of ``GET url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


def port_in_use(base_url: str) -> bool:
    u = urlparse(base_url)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((u.hostname or "127.0.0.1", u.port or 80)) == 0


def exit_description(code: int) -> str:
    """``exited with code N``, or the signal that killed it (SGLang's launcher SIGKILLs itself when a
    scheduler fails, so a refused draft ends in -9, not in an exit code)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit status {code})"
    return f"exited with code {code}"


class ServerProcess:
    """One engine server that this benchmark started and therefore stops."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        base_url: str,
        log_path: Path,
        *,
        health_path: str = "/health",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.base_url = base_url.rstrip("/")
        self.log_path = log_path
        self.health_url = self.base_url + health_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.death_note = ""  # how the server stood when a run failed, noted before it is stopped

    def start(
        self, timeout_s: float, poll_s: float = 1.0, log: Callable[[str], None] | None = None, every_s: float = 60.0
    ) -> ServerProcess:
        """Spawn the server and return once ``/health`` answers 200 (``log`` hears every ``every_s`` how it loads);
        otherwise stop it and raise with its log."""
        if port_in_use(self.base_url):
            raise ServerStartError(
                f"{self.name}: something already listens at {self.base_url}; stop it, pick another port, "
                "or attach to it (the serving resource's url)"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"$ {' '.join(self.command)}\n".encode())
            out.flush()
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerStartError(f"{self.name}: cannot run {self.command[0]!r}: {exc}") from exc
        try:
            return self._wait_healthy(timeout_s, poll_s, log, every_s)
        except BaseException:
            self.stop()  # whatever went wrong while waiting (a timeout, Ctrl-C, a failing log callback)
            raise

    def _wait_healthy(
        self, timeout_s: float, poll_s: float, log: Callable[[str], None] | None, every_s: float
    ) -> ServerProcess:
        assert self.proc is not None
        started = time.monotonic()
        deadline = started + timeout_s
        next_note = started + every_s
        last: int | None = None
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.name} {exit_description(code)} before it was healthy (log {self.log_path}); "
                    f"last lines:\n{log_tail(self.log_path)}"
                )
            last = health_status(self.health_url)
            if last == 200:
                return self
            if time.monotonic() >= deadline:
                seen = "no answer" if last is None else f"HTTP {last}"
                raise ServerStartError(
                    f"{self.name} was not healthy after {timeout_s:.0f}s ({seen} at {self.health_url}); stopped it. "
                    f"Log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
                )
            if log is not None and time.monotonic() >= next_note:
                next_note += every_s
                log(
                    f"{self.name}: not healthy yet after {time.monotonic() - started:.0f}s; "
                    f"log: {log_tail(self.log_path, 1)}"
                )
            time.sleep(poll_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe_death(self) -> str:
        """Why the server stopped answering, for a mid-run failure message."""
        if self.proc is None:
            return f"{self.name} was never started"
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # a server that drops its connections as it crashes is a moment from exiting
        code = self.proc.poll()
        state = exit_description(code) if code is not None else f"still running (pid {self.proc.pid})"
        return f"{self.name} {state}; log {self.log_path}, last lines:\n{log_tail(self.log_path)}"

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the server's session, SIGKILL it after ``grace_s``; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        # Workers the server forked into its session may outlive it; the session is ours alone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
