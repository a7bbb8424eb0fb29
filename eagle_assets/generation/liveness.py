"""Is a ledger owner still there? A heartbeat lease, with a pid check only where a pid means something.

Across hosts a pid means nothing, so every owner renews a lease on the database's clock: an owner whose heartbeat
is older than its lease is dead wherever it ran. The pid shortcut (a death seen at once) applies only within one
*pid space*: same boot of the same kernel and same pid namespace, so two containers never judge each other by pid.
"""

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from eagle_assets.settings import current_settings

log = logging.getLogger(__name__)


def lease_seconds() -> float:
    """The owner lease: ``EAGLE_FORGE_LEASE_S`` (seconds), else 30. A dead host's slots return after it."""
    return current_settings().lease_s


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def host_id() -> str:
    """This process's pid space: ``EAGLE_FORGE_HOST_ID`` if set, else hostname, boot id and pid namespace."""
    override = current_settings().host_id
    if override:
        return override
    boot = _read("/proc/sys/kernel/random/boot_id")[:8]
    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = ""
    return "/".join(x for x in (socket.gethostname(), boot, pidns) if x)


def pid_alive(pid: int, create_time: float) -> bool:
    """The process with this pid is the one that registered (a reused pid has another start time)."""
    try:
        return abs(psutil.Process(pid).create_time() - create_time) < 1.0
    except psutil.Error:
        return False


@dataclass(frozen=True)
class OwnerRecord:
    owner: str
    pid: int
    create_time: float
    host: str  # "" for owners written before leases existed: judged by pid alone, as they were
    heartbeat: float  # database clock
    lease_s: float


def why_dead(row: OwnerRecord, *, here: str, now: float) -> str | None:
    """Why ``row``'s owner counts as dead (its lease lapsed, or its process is gone from this pid space), or None."""
    if row.lease_s > 0 and now > row.heartbeat + row.lease_s:
        return f"no heartbeat for {now - row.heartbeat:.1f} s (lease {row.lease_s:.0f} s)"
    if row.host in ("", here) and not pid_alive(row.pid, row.create_time):
        return f"process {row.pid} is gone"
    return None


class Heartbeat:
    """Renews one owner's lease from a thread of its own, so a busy event loop never lets it lapse.

    Once ``beat`` finds the owner's row gone (another host found the lease expired and charged what was open),
    the owner is *lost* for good: its slots and reservations belong to no one, and whatever checks ``lost`` stops.
    """

    def __init__(self, beat: Callable[[], bool], interval_s: float, name: str = "ledger-heartbeat") -> None:
        self._beat, self.interval_s = beat, interval_s
        self._stop = threading.Event()
        self.lost = False
        self.failures = 0  # beats that failed in a row
        self.last_ok = time.monotonic()  # when the last renewal that succeeded was sent
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            sent = time.monotonic()
            try:
                alive = self._beat()
            except Exception as exc:  # the database is unreachable: try again; the lease may lapse meanwhile
                self.failures += 1
                # Three beats missed is half the lease gone: say so at error level, once per outage.
                level = logging.ERROR if self.failures == 3 else logging.WARNING
                log.log(
                    level,
                    "ledger heartbeat failed %d time(s) in a row, %.0f s since the last renewal: %s: %s",
                    self.failures,
                    self.since_ok(),
                    type(exc).__name__,
                    str(exc).splitlines()[:1],
                )
                continue
            self.failures = 0
            if not alive:
                self.lost = True
                log.error("ledger lease lost: another process found this owner's heartbeat expired")
                return
            self.last_ok = sent

    def since_ok(self) -> float:
        return time.monotonic() - self.last_ok

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, self.interval_s * 2))
