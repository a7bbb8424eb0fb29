"""The corpus shards as the instance's dynamic partitions (those of ``hidden_states``), kept and read back.

The corpus asset makes the partitions exactly its shards; the draft asset and the training sensor read the
train split's back. Here so that neither imports the other's module (keys: ``keys.CORPUS_SHARDS_NAME``; the
shard of a partition key: ``layout.shard_file``).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eagle_assets.keys import CORPUS_SHARDS_NAME

if TYPE_CHECKING:
    from dagster import DagsterInstance

TRAIN_PREFIX = "train-"  # ``layout.shard_partition_key`` of a shard of the train split


def sync_shard_partitions(instance: "DagsterInstance", keys: Sequence[str]) -> None:
    """Make the hidden-state partitions exactly the corpus shards (a re-merge may change their number)."""
    current = set(instance.get_dynamic_partitions(CORPUS_SHARDS_NAME))
    new = [k for k in keys if k not in current]
    if new:
        instance.add_dynamic_partitions(CORPUS_SHARDS_NAME, new)
    for stale in sorted(current - set(keys)):
        instance.delete_dynamic_partition(CORPUS_SHARDS_NAME, stale)


def train_partitions(instance: "DagsterInstance") -> list[str]:
    """The hidden-state partitions of the train split, sorted: what the draft trains on."""
    return sorted(k for k in instance.get_dynamic_partitions(CORPUS_SHARDS_NAME) if k.startswith(TRAIN_PREFIX))
