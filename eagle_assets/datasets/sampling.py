"""The order prompts are taken in: a seeded shuffle of the whole set, computed without holding it.

A token target (10M output tokens) usually ends a dataset part-way. Shards cut from the file's own
order would then buy the file's first rows, which in most published sets are grouped by source or
topic. Shard ``k`` is therefore positions ``k·size … (k+1)·size`` of a pseudo-random permutation of
the row indices, and a shard is asked in that order too: whatever the target stops at is a uniform
sample of the set.

The permutation is a keyed Feistel network on the smallest even power of two that covers the row
count, walked in cycles until it lands inside it (a bijection on ``0 … n-1``). Position → row costs
a few hashes and no memory, so a shard of a 1M-row set is found without a 1M-entry array.
"""

import hashlib
from dataclasses import dataclass

ORDERS = ("shuffled", "file")
_ROUNDS = 4


@dataclass(frozen=True)
class RowOrder:
    """``row(position)``: which row of an ``n``-row set comes at ``position``."""

    n: int
    seed: int = 0
    shuffled: bool = True

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")
        bits = max(2, (max(self.n - 1, 1)).bit_length())
        object.__setattr__(self, "_half", (bits + 1) // 2)
        object.__setattr__(self, "_keys", [self._key(r) for r in range(_ROUNDS)])

    def _key(self, r: int) -> bytes:
        return hashlib.blake2b(f"eagle-forge-order:{self.seed}:{r}".encode(), digest_size=16).digest()

    def _round(self, r: int, value: int) -> int:
        # _keys and _half: set once by __post_init__ (frozen), kept out of the dataclass's fields, eq and repr.
        h = hashlib.blake2b(value.to_bytes(8, "little"), digest_size=8, key=self._keys[r])  # type: ignore[attr-defined]
        return int.from_bytes(h.digest(), "little")

    def _permute(self, x: int) -> int:
        half: int = self._half  # type: ignore[attr-defined]  # see _round
        mask = (1 << half) - 1
        left, right = x >> half, x & mask
        for r in range(_ROUNDS):
            left, right = right, left ^ (self._round(r, right) & mask)
        return (left << half) | right

    def row(self, position: int) -> int:
        if not 0 <= position < self.n:
            raise IndexError(f"position {position} outside 0..{self.n - 1}")
        if not self.shuffled:
            return position
        x = self._permute(position)
        while x >= self.n:  # cycle walking: the domain is at most 4n, so this ends after a few steps
            x = self._permute(x)
        return x

    def shard_rows(self, shard: int, size: int) -> list[int]:
        """The rows of shard ``shard`` (shards of ``size``), in the order they are asked."""
        lo = shard * size
        return [self.row(p) for p in range(lo, min(lo + size, self.n))]


def shard_count(rows: int, size: int) -> int:
    return max(1, -(-rows // size))
