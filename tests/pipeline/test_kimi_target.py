"""The tiny Kimi K2.5 target (a kimi_k25 wrapper around DeepSeek-V3: MLA, MoE) through every asset that loads it.

The simulator answers with that target, so the corpus is its own output; then ``hidden_states`` (the three blocking
checks pass), ``draft_model`` (MLA sizing: head width = v_head_dim) and ``draft_benchmark`` (the speculative loop on
the MLA cache) run through Dagster as on the tiny Llama. Kept small: one dataset shard of 10 prompts.
"""

import json

import dagster as dg

from eagle_assets.assets.corpus import build_corpus_asset
from eagle_assets.assets.draft import draft_benchmark, draft_model
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.hidden_states import hidden_states
from eagle_assets.assets.tokens import build_tokenized_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.layout import latest_export_dir
from eagle_assets.shard_partitions import train_partitions
from eagle_assets.target.tiny_targets import build_named_tiny_target, tiny_target_path
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.simulator.config import LatencyConfig, SimulatorConfig
from resources.target.resource import TargetModelResource
from tests.generation.test_dagster_generation import write_prompts
from tests.pipeline.conftest import pipeline_resources
from tests.pipeline.test_hidden_state_checks import evaluations
from tests.simulator.harness import run_simulator_in_thread

TRAIN = {"draft_vocab_size": 512, "max_steps": 12, "batch_size": 4, "ttt_steps": 3, "lr": 3e-3, "log_every": 4}


def test_kimi_k25_target_through_hidden_states_draft_and_benchmark(tmp_path, forge_home):
    kimi = build_named_tiny_target("kimi-k25-tiny", tiny_target_path("kimi-k25-tiny"))
    spec = DatasetSpec("K1", write_prompts(tmp_path / "k1.jsonl", 10, tag="k"), 10**9, 10)
    gen = build_generated_asset(spec)
    tok = build_tokenized_asset(spec, gen.partitions_def)
    corpus = build_corpus_asset([spec])
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.002), tokenizer_dir=resolve_tokenizer_dir(), tiny_target_dir=kimi
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = {
            **pipeline_resources(sim.base_url, max_tokens=24),
            "target": TargetModelResource(tiny_target="kimi-k25-tiny"),
        }
        assert dg.materialize([gen, tok], partition_key="0000", instance=instance, resources=res).success
        run_config = {"ops": {"corpus": {"config": {"max_samples_per_shard": 8, "eval_fraction": 0.2}}}}
        assert dg.materialize([corpus], instance=instance, resources=res, run_config=run_config).success

        shards = sorted(train_partitions(instance))
        assert shards
        for shard in shards:
            r = dg.materialize([hidden_states], partition_key=shard, instance=instance, resources=res)
            checks = evaluations(r)
            assert r.success and len(checks) == 3 and all(checks.values()), checks

        r = dg.materialize(
            [draft_model], instance=instance, resources=res, run_config={"ops": {"draft_model": {"config": TRAIN}}}
        )
        assert r.success
        exported = json.loads((latest_export_dir() / "export" / "config.json").read_text())
        target = json.loads((kimi / "config.json").read_text())
        assert target["model_type"] == "kimi_k25" and "vision_config" in target
        text = target["text_config"]
        assert exported["head_dim"] == text["v_head_dim"] == 16 and exported["hidden_size"] == text["hidden_size"]
        assert exported["eagle_forge"]["target_num_hidden_layers"] == text["num_hidden_layers"] == 7

        bench = {"num_prompts": 2, "max_new_tokens": 12}
        r = dg.materialize(
            [draft_benchmark],
            instance=instance,
            resources=res,
            run_config={"ops": {"draft_benchmark": {"config": bench}}},
        )
        md = r.asset_materializations_for_node("draft_benchmark")[0].metadata
        assert md["prompts"].value == 2 and md["acceptance_length"].value >= 1.0
        assert md["acceptance_length_untrained"].value >= 1.0
