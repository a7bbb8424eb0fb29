"""What a generation partition keeps beside its Parquet for the steps after it: the providers the policy allowed
when its responses were bought (the checks and the corpus accept those and no other), and the provider's own
completion counts for a sample (what the tokenized partition compares its rebuilt counts with)."""

import json

from eagle_assets.durable_files import atomic_write_bytes
from eagle_assets.layout import allowed_providers_path, native_counts_path


def record_allowed_providers(dataset: str, shard: str, names: list[str]) -> list[str]:
    """Union over the runs that filled the partition: a response kept by an earlier run stays valid."""
    path = allowed_providers_path(dataset, shard)
    merged = sorted(set(names) | set(read_allowed_providers(dataset, shard)))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(merged) + "\n").encode())
    return merged


def read_allowed_providers(dataset: str, shard: str) -> list[str]:
    path = allowed_providers_path(dataset, shard)
    try:
        return list(json.loads(path.read_text()))
    except FileNotFoundError:
        return []


def read_native_counts(dataset: str, shard: str) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(native_counts_path(dataset, shard).read_text()).items()}
    except FileNotFoundError:
        return {}


def write_native_counts(dataset: str, shard: str, counts: dict[str, int]) -> None:
    atomic_write_bytes(native_counts_path(dataset, shard), (json.dumps(counts, sort_keys=True) + "\n").encode())
