"""The SGLang backend without SGLang: arguments, requests, response conversion, two-pass store.

``FakeSGLangEngine`` (``sglang_standin.py``) answers ``generate`` the way SGLang's scheduler fills
``meta_info`` (prompt rows as nested Python lists in ``hidden_states[0]``), and captures aux layers the way
SGLang's ``set_eagle3_layers_to_capture`` does. A store made through it must equal the HF backend's store.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eagle_assets.durable_files import current_version
from eagle_assets.hidden_states.capture_draft import capture_draft_name, ensure_capture_draft, write_capture_draft
from eagle_assets.hidden_states.extract_hf import extract_hf
from eagle_assets.hidden_states.extract_sglang import (
    SGLangCaptureConfig,
    SGLangEngineClient,
    SGLangUnavailableError,
    extract_sglang,
)
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.sglang_wire import SGLangResponseError, build_generate_request, features_from_response
from eagle_assets.hidden_states.store import HiddenStateStore
from eagle_assets.target.architecture import read_target_dims
from tests.hidden_states.sglang_standin import FakeSGLangEngine

F32 = torch.float32
requires_no_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang installed")


@pytest.fixture
def config(tmp_path, tiny_dir):
    layers = AuxLayers.default(read_target_dims(tiny_dir).num_layers)
    draft = write_capture_draft(tmp_path / "capture-draft", tiny_dir, layers)
    return SGLangCaptureConfig(model_path=str(tiny_dir), layers=layers, draft_path=str(draft), max_tokens_per_batch=64)


@requires_no_sglang
def test_module_imports_without_sglang_and_names_the_install(config):
    client = SGLangEngineClient(config, "last", hidden_size=64)
    with pytest.raises(SGLangUnavailableError, match=r"pip install .sglang"):
        client([HiddenStateSample("a", [1, 2], [0, 1])])


def test_engine_arguments_per_role(config):
    aux = config.engine_kwargs("aux")
    last = config.engine_kwargs("last")
    for kw in (aux, last):
        assert kw["tp_size"] == 8 and kw["enable_return_hidden_states"] and kw["disable_radix_cache"]
        assert kw["skip_tokenizer_init"] and kw["chunked_prefill_size"] >= config.max_seq_len
    assert aux["speculative_algorithm"] == "EAGLE3" and aux["speculative_draft_model_path"] == config.draft_path
    assert "speculative_algorithm" not in last
    argv = config.server_argv("aux", port=31000)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert "--enable-return-hidden-states" in argv and "--disable-radix-cache" in argv
    assert argv[argv.index("--tp-size") + 1] == "8" and argv[-2:] == ["--port", "31000"]
    with pytest.raises(ValueError, match="draft_path"):
        SGLangCaptureConfig(model_path=config.model_path, layers=config.layers).engine_kwargs("aux")


def test_capture_draft_carries_sglang_ids(config):
    cfg = json.loads(Path(config.draft_path, "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # HF [2, 3, 4] - 1
    assert cfg["eagle_forge"]["layers"]["hf_indices"] == [2, 3, 4]
    with safe_open(f"{config.draft_path}/model.safetensors", framework="pt") as f:
        assert f.get_slice("fc.weight").get_shape() == [64, 192]
        assert f.get_slice("d2t").get_shape() == [32000]
    for name in ("config.json", "model.safetensors"):  # an SGLang server running as another user reads them
        assert Path(config.draft_path, name).stat().st_mode & 0o777 == 0o644


def test_request_shape():
    batch = [HiddenStateSample("a", [5, 6, 7], [0, 1, 1]), HiddenStateSample("b", [9], [1])]
    req = build_generate_request(batch)
    assert req == {
        "input_ids": [[5, 6, 7], [9]],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
    }
    json.dumps(req)  # also the /generate body


def test_response_conversion_checks_the_shape():
    s = HiddenStateSample("a", [5, 6, 7], [0, 1, 1])
    rows = [[float(i * 10 + j) for j in range(4)] for i in range(3)]
    ok = {"meta_info": {"prompt_tokens": 3, "hidden_states": [rows, [0.0] * 4]}}  # + a generated-token row
    assert features_from_response(ok, s, 4).tolist() == rows
    with pytest.raises(SGLangResponseError, match="enable_return_hidden_states"):
        features_from_response({"meta_info": {}}, s, 4)
    with pytest.raises(SGLangResponseError, match="prefix cache"):
        features_from_response({"meta_info": {"hidden_states": [rows[1:]]}}, s, 4)
    with pytest.raises(SGLangResponseError, match="wide"):
        features_from_response(ok, s, 12)
    with pytest.raises(SGLangResponseError, match="prompt tokens"):
        features_from_response({"meta_info": {"prompt_tokens": 4, "hidden_states": [rows]}}, s, 4)
    nan = {"meta_info": {"hidden_states": [[[float("nan")] * 4] * 3]}}
    with pytest.raises(SGLangResponseError, match="non-finite"):
        features_from_response(nan, s, 4)


def test_two_pass_store_equals_the_hf_store(tmp_path, config, tiny_model, corpus):
    engines = {}

    def factory(cfg, role, hidden):
        engines[role] = FakeSGLangEngine(tiny_model, cfg.engine_kwargs(role))
        return SGLangEngineClient(cfg, role, hidden_size=hidden, engine=engines[role], out_dtype=F32)

    reports = extract_sglang(corpus, tmp_path / "sgl", config, model_id="tiny", dtype=F32, client_factory=factory)
    assert set(reports) == {"aux", "last"} and all(e.shut for e in engines.values())
    assert sorted(p.name for p in (tmp_path / "sgl").glob("shard-00000*")) == [
        "shard-00000-aux.safetensors",
        "shard-00000-last.safetensors",
    ]
    extract_hf(tiny_model, corpus, tmp_path / "hf", model_id="tiny", dtype=F32, max_tokens_per_batch=1)
    a, b = HiddenStateStore(tmp_path / "sgl"), HiddenStateStore(tmp_path / "hf")
    assert len(a) == len(b) == sum(len(s) for s in corpus)
    assert a.meta.extra["backend"] == "sglang" and a.meta.last_kind == "post_norm"
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def test_each_pass_resumes_on_its_own(tmp_path, config, tiny_model, corpus):
    started = []

    def factory(cfg, role, hidden):
        engine = FakeSGLangEngine(tiny_model, cfg.engine_kwargs(role))
        started.append((role, engine))
        return SGLangEngineClient(cfg, role, hidden_size=hidden, engine=engine, out_dtype=F32)

    def crash_in_last_pass(p):
        if started[-1][0] == "last" and p.event == "shard" and p.shard_index == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        extract_sglang(corpus, tmp_path, config, dtype=F32, client_factory=factory, progress=crash_in_last_pass)
    assert len(HiddenStateStore(tmp_path)) == len(corpus[0]) + len(corpus[1])  # complete shards only
    started.clear()
    reports = extract_sglang(corpus, tmp_path, config, dtype=F32, client_factory=factory)
    assert reports["aux"].shards_computed == 0 and reports["last"].shards_computed == len(corpus) - 2
    assert started[0][1].prompts == 0  # the aux engine was never asked anything
    assert len(HiddenStateStore(tmp_path)) == sum(len(s) for s in corpus)


def test_cli_prints_the_server_command(tiny_dir, capsys):
    from eagle_assets.hidden_states.extract_sglang import main

    assert main(["server-cmd", "--model-path", str(tiny_dir), "--role", "last", "--tp-size", "8"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"] and "--speculative-algorithm" not in cmd


def test_the_capture_draft_is_written_once_per_target_and_layers(tmp_path, tiny_dir):
    """The asset's SGLang path writes its capture draft itself (it used to pass none, and the aux pass refused to
    start); a second shard reuses it, other layers get their own folder, and the folder is only ever whole."""
    layers = AuxLayers.default(read_target_dims(tiny_dir).num_layers)
    name = capture_draft_name(tiny_dir, layers)
    public = tmp_path / "capture-drafts" / name
    first = ensure_capture_draft(public, tiny_dir, layers)
    assert first == public and current_version(public) is not None
    cfg = json.loads((public / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(layers.sglang_ids)
    assert (public / "model.safetensors").is_file()
    version = current_version(public)
    assert ensure_capture_draft(public, tiny_dir, layers) == public and current_version(public) == version
    other = AuxLayers((1, 2, 3), layers.num_layers)
    assert capture_draft_name(tiny_dir, other) != name
    # A folder that names other layers (an edited or stale one) is replaced, never used as it is.
    ensure_capture_draft(public, tiny_dir, other)
    assert json.loads((public / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        0,
        1,
        2,
    ]
