import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from eagle_assets.draft.model import DraftKVCache, Eagle3Config, Eagle3Draft, apply_rope, rope_cos_sin
from eagle_assets.draft.ttt import TTTAttention
from eagle_assets.target.tiny_targets import TINY_TARGETS
from tests.draft.helpers import small_config, tiny_llama

EXPECTED = {
    "fc.weight": (32, 96),
    "midlayer.self_attn.q_proj.weight": (32, 64),
    "midlayer.self_attn.k_proj.weight": (16, 64),
    "midlayer.self_attn.v_proj.weight": (16, 64),
    "midlayer.self_attn.o_proj.weight": (32, 32),
    "midlayer.mlp.gate_proj.weight": (64, 32),
    "midlayer.mlp.up_proj.weight": (64, 32),
    "midlayer.mlp.down_proj.weight": (32, 64),
    "midlayer.input_layernorm.weight": (32,),
    "midlayer.hidden_norm.weight": (32,),
    "midlayer.post_attention_layernorm.weight": (32,),
    "norm.weight": (32,),
    "lm_head.weight": (64, 32),
    "d2t": (64,),
    "t2d": (128,),
}


def test_checkpoint_names_match_sglang_vllm_layout():
    m = Eagle3Draft(small_config())
    sd = m.checkpoint_state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == EXPECTED
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert not m.embed_tokens.weight.requires_grad
    assert "embed_tokens.weight" in Eagle3Draft(small_config(save_embeddings=True)).checkpoint_state_dict()


def test_config_from_target_mirrors_geometry():
    target = tiny_llama()
    cfg = Eagle3Config.from_target(target.config, 256, (1, 2, 3))
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (64, 4, 2, 16)
    assert (cfg.target_vocab_size, cfg.draft_vocab_size, cfg.target_num_layers) == (512, 256, 4)
    assert Eagle3Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", TINY_TARGETS)
def test_sizing_from_config_json_is_sizing_from_the_hf_config(name, tmp_path):
    """Training processes size the draft from ``config.json`` as written (no transformers import); every tiny
    target, the Llama and the Kimi K2.5 wrapper (MLA, nested ``text_config``), must size the same as from the
    config object transformers builds of that file, defaults included."""
    from transformers import AutoConfig

    from eagle_assets.target.architecture import read_target_config
    from eagle_assets.target.tiny_targets import build_named_tiny_target

    path = build_named_tiny_target(name, tmp_path / name)
    hf = Eagle3Config.from_target(AutoConfig.from_pretrained(path, local_files_only=True), 128)
    assert Eagle3Config.from_target(read_target_config(path), 128) == hf


def test_a_target_folder_without_a_readable_config_is_named(tmp_path):
    from eagle_assets.target.architecture import read_target_config

    with pytest.raises(FileNotFoundError, match=r"no config\.json in the target folder"):
        read_target_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        read_target_config(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        read_target_config(tmp_path)


def test_rope_and_norm_match_hf_llama():
    target = tiny_llama()
    rot = LlamaRotaryEmbedding(config=target.config)
    x = torch.randn(1, 4, 9, 16)
    pos = torch.arange(3, 12)[None]
    cos_hf, sin_hf = rot(x, pos)
    q_hf, _ = apply_rotary_pos_emb(x, x, cos_hf, sin_hf)
    theta = Eagle3Config.from_target(target.config, 256, (1, 2, 3)).rope_theta
    cos, sin = rope_cos_sin(pos[0], 16, theta, x.dtype)
    torch.testing.assert_close(apply_rope(x, cos, sin), q_hf, rtol=0, atol=1e-6)
    h = torch.randn(2, 5, 64)
    norm_hf = LlamaRMSNorm(64, eps=1e-6)
    from eagle_assets.draft.model import RMSNorm

    torch.testing.assert_close(RMSNorm(64, 1e-6)(h), norm_hf(h), rtol=0, atol=0)


def test_step_residual_is_unnormalised_hidden():
    # With every projection zeroed the layer is the identity on h: the residual path carries raw h.
    m = Eagle3Draft(small_config())
    with torch.no_grad():
        for name, p in m.midlayer.named_parameters():
            if "proj" in name:
                p.zero_()
    h = torch.randn(1, 5, 32) * 7
    out, logits = m.step(h, torch.zeros(1, 5, dtype=torch.long), torch.arange(5), TTTAttention())
    assert torch.equal(out, h) and logits.shape == (1, 5, 64)


def test_kv_cache_incremental_equals_full():
    torch.manual_seed(0)
    m = Eagle3Draft(small_config())
    with torch.no_grad():
        m.embed_tokens.weight.normal_()
    h = torch.randn(1, 7, 32)
    ids = torch.randint(0, 128, (1, 7))
    full, _ = m.step(h, ids, torch.arange(7), DraftKVCache().attend)
    cache = DraftKVCache()
    a, _ = m.step(h[:, :4], ids[:, :4], torch.arange(4), cache.attend)
    b, _ = m.step(h[:, 4:], ids[:, 4:], torch.arange(4, 7), cache.attend)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-5, atol=1e-6)
    cache.crop(4)
    assert len(cache) == 4
