"""A persistent Dagster instance under the eagle-forge home, configured the way this pipeline needs.

Run monitoring frees the slots of cancelled runs (otherwise a pool of 1 deadlocks), and the pools
keep generation and GPU work from oversubscribing what they share.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance

from eagle_assets.keys import GPU_POOL
from eagle_assets.layout import dagster_home

DAGSTER_YAML = """\
run_monitoring:
  enabled: true
  free_slots_after_run_end_seconds: 300
concurrency:
  pools:
    granularity: op
    default_limit: 8
telemetry:
  enabled: false
"""


def ensure_dagster_home() -> Path:
    """Set DAGSTER_HOME (unless the user did) and write a dagster.yaml once."""
    home = Path(os.environ.get("DAGSTER_HOME") or dagster_home())
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


POOL_LIMITS = {GPU_POOL: 1}  # one GPU step at a time per host: hidden states and training each want every GPU


def configure_pools(instance: "DagsterInstance") -> None:
    """Set the pool limits this pipeline needs unless someone set them (``dagster instance concurrency set``)."""
    storage = instance.event_log_storage
    known = set(storage.get_concurrency_keys())
    for pool, limit in POOL_LIMITS.items():
        if pool not in known:
            storage.set_concurrency_slots(pool, limit)
