import pytest

from eagle_assets.hidden_states.layers import AuxLayers, default_hf_indices, resolve_aux_layers


def test_kimi_k2_default_and_engine_spellings():
    layers = AuxLayers.default(61)
    assert layers.hf_indices == (2, 30, 58)  # the doc's figure for Kimi K2, 61 layers
    assert layers.decoder_layer_inputs == (2, 30, 58)
    assert layers.decoder_layer_outputs == (1, 29, 57)
    assert layers.sglang_ids == (1, 29, 57)  # SGLang adds +1 to explicit ids
    assert layers.vllm_ids == (2, 30, 58)  # vLLM uses them as given


def test_conversions_round_trip():
    layers = AuxLayers.default(32)
    assert layers.hf_indices == (2, 16, 29)
    assert AuxLayers.from_sglang_ids(layers.sglang_ids, 32) == layers
    assert AuxLayers.from_vllm_ids(layers.vllm_ids, 32) == layers
    assert AuxLayers.from_dict(layers.to_dict()) == layers
    assert resolve_aux_layers(32, [1, 15, 28], convention="sglang") == layers
    assert resolve_aux_layers(32, [2, 16, 29], convention="vllm") == layers
    assert resolve_aux_layers(32) == layers


def test_recorded_dict_names_every_convention():
    d = AuxLayers.default(7).to_dict()
    assert d["convention"] == "hf_output_hidden_states_index"
    assert d["hf_indices"] == [2, 3, 4]
    assert d["sglang_eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert d["vllm_eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    d["sglang_eagle_aux_hidden_state_layer_ids"] = [2, 3, 4]  # someone "fixed" one spelling only
    with pytest.raises(ValueError, match="contradicts"):
        AuxLayers.from_dict(d)


@pytest.mark.parametrize("bad", [(2, 3, 7), (-1, 2, 3), (4, 3, 5)])
def test_out_of_range_or_unordered_indices_refused(bad):
    with pytest.raises(ValueError):
        AuxLayers(bad, 7)


def test_small_models_and_mismatch():
    assert default_hf_indices(6) == (2, 3, 3)  # why the tiny target has 7 layers
    with pytest.raises(ValueError):
        default_hf_indices(3)
    with pytest.raises(ValueError, match="target has 8"):
        resolve_aux_layers(8, AuxLayers.default(7))
    with pytest.raises(ValueError, match="unknown convention"):
        resolve_aux_layers(8, [1, 2, 3], convention="hf+1")
