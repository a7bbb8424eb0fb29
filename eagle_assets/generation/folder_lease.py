"""One writer per shared folder on every host: the folder's ``flock``, then its lease in the ledger's database.

``flock`` keeps writers on one machine apart; a mount that does not honour it across hosts (NFS with ``nolock``
or ``local_lock``) leaves only the database lease (``database_lease``), taken on a ledger opened for the
purpose and given back with it. ``EAGLE_FORGE_FLOCK=0`` leaves ``flock`` out, as on such a mount.
Used by the corpus merge and a hidden-state store's index.
"""

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from eagle_assets import layout
from eagle_assets.durable_files import directory_lock
from eagle_assets.generation.database_lease import DatabaseLease
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.settings import current_settings


def flock_enabled() -> bool:
    """``EAGLE_FORGE_FLOCK`` (default on): off where the mount does not honour ``flock``, so that the database
    lease alone keeps writers apart (and tests can show it does)."""
    return current_settings().flock


_LOCAL: dict[str, threading.Lock] = {}
_LOCAL_GUARD = threading.Lock()


def folder_lease_name(directory: Path) -> str:
    """The lease's name for a folder: relative to the home when inside it, since hosts may mount the shared
    home at different paths; the absolute path otherwise."""
    directory = Path(directory).expanduser().absolute()
    home = layout.root()
    return f"dir:{directory.relative_to(home)}" if directory.is_relative_to(home) else f"dir:{directory}"


@contextlib.contextmanager
def _thread_turn(name: str) -> Iterator[None]:
    """Threads of one process share nothing in the database (each opens its own owner), but take turns here
    too, so that turning ``flock`` off never lets two threads of one process in at once."""
    with _LOCAL_GUARD:
        lock = _LOCAL.setdefault(name, threading.Lock())
    with lock:
        yield


@contextlib.contextmanager
def exclusive(
    directory: Path,
    lock_name: str,
    *,
    what: str,
    location: str | Path | None = None,
    wait_s: float | None = None,
) -> Iterator[DatabaseLease]:
    """Be the only writer of ``directory``: its ``flock`` for this host, then its lease in the ledger's database
    (``location``; default ``layout.ledger_location()``) for every host. Yields the lease, to ``check``
    before publishing."""
    directory = Path(directory).expanduser().absolute()
    name = folder_lease_name(directory)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_thread_turn(name))
        if flock_enabled():
            stack.enter_context(directory_lock(directory, lock_name))
        ledger = BudgetLedger(layout.ledger_location() if location is None else location)
        stack.callback(ledger.close)
        yield stack.enter_context(DatabaseLease(ledger, name, what=what, wait_s=wait_s, wait_for_live=True))
