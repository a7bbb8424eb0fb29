"""The draft vocabulary: the N target ids the draft's ``lm_head`` can emit, and the maps to and from them.

A 163,840-wide ``lm_head`` would dominate the draft's cost, so EAGLE-3 keeps the N (typically 32,000) ids most
frequent among the loss-masked tokens. Both engines load ``d2t`` [N] int64 (``target_id = i + d2t[i]``) and ``t2d``
[V] bool (in the draft vocabulary or not; the trainer masks positions whose target top-1 is outside it). The kept
ids are sorted ascending, so ``t2d.nonzero()`` lists them in draft order.

With fewer distinct tokens than N, ranking by (count descending, id ascending) pads with the lowest unseen ids: the
map stays deterministic and full-size (the exported ``draft_vocab_size`` must equal the ``lm_head`` rows the engines
allocate), and the padded rows, never targets, are trained down. ``force_ids`` (the end-of-turn token) always stay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftVocab:
    """The draft → target id map; ``used[i]`` is the target id of draft id ``i``."""

    used: torch.Tensor  # [N] int64, strictly increasing
    target_vocab_size: int

    def __post_init__(self) -> None:
        used = self.used
        if used.dtype != torch.int64 or used.ndim != 1 or used.numel() == 0:
            raise ValueError("used must be a non-empty 1-D int64 tensor")
        if used.numel() > 1 and not bool((used[1:] > used[:-1]).all()):
            raise ValueError("draft vocabulary ids must be strictly increasing")
        if int(used[0]) < 0 or int(used[-1]) >= self.target_vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in [0, {self.target_vocab_size})")

    @property
    def size(self) -> int:
        return int(self.used.numel())

    @property
    def d2t(self) -> torch.Tensor:
        return self.used - torch.arange(self.size, dtype=torch.int64)

    @property
    def t2d(self) -> torch.Tensor:
        mask = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        mask[self.used] = True
        return mask

    @classmethod
    def identity(cls, draft_vocab_size: int, target_vocab_size: int) -> DraftVocab:
        """Ids ``0..N-1``: the map a freshly built model carries before a real one is set."""
        return cls(torch.arange(draft_vocab_size, dtype=torch.int64), target_vocab_size)

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, target_vocab_size: int) -> DraftVocab:
        d2t = d2t.to(torch.int64)
        return cls(d2t + torch.arange(d2t.numel(), dtype=torch.int64), target_vocab_size)


def count_tokens(samples: Iterable[Mapping[str, object]], target_vocab_size: int) -> torch.Tensor:
    """Frequency of each target id over loss-masked positions (int64 [V])."""
    counts = torch.zeros(target_vocab_size, dtype=torch.int64)
    for sample in samples:
        ids = torch.as_tensor(sample["input_ids"], dtype=torch.int64).reshape(-1)
        mask = torch.as_tensor(sample["loss_mask"]).reshape(-1).to(torch.bool)
        if ids.shape != mask.shape:
            raise ValueError(f"input_ids {tuple(ids.shape)} and loss_mask {tuple(mask.shape)} differ")
        picked = ids[mask]
        if picked.numel() and (int(picked.min()) < 0 or int(picked.max()) >= target_vocab_size):
            raise ValueError(f"token id outside [0, {target_vocab_size})")
        counts += torch.bincount(picked, minlength=target_vocab_size)
    return counts


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int, force_ids: Sequence[int] = ()) -> DraftVocab:
    """Top-N ids by count (ties and padding: lowest id first), plus ``force_ids``, sorted ascending."""
    counts = torch.as_tensor(counts, dtype=torch.int64).reshape(-1)
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab_size}], got {draft_vocab_size}")
    forced = sorted({int(i) for i in force_ids})
    if len(forced) > draft_vocab_size:
        raise ValueError("more forced ids than draft vocabulary slots")
    if forced and (forced[0] < 0 or forced[-1] >= vocab_size):
        raise ValueError("forced id outside the target vocabulary")
    # A stable descending sort keeps equal counts in ascending id order: zero-count ids pad by lowest id.
    order = torch.sort(counts, descending=True, stable=True).indices
    if forced:
        is_forced = torch.zeros(vocab_size, dtype=torch.bool)
        is_forced[torch.tensor(forced)] = True
        order = torch.cat([torch.tensor(forced, dtype=torch.int64), order[~is_forced[order]]])
    used = torch.sort(order[:draft_vocab_size]).values
    return DraftVocab(used, vocab_size)


def vocab_from_samples(
    samples: Iterable[Mapping[str, object]],
    target_vocab_size: int,
    draft_vocab_size: int,
    force_ids: Sequence[int] = (),
) -> DraftVocab:
    return build_draft_vocab(count_tokens(samples, target_vocab_size), draft_vocab_size, force_ids)
