"""Two gloo processes under torchrun must train like one process holding the same global batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_assets.draft.train import latest_checkpoint
from eagle_assets.draft.train_cli import run
from tests.draft.helpers import small_config

REPO = Path(__file__).resolve().parents[2]


def _config(out: Path, batch_size: int) -> dict:
    return {
        "seed": 0,
        "model": small_config().to_dict(),
        "data": {"kind": "synthetic", "n_samples": 24, "length": [8, 14], "seed": 5},
        "vocab": {"kind": "from_data"},
        "train": {"lr": 3e-3, "batch_size": batch_size, "epochs": 2, "ttt_steps": 3, "warmup_ratio": 0.1},
        "output_dir": str(out),
        "export": {"dtype": "float32"},
        "log_every": 0,
    }


@pytest.mark.slow
def test_torchrun_two_gloo_processes_match_single_process(tmp_path):
    cfg_path = tmp_path / "ddp.json"
    cfg_path.write_text(json.dumps(_config(tmp_path / "ddp", batch_size=2)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "eagle_assets.draft.train_cli",
        "--config",
        str(cfg_path),
        "--backend",
        "gloo",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    single = run(_config(tmp_path / "single", batch_size=4), device=torch.device("cpu"))
    assert single.global_step == 12

    ddp_ckpt = torch.load(latest_checkpoint(tmp_path / "ddp" / "checkpoints"), weights_only=True)
    assert ddp_ckpt["global_step"] == 12 and ddp_ckpt["world_size"] == 2 and len(ddp_ckpt["rng"]) == 2
    for name, p in single.model.checkpoint_state_dict().items():
        torch.testing.assert_close(ddp_ckpt["model"][name], p, rtol=0, atol=2e-6, msg=name)  # measured 1.2e-7
    ddp_metrics = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    single_metrics = [json.loads(line) for line in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    assert len(ddp_metrics) == len(single_metrics) == 12
    for a, b in zip(ddp_metrics, single_metrics, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["tokens"] == b["tokens"]
        assert a["acc"] == pytest.approx(b["acc"], abs=1e-9)  # global counts: identical unless a tie flips
    assert (tmp_path / "ddp" / "export" / "model.safetensors").is_file()
