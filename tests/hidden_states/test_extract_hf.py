import json

import pytest
import torch

from eagle_assets.draft.target import TargetHead, load_target_head
from eagle_assets.hidden_states.extract_hf import HFFeatureExtractor, extract_hf, pad_batch
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.store import HiddenStateStore
from tests.hidden_states.conftest import direct_forward, make_corpus

F32 = torch.float32


def target_logits(last: torch.Tensor, head: TargetHead) -> torch.Tensor:
    """The target's logits at every stored position, from the stored last hidden state."""
    with torch.no_grad():
        return head(last)


def flat(corpus):
    return [s for shard in corpus for s in shard]


def extract(model, corpus, out, **kw):
    kw.setdefault("dtype", F32)
    kw.setdefault("model_id", "tiny-kimi-seed0")
    return extract_hf(model, corpus, out, **kw)


def test_padded_batches_equal_a_direct_forward(tmp_path, tiny_model, corpus):
    report = extract(tiny_model, corpus, tmp_path, max_tokens_per_batch=96)
    assert report.shards_computed == len(corpus) and report.tokens_computed == sum(len(s) for s in flat(corpus))
    store = HiddenStateStore(tmp_path)
    assert store.layers.hf_indices == (2, 3, 4)
    for i, s in enumerate(flat(corpus)):
        item, ref = store[i], direct_forward(tiny_model, s)
        aux = torch.cat([ref.hidden_states[j][0] for j in (2, 3, 4)], dim=-1)
        torch.testing.assert_close(item["aux"], aux, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(item["last"], ref.hidden_states[-1][0], rtol=1e-5, atol=1e-5)
        assert item["input_ids"].tolist() == list(s.input_ids)


def test_unbatched_extraction_is_bitwise_and_reproduces_the_logits(tmp_path, tiny_model, corpus):
    # One sample per batch = the same arithmetic as the reference forward, so equality is exact.
    extract(tiny_model, corpus, tmp_path, max_tokens_per_batch=1)
    store = HiddenStateStore(tmp_path)
    head = TargetHead.from_model(tiny_model)
    for i, s in enumerate(flat(corpus)):
        item, ref = store[i], direct_forward(tiny_model, s)
        assert torch.equal(item["aux"], torch.cat([ref.hidden_states[j][0] for j in (2, 3, 4)], dim=-1))
        assert torch.equal(item["last"], ref.hidden_states[-1][0])
        assert torch.equal(target_logits(item["last"], head), ref.logits[0])


def test_head_loaded_from_the_checkpoint_gives_the_model_logits(tmp_path, tiny_dir, tiny_model, corpus):
    extract(tiny_model, corpus[:1], tmp_path, max_tokens_per_batch=64)
    store = HiddenStateStore(tmp_path)
    head = load_target_head(tiny_dir, store.meta.last_kind)
    assert torch.equal(head.lm_head.weight, tiny_model.lm_head.weight)
    for i, s in enumerate(corpus[0]):
        logits = target_logits(store[i]["last"], head)
        ref = direct_forward(tiny_model, s).logits[0]
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=2e-5)
        assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_pre_norm_variant_needs_and_applies_the_final_norm(tmp_path, tiny_dir, tiny_model, corpus):
    extract(tiny_model, corpus[:2], tmp_path, last_kind="pre_norm", max_tokens_per_batch=1)
    store = HiddenStateStore(tmp_path)
    assert store.meta.last_kind == "pre_norm"
    heads = [TargetHead.from_model(tiny_model, "pre_norm"), load_target_head(tiny_dir, "pre_norm")]
    for i, s in enumerate(flat(corpus[:2])):
        ref = direct_forward(tiny_model, s)
        last = store[i]["last"]
        assert not torch.allclose(last, ref.hidden_states[-1][0])  # really before the norm
        assert torch.equal(target_logits(last, heads[0]), ref.logits[0])
        torch.testing.assert_close(target_logits(last, heads[1]), ref.logits[0], rtol=1e-5, atol=2e-5)
    with pytest.raises(ValueError, match="final norm"):
        TargetHead(tiny_model.lm_head.weight, last_kind="pre_norm")


