"""Export a trained draft as one ``LlamaForCausalLMEagle3`` folder that SGLang and vLLM both load, and load it back.

What the folder holds, the aux ids in both engines' spellings, whose embedding each serves and the serving commands:
docs/draft-and-benchmark.md, "The exported draft". Published atomically, folder 0755 and files 0644 so that a server
running as another user can read them; the ``eagle_forge`` block records the HF aux indices, so ``load_draft`` never
guesses. Both ``rope_parameters`` (transformers 5) and the top-level ``rope_theta`` (loaders on transformers 4,
default 10000) carry the draft's RoPE base.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from eagle_assets.draft.model import Eagle3Config, Eagle3Draft
from eagle_assets.durable_files import publishing_directory
from eagle_assets.errors import EagleForgeWarning

ARCHITECTURE = "LlamaForCausalLMEagle3"
ENGINES = ("sglang", "vllm")
CONVENTION = "hf_output_hidden_states_index"
WEIGHTS = "model.safetensors"
FORMAT_VERSION = 2
FILE_MODE = 0o644
DIR_MODE = 0o755
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
log = logging.getLogger(__name__)


def _offset(engine: str) -> int:
    """What an engine adds to the layer ids it reads (SGLang +1, vLLM none) to get HF indices."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return 1 if engine == "sglang" else 0


def engine_layer_ids(hf_indices: tuple[int, ...], engine: str) -> list[int]:
    """The ids an engine must read to capture the HF ``output_hidden_states`` indices ``hf_indices``."""
    return [i - _offset(engine) for i in hf_indices]


def hf_layer_ids(ids: list[int], engine: str) -> tuple[int, ...]:
    """Inverse of ``engine_layer_ids``: what an engine captures for the ids it read."""
    return tuple(i + _offset(engine) for i in ids)


class EngineEmbeddingWarning(EagleForgeWarning):
    """SGLang and vLLM would serve this export with different embeddings: two different drafts."""


def engine_embedding_sources(config: Eagle3Config) -> dict[str, str]:
    """Whose embedding each engine serves the draft with: SGLang's EAGLE worker sets the target's unless
    ``target_hidden_size`` differs from ``hidden_size``, whatever the folder holds; vLLM keeps the folder's own."""
    return {
        "sglang": "draft" if config.target_hidden_size != config.hidden_size else "target",
        "vllm": "draft" if config.save_embeddings else "target",
    }


def embedding_divergence(config: Eagle3Config) -> str | None:
    """Why the engines would serve different drafts from this config, or None when they agree."""
    sources = engine_embedding_sources(config)
    if sources["sglang"] == sources["vllm"]:
        return None
    return (
        f"the draft carries its own embedding (embed_tokens.weight) and is as wide as its target "
        f"(hidden_size = target_hidden_size = {config.hidden_size}): SGLang serves it with the target's embedding "
        "instead (set_embed), vLLM with its own, so the two engines serve different drafts. Train with the "
        "target's embedding (embeddings.kind = target), or expect SGLang's acceptance to differ from vLLM's"
    )


