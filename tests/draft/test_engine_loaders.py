"""The exported folder as SGLang and vLLM load it (``tests/draft/engine_loaders.py``), and the Kimi-sized geometry.

The published Kimi-K2 EAGLE-3 draft used as the reference geometry is the ``config.json`` of
AQ-MedAI/Kimi-K2-Instruct-eagle3 on the Hugging Face Hub, identical in every size to SpecForge's
``configs/kimi-k2-eagle3.json`` (sgl-project/SpecForge) and to AQ-MedAI/Kimi-K25-eagle3 (which differs
only in ``max_position_embeddings`` 262144). Only the keys the loaders read are kept here.
"""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, PretrainedConfig

from eagle_assets.draft.export import EngineEmbeddingWarning, export_config, export_draft, load_draft
from eagle_assets.draft.model import Eagle3Config, Eagle3Draft
from eagle_assets.draft.target import load_target_embeddings
from eagle_assets.draft.train_cli import run
from eagle_assets.draft.ttt import TTTAttention
from eagle_assets.draft.vocab import DraftVocab
from tests.draft.engine_loaders import (
    ENGINES,
    Geometry,
    capture_layer_inputs,
    check_export,
    engine_param_shapes,
    load_folder,
    project_state_dict,
)
from tests.draft.engine_loaders import main as engine_loaders_main
from tests.draft.helpers import TINY_AUX, TINY_LAYERS, HFTargetFeatures, small_config, tiny_llama

PUBLISHED_KIMI_K2_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 1,
    "num_key_value_heads": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "vocab_size": 163840,
    "draft_vocab_size": 32000,
}

# The text model of moonshotai/Kimi-K2.5 (DeepSeek-V3 architecture, multi-head latent attention): no weights.
KIMI_TEXT = {
    "model_type": "kimi_k2",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rms_norm_eps": 1e-06,
}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target") / "tiny"
    tiny_llama().save_pretrained(path)
    return path


def _train_and_export(tmp_path, target_dir):
    """A short online run through ``train_cli.run``: the export code path the draft_model asset runs."""
    gen = torch.Generator().manual_seed(0)
    rows = [
        {"input_ids": torch.randint(0, 512, (12,), generator=gen).tolist(), "loss_mask": [0] * 4 + [1] * 8}
        for _ in range(6)
    ]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = {
        "seed": 0,
        "target": {"path": str(target_dir), "dtype": "float32"},
        "draft_vocab_size": 128,
        "aux_layer_ids": list(TINY_AUX),
        "data": {"kind": "tokens", "path": str(tmp_path / "rows.jsonl")},
        "train": {"lr": 1e-3, "batch_size": 2, "epochs": 1, "ttt_steps": 2},
        "output_dir": str(tmp_path / "run"),
        "export": {"dtype": "bfloat16"},
        "log_every": 0,
    }
    trainer = run(cfg, device=torch.device("cpu"))
    return trainer, tmp_path / "run" / "export", tuple(cfg["aux_layer_ids"])


