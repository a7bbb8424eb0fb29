import json
import os
import stat

import pytest
import torch
from safetensors import safe_open

from eagle_assets.draft.data import SyntheticDataset, collate
from eagle_assets.draft.export import EngineEmbeddingWarning, export_draft, load_draft
from eagle_assets.draft.model import Eagle3Draft
from eagle_assets.draft.ttt import TTTAttention
from eagle_assets.draft.vocab import vocab_from_samples
from tests.draft.helpers import small_config
from tests.draft.test_model import EXPECTED


def _model(**cfg):
    data = SyntheticDataset(4, hidden_size=32, vocab_size=128, seed=1)
    torch.manual_seed(0)
    m = Eagle3Draft(small_config(aux_layer_ids=(2, 30, 58), target_num_layers=61, **cfg), data.embed_weight)
    m.set_vocab(vocab_from_samples(data, 128, 64))
    with torch.no_grad():  # non-trivial norms, so a dropped norm weight would show
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return m, data


def _logits(m, data):
    batch = collate([data[i] for i in range(4)])
    with torch.no_grad():
        h = m.project(batch["aux"])
        h, lg1 = m.step(h, batch["input_ids"], torch.arange(batch["input_ids"].shape[1]), attend := TTTAttention())
        _, lg2 = m.step(h, batch["input_ids"].roll(-1, 1), torch.arange(batch["input_ids"].shape[1]) + 1, attend)
    return torch.stack([lg1, lg2])


def test_export_reload_gives_identical_logits(tmp_path):
    m, data = _model()
    out = export_draft(m, tmp_path / "draft", dtype=torch.float32)
    r = load_draft(out, embed_weight=data.embed_weight)
    assert torch.equal(_logits(m, data), _logits(r, data))
    assert torch.equal(r.d2t, m.d2t) and torch.equal(r.t2d, m.t2d) and r.config == m.config


def test_export_layout_and_config(tmp_path):
    m, data = _model()
    out = export_draft(m, tmp_path / "draft")  # bf16
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["vocab_size"] == 128 and cfg["draft_vocab_size"] == 64 and cfg["target_hidden_size"] == 32
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "bfloat16"
    # SGLang reads only eagle_config (+1), vLLM the top-level key (as given): both name HF [2, 30, 58]
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    assert cfg["eagle_forge"]["aux_layers"]["hf_indices"] == [2, 30, 58]
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "max_position_embeddings",
    ):
        assert key in cfg
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert names == set(EXPECTED)
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
    # a bf16 export still loads, and the HF config parser (what both engines use) reads the file
    r = load_draft(out, embed_weight=data.embed_weight)
    torch.testing.assert_close(_logits(r, data), _logits(m, data), rtol=0.1, atol=0.1)
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(out, local_files_only=True)
    assert hf.draft_vocab_size == 64 and hf.eagle_config["use_aux_hidden_state"] is True


def test_foreign_configs_are_read_in_the_named_spelling(tmp_path):
    m, data = _model()
    out = export_draft(m, tmp_path / "draft", dtype=torch.float32)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["eagle_forge"]  # as written by another tool: the ids alone say which layers
    (out / "config.json").write_text(json.dumps(cfg))
    assert load_draft(out, embed_weight=data.embed_weight).config.aux_layer_ids == (2, 30, 58)  # top-level key
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="pass engine="):
        load_draft(out, embed_weight=data.embed_weight)
    assert load_draft(out, embed_weight=data.embed_weight, engine="sglang").config.aux_layer_ids == (2, 30, 58)
    assert load_draft(out, embed_weight=data.embed_weight, engine="vllm").config.aux_layer_ids == (1, 29, 57)


def test_files_are_world_readable_whatever_the_umask(tmp_path):
    m, _ = _model()
    old = os.umask(0o077)
    try:
        out = export_draft(m, tmp_path / "draft")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    for name in ("config.json", "model.safetensors"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644


def test_rope_base_in_both_spellings(tmp_path):
    m, _ = _model(rope_theta=50_000.0)
    out = export_draft(m, tmp_path / "draft")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 50_000.0
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(out, local_files_only=True)  # transformers 5 keeps it in rope_parameters
    assert hf.rope_parameters["rope_theta"] == 50_000.0
    assert load_draft(out, embed_weight=torch.zeros(128, 32)).config.rope_theta == 50_000.0


def test_embeddings_saved_only_when_configured(tmp_path):
    m, _ = _model(save_embeddings=True)
    with pytest.warns(EngineEmbeddingWarning, match="SGLang serves it with the target's embedding"):
        out = export_draft(m, tmp_path / "with", dtype=torch.float32)
    r = load_draft(out)
    assert torch.equal(r.embed_tokens.weight, m.embed_tokens.weight)
    m2, _ = _model()
    out2 = export_draft(m2, tmp_path / "without", dtype=torch.float32)
    with pytest.raises(ValueError, match="embed_weight"):
        load_draft(out2)
    export_draft(m2, out2, dtype=torch.float32)  # overwrite in place
    # The two public names, and their versions in the one folder beside them (durable_files.publishing_directory):
    assert sorted(p.name for p in tmp_path.iterdir()) == [".published", "with", "without"]
    assert sorted(p.name for p in (tmp_path / ".published").iterdir()) == ["with", "without"]
    assert not [p for p in (tmp_path / ".published").rglob(".tmp-*")]  # no temporaries left
    assert out2.is_symlink() and len([v for v in (tmp_path / ".published" / "without").iterdir() if v.is_dir()]) == 2