def export_config(config: Eagle3Config, *, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """The one ``config.json`` both engines read (see the module docstring for each key's reader)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": config.max_position,
        "vocab_size": config.target_vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": _DTYPE_NAMES[dtype],
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": engine_layer_ids(config.aux_layer_ids, "sglang"),
            "use_aux_hidden_state": True,
        },
        "eagle_aux_hidden_state_layer_ids": engine_layer_ids(config.aux_layer_ids, "vllm"),
        "eagle_forge": {
            "format_version": FORMAT_VERSION,
            "aux_layers": {
                "convention": CONVENTION,
                "hf_indices": list(config.aux_layer_ids),
                "sglang_reads": "eagle_config.eagle_aux_hidden_state_layer_ids (+1)",
                "vllm_reads": "eagle_aux_hidden_state_layer_ids (as given)",
            },
            "target_num_hidden_layers": config.target_num_layers or None,
            "embed_tokens_included": config.save_embeddings,
            "embedding_served_by": engine_embedding_sources(config),
            "warnings": [w for w in (embedding_divergence(config),) if w],
        },
    }


def _export_tensors(model: Eagle3Draft, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in model.checkpoint_state_dict().items():
        t = t.detach().cpu()
        if name == "d2t":
            t = t.to(torch.int64)
        elif name == "t2d":
            t = t.to(torch.bool)
        else:
            t = t.to(dtype)
        out[name] = t.contiguous()
    return out


def export_draft(model: Eagle3Draft, out_dir: str | Path, *, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``config.json`` + ``model.safetensors``, published whole. A draft the two engines would serve differently
    (``embedding_divergence``) is still exported, with an ``EngineEmbeddingWarning`` and the reason in the config."""
    from safetensors.torch import save_file

    divergence = embedding_divergence(model.config)
    if divergence:
        log.warning("exporting to %s: %s", out_dir, divergence)
        warnings.warn(divergence, EngineEmbeddingWarning, stacklevel=2)

    out = Path(out_dir).expanduser().absolute()
    with publishing_directory(out) as staged:
        save_file(_export_tensors(model, dtype), str(staged / WEIGHTS), metadata={"format": "pt"})
        (staged / "config.json").write_text(json.dumps(export_config(model.config, dtype=dtype), indent=2))
        for f in staged.iterdir():
            f.chmod(FILE_MODE)
        staged.chmod(DIR_MODE)
    return out


def _aux_hf_indices(d: dict[str, Any], engine: str | None) -> tuple[int, ...]:
    """HF indices from the ``eagle_forge`` block, else from a foreign config in ``engine``'s spelling."""
    forge = d.get("eagle_forge", {})
    if "aux_layers" in forge:
        return tuple(forge["aux_layers"]["hf_indices"])
    top = d.get("eagle_aux_hidden_state_layer_ids")
    nested = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if engine == "sglang" and nested:
        return hf_layer_ids(list(nested), "sglang")
    if engine == "vllm" and (given := top or nested):
        return hf_layer_ids(list(given), "vllm")
    if engine is None and top:
        return hf_layer_ids(list(top), "vllm")  # only vLLM reads the top-level key
    if engine is None and nested:
        raise ValueError(
            "config.json names its aux layers only in eagle_config, which SGLang reads +1 and some vLLM versions "
            "as given: pass engine='sglang' or engine='vllm' to say which spelling it is"
        )
    raise KeyError("config.json names no aux layers (eagle_config.eagle_aux_hidden_state_layer_ids)")


def config_from_export(d: dict[str, Any], engine: str | None = None) -> Eagle3Config:
    """Rebuild ``Eagle3Config`` from an exported (or foreign) ``config.json``."""
    forge = d.get("eagle_forge", {})
    heads = int(d["num_attention_heads"])
    rope = d.get("rope_parameters") or {}
    return Eagle3Config(
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
        target_vocab_size=int(d["vocab_size"]),
        draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
        aux_layer_ids=_aux_hf_indices(d, engine),
        target_hidden_size=int(d.get("target_hidden_size") or d["hidden_size"]),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(d.get("rope_theta") or rope.get("rope_theta") or 10_000.0),
        max_position=int(d.get("max_position_embeddings", 4096)),
        target_num_layers=int(forge.get("target_num_hidden_layers") or 0),
        save_embeddings=bool(forge.get("embed_tokens_included", False)),
    )


def load_draft(
    path: str | Path,
    *,
    embed_weight: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    engine: str | None = None,
) -> Eagle3Draft:
    """Rebuild an ``Eagle3Draft`` from an export folder (embeddings from the folder or ``embed_weight``)."""
    from safetensors.torch import load_file

    root = Path(path)
    config = config_from_export(json.loads((root / "config.json").read_text()), engine)
    tensors = load_file(str(root / WEIGHTS))
    model = Eagle3Draft(config)
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is None:
        embed = embed_weight
    if embed is None:
        raise ValueError(f"{root} has no embed_tokens.weight: pass the target's embedding as embed_weight")
    model.load_embeddings(embed.to(model.embed_tokens.weight.dtype))
    model.load_checkpoint_state_dict(tensors)
    return model.to(device=device, dtype=dtype).eval()  # .to(dtype) leaves the int64/bool maps alone
