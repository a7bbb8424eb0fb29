"""draft_model with ``features: online`` on a real instance: launched on the corpus alone, no store written.

The corpus is a stand-in (two train shards of the tiny target's own greedy answers, written where the corpus asset
writes them): generation and tokenization are tested elsewhere, and online training reads only the shards.
"""

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
import torch

from eagle_assets.assets.draft import TINY_TARGET_TRAIN_CONFIG, draft_model, training_processes, training_run_config
from eagle_assets.errors import ConfigError
from eagle_assets.keys import CORPUS_KEY, CORPUS_SHARDS_NAME
from eagle_assets.layout import hidden_states_root, shard_file
from resources.target.resource import TargetModelResource
from resources.target.training_pipes import training_pipes_client
from sensors.training_sensor import build_training_sensor, features_mode

TRAIN = {"draft_vocab_size": 512, "max_steps": 6, "batch_size": 4, "ttt_steps": 3, "lr": 3e-3, "log_every": 2}
KEYS = ["train-00000", "train-00001"]


@dg.asset(key=CORPUS_KEY)
def standin_corpus(context: dg.AssetExecutionContext) -> None:
    """Random prompts and answers (the fidelity gate holds the stream to the target run on them, whatever they say)."""
    gen = torch.Generator().manual_seed(len(context.run.run_id))
    for key in KEYS:
        ids = [torch.randint(1000, 150_000, (int(n),), generator=gen).tolist() for n in torch.randint(16, 28, (8,))]
        path = shard_file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = {
            "prompt_id": [f"{key}-{i}" for i in range(len(ids))],
            "input_ids": ids,
            "loss_mask": [[0] * 10 + [1] * (len(x) - 10) for x in ids],
            "prompt_len": [10] * len(ids),
        }
        pl.DataFrame(rows).write_parquet(path)
    context.instance.add_dynamic_partitions(CORPUS_SHARDS_NAME, KEYS)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def test_the_sensor_launches_online_training_on_the_corpus_and_no_store_is_written(tmp_path, forge_home):
    online_config = {"ops": {"draft_model": {"config": {**TINY_TARGET_TRAIN_CONFIG, "features": "online"}}}}
    sensor = build_training_sensor(run_config=online_config)
    assert features_mode(online_config) == "online" and features_mode(training_run_config(True)) == "offline"
    with dg.instance_for_test() as instance:
        res = {"target": TargetModelResource(), "pipes_subprocess_client": training_pipes_client()}
        ctx = dg.build_sensor_context(instance=instance)
        assert "materialize the corpus" in sensor(ctx).skip_message
        assert dg.materialize([standin_corpus], instance=instance, resources=res).success

        # Online: the corpus is enough, no hidden states are waited for.
        first = sensor(ctx)
        assert isinstance(first, dg.SensorResult) and len(first.run_requests) == 1
        assert first.run_requests[0].run_config["ops"]["draft_model"]["config"]["features"] == "online"

        r = dg.materialize(
            [draft_model],
            instance=instance,
            resources=res,
            run_config={"ops": {"draft_model": {"config": {**TRAIN, "features": "online"}}}},
        )
        assert r.success
        md = r.asset_materializations_for_node("draft_model")[0].metadata
        assert md["features"].value == "online" and md["feature_bytes_written"].value == 0
        assert md["target_tokens_per_s"].value > 0 and md["draft_tokens_per_s"].value > 0
        assert md["steps"].value == 6 and md["train_samples"].value > 0
        assert set(md["online_fidelity"].value) == {"alignment", "aux_layers", "last_state_next_token"}
        assert tree_bytes(hidden_states_root()) == 0
        run_cfg = json.loads((Path(md["run_dir"].value) / "run.json").read_text())
        assert run_cfg["data"]["kind"] == "tokens" and run_cfg["data"]["backend"] == "hf"
        assert (latest := Path(md["export"].value)).is_dir() and (latest / "config.json").is_file()

        # Nothing new since the draft: skipped; a re-materialized corpus trains again.
        assert "trained after the current corpus" in sensor(ctx).skip_message
        assert dg.materialize([standin_corpus], instance=instance, resources=res).success
        again = sensor(ctx)
        assert isinstance(again, dg.SensorResult) and again.run_requests[0].run_key != first.run_requests[0].run_key


def test_online_vllm_features_under_torchrun_are_refused_before_anything_starts(tmp_path, forge_home):
    """Each rank would start a vLLM engine of the whole target: refused by name, one process or offline allowed."""
    assert training_processes(0, 0, "online", "vllm") == 1 and training_processes(1, 8, "online", "vllm") == 1
    assert training_processes(0, 8, "offline", "vllm") == 8 and training_processes(2, 0, "online", "hf") == 2
    with pytest.raises(ConfigError, match="nproc_per_node: 1"):
        training_processes(0, 8, "online", "vllm")
    with dg.instance_for_test() as instance:
        res = {"target": TargetModelResource(backend="vllm"), "pipes_subprocess_client": training_pipes_client()}
        assert dg.materialize([standin_corpus], instance=instance, resources=res).success
        r = dg.materialize(
            [draft_model],
            instance=instance,
            resources=res,
            run_config={"ops": {"draft_model": {"config": {**TRAIN, "features": "online", "nproc_per_node": 2}}}},
            raise_on_error=False,
        )
        assert not r.success
        failure = next(e for e in r.all_events if e.is_step_failure)
        assert "each torchrun rank would start a vLLM engine" in str(failure.step_failure_data.error)
        assert not (forge_home / "draft").exists()  # no run folder, no training process
