"""Training rows for the draft, and the deterministic order the trainer visits them in.

A dataset has ``__len__`` and ``__getitem__(i) -> dict`` with ``input_ids`` [T], ``loss_mask`` [T] and, offline,
``aux`` [T, n_aux*H] and ``last`` [T, H] (a hidden-state store reader); online rows need only the first two.

Each epoch is one permutation drawn from ``(seed, epoch)`` alone, cut into global batches of ``world_size ×
grad_accum × batch_size`` rows, the incomplete tail dropped so that every optimizer step sees as many rows. The
order is a pure function of (seed, epoch, batch index): a checkpoint resumes exactly from those three numbers, and
one process with a ``world_size``-times larger batch sees the same global batches as a data-parallel run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

Row = dict[str, torch.Tensor]


class RowDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Mapping[str, Any]: ...


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    if not shuffle:
        return torch.arange(n)
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(n, generator=gen)


def steps_per_epoch(n: int, global_batch: int) -> int:
    return n // global_batch


def global_batch_indices(
    n: int, global_batch: int, seed: int, epoch: int, index: int, shuffle: bool = True
) -> list[int]:
    """Row indices of global batch ``index`` of ``epoch``."""
    perm = epoch_permutation(n, seed, epoch, shuffle)
    return perm[index * global_batch : (index + 1) * global_batch].tolist()


def local_slice(indices: Sequence[int], rank: int, world_size: int, micro: int, batch_size: int) -> list[int]:
    """Rows of micro-batch ``micro`` on ``rank`` (micro-major, then rank: micro-batch m of all ranks is contiguous)."""
    start = (micro * world_size + rank) * batch_size
    return list(indices[start : start + batch_size])


def _as_row(sample: Mapping[str, Any], max_length: int | None, dtype: torch.dtype | None) -> Row:
    ids = torch.as_tensor(sample["input_ids"]).to(torch.int64).reshape(-1)
    mask = torch.as_tensor(sample["loss_mask"]).reshape(-1).to(torch.bool)
    if ids.shape != mask.shape:
        raise ValueError(f"input_ids {tuple(ids.shape)} vs loss_mask {tuple(mask.shape)}")
    end = ids.numel() if max_length is None else min(ids.numel(), max_length)
    row: Row = {"input_ids": ids[:end], "loss_mask": mask[:end]}
    for key in ("aux", "last"):
        if key in sample:
            feat = torch.as_tensor(sample[key])
            if feat.ndim != 2 or feat.shape[0] != ids.numel():
                raise ValueError(f"{key} has shape {tuple(feat.shape)} for {ids.numel()} tokens")
            feat = feat[:end]
            row[key] = feat.to(dtype) if dtype is not None else feat
    return row


class StoreDataset:
    """A hidden-state store reader seen as training rows (truncated to ``max_length``, cast to ``dtype``)."""

    def __init__(self, store: RowDataset, *, max_length: int | None = None, dtype: torch.dtype | None = torch.float32):
        self.store = store
        self.max_length = max_length
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> Row:
        row = _as_row(self.store[i], self.max_length, self.dtype)
        if "aux" not in row or "last" not in row:
            raise KeyError("a store row needs 'aux' and 'last' features (use TokenDataset for online training)")
        return row


class TokenDataset:
    """Token rows only, for online training (the target computes features during training)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], *, max_length: int | None = None):
        self.rows = [
            _as_row({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}, max_length, None) for r in rows
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Row:
        return self.rows[i]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)


class SyntheticDataset:
    """Seeded in-memory rows whose target is learnable: tokens follow a sparse random Markov chain, features are
    fixed random functions of the current token plus noise and ``target_head()`` a random linear map, so the
    target's next-token distribution at t is a function of ``x_t`` a draft can learn; the mask covers a suffix."""

    def __init__(
        self,
        n_samples: int,
        *,
        hidden_size: int,
        vocab_size: int,
        n_aux: int = 3,
        length: tuple[int, int] = (12, 24),
        seed: int = 0,
        noise: float = 0.1,
    ):
        gen = torch.Generator().manual_seed(seed)
        self.hidden_size, self.vocab_size, self.n_aux = hidden_size, vocab_size, n_aux
        successors = torch.randint(0, vocab_size, (vocab_size, 4), generator=gen)
        aux_table = torch.randn(vocab_size, n_aux * hidden_size, generator=gen)
        last_table = torch.randn(vocab_size, hidden_size, generator=gen)
        self._head_weight = torch.randn(vocab_size, hidden_size, generator=gen) * (8.0 / hidden_size**0.5)
        self.embed_weight = torch.randn(vocab_size, hidden_size, generator=gen)
        self.rows: list[Row] = []
        for _ in range(n_samples):
            t = int(torch.randint(length[0], length[1] + 1, (1,), generator=gen))
            ids = torch.empty(t, dtype=torch.int64)
            ids[0] = torch.randint(0, vocab_size, (1,), generator=gen)
            choice = torch.randint(0, 4, (t,), generator=gen)
            for i in range(1, t):
                ids[i] = successors[ids[i - 1], choice[i]]
            start = int(torch.randint(1, max(2, t // 2), (1,), generator=gen))
            mask = torch.zeros(t, dtype=torch.bool)
            mask[start:] = True
            aux = aux_table[ids] + noise * torch.randn(t, n_aux * hidden_size, generator=gen)
            last = last_table[ids] + noise * torch.randn(t, hidden_size, generator=gen)
            self.rows.append({"input_ids": ids, "loss_mask": mask, "aux": aux, "last": last})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Row:
        return self.rows[i]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def target_head(self) -> nn.Module:
        head = nn.Linear(self.hidden_size, self.vocab_size, bias=False)
        with torch.no_grad():
            head.weight.copy_(self._head_weight)
        return head.requires_grad_(False)


def collate(rows: Sequence[Mapping[str, torch.Tensor]], pad_id: int = 0) -> Row:
    """Right-pad to the longest row; padding has ``loss_mask`` 0 and zero features."""
    if not rows:
        raise ValueError("empty batch")
    t = max(int(r["input_ids"].numel()) for r in rows)
    b = len(rows)
    ids = torch.full((b, t), pad_id, dtype=torch.int64)
    mask = torch.zeros(b, t, dtype=torch.bool)
    lengths = torch.zeros(b, dtype=torch.int64)
    out: Row = {}
    for key in ("aux", "last"):
        if key in rows[0]:
            ref = rows[0][key]
            out[key] = torch.zeros(b, t, ref.shape[-1], dtype=ref.dtype)
    for i, r in enumerate(rows):
        n = int(r["input_ids"].numel())
        ids[i, :n] = r["input_ids"]
        mask[i, :n] = r["loss_mask"]
        lengths[i] = n
        for key in out:
            out[key][i, :n] = r[key]
    out.update(input_ids=ids, loss_mask=mask, lengths=lengths)
    return out
