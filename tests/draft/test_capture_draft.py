"""The SGLang capture draft's ``config.json`` is the exporter's: a key both engines read is written in one place."""

import json

from eagle_assets.draft.export import config_from_export, export_config
from eagle_assets.hidden_states.capture_draft import write_capture_draft
from eagle_assets.hidden_states.layers import AuxLayers


def test_the_capture_drafts_config_is_the_exporters_with_the_values_it_always_had(tmp_path):
    target = tmp_path / "kimi"
    target.mkdir()
    text = {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}
    (target / "config.json").write_text(json.dumps({"text_config": text}))
    layers = AuxLayers.default(61)
    folder = write_capture_draft(tmp_path / "capture", target, layers, weights=False)
    written = json.loads((folder / "config.json").read_text())

    exported = export_config(config_from_export(written))
    purpose = {"purpose": "capture-only placeholder draft (zero weights)", "layers": layers.to_dict()}
    assert written == {**exported, "eagle_forge": {**exported["eagle_forge"], **purpose}}
    # Every key the hand-written config had, with its value (Kimi K2.5: 56 heads x 128, SGLang ids HF - 1).
    before = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 7168,
        "target_hidden_size": 7168,
        "intermediate_size": 7168,
        "num_hidden_layers": 1,
        "num_attention_heads": 56,
        "num_key_value_heads": 56,
        "head_dim": 128,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "vocab_size": 163840,
        "draft_vocab_size": 32000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
    }
    assert {k: written[k] for k in before} == before
    assert written["eagle_forge"]["layers"]["hf_indices"] == [2, 30, 58]