def test_hooks_equal_output_hidden_states_capture(tiny_model, corpus):
    layers = AuxLayers.default(7)
    batch = flat(corpus)[:6]
    ids, mask, _ = pad_batch(batch, 163_839, torch.device("cpu"))
    hooks = HFFeatureExtractor(tiny_model, layers, out_dtype=F32).forward_features(ids, mask)
    full = HFFeatureExtractor(tiny_model, layers, out_dtype=F32, capture="output_hidden_states")
    ref = full.forward_features(ids, mask)
    assert torch.equal(hooks["aux"], ref["aux"]) and torch.equal(hooks["last"], ref["last"])
    # and no hook is left behind on the user's model
    assert all(not m._forward_pre_hooks for m in tiny_model.model.layers)


def test_other_layers_and_sglang_spelling(tmp_path, tiny_model, corpus):
    extract(tiny_model, corpus[:1], tmp_path, layers=[0, 3, 5], layer_convention="sglang", with_last=False)
    store = HiddenStateStore(tmp_path)
    assert store.layers.hf_indices == (1, 4, 6) and "last" not in store[0]
    ref = direct_forward(tiny_model, corpus[0][0])
    torch.testing.assert_close(
        store[0]["aux"], torch.cat([ref.hidden_states[j][0] for j in (1, 4, 6)], -1), rtol=1e-5, atol=1e-5
    )
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["layers"]["sglang_eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]
    assert index["model_id"] == "tiny-kimi-seed0" and index["with_last"] is False


def test_loading_from_a_directory_and_bf16_default(tmp_path, tiny_dir, tiny_model, corpus):
    extract_hf(tiny_dir, corpus[:1], tmp_path, device="cpu")
    store = HiddenStateStore(tmp_path)
    assert store.meta.dtype == torch.bfloat16 and store[0]["aux"].dtype == torch.bfloat16
    assert store.meta.model_id == str(tiny_dir)
    ref = direct_forward(tiny_model, corpus[0][0])
    torch.testing.assert_close(store[0]["last"].float(), ref.hidden_states[-1][0], rtol=1e-2, atol=1e-2)


class Interrupt(Exception):
    pass


def test_resume_after_interruption_computes_only_missing_shards(tmp_path, tiny_model):
    corpus = make_corpus(seed=3, n_shards=5)
    calls = {"n": 0}
    counter = tiny_model.model.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    try:
        events = []

        def crash_after_two_shards(p):
            events.append(p)
            if p.event == "shard" and p.shards_done == 2:
                raise Interrupt

        with pytest.raises(Interrupt):
            extract(tiny_model, corpus, tmp_path / "resumed", max_tokens_per_batch=48, progress=crash_after_two_shards)
        assert events[-1].tokens_total == sum(len(s) for s in flat(corpus)) and events[-1].tokens_per_s > 0
        first_calls = calls["n"]
        assert len(HiddenStateStore(tmp_path / "resumed")) == len(corpus[0]) + len(corpus[1])

        calls["n"] = 0
        report = extract(tiny_model, corpus, tmp_path / "resumed", max_tokens_per_batch=48)
        resumed_calls = calls["n"]
        calls["n"] = 0
        extract(tiny_model, corpus, tmp_path / "straight", max_tokens_per_batch=48)
        straight_calls = calls["n"]
    finally:
        counter.remove()
    assert (report.shards_skipped, report.shards_computed) == (2, 3)
    assert report.tokens_computed == sum(len(s) for shard in corpus[2:] for s in shard)
    assert first_calls + resumed_calls == straight_calls  # nothing computed twice
    a, b = HiddenStateStore(tmp_path / "resumed"), HiddenStateStore(tmp_path / "straight")
    assert len(a) == len(b) == len(flat(corpus))
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    # A third run is a no-op.
    calls_before = calls["n"]
    assert extract(tiny_model, corpus, tmp_path / "resumed").shards_computed == 0
    assert calls["n"] == calls_before


def test_interruption_inside_a_shard_leaves_it_for_the_rerun(tmp_path, tiny_model):
    corpus = make_corpus(seed=4, n_shards=2, per_shard=(4, 5))

    def crash_mid_shard(p):
        if p.event == "batch" and p.shard_index == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        extract(tiny_model, corpus, tmp_path, max_tokens_per_batch=40, progress=crash_mid_shard)
    assert not (tmp_path / "shard-00001.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    report = extract(tiny_model, corpus, tmp_path, max_tokens_per_batch=40)
    assert (report.shards_skipped, report.shards_computed) == (1, 1)
