"""Export a trained draft as an SGLang / vLLM ``LlamaForCausalLMEagle3`` folder, and load it back.

Layout written (atomically: built in a sibling temporary folder, then renamed)::

    <out>/config.json          architectures ["LlamaForCausalLMEagle3"], model_type "llama", geometry,
                               vocab_size (target), draft_vocab_size, target_hidden_size,
                               eagle_config {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state},
                               tie_word_embeddings false, torch_dtype, plus an "eagle_forge" block
    <out>/model.safetensors    fc.weight, midlayer.*, norm.weight, lm_head.weight (torch_dtype),
                               d2t (int64), t2d (bool), embed_tokens.weight only if configured

Aux layer ids: the model keeps HF ``output_hidden_states`` indices. SGLang adds 1 to explicit ids
(it captures the input of layer id+1), vLLM uses them as given, so the ids written into
``eagle_config`` depend on ``engine``: ``"sglang"`` writes ``hf - 1``, ``"vllm"`` writes ``hf`` (and
also the top-level ``eagle_aux_hidden_state_layer_ids`` vLLM looks for first). The ``eagle_forge``
block records every spelling and which one was written, so ``load_draft`` never has to guess and a
folder can be rewritten for the other engine with ``write_config(folder, model.config, engine=...)``.
For Kimi K2/K2.5 (61 layers, HF [2, 30, 58]): SGLang ids [1, 29, 57], vLLM ids [2, 30, 58].

Without ``embed_tokens.weight`` in the folder both engines share the target's embedding (the draft's
is the target's, frozen), which is why it is left out by default (2.3 GB for Kimi in bf16).

Serving (chain drafting, 3 steps / 4 draft tokens as in the public Kimi numbers)::

    # SGLang
    python -m sglang.launch_server --model-path <target> --trust-remote-code --tp 8 \\
        --speculative-algorithm EAGLE3 --speculative-draft-model-path <out> \\
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4

    # vLLM
    vllm serve <target> --trust-remote-code --tensor-parallel-size 8 \\
        --speculative-config '{"method": "eagle3", "model": "<out>", "num_speculative_tokens": 3}'

(``--speculative-eagle-topk`` > 1 with more draft tokens turns on tree drafting in SGLang.)
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from eagle_assets.draft.model import Eagle3Config, Eagle3Draft

ARCHITECTURE = "LlamaForCausalLMEagle3"
ENGINES = ("sglang", "vllm")
CONVENTION = "hf_output_hidden_states_index"
WEIGHTS = "model.safetensors"
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def engine_layer_ids(hf_indices: tuple[int, ...], engine: str) -> list[int]:
    if engine == "sglang":
        return [i - 1 for i in hf_indices]
    if engine == "vllm":
        return list(hf_indices)
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def hf_layer_ids(ids: list[int], engine: str) -> tuple[int, ...]:
    if engine == "sglang":
        return tuple(i + 1 for i in ids)
    if engine == "vllm":
        return tuple(ids)
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def export_config(
    config: Eagle3Config, *, dtype: torch.dtype = torch.bfloat16, engine: str = "sglang"
) -> dict[str, Any]:
    ids = engine_layer_ids(config.aux_layer_ids, engine)
    d: dict[str, Any] = {
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
        "rope_scaling": None,
        "max_position_embeddings": config.max_position,
        "vocab_size": config.target_vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": _DTYPE_NAMES[dtype],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "eagle_forge": {
            "format_version": 1,
            "written_for": engine,
            "aux_layers": {
                "convention": CONVENTION,
                "hf_indices": list(config.aux_layer_ids),
                "sglang_eagle_aux_hidden_state_layer_ids": engine_layer_ids(config.aux_layer_ids, "sglang"),
                "vllm_eagle_aux_hidden_state_layer_ids": engine_layer_ids(config.aux_layer_ids, "vllm"),
            },
            "target_num_hidden_layers": config.target_num_layers or None,
            "embed_tokens_included": config.save_embeddings,
        },
    }
    if engine == "vllm":
        d["eagle_aux_hidden_state_layer_ids"] = ids
    return d


def write_config(folder: str | Path, config: Eagle3Config, *, dtype: torch.dtype, engine: str) -> None:
    (Path(folder) / "config.json").write_text(json.dumps(export_config(config, dtype=dtype, engine=engine), indent=2))


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


def export_draft(
    model: Eagle3Draft, out_dir: str | Path, *, dtype: torch.dtype = torch.bfloat16, engine: str = "sglang"
) -> Path:
    """Write ``config.json`` + ``model.safetensors``; replaces an existing folder only once the new one is complete."""
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(_export_tensors(model, dtype), str(tmp / WEIGHTS), metadata={"format": "pt"})
        write_config(tmp, model.config, dtype=dtype, engine=engine)
        for f in tmp.iterdir():
            with f.open("rb") as h:
                os.fsync(h.fileno())
        if out.exists():
            stale = out.parent / f".{out.name}.stale-{uuid.uuid4().hex[:8]}"
            os.rename(out, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def config_from_export(d: dict[str, Any], engine: str | None = None) -> Eagle3Config:
    """Rebuild ``Eagle3Config``; HF layer indices from the ``eagle_forge`` block, else from ``engine``'s spelling."""
    forge = d.get("eagle_forge", {})
    if "aux_layers" in forge:
        hf = tuple(forge["aux_layers"]["hf_indices"])
    else:
        ids = d.get("eagle_aux_hidden_state_layer_ids") or d.get("eagle_config", {}).get(
            "eagle_aux_hidden_state_layer_ids"
        )
        if ids is None:
            raise KeyError("config.json names no aux layers (eagle_config.eagle_aux_hidden_state_layer_ids)")
        hf = hf_layer_ids(list(ids), engine or "vllm")
    heads = int(d["num_attention_heads"])
    return Eagle3Config(
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
        target_vocab_size=int(d["vocab_size"]),
        draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
        aux_layer_ids=hf,
        target_hidden_size=int(d.get("target_hidden_size") or d["hidden_size"]),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(d.get("rope_theta", 10_000.0)),
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
