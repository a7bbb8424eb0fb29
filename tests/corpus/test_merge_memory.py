"""The merge's memory does not grow with the data: measured, in a fresh process, by allocation peaks.

RSS is the wrong instrument at this size (allocator arenas and lazy imports move it by tens of MB),
so the child process reports the peak of Arrow's memory pool (every Parquet, IPC and compute buffer)
and of tracemalloc (Python and numpy). It merges a quarter of the data, then all of it: bounded
means the second peak is no higher than the first, and both far below the data held in memory. A
control (reading everything into one table) shows the instrument sees a full load.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from eagle_assets.corpus.tokenized_schema import write_tokenized
from tests.corpus.synthetic import synthetic_tokenized_table

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, sys, tracemalloc
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from eagle_assets.corpus.merge import MergeConfig, find_partitions, merge_corpus

root, out = Path(sys.argv[1]), Path(sys.argv[2])
paths = find_partitions(root)
cfg = MergeConfig(eval_fraction=0.02, max_tokens_per_shard=50_000, batch_rows=16)
pool = pa.default_memory_pool()

def measure(tag, sources):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    merge_corpus(sources, out / tag, cfg)
    py = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    return {"arrow": pool.max_memory(), "python": py, "rss_growth": grown * 1024}

report = {"quarter": measure("quarter", paths[: len(paths) // 4]), "full": measure("full", paths)}
pa.concat_tables([pq.read_table(p) for p in paths])
report["control_arrow"] = pool.max_memory()
print(json.dumps(report))
"""


def test_merge_memory_is_bounded(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    tokens = 0
    for d in range(1, 9):
        for s in range(2):
            table = synthetic_tokenized_table(rng, 80, dataset=f"B{d}", shard=f"{s:05d}")
            tokens += sum(table["n_tokens"].to_pylist())
            write_tokenized(tmp_path / "tokenized" / f"B{d}" / f"{s:05d}.parquet", table, row_group_tokens=50_000)
    data_bytes = tokens * 5  # int32 id + uint8 mask per token, as Arrow holds them
    assert tokens > 1_500_000

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "tokenized"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    report = json.loads(child.stdout.strip().splitlines()[-1])
    quarter, full = report["quarter"], report["full"]
    # The instrument sees a full load...
    assert report["control_arrow"] >= data_bytes
    # ...and the merge never comes near one: bounded by row groups and one 50k-token shard.
    assert full["arrow"] + full["python"] < data_bytes / 2, report
    # Four times the data, no more memory (a load-everything merge would need four times as much).
    assert full["arrow"] <= 1.25 * quarter["arrow"] + 256 * 1024, report
    assert full["python"] <= 1.25 * quarter["python"] + 1024 * 1024, report
