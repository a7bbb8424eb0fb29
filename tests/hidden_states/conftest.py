"""Shared fixtures: one tiny target per session (built once, ~1 s), small synthetic corpora."""

import random

import pytest
import torch

from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.target.tiny import build_tiny_target, load_target


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_target(tmp_path_factory.mktemp("target") / "tiny-kimi", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    return load_target(tiny_dir, "cpu", torch.float32)


def make_corpus(
    seed: int = 0, n_shards: int = 4, per_shard: tuple[int, int] = (2, 5), length: tuple[int, int] = (3, 40)
):
    """Shards of random Kimi-vocabulary samples with random assistant masks."""
    r = random.Random(seed)
    shards = []
    for k in range(n_shards):
        shard = []
        for i in range(r.randint(*per_shard)):
            n = r.randint(*length)
            shard.append(
                HiddenStateSample(
                    f"s{seed}-{k}-{i}", [r.randrange(163_584) for _ in range(n)], [r.randint(0, 1) for _ in range(n)]
                )
            )
        shards.append(shard)
    return shards


@pytest.fixture
def corpus():
    return make_corpus()


@torch.inference_mode()
def direct_forward(model, sample):
    """The reference: one unpadded sample through the full model with output_hidden_states=True."""
    return model(torch.tensor([list(sample.input_ids)]), output_hidden_states=True)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| relative to b's largest magnitude."""
    return float((a - b).abs().max() / b.abs().max())


def assert_same_store(ours, ref, tolerance: float = 1e-5) -> None:
    """Two hidden-state stores (folders) hold the same rows: the same samples, shapes, and features within
    ``tolerance`` (relative); neither empty."""
    from eagle_assets.hidden_states.store import HiddenStateStore

    a_store, b_store = HiddenStateStore(ours), HiddenStateStore(ref)
    assert len(a_store) == len(b_store) > 0
    for a, b in zip(a_store, b_store, strict=True):
        assert a["aux"].shape == b["aux"].shape and a["last"].shape == b["last"].shape
        assert relative(a["aux"], b["aux"]) < tolerance
        assert relative(a["last"], b["last"]) < tolerance
