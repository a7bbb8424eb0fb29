"""The blocking fidelity checks on ``hidden_states`` in a real Dagster instance, and what waits for them.

One shard is extracted correctly; the other through a capture that is off by one position (injected into the real
extractor, as a bug would be). The bad shard's step fails on its blocking check with the shard, the check and the
figure; the training sensor and ``draft_model`` refuse to train until that shard is re-extracted and passes.
"""

import shutil

import dagster as dg
import polars as pl
import pytest
import torch

from eagle_assets.assets.draft import draft_model, training_run_config
from eagle_assets.assets.hidden_state_checks import check_summaries, fidelity_failures
from eagle_assets.assets.hidden_states import hidden_states
from eagle_assets.hidden_states import extract_hf
from eagle_assets.keys import CORPUS_SHARDS
from eagle_assets.layout import shard_file, store_dir
from resources.target.resource import TargetModelResource
from resources.target.training_pipes import training_pipes_client
from sensors.training_sensor import build_training_sensor

SHARDS = ("train-00000", "train-00001")


def write_corpus_shard(key: str, seed: int) -> None:
    """A corpus shard file as the corpus asset writes it (the columns hidden_states reads), random ids: the checks
    hold a store to the target run in full on the same data, whatever the target thinks of it."""
    ids = torch.randint(1000, 150_000, (6, 26), generator=torch.Generator().manual_seed(seed)).tolist()
    frame = pl.DataFrame(
        {
            "prompt_id": [f"{key}-{i}" for i in range(len(ids))],
            "input_ids": ids,
            "loss_mask": [[0] * 12 + [1] * 14 for _ in ids],
            "prompt_len": [12] * len(ids),
        },
        schema={
            "prompt_id": pl.String,
            "input_ids": pl.List(pl.Int32),
            "loss_mask": pl.List(pl.UInt8),
            "prompt_len": pl.Int32,
        },
    )
    path = shard_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)


def evaluations(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {
        e.event_specific_data.check_name: e.event_specific_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }


def check_metadata(result: dg.ExecuteInProcessResult, name: str) -> dict:
    (data,) = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION" and e.event_specific_data.check_name == name
    ]
    return data.metadata


def test_a_bad_shard_fails_its_blocking_checks_and_training_waits_for_it(forge_home):
    resources = {"target": TargetModelResource(), "pipes_subprocess_client": training_pipes_client()}
    sensor = build_training_sensor(run_config=training_run_config(tiny_target=True))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_SHARDS.name, list(SHARDS))
        for k, key in enumerate(SHARDS):
            write_corpus_shard(key, k)

        config = {"ops": {"hidden_states": {"config": {"fidelity_positions": 40, "calibration_samples": 3}}}}
        good = dg.materialize(
            [hidden_states], partition_key=SHARDS[0], instance=instance, resources=resources, run_config=config
        )
        assert evaluations(good) == {"alignment": True, "aux_layers": True, "last_state_next_token": True}
        figures = check_metadata(good, "last_state_next_token")  # the asset's config reaches the checks
        assert figures["calibration_positions"].value == 40 and figures["shard_positions"].value == 40
        md = good.asset_materializations_for_node("hidden_states")[0].metadata
        assert md["fidelity_passed"].value is True and md["fidelity_consistency"].value >= 0.9
        assert md["fidelity_agreement"].value >= 0.9 * md["fidelity_target_agreement"].value
        assert "last_state_next_token" in md["fidelity_checks"].value
        assert (store_dir(SHARDS[0]) / "fidelity_calibration.json").is_file()

        # A capture off by one position: the features of token t-1 stored at t.
        real = extract_hf.HFFeatureExtractor.forward_features

        def shifted(self, input_ids, attention_mask):
            return {
                k: torch.cat([v[:, :1], v[:, :-1]], dim=1) for k, v in real(self, input_ids, attention_mask).items()
            }

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(extract_hf.HFFeatureExtractor, "forward_features", shifted)
            bad = dg.materialize(
                [hidden_states], partition_key=SHARDS[1], instance=instance, resources=resources, raise_on_error=False
            )
        assert not bad.success  # the blocking checks fail the step
        assert evaluations(bad) == {"alignment": True, "aux_layers": False, "last_state_next_token": False}
        (failed,) = [s for ok, s in check_summaries(bad) if not ok and "last_state_next_token" in s]
        assert failed.startswith(f"hidden_states {SHARDS[1]} shard-00000: last_state_next_token FAILED: ")
        assert "top-1 consistency with the target 0.0" in failed  # random data: agreement says little, this does

        # The training sensor waits, naming the shard, the check and the figure; draft_model refuses too.
        skip = sensor(dg.build_sensor_context(instance=instance))
        assert isinstance(skip, dg.SkipReason), skip
        assert "fidelity checks of 1 of 2 shards" in skip.skip_message and SHARDS[1] in skip.skip_message
        assert (
            "last_state_next_token FAILED: " in skip.skip_message and "aux_layers FAILED: slot low" in skip.skip_message
        )
        assert set(fidelity_failures(instance, list(SHARDS))) == {SHARDS[1]}
        refused = dg.materialize([draft_model], instance=instance, resources=resources, raise_on_error=False)
        assert not refused.success
        (failure,) = refused.get_step_failure_events()
        assert f"hidden states of {SHARDS[1]}: " in failure.step_failure_data.error.message

        # Re-extracted once the cause is fixed (the bad store deleted, as the log says), it passes, and training starts.
        assert any("delete it and re-materialize" in (e.message or "") for e in instance.all_logs(bad.run_id))
        shutil.rmtree(store_dir(SHARDS[1]))
        fixed = dg.materialize([hidden_states], partition_key=SHARDS[1], instance=instance, resources=resources)
        assert all(evaluations(fixed).values())
        assert fidelity_failures(instance, list(SHARDS)) == {}
        run = sensor(dg.build_sensor_context(instance=instance))
        assert isinstance(run, dg.SensorResult) and len(run.run_requests) == 1