def _logits(draft: Eagle3Draft, ids: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        attend = TTTAttention()
        pos = torch.arange(ids.shape[1])
        h, first = draft.step(draft.project(aux), ids, pos, attend)
        _, second = draft.step(h, ids.roll(-1, 1), pos + 1, attend)
    return torch.stack([first, second])


def test_the_one_folder_loads_in_both_engines_with_the_trained_layers(tmp_path, target_dir):
    trainer, folder, trained = _train_and_export(tmp_path, target_dir)
    result = check_export(folder, trained, TINY_LAYERS)
    assert result.problems == []
    sglang, vllm = result.loads["sglang"], result.loads["vllm"]
    assert sglang.captured_hf_layers == vllm.captured_hf_layers == trained

    # every tensor of the file reached a parameter of the shape the engine built from config.json
    cfg = json.loads((folder / "config.json").read_text())
    for engine, load in result.loads.items():
        assert {n: p.shape for n, p in load.params.items()} == engine_param_shapes(cfg, engine)
        assert all(p.complete for n, p in load.params.items() if "embed_tokens" not in n)
        assert load.embedding_source == "target" and load.lm_head_source == "draft"

    # the features each engine captures at those layer inputs are the ones the draft was trained on
    target = tiny_llama()
    ids = torch.randint(0, 512, (2, 10), generator=torch.Generator().manual_seed(3))
    trained_aux, _ = HFTargetFeatures(target, trained)(ids)
    for load in (sglang, vllm):
        assert torch.equal(capture_layer_inputs(target, ids, load.captured_hf_layers), trained_aux)

    # and the draft each engine assembles computes what this project's own loader computes
    embed = load_target_embeddings(target_dir)
    ours = load_draft(folder, embed_weight=embed)
    for load in (sglang, vllm):
        sd = project_state_dict(load, embed)
        vocab = DraftVocab.from_d2t(sd.pop("d2t"), trainer.model.config.target_vocab_size)
        served = Eagle3Draft(trainer.model.config, sd.pop("embed_tokens.weight").float())
        served.load_checkpoint_state_dict({k: v.float() for k, v in sd.items()} | {"d2t": vocab.d2t, "t2d": vocab.t2d})
        assert torch.equal(_logits(served.eval(), ids, trained_aux), _logits(ours, ids, trained_aux))


def _rewrite(folder, *, config=None, tensors=None):
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(folder / "model.safetensors"))


