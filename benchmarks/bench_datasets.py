"""Reading a large ShareGPT-format set: sharding (row count) and the first shard, at 100k and 1M rows.

Writes a synthetic ShareGPT JSONL file of 1M conversations (and its first 100k rows as a second
file), then, in a fresh process per measurement, times and measures the peak RSS of:

- ``shard keys``: resolving the source and counting its rows (what listing the partitions costs);
- ``first shard``: reading shard 0000 (1,000 rows, in the shuffled asking order, ``every_turn``);
- ``scan`` (``--scan``): the whole-set validation pass done once before anything is bought.

Peak RSS is printed against the same process's RSS after its imports (the baseline), so the figure
is what reading the set added; the goal is that it does not grow with the file.

    python benchmarks/bench_datasets.py                 # 100k and 1M rows
    python benchmarks/bench_datasets.py --rows 200000 --scan --compress zst
"""

import argparse
import json
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
import json, resource, sys, time
from pathlib import Path
path, what = Path(sys.argv[1]), sys.argv[2]
from eagle_assets.datasets.dataset_scan import scan_dataset
from eagle_assets.datasets.formats import detect_format
from eagle_assets.datasets.sampling import RowOrder
from eagle_assets.datasets.shard_reader import read_shard
from eagle_assets.datasets.sources import SourceSpec, resolve_source
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
source = resolve_source(SourceSpec.parse(str(path)))
rows = source.count_rows()
out = {"rows": rows}
if what == "shard":
    fmt = detect_format(*source.columns())
    contents = read_shard(source, fmt, RowOrder(rows), 0, 1000, "every_turn")
    out["conversations"] = len(contents.conversations)
    out["turns"] = sum(c.turn_count for c in contents.conversations)
elif what == "scan":
    fmt = detect_format(*source.columns())
    summary = scan_dataset(source, fmt, "every_turn")
    out["usable"] = summary.usable
out["seconds"] = time.perf_counter() - t0
out["baseline_mb"] = base / 1024
out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def measure(path: Path, what: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), what], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the large file (the small one is 1/10)")
    ap.add_argument("--compress", choices=["none", "zst"], default="none")
    ap.add_argument("--scan", action="store_true", help="also time the whole-set scan (slow at 1M rows)")
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
    whats = ["keys", "shard"] + (["scan"] if args.scan else [])
    results: dict[tuple[int, str], dict] = {}
    for n in sizes:
        for what in whats:
            r = results[(n, what)] = measure(files[n], what)
            assert r["rows"] == n, r
            added = r["peak_mb"] - r["baseline_mb"]
            extra = f", {r['conversations']} conversations / {r['turns']} turns" if what == "shard" else ""
            print(
                f"{n:>9,} rows  {what:<6} {r['seconds']:7.2f}s  peak RSS {r['peak_mb']:6.0f} MB"
                f" (+{added:.0f} MB over the {r['baseline_mb']:.0f} MB after imports){extra}",
                flush=True,
            )
    small, large = sizes
    for what in whats:
        a, b = results[(small, what)], results[(large, what)]
        print(
            f"{what}: 10x the rows -> {b['seconds'] / max(a['seconds'], 1e-9):.1f}x the time,"
            f" {b['peak_mb'] / a['peak_mb']:.2f}x the peak RSS"
            f" ({b['peak_mb'] - b['baseline_mb']:.0f} vs {a['peak_mb'] - a['baseline_mb']:.0f} MB added)"
        )
    if args.work:
        print(f"files kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
