"""Corpus throughput: DuckDB validation and the merge over a synthetic tokenized dataset (~60M tokens).

Writes 8 datasets × 4 shards of tokenized partitions (sample lengths log-normal in 200–8000 tokens,
see ``tests.corpus.synthetic``) into a temporary directory, then times:

- the tokenized validation suite (every check, each its own DuckDB connection and scan);
- the merge (dedup, shuffle, train/eval split, shards), and its rerun (skipped: index matches).

Printed per phase: tokens, seconds, tokens/s; at the end the process's peak RSS (ru_maxrss) and the
Arrow pool's peak. The directory is deleted afterwards unless ``--keep``.

    python benchmarks/bench_corpus.py                    # ~60M tokens (~0.4 GB on disk, twice during the merge)
    python benchmarks/bench_corpus.py --tokens 2000000   # smoke run
"""

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.corpus import validation as v  # noqa: E402
from eagle_assets.corpus.merge import MergeConfig, find_partitions, merge_corpus  # noqa: E402
from eagle_assets.corpus.tokenized_schema import write_tokenized  # noqa: E402
from tests.corpus.synthetic import synthetic_lengths, synthetic_tokenized_table  # noqa: E402

PROVIDER = "moonshotai"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dir_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def _line(name: str, tokens: int, seconds: float, extra: str = "") -> None:
    rate = tokens / seconds if seconds > 0 else float("inf")
    print(f"{name:<28} {tokens:>12,} tokens {seconds:8.2f} s {rate / 1e6:8.2f} M tokens/s  {extra}", flush=True)


def write_dataset(root: Path, tokens: int, datasets: int, shards: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    per_partition = tokens // (datasets * shards)
    total = 0
    for d in range(1, datasets + 1):
        for s in range(shards):
            lengths = synthetic_lengths(rng, max(1, int(per_partition / 1000)))
            while lengths.sum() < per_partition:
                lengths = np.concatenate([lengths, synthetic_lengths(rng, max(1, len(lengths) // 4))])
            lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), per_partition)) + 1]
            table = synthetic_tokenized_table(
                rng, len(lengths), dataset=f"B{d}", shard=f"{s:05d}", lengths=lengths, provider=PROVIDER
            )
            write_tokenized(root / f"B{d}" / f"{s:05d}.parquet", table)
            total += int(lengths.sum())
            del table
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=60_000_000)
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--shards", type=int, default=4, help="partitions per dataset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads")
    ap.add_argument("--memory-limit", default="2GB", help="DuckDB memory_limit")
    ap.add_argument("--shard-tokens", type=int, default=16_000_000, help="merge: max tokens per output shard")
    ap.add_argument("--dir", type=Path, default=None, help="parent of the temporary directory")
    ap.add_argument("--keep", action="store_true", help="leave the data behind")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-corpus-", dir=args.dir))
    try:
        tokenized = work / "tokenized"
        t0 = time.perf_counter()
        tokens = write_dataset(tokenized, args.tokens, args.datasets, args.shards, args.seed)
        paths = find_partitions(tokenized, [f"B{d}" for d in range(1, args.datasets + 1)])
        _line(
            "write synthetic partitions",
            tokens,
            time.perf_counter() - t0,
            f"{len(paths)} files, {_dir_mib(tokenized):.0f} MiB, peak RSS {_rss_mib():.0f} MiB",
        )

        settings = v.DuckDBSettings(threads=args.threads, memory_limit=args.memory_limit)
        source = str(tokenized / "*" / "*.parquet")
        suite = time.perf_counter()
        checks = [
            ("unique_prompt_ids", lambda: v.check_unique_prompt_ids(source, settings)),
            ("allowed_providers", lambda: v.check_allowed_providers(source, {PROVIDER}, settings)),
            ("finish_reasons", lambda: v.check_finish_reasons(source, settings=settings)),
            ("token_layout", lambda: v.check_token_layout(source, settings)),
            ("end_of_turn", lambda: v.check_end_of_turn(source, settings=settings)),
            ("token_diff", lambda: v.check_token_diff(source, settings=settings)),
            ("length_distribution", lambda: v.length_distribution(source, settings)),
        ]
        for name, run in checks:
            t = time.perf_counter()
            outcome = run()
            status = "pass" if outcome.passed else "FAIL"
            _line(f"  check {name}", tokens, time.perf_counter() - t, f"{status}: {outcome.summary[:70]}")
        _line("validation suite", tokens, time.perf_counter() - suite, f"peak RSS {_rss_mib():.0f} MiB")

        out = work / "corpus"
        config = MergeConfig(seed=args.seed, max_tokens_per_shard=args.shard_tokens)
        t = time.perf_counter()
        result = merge_corpus(paths, out, config)
        c = result.index["counts"]
        _line(
            "merge",
            tokens,
            time.perf_counter() - t,
            f"{c['samples']:,} samples, "
            f"{len(result.shards('train'))}+{len(result.shards('eval'))} shards, {_dir_mib(out):.0f} MiB, "
            f"peak RSS {_rss_mib():.0f} MiB",
        )
        t = time.perf_counter()
        again = merge_corpus(paths, out, config)
        _line(
            "merge rerun (skipped)" if again.skipped else "merge rerun (NOT skipped)", tokens, time.perf_counter() - t
        )
        print(
            f"peak RSS (ru_maxrss) {_rss_mib():.0f} MiB; Arrow pool peak "
            f"{pa.default_memory_pool().max_memory() / 2**20:.0f} MiB; data as Arrow ~{tokens * 5 / 2**20:.0f} MiB"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
