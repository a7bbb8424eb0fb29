"""Draft training throughput (tokens/s) on CPU for a small config: ``python benchmarks/bench_draft.py``.

Measures full optimizer steps (target head + 7-step TTT forward/backward + AdamW) on synthetic
offline features, after warm-up steps, so regressions in the TTT unroll or the loss show up without
a GPU. Tokens are real (unpadded) tokens of the global batch.

``--run-config RUN.json`` times the steps of a real run instead (a ``draft_model`` run file, e.g. the demo's
``draft/runs/<id>/run.json``: its store, its target's head over the full vocabulary, its prompts and padding,
which synthetic rows do not have), without checkpoints or an export. Both print CPU seconds beside wall time:
on a shared machine tokens per CPU-second is the figure to compare between two trees.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_assets.draft.data import SyntheticDataset
from eagle_assets.draft.model import Eagle3Config, Eagle3Draft
from eagle_assets.draft.train import TrainConfig, Trainer
from eagle_assets.draft.vocab import vocab_from_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--draft-vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--attn", default="eager", choices=("eager", "sdpa"))
    parser.add_argument("--run-config", help="time a real run file's steps (its data and head) instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.run_config:
        time_run_file(args.run_config, args.steps, args.warmup, args.threads)
        return

    heads = max(1, args.hidden // 32)
    config = Eagle3Config(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_heads=heads,
        num_kv_heads=max(1, heads // 2),
        head_dim=args.hidden // heads,
        target_vocab_size=args.vocab,
        draft_vocab_size=args.draft_vocab,
        aux_layer_ids=(2, 4, 6),
    )
    n_rows = args.batch * (args.steps + args.warmup)
    data = SyntheticDataset(n_rows, hidden_size=args.hidden, vocab_size=args.vocab, length=(args.seq, args.seq), seed=0)
    torch.manual_seed(0)
    model = Eagle3Draft(config, data.embed_weight)
    model.set_vocab(vocab_from_samples(data, args.vocab, args.draft_vocab))
    cfg = TrainConfig(batch_size=args.batch, ttt_steps=args.ttt_steps, epochs=1, attn_impl=args.attn, shuffle=False)
    trainer = Trainer(model, data, data.target_head(), cfg, device="cpu")
    for _ in range(args.warmup):
        trainer.train_step()
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(
        f"draft train CPU: H={args.hidden} V={args.vocab} N={args.draft_vocab} T={args.seq} B={args.batch} "
        f"K={args.ttt_steps} threads={args.threads} attn={args.attn} trainable={params / 1e6:.2f}M"
    )
    report(trainer, args.steps)


def time_run_file(path: str, steps: int, warmup: int, threads: int) -> None:
    import json

    from eagle_assets.draft.train_cli import build

    cfg = json.loads(Path(path).read_text())
    cfg.update(output_dir=None, export=None)
    cfg["train"] = {**cfg.get("train", {}), "checkpoint_every": 0}
    trainer = build(cfg, device=torch.device("cpu"))
    for _ in range(warmup):
        trainer.train_step()
    print(f"draft train CPU: {path} ({len(trainer.dataset)} rows), threads={threads}")
    report(trainer, steps)


def report(trainer: Trainer, steps: int) -> None:
    rates, times, tokens = [], [], 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        m = trainer.train_step()
        rates.append(m.tokens_per_s)
        times.append(m.seconds)
        tokens += m.tokens
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"  {steps} steps in {wall:.2f}s: median {statistics.median(rates):.0f} tokens/s "
        f"(min {min(rates):.0f}, max {max(rates):.0f}); median step {1000 * statistics.median(times):.1f} ms; "
        f"{tokens / cpu:.0f} tokens per CPU-second"
    )


if __name__ == "__main__":
    main()