def test_the_reimplementations_catch_what_used_to_go_wrong(tmp_path):
    torch.manual_seed(0)
    draft = Eagle3Draft(small_config(aux_layer_ids=(2, 30, 58), target_num_layers=61))
    folder = export_draft(draft, tmp_path / "d", dtype=torch.float32)
    assert check_export(folder, (2, 30, 58), 61).problems == []
    cfg = json.loads((folder / "config.json").read_text())

    # the former vLLM folder (eagle_config in vLLM's spelling) makes SGLang capture layers 3, 31, 59
    old_vllm = {**cfg, "eagle_config": {**cfg["eagle_config"], "eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    _rewrite(folder, config=old_vllm)
    assert load_folder(folder, "sglang", 61).captured_hf_layers == (3, 31, 59)
    problems = check_export(folder, (2, 30, 58), 61).problems
    assert any("sglang captures the inputs of layers [3, 31, 59]" in p for p in problems)

    # the former SGLang folder (no top-level ids): vLLM versions that fall back to eagle_config take [1, 29, 57]
    old_sglang = {k: v for k, v in cfg.items() if k != "eagle_aux_hidden_state_layer_ids"}
    _rewrite(folder, config=old_sglang)
    assert load_folder(folder, "vllm", 61).captured_hf_layers == (1, 29, 57)

    # a four-layer draft's fc: both engines build fc for 3 x target_hidden_size inputs
    _rewrite(folder, config=cfg)
    tensors = load_file(str(folder / "model.safetensors"))
    _rewrite(folder, tensors={**tensors, "fc.weight": torch.zeros(32, 4 * 32)})
    problems = check_export(folder, (2, 30, 58), 61).problems
    assert any(p.startswith("sglang refuses") and "fc.weight" in p for p in problems)
    assert any(p.startswith("vllm refuses") and "fc.weight" in p for p in problems)

    # a tensor the engines do not know: SGLang drops it silently (leaving q unloaded), vLLM stops
    tensors["midlayer.self_attn.query.weight"] = tensors.pop("midlayer.self_attn.q_proj.weight")
    _rewrite(folder, tensors=tensors)
    problems = check_export(folder, (2, 30, 58), 61).problems
    assert "sglang silently dropped midlayer.self_attn.query.weight" in problems
    assert any("sglang left model.midlayer.self_attn.qkv_proj.weight" in p for p in problems)
    assert any(p.startswith("vllm refuses") and "query" in p for p in problems)


def test_kimi_k25_draft_has_the_shapes_of_the_published_kimi_k2_draft():
    k25 = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": KIMI_TEXT}
    hf_k2 = DeepseekV3Config(**{k: v for k, v in KIMI_TEXT.items() if k != "model_type"})
    assert hf_k2.head_dim == 64  # transformers' head_dim for MLA is the RoPE part: not the draft's head width
    configs = [
        Eagle3Config.from_target(k25, 32000),  # config.json of the vision-language wrapper, parsed
        Eagle3Config.from_target(PretrainedConfig(text_config=hf_k2), 32000),
        Eagle3Config.from_target(hf_k2, 32000),
    ]
    assert configs[0] == configs[1] == configs[2]
    cfg = configs[0]
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size) == (
        7168,
        64,
        64,
        128,
        18432,
    )
    assert (cfg.aux_layer_ids, cfg.rope_theta, cfg.max_position) == ((2, 30, 58), 50000.0, 262144)

    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    shapes = {n: tuple(t.shape) for n, t in draft.checkpoint_state_dict().items()}
    assert shapes["midlayer.self_attn.q_proj.weight"] == (8192, 14336)  # was (4096, 14336) with head_dim 64
    assert shapes["midlayer.self_attn.k_proj.weight"] == shapes["midlayer.self_attn.v_proj.weight"] == (8192, 14336)
    assert shapes["midlayer.self_attn.o_proj.weight"] == (7168, 8192)
    assert shapes["fc.weight"] == (7168, 21504) and shapes["lm_head.weight"] == (32000, 7168)
    assert shapes["midlayer.mlp.gate_proj.weight"] == (18432, 7168) and shapes["d2t"] == (32000,)

    exported = export_config(cfg)
    assert exported["rope_theta"] == exported["rope_parameters"]["rope_theta"] == 50000.0
    for engine, load in ENGINES.items():
        # the engine builds the same parameters from our config.json as from the published one
        assert engine_param_shapes(exported, engine) == engine_param_shapes(PUBLISHED_KIMI_K2_DRAFT, engine)
        served = load(exported, draft.checkpoint_state_dict(), 61, device="meta")
        assert served.problems(Geometry.of(exported)) == []
        assert served.captured_hf_layers == (2, 30, 58)


def test_exactly_three_aux_layers():
    for ids in ((2, 30), (2, 20, 40, 58)):
        with pytest.raises(ValueError, match="exactly 3 auxiliary target layers"):
            small_config(aux_layer_ids=ids)
    with pytest.raises(ValueError, match="exactly 3"):
        Eagle3Config.from_target({**KIMI_TEXT}, 32000, (2, 15, 30, 58))


def test_a_draft_with_its_own_embedding_exports_it(tmp_path):
    model = small_config(target_vocab_size=128, draft_vocab_size=64).to_dict()
    cfg = {
        "seed": 0,
        "model": model,
        "embeddings": {"kind": "random", "seed": 5},
        "vocab": {"kind": "identity"},
        "data": {"kind": "synthetic", "n_samples": 4, "length": [8, 10]},
        "train": {"lr": 1e-3, "batch_size": 2, "max_steps": 1, "ttt_steps": 1},
        "output_dir": str(tmp_path / "run"),
        "export": {"dtype": "float32"},
        "log_every": 0,
    }
    trainer = run(cfg, device=torch.device("cpu"))
    folder = tmp_path / "run" / "export"
    exported = load_file(str(folder / "model.safetensors"))
    assert torch.equal(exported["embed_tokens.weight"], trainer.model.embed_tokens.weight)
    # vLLM keeps a draft's own embedding; SGLang swaps in the target's whenever the widths are equal ...
    assert load_folder(folder, "vllm", 8).embedding_source == "draft"
    assert load_folder(folder, "sglang", 8).embedding_source == "target"
    # ... so the two engines serve different drafts: reported, and recorded in the folder by the export
    (problem,) = check_export(folder, (1, 2, 3), 8).problems
    assert problem.startswith("sglang would serve the target's embedding in place of the folder's embed_tokens")
    assert "vllm the draft's own: the engines serve different drafts" in problem
    forge = json.loads((folder / "config.json").read_text())["eagle_forge"]
    assert forge["embedding_served_by"] == {"sglang": "target", "vllm": "draft"}
    assert len(forge["warnings"]) == 1 and "SGLang serves it with the target's embedding" in forge["warnings"][0]


def test_a_narrower_draft_must_carry_its_embedding(tmp_path):
    with pytest.raises(ValueError, match="save_embeddings"):
        small_config(target_hidden_size=48)
    torch.manual_seed(0)
    draft = Eagle3Draft(small_config(target_hidden_size=48, save_embeddings=True))
    folder = export_draft(draft, tmp_path / "narrow", dtype=torch.float32)
    result = check_export(folder, (1, 2, 3), 8)
    assert result.problems == []
    for load in result.loads.values():
        assert load.embedding_source == "draft"
        assert load.params["model.fc.weight"].shape == (32, 144)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["embed_tokens.weight"]
    _rewrite(folder, tensors=tensors)
    problems = check_export(folder, (1, 2, 3), 8).problems
    assert any("sglang left model.embed_tokens.weight" in p for p in problems)
    assert any(p.startswith("vllm would take the target's embedding") for p in problems)


def test_the_cli_reports_a_draft_the_engines_would_serve_with_different_embeddings(tmp_path, capsys):
    torch.manual_seed(0)
    own = Eagle3Draft(small_config(aux_layer_ids=(2, 30, 58), target_num_layers=61, save_embeddings=True))
    with pytest.warns(EngineEmbeddingWarning, match="the two engines serve different drafts"):
        folder = export_draft(own, tmp_path / "own", dtype=torch.float32)
    assert engine_loaders_main([str(folder), "--trained-layers", "2,30,58", "--target-layers", "61"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "1 problem(s)" and "ok" not in out.splitlines()
    assert "PROBLEM: sglang would serve the target's embedding in place of the folder's embed_tokens" in err
    # the same draft with the target's embedding (none in the folder) is served alike by both: "ok", no warning
    shared = Eagle3Draft(small_config(aux_layer_ids=(2, 30, 58), target_num_layers=61))
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineEmbeddingWarning)
        folder = export_draft(shared, tmp_path / "target-embedding", dtype=torch.float32)
    assert engine_loaders_main([str(folder), "--trained-layers", "2,30,58", "--target-layers", "61"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ok"
    assert json.loads((folder / "config.json").read_text())["eagle_forge"]["warnings"] == []


@pytest.mark.parametrize(
    ("ids", "why"),
    [((3, 3, 3), "must differ"), ((4, 3, 2), "ordered low → high"), ((-1, 3, 5), "outside 1..60")],
)
def test_aux_layer_ids_are_validated_on_the_export_and_training_path(tmp_path, ids, why):
    with pytest.raises(ValueError, match=why):
        small_config(aux_layer_ids=ids, target_num_layers=61)
    # an export whose config.json was edited by hand is refused when loaded back ...
    draft = Eagle3Draft(small_config(aux_layer_ids=(2, 30, 58), target_num_layers=61))
    folder = export_draft(draft, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eagle_forge"]["aux_layers"]["hf_indices"] = list(ids)
    _rewrite(folder, config=cfg)
    with pytest.raises(ValueError, match=why):
        load_draft(folder, embed_weight=torch.zeros(128, 32))
    # ... and a training run asked for such layers never starts
    cfg = {
        "seed": 0,
        "model": {**small_config().to_dict(), "aux_layer_ids": list(ids), "target_num_layers": 61},
        "embeddings": {"kind": "synthetic"},
        "vocab": {"kind": "identity"},
        "data": {"kind": "synthetic", "n_samples": 4, "length": [8, 10]},
        "train": {"lr": 1e-3, "batch_size": 2, "max_steps": 1, "ttt_steps": 1},
        "output_dir": str(tmp_path / "run"),
        "log_every": 0,
    }
    with pytest.raises(ValueError, match=why):
        run(cfg, device=torch.device("cpu"))
