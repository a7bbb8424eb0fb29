"""Offline vs online draft training side by side on the tiny target: ``python benchmarks/bench_online.py``.

Same corpus, seed, data order and hyperparameters in both modes. Offline extracts the corpus into a bf16 store
(the ``hidden_states`` asset's HF path) and trains from it; online trains from the token rows while the target
computes each batch's features (the same extraction function, prefetched, the fidelity checks on the first rows).
Each mode runs in its own process so that its peak memory is its own. Printed: the per-step loss of the first 50
steps in both modes and their largest difference, τ after training (greedy speculative decoding of held-out
prompts against the target, 4 draft tokens), wall time, peak feature bytes on disk and peak resident memory.

The corpus is the demo's train split (``corpus/train/shard-*.parquet`` under the forge home) when it is there,
else the tiny target's own greedy answers to random prompts (the kind of data the demo's simulator serves).
``--device cuda`` runs both modes on a GPU (``scripts/device_check.py`` does).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle_assets.target.tiny import build_tiny_target, load_target  # noqa: E402

LAYERS = [2, 3, 4]  # the tiny target's 7 layers: the reference default [2, N//2, N-3]


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def demo_rows() -> list[dict[str, list[int]]]:
    import polars as pl

    from eagle_assets.layout import corpus_split_dir

    files = sorted(corpus_split_dir("train").glob("shard-*.parquet"))
    rows: list[dict[str, list[int]]] = []
    for f in files:
        frame = pl.read_parquet(f, columns=["input_ids", "loss_mask"])
        rows += [{"input_ids": list(i), "loss_mask": list(m)} for i, m in frame.iter_rows()]
    return rows


@torch.inference_mode()
def synthetic_rows(model: Any, n: int, seed: int = 3, prompt: int = 12, answer: int = 40) -> list[dict[str, list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1000, 150_000, (n, prompt), generator=gen)
    full = model.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=answer,
        min_new_tokens=answer,
        do_sample=False,
        pad_token_id=0,
    )
    return [{"input_ids": row, "loss_mask": [0] * prompt + [1] * answer} for row in full.tolist()]


def run_config(target: Path, data: dict[str, Any], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "seed": 0,
        "target": {"path": str(target), "dtype": "float32" if args.device == "cpu" else "bfloat16"},
        "draft_vocab_size": 2048,
        "aux_layer_ids": LAYERS,
        "data": data,
        "train": {
            "lr": 5e-3,
            "batch_size": args.batch,
            "max_steps": args.steps,
            "ttt_steps": 5,
            "warmup_ratio": 0.05,
            "max_length": 512,
        },
        "output_dir": str(out),
        "log_every": 0,
    }


def one_mode(args: argparse.Namespace) -> dict[str, Any]:
    """One mode, in this process: (extraction +) training + τ; the figures as JSON."""
    from eagle_assets.draft.speculative import evaluate_acceptance
    from eagle_assets.draft.train_cli import run
    from eagle_assets.hidden_states.extract_hf import extract_hf

    torch.set_num_threads(args.threads)
    work, target = Path(args.work), Path(args.target)
    device = torch.device(args.device)
    rows = [json.loads(x) for x in (work / "rows.jsonl").read_text().splitlines()]
    hidden_states = work / "hidden_states"
    shutil.rmtree(hidden_states, ignore_errors=True)
    hidden_states.mkdir()
    started = time.perf_counter()
    extract_s = 0.0
    if args.mode == "offline":
        model = load_target(target, device, torch.float32 if args.device == "cpu" else torch.bfloat16)
        samples = [{"sample_id": f"r{i}", **r} for i, r in enumerate(rows)]
        extract_hf(model, {"train-00000": samples}, hidden_states / "train-00000", layers=LAYERS, dtype=torch.bfloat16)
        extract_s = time.perf_counter() - started
        del model
        data: dict[str, Any] = {"kind": "store", "path": str(hidden_states / "train-00000")}
    else:
        data = {"kind": "tokens", "path": str(work / "rows.jsonl")}
    losses: list[float] = []
    peak_disk = [tree_bytes(hidden_states)]

    def on_step(m: Any) -> None:
        losses.append(m.loss)
        if m.step % 10 == 1:
            peak_disk.append(tree_bytes(hidden_states))

    out = work / f"run-{args.mode}"
    shutil.rmtree(out, ignore_errors=True)
    trainer = run(run_config(target, data, out, args), device, on_step)
    train_s = time.perf_counter() - started - extract_s
    stats = trainer.stream.stats if trainer.stream is not None else None
    model = load_target(target, device, torch.float32 if args.device == "cpu" else torch.bfloat16)
    held_out = [r["input_ids"][:12] for r in json.loads((work / "held_out.json").read_text())]
    acceptance = evaluate_acceptance(model, trainer.model.eval(), held_out, args.new_tokens, num_draft_tokens=4)
    return {
        "mode": args.mode,
        "losses": losses,
        "tau": acceptance.tau,
        "extract_s": extract_s,
        "train_s": train_s,
        "wall_s": extract_s + train_s,
        "peak_feature_bytes": max(max(peak_disk), stats.extra.get("fidelity_scratch_bytes", 0) if stats else 0),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "target_tokens_per_s": stats.tokens_per_s if stats else None,
        "waited_for_target_s": stats.waited_s if stats else None,
        "samples": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in rows),
    }


def prepare(args: argparse.Namespace) -> Path:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target = build_tiny_target(work / "tiny-target", seed=0)
    rows = [] if args.synthetic else demo_rows()
    source = "the demo's train split"
    model = load_target(target, "cpu", torch.float32)
    if not rows:
        rows, source = synthetic_rows(model, args.samples), f"synthetic ({args.samples} greedy answers)"
    held_out = synthetic_rows(model, args.prompts, seed=99)
    (work / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "held_out.json").write_text(json.dumps(held_out))
    print(f"corpus: {source}, {len(rows)} samples, {sum(len(r['input_ids']) for r in rows)} tokens", flush=True)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=128, help="synthetic corpus size")
    parser.add_argument("--prompts", type=int, default=12, help="held-out prompts for τ")
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--synthetic", action="store_true", help="the synthetic corpus even if the demo's is there")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default="/tmp/eagle-forge-bench-online")
    parser.add_argument("--mode", choices=["offline", "online"], help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # a child: one mode
        print("RESULT " + json.dumps(one_mode(args)), flush=True)
        return 0
    target = prepare(args)
    results = {}
    for mode in ("offline", "online"):
        argv = [a for a in sys.argv[1:]]
        child = subprocess.run(
            [sys.executable, __file__, *argv, "--mode", mode, "--target", str(target)],
            check=True,
            capture_output=True,
            text=True,
        )
        line = next(x for x in child.stdout.splitlines() if x.startswith("RESULT "))
        results[mode] = json.loads(line.removeprefix("RESULT "))
    report(results)
    return 0


def report(results: dict[str, dict[str, Any]]) -> None:
    off, on = results["offline"], results["online"]
    print("step  loss offline  loss online  |diff|")
    for i, (a, b) in enumerate(zip(off["losses"][:50], on["losses"][:50], strict=True)):
        print(f"{i + 1:4d}  {a:12.6f}  {b:11.6f}  {abs(a - b):.2e}")
    diff = max(abs(a - b) for a, b in zip(off["losses"][:50], on["losses"][:50], strict=True))
    print(f"largest |loss difference| over the first 50 steps: {diff:.3e}")
    print(f"{'':28s}{'offline':>14s}{'online':>14s}")
    for what, key, fmt in (
        ("τ after training", "tau", "{:.3f}"),
        ("wall time (s)", "wall_s", "{:.1f}"),
        ("  of which extraction (s)", "extract_s", "{:.1f}"),
        ("peak feature bytes on disk", "peak_feature_bytes", "{:,}"),
        ("peak resident memory (MiB)", "peak_rss_mib", "{:.0f}"),
        ("target tokens/s (online)", "target_tokens_per_s", "{:.0f}"),
    ):
        cells = ["-" if r[key] is None else fmt.format(r[key]) for r in (off, on)]
        print(f"{what:28s}{cells[0]:>14s}{cells[1]:>14s}")
    print(f"τ online - offline: {on['tau'] - off['tau']:+.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
