import json

import torch

from eagle_assets.target.tiny import (
    COMPLETE_MARKER,
    KIMI_EOS_ID,
    KIMI_PAD_ID,
    KIMI_VOCAB_SIZE,
    TinyTargetSpec,
    build_tiny_target,
    load_target,
    make_tiny_target,
)
from tests.draft.helpers import generate_greedy


def test_config_is_kimi_shaped(tiny_model):
    cfg = tiny_model.config
    assert cfg.vocab_size == KIMI_VOCAB_SIZE == 163_840
    assert cfg.eos_token_id == KIMI_EOS_ID == 163_586
    assert cfg.pad_token_id == KIMI_PAD_ID == 163_839
    assert cfg.tie_word_embeddings is False
    assert cfg.num_hidden_layers == 7 and cfg.hidden_size == 64
    assert not torch.equal(tiny_model.lm_head.weight, tiny_model.model.embed_tokens.weight[: cfg.vocab_size])


def test_build_is_deterministic_and_skips_when_complete(tmp_path, tiny_dir, tiny_model):
    again = build_tiny_target(tiny_dir, seed=0)
    assert again == tiny_dir  # complete: nothing rebuilt
    fresh = make_tiny_target(TinyTargetSpec(seed=0))
    for (n1, p1), (_, p2) in zip(fresh.state_dict().items(), tiny_model.state_dict().items(), strict=True):
        assert torch.equal(p1, p2), n1
    other = make_tiny_target(TinyTargetSpec(seed=1))
    assert not torch.equal(other.lm_head.weight, fresh.lm_head.weight)


def test_incomplete_or_other_seed_is_rebuilt(tmp_path):
    path = build_tiny_target(tmp_path / "m", seed=3)
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    weights = next(f for f in marker["files"] if f.endswith(".safetensors"))
    with open(path / weights, "r+b") as f:  # a torn copy
        f.truncate(1000)
    build_tiny_target(path, seed=3)
    assert (path / weights).stat().st_size == marker["files"][weights]
    build_tiny_target(path, seed=4)  # same place, other spec: replaced, not silently reused
    assert json.loads((path / COMPLETE_MARKER).read_text())["spec"]["seed"] == 4
    assert not any(p.name.startswith(".m.") for p in tmp_path.iterdir())  # no temporaries left
    assert load_target(path).config.vocab_size == KIMI_VOCAB_SIZE


@torch.inference_mode()
def test_generate_greedy_matches_full_recompute(tiny_model):
    prompt = torch.randint(0, 163_584, (9,), generator=torch.Generator().manual_seed(0))
    got = generate_greedy(tiny_model, prompt, 6, eos_id=None)
    ids = prompt.tolist()
    for _ in range(6):  # no cache: the whole sequence every step
        ids.append(int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert got == ids[9:]


def test_generate_greedy_stops_at_eos(tiny_model):
    prompt = [5, 6, 7]
    first = generate_greedy(tiny_model, prompt, 1, eos_id=None)[0]
    assert generate_greedy(tiny_model, prompt, 10, eos_id=first) == [first]


def test_greedy_output_is_not_degenerate(tiny_model):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 163_584, (12,), generator=g) for _ in range(4)]
    outs = [generate_greedy(tiny_model, p, 32, eos_id=None) for p in prompts]
    assert len({tuple(o) for o in outs}) == len(outs)  # different prompts, different answers
    assert all(len(set(o)) >= 24 for o in outs)  # no short loop
    # Context matters: changing only the first prompt token changes some next-token predictions.
    batch = torch.randint(0, 163_584, (32, 16), generator=g)
    changed = batch.clone()
    changed[:, 0] = (changed[:, 0] + 11) % 163_584
    with torch.inference_mode():
        logits = tiny_model(batch, logits_to_keep=1).logits[:, -1]
        a = logits.argmax(-1)
        b = tiny_model(changed, logits_to_keep=1).logits[:, -1].argmax(-1)
        probs = logits.softmax(-1)
    assert (a != b).any()
    assert probs.max(-1).values.mean() > 0.1  # a peaked distribution, not a flat one
