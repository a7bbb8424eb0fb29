"""An online and an offline draft run of the tiny target on the same corpus, seed and data order (tests, benchmark).

``python -m tests.hidden_states.online_runs RUN_JSON LOG [STOP_AT]`` trains one run from its run file and appends,
after every optimizer step, the step, its epoch and the dataset rows it trained on to ``LOG`` (flushed and synced,
so that a SIGKILL loses nothing written): what the resume test counts. With ``STOP_AT`` it waits after that step
until it is killed, so the test kills it at a step it chose rather than wherever a timer finds it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from eagle_assets.hidden_states.extract_hf import extract_hf
from eagle_assets.hidden_states.samples import HiddenStateSample

KEY = "train-00000"


def greedy_corpus(model: Any, n: int, seed: int = 3, prompt: int = 10) -> list[HiddenStateSample]:
    """``n`` samples: a random prompt and a prefix of the target's greedy continuation (the demo's kind of data)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1000, 150_000, (n, prompt), generator=gen)
    with torch.inference_mode():
        full = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )
    r = random.Random(seed)
    out = []
    for i, row in enumerate(full.tolist()):
        ids = row[: prompt + r.randint(8, 16)]
        out.append(HiddenStateSample(f"p{i}", ids, [0] * prompt + [1] * (len(ids) - prompt)))
    return out


def write_rows(path: Path, samples: list[HiddenStateSample]) -> Path:
    path.write_text(
        "".join(json.dumps({"input_ids": list(s.input_ids), "loss_mask": list(s.loss_mask)}) + "\n" for s in samples)
    )
    return path


def write_store(directory: Path, model: Any, samples: list[HiddenStateSample], layers: tuple[int, ...]) -> Path:
    """The offline path: the HF extraction into a bf16 store (what ``hidden_states`` writes per shard)."""
    extract_hf(model, {KEY: samples}, directory, layers=layers, dtype=torch.bfloat16, max_tokens_per_batch=256)
    return directory


def run_config(target: Path, data: dict[str, Any], out: Path, *, steps: int, **train: Any) -> dict[str, Any]:
    return {
        "seed": 0,
        "target": {"path": str(target), "dtype": "float32"},
        "draft_vocab_size": 256,
        "aux_layer_ids": [2, 3, 4],
        "data": data,
        "train": {"lr": 2e-3, "batch_size": 2, "max_steps": steps, "ttt_steps": 3, "warmup_ratio": 0.0, **train},
        "output_dir": str(out),
        "log_every": 0,
    }


def offline_data(store: Path) -> dict[str, Any]:
    return {"kind": "store", "path": str(store)}


def online_data(rows: Path, **options: Any) -> dict[str, Any]:
    return {"kind": "tokens", "path": str(rows), **options}


def main(argv: list[str]) -> int:
    from eagle_assets.draft.train_cli import build, load_config

    torch.set_num_threads(1)
    cfg = load_config(argv[0])
    log = Path(argv[1])
    stop_at = int(argv[2]) if len(argv) > 2 else None
    trainer = build(cfg, torch.device("cpu"))
    inner = trainer.callback
    assert trainer.stream is not None

    def record(m: Any) -> None:
        if inner is not None:
            inner(m)
        last = trainer.stream.last if trainer.stream is not None else None
        rows = [i for micro in last.rows for i in micro] if last is not None else []
        with log.open("a") as f:
            f.write(json.dumps({"step": m.step, "epoch": m.epoch, "rows": rows, "pid": os.getpid()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        while m.step == stop_at:  # the SIGKILL comes here
            time.sleep(1.0)

    trainer.callback = record
    trainer.resume()
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
