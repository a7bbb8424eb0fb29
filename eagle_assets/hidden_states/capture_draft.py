"""The zero-weight EAGLE-3 draft whose only job is to make an SGLang engine capture the aux layers: SGLang captures
them only in EAGLE-3 mode, reading the layer ids (SGLang's spelling) from a draft's config."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.target.architecture import read_target_dims


def capture_draft_name(model_path: str | Path, layers: AuxLayers) -> str:
    """A folder name that changes with the target and the layers it captures (a draft for other layers would
    make SGLang capture those instead, silently)."""
    ids = "-".join(str(i) for i in layers.sglang_ids)
    digest = hashlib.sha256(str(Path(model_path).resolve()).encode()).hexdigest()[:12]
    return f"{Path(model_path).name}-{digest}-layers-{ids}"


def ensure_capture_draft(public: str | Path, model_path: str | Path, layers: AuxLayers) -> Path:
    """The capture draft at ``public``, written (and published whole, so a crash or a second shard writing it at
    the same time never leaves a half-written folder) unless one for the same layers is already there."""
    from eagle_assets.durable_files import current_version, publishing_directory

    public = Path(public)
    config = public / "config.json"
    if current_version(public) is not None and config.is_file():
        ids = json.loads(config.read_text()).get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
        if ids == list(layers.sglang_ids):
            return public
    public.parent.mkdir(parents=True, exist_ok=True)
    with publishing_directory(public) as staged:
        write_capture_draft(staged, model_path, layers)
    return public


def write_capture_draft(
    directory: str | Path,
    model_path: str | Path,
    layers: AuxLayers,
    *,
    weights: bool = True,
) -> Path:
    """Zero weights keep the draft's outputs finite and its proposals irrelevant (with ``max_new_tokens=1`` the
    answer is the target's prefill); any trained EAGLE-3 draft of the target with the same layer ids works as well."""
    from eagle_assets.draft.export import export_config
    from eagle_assets.draft.model import Eagle3Config

    dims = read_target_dims(model_path)
    h = dims.hidden_size
    heads = max(1, h // 128)
    head_dim = h // heads
    inter = h  # any size works for a zero-weight draft; small keeps it ~1.8 GB at H=7168
    draft_vocab_size = 32000
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    shape = Eagle3Config(
        hidden_size=h,
        intermediate_size=inter,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        target_vocab_size=dims.vocab_size,
        draft_vocab_size=draft_vocab_size,
        aux_layer_ids=layers.hf_indices,
        target_hidden_size=h,
        rms_norm_eps=1e-6,
        rope_theta=50000.0,
        max_position=262144,
        target_num_layers=layers.num_layers,
    )
    config = export_config(shape, dtype=torch.bfloat16)
    config["eagle_forge"].update(purpose="capture-only placeholder draft (zero weights)", layers=layers.to_dict())
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if weights:
        from safetensors.torch import save_file

        bf = torch.bfloat16
        n = layers.n_aux
        tensors = {
            "fc.weight": torch.zeros(h, n * h, dtype=bf),
            "midlayer.hidden_norm.weight": torch.ones(h, dtype=bf),
            "midlayer.input_layernorm.weight": torch.ones(h, dtype=bf),
            "midlayer.post_attention_layernorm.weight": torch.ones(h, dtype=bf),
            "midlayer.self_attn.q_proj.weight": torch.zeros(heads * head_dim, 2 * h, dtype=bf),
            "midlayer.self_attn.k_proj.weight": torch.zeros(heads * head_dim, 2 * h, dtype=bf),
            "midlayer.self_attn.v_proj.weight": torch.zeros(heads * head_dim, 2 * h, dtype=bf),
            "midlayer.self_attn.o_proj.weight": torch.zeros(h, heads * head_dim, dtype=bf),
            "midlayer.mlp.gate_proj.weight": torch.zeros(inter, h, dtype=bf),
            "midlayer.mlp.up_proj.weight": torch.zeros(inter, h, dtype=bf),
            "midlayer.mlp.down_proj.weight": torch.zeros(h, inter, dtype=bf),
            "norm.weight": torch.ones(h, dtype=bf),
            "lm_head.weight": torch.zeros(draft_vocab_size, h, dtype=bf),
            "d2t": torch.zeros(draft_vocab_size, dtype=torch.int64),
            "t2d": torch.cat(
                [
                    torch.ones(draft_vocab_size, dtype=torch.bool),
                    torch.zeros(dims.vocab_size - draft_vocab_size, dtype=torch.bool),
                ]
            ),
        }
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    # safetensors writes 0600 whatever the umask; the SGLang server may run as another user.
    for f in out.iterdir():
        f.chmod(0o644)
    return out
