"""Child processes for the tests that need real ones (another owner, a dead or paused host, racing writers),
forked from a fork server instead of started by ``spawn``.

``spawn`` starts a fresh Python per child, which imports the ledger (or the runner) again: about 1 CPU s a child
(2 with the runner), and these tests start some sixty. The fork server is one such Python per test process,
started at the first child with the modules below already imported; every child is a fork of it (a
single-threaded process: no lock held by another thread comes along), a process of its own, with its own pid,
connections and signals, as before. A fork of the server does not see what the test put in the environment or
which folder it is in after the server started, so ``process`` hands both to the child.
"""

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

CTX = multiprocessing.get_context("forkserver")
# What the children import anyway (a module missing here is imported by each child on its own: slower, not wrong).
CTX.set_forkserver_preload(
    [
        "tests.generation.forked",
        "tests.generation.holders",
        "eagle_assets.generation.ledger",
        "eagle_assets.generation.journal",
        "eagle_assets.generation.folder_lease",
        "eagle_assets.generation.runner",
        "resources.openrouter.client",
        "psycopg",
    ]
)


def _as_started(env: dict[str, str], cwd: str, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    target(*args)


def process(target: Callable[..., Any], *args: Any, daemon: bool | None = None) -> BaseProcess:
    """A child that runs ``target(*args)`` in this process's environment and folder; ``start()`` it."""
    return CTX.Process(target=_as_started, args=(dict(os.environ), os.getcwd(), target, args), daemon=daemon)
