"""Process-group setup for ``torchrun`` (gloo on CPU, nccl on GPU) and the few collectives the trainer uses.

Every helper is a no-op in a single process, so the trainer has one code path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current() -> DistInfo:
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return DistInfo()


def init_from_env(backend: str | None = None) -> DistInfo:
    """Join the group ``torchrun`` describes in the environment; single process when WORLD_SIZE is unset or 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return current()
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend=backend or ("nccl" if use_cuda else "gloo"))
    return current()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks into a new tensor (NCCL needs it on the GPU; the result comes back to ``t``'s device)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    out = t.clone()
    if dist.get_backend() == "nccl":
        out = out.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(out)
    return out.to(t.device)


def all_gather_object(obj: Any) -> list[Any]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
