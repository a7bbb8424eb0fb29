"""Reading a large ShareGPT-format set the way the generation asset does, at 100k and 1M rows.

Writes a synthetic ShareGPT JSONL file of 1M conversations (and its first 100k rows as a second
file), declares it in a ``datasets.yaml`` (``regenerate: every_turn``, 1,000 rows per shard), then, in
a fresh process per measurement and with a fresh ``$EAGLE_FORGE_HOME`` per file, times and measures
the peak RSS of, in this order:

- ``keys cold``: ``spec.shard_keys()`` with nothing cached: resolving the source and counting its rows
  (what listing the partitions costs when the definitions load the first time);
- ``keys cached``: the same once the row count is on disk (every later definitions load);
- ``partition cold``: ``partition_inputs(spec, "0000")`` for the first partition: format detection, the
  whole-set scan (bad rows, repeated ids, turns) and reading shard 0000 in the shuffled asking order;
- ``partition cached``: the same for a second partition, the scan read from its cache.

Peak RSS is printed against the same process's RSS after its imports (the baseline), so the figure is
what the step added. The goal is that it does not grow with the file; the one part that does is the
whole-set scan's repeated-id check, 20 bytes per usable row while reading and about 37 at its peak (the
hashes sorted), paid once per source by the cold partition.

    python benchmarks/bench_datasets.py                 # 100k and 1M rows
    python benchmarks/bench_datasets.py --rows 200000 --compress zst --work /tmp/bench-sets
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but").split(" ")  # noqa: SIM905


def write_set(path: Path, rows: int, compress: str | None) -> None:
    import zstandard

    raw = path.open("wb")
    out = zstandard.ZstdCompressor(level=3).stream_writer(raw) if compress == "zst" else raw
    try:
        for i in range(rows):
            text = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12 + i % 20))
            row = {
                "id": f"sg{i:07d}",
                "conversations": [
                    {"from": "human", "value": f"Question {i}: {text}?"},
                    {"from": "gpt", "value": f"An answer of the set about {text}."},
                    {"from": "human", "value": "Please go on."},
                    {"from": "gpt", "value": "More of the set's answer."},
                ],
            }
            out.write(orjson.dumps(row) + b"\n")
    finally:
        out.close()


_CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
config, what = Path(sys.argv[1]), sys.argv[2]
from eagle_assets.datasets.config import load_datasets
from eagle_assets.generation.partition_inputs import partition_inputs
from eagle_assets.layout import dataset_cache_dir
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
spec = load_datasets(config)["SG"]
if what == "keys":
    out = {"shards": len(spec.shard_keys())}
else:
    inputs = partition_inputs(spec, sys.argv[3], dataset_cache_dir())
    out = {
        "rows": inputs.scan.rows,
        "scan_cached": inputs.scan_was_cached,
        "conversations": len(inputs.shard.conversations),
        "requests": inputs.requests,
    }
out["seconds"] = time.perf_counter() - t0
out["baseline_mb"] = base / 1024
out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""

SHARD_SIZE = 1000
STEPS: tuple[tuple[str, str, str], ...] = (
    ("keys cold", "keys", ""),
    ("keys cached", "keys", ""),
    ("partition cold", "partition", "0000"),
)
STEPS += (("partition cached", "partition", "0001"),)


def measure(config: Path, home: Path, what: str, shard: str) -> dict:
    env = {**os.environ, "EAGLE_FORGE_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(config), what, shard],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} {shard} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def declare(work: Path, data: Path) -> tuple[Path, Path]:
    """A datasets.yaml naming ``data`` and an empty home for it (so the first steps are cold)."""
    home = work / f"home-{data.name}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    config = home / "datasets.yaml"
    config.write_text(f"datasets:\n  SG: {{path: {data}, regenerate: every_turn, shard_size: {SHARD_SIZE}}}\n")
    return config, home


def report(n: int, step: str, r: dict) -> None:
    added = r["peak_mb"] - r["baseline_mb"]
    if "shards" in r:
        extra = f"{r['shards']:,} shards"
    else:
        cached = "scan cached" if r["scan_cached"] else "scan done"
        extra = f"{cached}, {r['conversations']} conversations / {r['requests']} turns"
    print(
        f"{n:>9,} rows  {step:<16} {r['seconds']:7.2f}s  peak RSS {r['peak_mb']:6.0f} MB"
        f" (+{added:4.0f} MB over the {r['baseline_mb']:.0f} MB after imports)  {extra}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the large file (the small one is 1/10)")
    ap.add_argument("--compress", choices=["none", "zst"], default="none")
    ap.add_argument("--work", type=Path, default=None, help="folder for the files (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-datasets-"))  # removed at the end unless --work
    work.mkdir(parents=True, exist_ok=True)
    suffix = ".jsonl.zst" if args.compress == "zst" else ".jsonl"
    sizes = [args.rows // 10, args.rows]
    files = {}
    for n in sizes:
        path = work / f"sharegpt-{n}{suffix}"
        if not path.exists():
            t0 = time.perf_counter()
            write_set(path, n, None if args.compress == "none" else args.compress)
            print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f}s", flush=True)
        files[n] = path
    results: dict[tuple[int, str], dict] = {}
    for n in sizes:
        config, home = declare(work, files[n])
        for step, what, shard in STEPS:
            r = results[(n, step)] = measure(config, home, what, shard)
            assert r["shards"] == -(-n // SHARD_SIZE) if what == "keys" else r["rows"] == n, r
            report(n, step, r)
    small, large = sizes
    for step, _, _ in STEPS:
        a, b = results[(small, step)], results[(large, step)]
        print(
            f"{step}: 10x the rows -> {b['seconds'] / max(a['seconds'], 1e-9):.1f}x the time,"
            f" {b['peak_mb'] - b['baseline_mb']:.0f} vs {a['peak_mb'] - a['baseline_mb']:.0f} MB added"
        )
    if args.work:
        print(f"files kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
