"""Generated → tokenized (with blocking DuckDB checks) → corpus → hidden states, on a real Dagster instance."""

import dagster as dg
import polars as pl
import pytest
import torch

from eagle_assets.assets.corpus import build_corpus_asset
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.hidden_states import hidden_states
from eagle_assets.assets.tokens import build_tokenized_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.hidden_states.store import HiddenStateStore
from eagle_assets.keys import CORPUS_SHARDS
from eagle_assets.layout import corpus_dir, partition_paths, shard_file, store_dir
from eagle_assets.target.tiny import load_target
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource
from resources.simulator.config import LatencyConfig, SimulatorConfig
from resources.target.resource import TargetModelResource
from tests.generation.test_dagster_generation import resource_for, write_prompts
from tests.pipeline.conftest import pipeline_resources
from tests.simulator.harness import run_simulator_in_thread


def _checks(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], bool]:
    return {
        (e.asset_key.to_user_string(), e.check_name): e.passed
        for e in (ev.event_specific_data for ev in result.all_events if ev.event_type_value == "ASSET_CHECK_EVALUATION")
    }


@pytest.mark.slow
def test_checks_corpus_and_hidden_states_end_to_end(tmp_path, forge_home):
    specs = [
        DatasetSpec("P1", write_prompts(tmp_path / "p1.jsonl", 20, tag="a"), 10**9, 10),
        DatasetSpec("P2", write_prompts(tmp_path / "p2.jsonl", 10, tag="b"), 10**9, 10),
    ]
    gens = [build_generated_asset(s) for s in specs]
    toks = [build_tokenized_asset(s, g.partitions_def) for s, g in zip(specs, gens, strict=True)]
    corpus = build_corpus_asset(specs)
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.002), mean_completion_tokens=40, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = pipeline_resources(sim.base_url, max_tokens=48)
        for spec, gen, tok in zip(specs, gens, toks, strict=True):
            for shard in spec.shard_keys():
                r = dg.materialize([gen, tok], partition_key=shard, instance=instance, resources=res)
                checks = _checks(r)
                assert len(checks) == 4 + 6 and all(checks.values()), checks

        # The corpus refuses a dataset that is not complete …
        spec3 = DatasetSpec("P3", write_prompts(tmp_path / "p3.jsonl", 5, tag="c"), 10**9, 10)
        partial = build_corpus_asset([*specs, spec3])
        r = dg.materialize([partial], instance=instance, resources=res, raise_on_error=False)
        assert not r.success
        assert "1 tokenized partitions missing (P3/0000" in _failure(r)

        # … and otherwise merges everything into shards that become the hidden-state partitions.
        run_config = {"ops": {"corpus": {"config": {"max_samples_per_shard": 8, "eval_fraction": 0.2}}}}
        r = dg.materialize([corpus], instance=instance, resources=res, run_config=run_config)
        md = r.asset_materializations_for_node("corpus")[0].metadata
        assert md["samples"].value == 30 and md["train_samples"].value + md["eval_samples"].value == 30
        assert md["eval_samples"].value == 6
        keys = instance.get_dynamic_partitions(CORPUS_SHARDS.name)
        assert sorted(keys) == ["eval-00000", "train-00000", "train-00001", "train-00002"]
        assert (corpus_dir() / "index.json").is_file()
        assert "data:image/png;base64," in md["tokens_per_dataset"].value

        # Hidden states of one shard equal a direct output_hidden_states forward pass of the target.
        r = dg.materialize([hidden_states], partition_key="train-00001", instance=instance, resources=res)
        hmd = r.asset_materializations_for_node("hidden_states")[0].metadata
        assert hmd["already_complete"].value is False and hmd["samples"].value == 8
        store = HiddenStateStore(store_dir("train-00001"))
        rows = pl.read_parquet(shard_file("train-00001"))
        assert len(store) == 8
        model = load_target(TargetModelResource().model_dir())
        layers = store.meta.layers.hf_indices
        for i in (0, 7):
            ids = torch.tensor(rows["input_ids"][i].to_list())[None]
            with torch.no_grad():
                hs = model(input_ids=ids, output_hidden_states=True).hidden_states
            expected = torch.cat([hs[j][0] for j in layers], dim=-1).to(torch.bfloat16)
            assert torch.equal(store[i]["input_ids"], ids[0])
            torch.testing.assert_close(store[i]["aux"], expected, atol=2e-2, rtol=2e-2)

        # Re-materializing resumes: the complete shard is skipped, not recomputed.
        r = dg.materialize([hidden_states], partition_key="train-00001", instance=instance, resources=res)
        assert r.asset_materializations_for_node("hidden_states")[0].metadata["already_complete"].value is True

        # A disk that cannot hold the store is refused before the model runs.
        greedy = {**res, "target": TargetModelResource(reserve_disk_gb=10**9)}
        r = dg.materialize(
            [hidden_states], partition_key="train-00000", instance=instance, resources=greedy, raise_on_error=False
        )
        assert not r.success and "not enough disk for hidden states" in _failure(r)


def _failure(result: dg.ExecuteInProcessResult) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return "\n".join(str(e.event_specific_data.error.message) for e in failures)


def test_blocking_check_keeps_a_bad_partition_out_of_the_corpus(tmp_path, forge_home):
    spec = DatasetSpec("Q1", write_prompts(tmp_path / "q1.jsonl", 8, tag="q"), 10**9, 8)
    gen = build_generated_asset(spec)
    tok = build_tokenized_asset(spec, gen.partitions_def)
    corpus = build_corpus_asset([spec])
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.002), mean_completion_tokens=30, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = {"openrouter": resource_for(sim.base_url, max_tokens=32), "duckdb": DuckDBResource()}
        assert dg.materialize([gen], partition_key="0000", instance=instance, resources=res).success
        # A response bought twice (as a resumed run with a broken journal could produce).
        parquet = partition_paths("Q1", "0000")[1]
        frame = pl.read_parquet(parquet)
        pl.concat([frame, frame.head(1)]).write_parquet(parquet)

        r = dg.materialize([tok, corpus], partition_key="0000", instance=instance, resources=res, raise_on_error=False)
        checks = _checks(r)
        assert checks[("tokenized/Q1", "unique_prompt_ids")] is False
        assert checks[("tokenized/Q1", "token_diff")] is True
        assert not r.success
        assert not r.asset_materializations_for_node("corpus")  # blocked in the same run: never started
        assert not [e for e in r.all_events if e.step_key == "corpus" and e.event_type_value == "STEP_START"]

        r = dg.materialize([corpus], instance=instance, resources=res, raise_on_error=False)
        assert not r.success  # and refused in a run of its own
        assert "blocking checks fail" in _failure(r) and "unique_prompt_ids" in _failure(r)
