"""Draft training through Dagster Pipes, the acceptance benchmark, and the training sensor, on a real instance."""

import json
from pathlib import Path

import dagster as dg
import pytest
import torch

from eagle_assets.assets.corpus import build_corpus_asset
from eagle_assets.assets.draft import TINY_TARGET_TRAIN_CONFIG, draft_benchmark, draft_model, training_run_config
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.hidden_states import hidden_states
from eagle_assets.assets.tokens import build_tokenized_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.draft.checkpoint import latest_checkpoint
from eagle_assets.keys import BENCHMARK_KEY, DRAFT_KEY
from eagle_assets.layout import latest_export_dir
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.simulator.config import LatencyConfig, SimulatorConfig
from sensors.training_sensor import build_training_sensor
from tests.draft.engine_loaders import check_export
from tests.generation.test_dagster_generation import write_prompts
from tests.pipeline.conftest import pipeline_resources
from tests.simulator.harness import run_simulator_in_thread

TRAIN = {"draft_vocab_size": 512, "max_steps": 12, "batch_size": 4, "ttt_steps": 3, "lr": 3e-3, "log_every": 4}


@pytest.mark.slow
def test_sensor_trains_and_benchmarks_the_draft(tmp_path, forge_home):
    spec = DatasetSpec("D1", write_prompts(tmp_path / "d1.jsonl", 24, tag="d"), 10**9, 12)
    gen = build_generated_asset(spec)
    tok = build_tokenized_asset(spec, gen.partitions_def)
    corpus = build_corpus_asset([spec])
    sensor = build_training_sensor(run_config=training_run_config(tiny_target=True))
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.002), mean_completion_tokens=30, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = pipeline_resources(sim.base_url, max_tokens=32)
        for shard in spec.shard_keys():
            assert dg.materialize([gen, tok], partition_key=shard, instance=instance, resources=res).success
        run_config = {"ops": {"corpus": {"config": {"max_samples_per_shard": 10, "eval_fraction": 0.2}}}}
        assert dg.materialize([corpus], instance=instance, resources=res, run_config=run_config).success

        # The sensor waits for every train shard's hidden states …
        ctx = dg.build_sensor_context(instance=instance)
        skip = sensor(ctx)
        assert isinstance(skip, dg.SkipReason) and "waiting for hidden states of 2 of 2" in skip.skip_message
        dg.materialize([hidden_states], partition_key="train-00000", instance=instance, resources=res)
        assert "1 of 2" in sensor(ctx).skip_message
        dg.materialize([hidden_states], partition_key="train-00001", instance=instance, resources=res)
        first = sensor(ctx)
        assert isinstance(first, dg.SensorResult) and len(first.run_requests) == 1
        assert first.run_requests[0].run_config["ops"]["draft_model"]["config"] == TINY_TARGET_TRAIN_CONFIG
        assert first.run_requests[0].asset_selection == [DRAFT_KEY, BENCHMARK_KEY]
        # a real target with no serving backend: the run trains only (it cannot be benchmarked in process)
        trains_only = build_training_sensor(with_benchmark=False)(ctx)
        assert trains_only.run_requests[0].asset_selection == [DRAFT_KEY]

        # … then training runs as a Pipes subprocess and reports its curves and export.
        r = dg.materialize(
            [draft_model], instance=instance, resources=res, run_config={"ops": {"draft_model": {"config": TRAIN}}}
        )
        md = r.asset_materializations_for_node("draft_model")[0].metadata
        assert md["steps"].value == 12 and md["train_samples"].value == 19
        assert "data:image/png;base64," in md["loss_curve"].value
        assert len(md["final_acc_per_step"].value) == 3
        # trained with the target's embedding: both engines serve the same draft, nothing to warn about
        assert md["export_warnings"].value == []
        assert md["embedding_served_by"].value == {"sglang": "target", "vllm": "target"}
        logs = [e.message for e in instance.all_logs(r.run_id) if e.message]
        assert any("step 4: loss" in m for m in logs)  # streamed from the subprocess while it trained
        assert_one_export_for_both_engines(Path(md["run_dir"].value))

        # The same asset under torchrun: two gloo processes holding half of each global batch train like the one
        # process above, and rank 0 alone talks to Dagster through Pipes.
        ddp = {**TRAIN, "batch_size": TRAIN["batch_size"] // 2, "nproc_per_node": 2}
        r = dg.materialize(
            [draft_model], instance=instance, resources=res, run_config={"ops": {"draft_model": {"config": ddp}}}
        )
        ddp_md = r.asset_materializations_for_node("draft_model")[0].metadata
        assert ddp_md["processes"].value == 2 and ddp_md["steps"].value == 12
        assert_trained_alike(Path(ddp_md["run_dir"].value), Path(md["run_dir"].value), steps=12)

        # Nothing new since the draft: the sensor skips; a refreshed shard makes it train again.
        assert "trained after every current shard" in sensor(ctx).skip_message
        dg.materialize([hidden_states], partition_key="train-00001", instance=instance, resources=res)
        again = sensor(ctx)
        assert isinstance(again, dg.SensorResult)
        assert again.run_requests[0].run_key != first.run_requests[0].run_key

        r = dg.materialize(
            [draft_benchmark],
            instance=instance,
            resources=res,
            run_config={"ops": {"draft_benchmark": {"config": {"num_prompts": 3, "max_new_tokens": 8}}}},
        )
        bmd = r.asset_materializations_for_node("draft_benchmark")[0].metadata
        assert bmd["prompts"].value == 3 and len(bmd["per_position_accept_rate"].value) == 3  # num_steps
        assert bmd["acceptance_length"].value >= 1.0 and bmd["acceptance_length_untrained"].value >= 1.0
        assert "data:image/png;base64," in bmd["acceptance_plot"].value


def assert_one_export_for_both_engines(run_dir: Path) -> None:
    """One folder for both engines (export-vllm is only an alias of it), loaded as each engine loads it: every
    tensor maps, and both capture the target layers the draft was trained on."""
    export = latest_export_dir() / "export"
    assert (latest_export_dir() / "export-vllm").resolve() == export.resolve()
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["LlamaForCausalLMEagle3"] and exported["draft_vocab_size"] == 512
    run_cfg = json.loads((run_dir / "run.json").read_text())
    target_layers = json.loads((Path(run_cfg["target"]["path"]) / "config.json").read_text())["num_hidden_layers"]
    trained = tuple(run_cfg["aux_layer_ids"])
    assert trained == (2, 3, 4)  # the tiny target's 7 layers: the reference default [2, N//2, N-3]
    checked = check_export(export, trained, target_layers)
    assert checked.problems == []
    assert {e: load.captured_hf_layers for e, load in checked.loads.items()} == {"sglang": trained, "vllm": trained}


def assert_trained_alike(ddp_dir: Path, single_dir: Path, steps: int) -> None:
    """Same weights and per-step losses as one process holding the whole global batch (gloo's all-reduce differs
    from a single sum only in float rounding: 1.2e-7 measured on synthetic data), and an export of its own."""
    ddp = torch.load(latest_checkpoint(ddp_dir / "checkpoints"), weights_only=True)
    single = torch.load(latest_checkpoint(single_dir / "checkpoints"), weights_only=True)
    assert ddp["global_step"] == single["global_step"] == steps
    assert ddp["world_size"] == 2 and len(ddp["rng"]) == 2
    for name, p in single["model"].items():
        torch.testing.assert_close(ddp["model"][name], p, rtol=0, atol=2e-6, msg=name)

    def metrics(d: Path) -> list[dict]:
        return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]

    ddp_metrics, single_metrics = metrics(ddp_dir), metrics(single_dir)
    assert len(ddp_metrics) == len(single_metrics) == steps
    for a, b in zip(ddp_metrics, single_metrics, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["tokens"] == b["tokens"]
        assert a["acc"] == pytest.approx(b["acc"], abs=1e-9)  # global counts: identical unless a tie flips
    assert (ddp_dir / "export" / "model.safetensors").is_file()
    assert any((ddp_dir / "torchrun-logs").iterdir())  # torchrun's logs kept with the run, not left in /tmp
