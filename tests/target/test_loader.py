"""The one target loader: plain causal LMs and vision-language wrappers alike, one clear refusal otherwise."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import BertConfig, BertModel

from eagle_assets.draft.target import load_target_head
from eagle_assets.target import checkpoint_tensors
from eagle_assets.target.checkpoint_tensors import INDEX_FILE, checkpoint_tensor
from eagle_assets.target.loader import TargetLoadError, load_target
from eagle_assets.target.tiny import KIMI_VOCAB_SIZE


def test_a_wrapper_loads_as_its_text_causal_lm(kimi_dir, kimi_model):
    config = json.loads((kimi_dir / "config.json").read_text())
    assert config["model_type"] == "kimi_k25" and config["architectures"] == ["Kimi_K25ForConditionalGeneration"]
    # The vision tower and projector never reach the device: the text model, as transformers' causal LM for it.
    assert type(kimi_model).__name__ == "DeepseekV3ForCausalLM"
    assert not any("vision" in n or "mm_projector" in n for n, _ in kimi_model.named_parameters())
    assert kimi_model.config.vocab_size == KIMI_VOCAB_SIZE and kimi_model.lm_head.weight.shape[0] == KIMI_VOCAB_SIZE
    # Same logits as the whole wrapper on text.
    whole = load_target(kimi_dir, text_only=False)
    assert type(whole).__name__ == "Kimi_K25ForConditionalGeneration"
    ids = torch.tensor([[163584, 1000, 2000, 3000, 4000, 5000]])
    with torch.inference_mode():
        assert torch.equal(kimi_model(ids).logits, whole(ids).logits)
    # Without the head (the extraction runs the decoder alone).
    assert load_target(kimi_dir, with_head=False).get_output_embeddings() is None


def test_a_checkpoint_that_is_no_causal_lm_is_refused_with_one_clear_message(tmp_path):
    # BERT's config is even in transformers' causal-LM mapping (BertLMHeadModel); its checkpoint is an encoder.
    bert = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertModel(bert).save_pretrained(tmp_path / "bert")
    with pytest.raises(TargetLoadError) as err:
        load_target(tmp_path / "bert")
    message = str(err.value)
    for part in (
        "model_type 'bert'",
        "architectures ['BertModel']",
        "AutoModelForCausalLM",
        "AutoModelForImageTextToText",
    ):
        assert part in message
    assert isinstance(err.value, ValueError)  # still caught where a ValueError was


def test_the_head_and_norm_are_read_from_the_one_shard_that_holds_them(tmp_path, kimi_model, monkeypatch):
    sharded = tmp_path / "sharded"
    load_target(kimi_model.config.name_or_path, text_only=False).save_pretrained(sharded, max_shard_size="6MB")
    index = json.loads((sharded / INDEX_FILE).read_text())["weight_map"]
    head_file, norm_file = index["language_model.lm_head.weight"], index["language_model.model.norm.weight"]
    assert len(set(index.values())) == 3 and head_file != norm_file  # the two 40 MB matrices, the rest
    opened: list[str] = []

    def recording_open(file, *args, **kwargs):
        opened.append(file)
        return safe_open(file, *args, **kwargs)

    monkeypatch.setattr(checkpoint_tensors, "safe_open", recording_open)
    head = load_target_head(sharded, "pre_norm")
    assert [f.rsplit("/", 1)[-1] for f in opened] == [head_file, norm_file]  # never the embeddings' shard
    assert torch.equal(head.lm_head.weight, kimi_model.lm_head.weight)
    assert head.norm is not None and torch.equal(head.norm.state_dict()["weight"], kimi_model.model.norm.weight)
    assert checkpoint_tensor(sharded, ("no.such.tensor",)) is None
