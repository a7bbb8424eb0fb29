import pytest
import torch

from eagle_assets.draft.speculative import evaluate_acceptance, speculative_generate
from tests.draft.helpers import (
    TINY_VOCAB,
    draft_for,
    generate_greedy,
    tiny_llama,
    trained_draft,
)

PROMPT, NEW = 6, 26


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def prompts():
    return torch.randint(0, TINY_VOCAB, (52, PROMPT), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def trained(target, prompts):
    return trained_draft(target, prompts[:48], NEW)


def test_untrained_draft_output_equals_greedy(target, prompts):
    draft = draft_for(target).eval()
    for p in prompts[48:50]:
        r = speculative_generate(target, draft, p, 20, num_draft_tokens=3)
        assert r.tokens == generate_greedy(target, p, 20, eos_id=None)
        assert r.tau >= 1.0 and len(r.accepted) >= 1


@pytest.mark.slow
def test_trained_draft_output_equals_greedy_and_beats_untrained(target, prompts, trained):
    held_out = prompts[48:].tolist()
    for k in (1, 3, 5):
        for p in held_out[:2]:
            r = speculative_generate(target, trained, p, 24, num_draft_tokens=k)
            assert r.tokens == generate_greedy(target, p, 24, eos_id=None)
            assert len(r.position_accept_rate) == k and all(0.0 <= a <= 1.0 for a in r.position_accept_rate)
    base = evaluate_acceptance(target, draft_for(target), held_out, 24, num_draft_tokens=3)
    good = evaluate_acceptance(target, trained, held_out, 24, num_draft_tokens=3)
    assert base.tau < 1.2
    assert good.tau > base.tau + 0.8, (good.tau, good.position_accept_rate)


def test_stops_at_eos_like_greedy(target, prompts, trained):
    p = prompts[50]
    ref = generate_greedy(target, p, 24, eos_id=None)
    eos = ref[9]  # pretend the 10th generated token ends the turn
    r = speculative_generate(target, trained, p, 24, num_draft_tokens=3, eos_id=eos)
    assert r.tokens == generate_greedy(target, p, 24, eos_id=eos)
    assert r.tokens[-1] == eos
