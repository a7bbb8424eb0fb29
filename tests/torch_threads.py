"""One CPU thread for torch, in the test process and in every process it starts.

The suite runs on 4 xdist workers sharing 2 cores. With torch's default (one intra-op thread per core) each
OpenMP thread spins at every barrier waiting for a core the other workers hold: on this machine that doubled the
CPU seconds of the tiny-target tests (the draft benchmark step 18 s → 3 s, a Pipes training subprocess 24 s → 13 s)
without making them faster. ``OMP_NUM_THREADS`` reaches the subprocesses (Pipes training, ``torchrun`` workers, the
simulator, ``dagster dev`` and its runs); ``torch.set_num_threads`` covers this process, where torch is already up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread here and in child processes while inside; the previous settings restored after."""
    import torch

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
