"""The training run's one typed config: unknown keys are errors that name them; the asset's run file round-trips."""

import hashlib
import json

import pytest
from pydantic import ValidationError

from eagle_assets.draft.run_config import DraftRunConfig, StoreData, TrainConfig, TrainKnobs, load_config
from eagle_assets.draft.train_cli import main as train_cli_main

SYNTHETIC = {
    "model": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "num_kv_heads": 2,
        "head_dim": 16,
        "target_vocab_size": 128,
        "draft_vocab_size": 64,
        "aux_layer_ids": [1, 2, 3],
    },
    "data": {"kind": "synthetic", "n_samples": 4},
}


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"lerning_rate": 1e-3}, "lerning_rate"),
        ({"train": {"lerning_rate": 1e-3}}, "train.lerning_rate"),
        ({"data": {"kind": "synthetic", "n_sample": 4}}, "data.synthetic.n_sample"),
        ({"export": {"engine": "vllm"}}, "export.engine"),
        ({"target": {"path": "/m", "last": "pre_norm"}}, "target.last"),
        ({"vocab": {"kind": "identity", "forced_ids": [1]}}, "vocab.forced_ids"),
        ({"embeddings": {"kind": "random", "sed": 1}}, "embeddings.sed"),
    ],
)
def test_an_unknown_key_is_an_error_that_names_it(patch, where):
    with pytest.raises(ValidationError) as info:
        DraftRunConfig.model_validate({**SYNTHETIC, **patch})
    assert where in str(info.value) and "Extra inputs are not permitted" in str(info.value)


def test_an_unknown_draft_shape_key_is_an_error_that_names_it():
    with pytest.raises(ValidationError, match=r"unknown model keys \['hiden_size'\]"):
        DraftRunConfig.model_validate({**SYNTHETIC, "model": {**SYNTHETIC["model"], "hiden_size": 32}})


def test_the_command_line_refuses_an_unknown_key_before_training(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({**SYNTHETIC, "train": {"lr": 1e-3, "epoch": 2}, "output_dir": str(tmp_path / "r")}))
    with pytest.raises(ValidationError, match="epoch"):
        train_cli_main(["--config", str(path)])
    assert not (tmp_path / "r").exists()


def test_defaults_and_bounds_are_the_models(tmp_path):
    for name in ("run.json", "run.yml"):  # JSON is valid YAML: both branches of load_config
        (tmp_path / name).write_text(json.dumps(SYNTHETIC))
        cfg = load_config(tmp_path / name)
        assert cfg.train == TrainConfig() and cfg.log_every == 1 and cfg.export is None and cfg.out is None
        assert cfg.embeddings_kind == "synthetic" and cfg.data.kind == "synthetic" and cfg.data.length == (12, 24)
    with pytest.raises(ValidationError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValidationError, match=r"give either 'model' or 'target\.path'"):
        DraftRunConfig.model_validate({"data": SYNTHETIC["data"]})
    with pytest.raises(ValidationError, match=r"store data needs target\.path"):
        DraftRunConfig.model_validate({**SYNTHETIC, "data": {"kind": "store", "path": "/hs"}})
    tokens = {"kind": "tokens", "path": "rows.jsonl"}
    with pytest.raises(ValidationError, match="synthetic embeddings need synthetic data"):
        DraftRunConfig.model_validate(
            {"target": {"path": "/m"}, "draft_vocab_size": 8, "embeddings": {"kind": "synthetic"}, "data": tokens}
        )


def test_the_draft_model_assets_config_keeps_its_fields_and_defaults(tmp_path, monkeypatch):
    from eagle_assets.assets import draft as assets

    # The field set and defaults name the run directory (run_identity): unchanged, so runs still resume.
    assert assets.DraftTrainConfig().model_dump() == {
        "draft_vocab_size": 32000,
        "epochs": 1,
        "max_steps": 0,
        "lr": 1e-4,
        "warmup_ratio": 0.015,
        "batch_size": 1,
        "grad_accum": 1,
        "grad_clip": 0.5,
        "ttt_steps": 7,
        "step_weight": 0.8,
        "max_length": 4096,
        "checkpoint_every": 200,
        "log_every": 10,
        "seed": 0,
        "nproc_per_node": 0,
        "features": "offline",
        "online_prefetch": 2,
    }
    # An offline run keeps the name it had before the online fields existed (the old field set hashed), so it resumes.
    old_fields = {
        k: v for k, v in assets.DraftTrainConfig().model_dump().items() if k not in ("features", "online_prefetch")
    }
    old_blob = json.dumps({"target": "t", "shards": {"a": "1"}, "train": old_fields}, sort_keys=True)
    old_name = hashlib.blake2b(old_blob.encode(), digest_size=8).hexdigest()
    assert assets.run_identity("t", {"a": "1"}, assets.DraftTrainConfig()) == old_name
    assert assets.run_identity("t", {"a": "1"}, assets.DraftTrainConfig(online_prefetch=5)) == old_name
    assert assets.run_identity("t", {"a": "1"}, assets.DraftTrainConfig(features="online")) != old_name
    knobs = {"lr": 3e-3, "batch_size": 4, "ttt_steps": 3, "max_steps": 12, "seed": 5, "checkpoint_every": 0}
    config = assets.DraftTrainConfig(draft_vocab_size=512, max_length=0, log_every=4, **knobs)
    monkeypatch.setattr(assets, "hidden_states_root", lambda: tmp_path / "hs")
    run = assets.train_run_config(config, tmp_path / "target", ["train-00000"], [2, 3, 4], tmp_path / "run")
    # The run file the Pipes process reads: the same typed model, every knob passed through by name.
    again = DraftRunConfig.model_validate_json(run.model_dump_json())
    assert again == run
    assert {k: getattr(again.train, k) for k in TrainKnobs.model_fields} == {
        k: getattr(config, k) for k in TrainKnobs.model_fields
    }
    assert isinstance(again.data, StoreData) and again.data.max_length is None
    assert again.data.reader_kwargs == {"partitions": ["train-00000"]}
    assert (again.seed, again.draft_vocab_size, again.aux_layer_ids, again.log_every) == (5, 512, [2, 3, 4], 4)
    assert again.target.path == str(tmp_path / "target") and again.output_dir == str(tmp_path / "run")
    assert again.embeddings_kind == "target" and again.export is not None and again.export.dtype == "bfloat16"
