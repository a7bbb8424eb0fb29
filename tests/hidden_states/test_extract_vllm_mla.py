"""Kimi K2.5's architecture through the real vLLM engine: the tiny Kimi's text model (DeepSeek-V3: multi-head
latent attention at the release's 512 + 64 latent widths, the MoE's sigmoid router) at tensor-parallel size 2,
whose store must equal the HF backend's. This is where vLLM's CPU rotary kernel, wrong on MLA's 3-D queries, was
found: with it the features were 0.4-2.6% off (``vllm_engine.CPU_NATIVE_OPS``).

One engine (tp=2: 20-25 s to start here), in a module of its own: an in-process engine's shutdown tears down the
process's tensor-parallel groups, which another module's engine still running would need.
"""

from __future__ import annotations

import json

import pytest
import torch

from eagle_assets.hidden_states.extract_hf import extract_hf
from eagle_assets.hidden_states.extract_vllm import VLLMEngineConfig, extract_vllm
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.target.tiny_kimi import VLLM_CPU_KIMI_SPEC, build_tiny_kimi_text_target
from tests.hidden_states.conftest import assert_same_store, make_corpus
from tests.vllm_engines import require_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
require_vllm()


def test_the_kimi_text_model_at_tp2_gives_the_hf_store(tmp_path):
    target = build_tiny_kimi_text_target(tmp_path / "tiny-kimi-text")
    assert json.loads((target / "config.json").read_text())["kv_lora_rank"] == VLLM_CPU_KIMI_SPEC.kv_lora_rank
    corpus = make_corpus(seed=3)
    extract_hf(
        str(target),
        corpus,
        tmp_path / "hf",
        model_id="tiny",
        dtype=torch.float32,
        last_kind="pre_norm",
        device="cpu",
        check_space=False,
    )
    config = VLLMEngineConfig(
        model_path=str(target),
        layers=AuxLayers.default(VLLM_CPU_KIMI_SPEC.num_hidden_layers),
        tp_size=2,
        max_seq_len=512,
        max_tokens_per_batch=1024,
        dtype="float32",
        scratch_dir=str(tmp_path / "handoff"),
    )
    report = extract_vllm(corpus, tmp_path / "vllm", config, model_id="tiny", dtype=torch.float32, check_space=False)
    assert report.shards_computed == len(corpus) and report.tokens_computed > 0
    assert_same_store(tmp_path / "vllm", tmp_path / "hf")
    index = json.loads((tmp_path / "vllm" / "index.json").read_text())
    assert index["last_kind"] == "pre_norm" and index["extra"]["tp_size"] == 2
