"""Online training on the tiny target: the offline run's numbers without a store, the checks before step 1, resume.

Both modes train from ``train_cli`` run files on the same corpus (the tiny target's own greedy answers), seed and
data order; offline reads the HF extraction's bf16 store, online calls the same extraction function per batch.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle_assets.draft.train_cli import build, run
from eagle_assets.hidden_states.extract_hf import HFFeatureExtractor
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.online_features import online_stream
from eagle_assets.hidden_states.online_fidelity import OnlineFidelityError
from tests.hidden_states import online_runs
from tests.hidden_states.online_runs import (
    greedy_corpus,
    offline_data,
    online_data,
    run_config,
    write_rows,
    write_store,
)
from tests.hidden_states.test_fidelity import Shifted

ROOT = Path(__file__).resolve().parents[2]
STEPS = 50


@pytest.fixture(scope="module")
def corpus(tiny_model):
    return greedy_corpus(tiny_model, 16)


@pytest.fixture(scope="module")
def rows(tmp_path_factory, corpus):
    return write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl", corpus)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory, tiny_dir, tiny_model, corpus, rows):
    """The first 50 steps in both modes; the online run watched for feature bytes after every step."""
    work = tmp_path_factory.mktemp("modes")
    hidden_states = work / "hidden_states"  # where the offline store of this layout lives
    hidden_states.mkdir()
    store = write_store(hidden_states / "train-00000", tiny_model, corpus, (2, 3, 4))
    offline: list[float] = []
    run(
        run_config(tiny_dir, offline_data(store), work / "offline", steps=STEPS),
        on_step=lambda m: offline.append(m.loss),
    )
    shutil_rmtree(hidden_states)  # online has no store: the folder must stay empty
    hidden_states.mkdir()
    online: list[float] = []
    during: list[int] = []

    def watch(m):
        online.append(m.loss)
        during.append(tree_bytes(hidden_states))

    t0 = time.perf_counter()
    trainer = run(run_config(tiny_dir, online_data(rows), work / "online", steps=STEPS), on_step=watch)
    print(f"online {time.perf_counter() - t0:.1f}s")
    return {
        "offline": offline,
        "online": online,
        "during": during,
        "after": tree_bytes(hidden_states),
        "run": work / "online",
        "stats": trainer.stream.stats,
    }


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def test_online_and_offline_agree_on_the_first_50_losses(both_runs):
    assert len(both_runs["online"]) == len(both_runs["offline"]) == STEPS
    torch.testing.assert_close(
        torch.tensor(both_runs["online"]), torch.tensor(both_runs["offline"]), rtol=1e-5, atol=1e-6
    )
    assert both_runs["online"][-1] < both_runs["online"][0]  # it learns
    stats = both_runs["stats"]
    assert stats.tokens > 0 and stats.tokens_per_s > 0 and stats.gate_batches >= 1
    assert set(stats.extra["fidelity"]) == {"alignment", "aux_layers", "last_state_next_token"}


def test_an_online_run_writes_no_feature_store(both_runs):
    assert both_runs["during"] == [0] * STEPS and both_runs["after"] == 0
    run_dir = both_runs["run"]
    assert not list(run_dir.rglob("*.safetensors"))  # no features anywhere in the run (no export asked)
    assert tree_bytes(run_dir / "online-scratch") == 0  # the fidelity gate's few rows are gone


def wrong_layer_stream(spec, **kw):
    """The fidelity tests' wrong-layer producer: captured at (2, 3, 5), the run expects (2, 3, 4)."""
    wrong = HFFeatureExtractor(kw["model"], AuxLayers((2, 3, 5), 7), out_dtype=torch.bfloat16)
    return online_stream(spec, **kw, batch_fn=wrong)


def shifted_stream(spec, **kw):
    """The fidelity tests' off-by-one producer: the features of token t-1 at t."""
    shifted = Shifted(HFFeatureExtractor(kw["model"], AuxLayers((2, 3, 4), 7), out_dtype=torch.bfloat16))
    return online_stream(spec, **kw, batch_fn=shifted)


@pytest.mark.parametrize(
    ("producer", "phrases"),
    [
        ("wrong_layer_stream", ["aux_layers FAILED: ", "slot high claims layer 4 but is nearest to layer 5"]),
        ("shifted_stream", ["last_state_next_token FAILED: ", "top-1 agreement", "aux_layers FAILED: "]),
    ],
)
def test_a_broken_stream_stops_before_the_first_optimizer_step(tmp_path, tiny_dir, rows, producer, phrases):
    data = online_data(rows, stream=f"{__name__}:{producer}")
    trainer = build(run_config(tiny_dir, data, tmp_path / "run", steps=STEPS), torch.device("cpu"))
    with pytest.raises(OnlineFidelityError) as err:
        trainer.train()
    message = str(err.value)
    assert "before the first optimizer step" in message
    assert "hidden_states online shard-00000: " in message  # the offline checks' message shape, partition "online"
    for phrase in phrases:
        assert phrase in message, message
    assert trainer.global_step == 0 and not trainer.optimizer.state  # no step taken
    assert not (tmp_path / "run" / "checkpoints").exists()


def read_steps(log: Path) -> dict[int, dict]:
    """The last record of each step (a step redone after a resume replaces the killed run's)."""
    by_step: dict[int, dict] = {}
    for line in log.read_text().splitlines():
        if line.strip():
            m = json.loads(line)
            by_step[m["step"]] = m
    return by_step


def test_sigkill_mid_epoch_then_rerun_trains_every_sample_once_per_epoch(tmp_path, tiny_dir, rows, corpus):
    n = len(corpus)  # 16 rows, batch 2: 8 steps an epoch; 3 epochs; a checkpoint every 3 steps
    cfg = run_config(tiny_dir, online_data(rows), tmp_path / "run", steps=24, checkpoint_every=3)
    config_path = tmp_path / "run.json"
    config_path.write_text(json.dumps(cfg))
    log = tmp_path / "steps.jsonl"
    command = [sys.executable, "-m", "tests.hidden_states.online_runs", str(config_path), str(log)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([*command, "14"], cwd=ROOT, env=env)  # it waits after step 14 to be killed
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and max((json.loads(x)["step"] for x in log.read_text().splitlines() if x), default=0) >= 14:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-epoch 1 (steps 9-16), two steps after the checkpoint of step 12
    proc.wait()
    before = read_steps(log)
    killed_at = max(before)
    assert killed_at == 14
    # The rerun reads only what the killed process left on disk (run file, checkpoints, log), so it runs here
    # rather than in a second fresh interpreter (torch, transformers and the target loaded again: ~8 CPU s).
    assert online_runs.main([str(config_path), str(log)]) == 0
    lines = [json.loads(x) for x in log.read_text().splitlines() if x]
    resumed = [m for m in lines if m["pid"] != lines[0]["pid"]]
    assert resumed[0]["step"] == 13  # from the checkpoint of step 12, not from the start
    steps = read_steps(log)
    assert sorted(steps) == list(range(1, 25))
    for step in range(13, killed_at + 1):  # the same place in the same data order
        assert steps[step]["rows"] == before[step]["rows"]
    for epoch in range(3):
        trained = sorted(r for m in steps.values() if m["epoch"] == epoch for r in m["rows"])
        assert trained == list(range(n)), f"epoch {epoch}: {trained}"
