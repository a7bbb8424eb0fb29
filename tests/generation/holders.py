"""What the child processes of the folder-lease and account tests run, in a module of its own: a child imports
its target's module, and those tests' modules import torch or dagster (seconds per child), where these need
only the ledger and the lease."""

import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from eagle_assets.generation.folder_lease import exclusive
from eagle_assets.generation.ledger import AccountSettings, BudgetLedger


def hold_folder(location: Any, directory: str, lock_name: str, conn: Connection) -> None:
    """host-b: hold the folder's lease until told to give it back."""
    os.environ["EAGLE_FORGE_HOST_ID"] = "host-b"
    with exclusive(Path(directory), lock_name, what=f"{directory} (host-b)", location=location) as lease:
        conn.send(("holding", lease.token, os.getpid()))
        conn.recv()
    conn.send("released")


def hold_account(at: Any, account: AccountSettings, ready: Any) -> None:
    """A run that opened the ledger with ``account`` and then hangs until it is killed."""
    BudgetLedger(at, account=account)
    ready.set()
    signal.pause()
