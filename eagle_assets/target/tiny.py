"""A tiny Llama-style target over the Kimi K2.5 vocabulary, built locally from a seed.

The demo and the tests need a target that exists without downloads, runs on two CPU cores, sees the real target's
token ids (163,840; ``<|im_end|>`` = 163586 ends a turn), and whose greedy output depends on its input.

Why not Hugging Face's init: with ``initializer_range=0.02`` the logits are nearly flat (entropy ≈ ln 163840 ≈ 12
nats), a target distribution with no signal for the draft's soft cross-entropy. ``init_weights`` draws every tensor
from one seeded generator (the same weights on any transformers version): embeddings std 1, so token identity is
strong; projections ``proj_gain / sqrt(fan_in)``, gain 0.3, so recent tokens mostly decide the next one but context
matters (the greedy next token is the one-token-context prediction about 45% of the time, and the first prompt
token alone changes it in about 12% of cases; gain 1.0 is chaotic, 0.16 a bigram table); ``lm_head`` std
``logit_std / sqrt(hidden)``, 6, an LM-like distribution (mean entropy ≈ 2.6 nats, mean top-1 probability ≈ 0.4).

The head is restricted to the ~36k plain-word ids of ``tokenization.safe_vocab`` (other rows zero): the demo's
responses are its greedy output turned into text by the simulator and tokenized again, a round trip exact only for
these ids, so the training data, the hidden states and the benchmark's target are one model's behaviour.
``<|im_end|>`` is never chosen, so greedy responses run to ``max_new_tokens``. Stored in float32 (about 84 MB) so
that exactness tests need no up-casting.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from eagle_assets.durable_files import discard_staged, publish_directory, stage_directory
from eagle_assets.target.loader import load_target as load_target  # re-exported: the one loader, for old callers
from eagle_assets.target.loader import quiet_transformers

KIMI_VOCAB_SIZE = 163_840
KIMI_BOS_ID = 163_584  # [BOS]
KIMI_EOS_ID = 163_586  # <|im_end|>: ends an assistant turn; generation stops on it
KIMI_PAD_ID = 163_839  # [PAD]

COMPLETE_MARKER = "eagle_forge_tiny_target.json"


@dataclass(frozen=True)
class TinyTargetSpec:
    """Everything that determines the tiny target's weights; recorded next to them."""

    seed: int = 0
    hidden_size: int = 64
    # 7 layers, not 6: the EAGLE-3 default aux indices [2, N//2, N-3] are distinct only from N = 7
    # on ([2, 3, 3] at N = 6), and distinct indices let the tests catch a swapped mid/high layer.
    num_hidden_layers: int = 7
    # 2 heads of 32: vLLM's CPU attention takes head sizes 32, 64, 80, …, not 16 (the real engine runs this target).
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 4096
    vocab_size: int = KIMI_VOCAB_SIZE
    embed_std: float = 1.0
    proj_gain: float = 0.3
    logit_std: float = 6.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    text_safe_output: bool = True  # lm_head rows zero outside ``tokenization.safe_vocab`` (see module doc)

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def tiny_config(spec: TinyTargetSpec) -> LlamaConfig:
    # rope_theta: a legacy keyword that LlamaConfig's __post_init__ still takes (as **kwargs), unseen by mypy.
    return LlamaConfig(  # type: ignore[call-arg]
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=KIMI_BOS_ID,
        eos_token_id=KIMI_EOS_ID,
        pad_token_id=KIMI_PAD_ID,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
    )


def _std(name: str, shape: torch.Size, spec: Any) -> float:
    if name.endswith("embed_tokens.weight"):
        return spec.embed_std
    if name.endswith("lm_head.weight"):
        return spec.logit_std / math.sqrt(spec.hidden_size)
    # Linear [out, in] and experts [E, out, in]: the input width; a convolution [out, c, h, w]: c*h*w.
    fan_in = shape[-1] if len(shape) <= 3 else math.prod(shape[1:])
    return spec.proj_gain / math.sqrt(fan_in)


@torch.no_grad()
def init_weights(model: torch.nn.Module, spec: Any) -> None:
    """The recipe of the module doc for either tiny target (``spec``: its seed and gains)."""
    # Sorted names + one generator: the weights are a function of the spec alone, whatever transformers' init order.
    gen = torch.Generator().manual_seed(spec.seed)
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if param.ndim == 1:  # norm weights 1, biases 0
            param.fill_(0.0 if name.endswith("bias") else 1.0)
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * _std(name, param.shape, spec))


@torch.no_grad()
def restrict_output(model: Any) -> None:
    """Zero the ``lm_head`` rows outside ``tokenization.safe_vocab`` (see the module doc)."""
    from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
    from eagle_assets.tokenization.safe_vocab import safe_token_ids
    from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir

    keep = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
    keep[list(safe_token_ids(load_kimi_tokenizer(resolve_tokenizer_dir())))] = True
    model.lm_head.weight[~keep] = 0.0


def make_tiny_target(spec: TinyTargetSpec | None = None) -> LlamaForCausalLM:
    """Build the model in memory (float32, eval mode)."""
    spec = spec or TinyTargetSpec()
    config = tiny_config(spec)
    return finish_tiny_model(LlamaForCausalLM(config), spec)


def finish_tiny_model(model: Any, spec: Any) -> Any:
    """Weights from ``spec``, the plain-word head, Kimi's special ids for greedy generation; eval mode."""
    init_weights(model, spec)
    if spec.text_safe_output:
        restrict_output(model)
    model.generation_config = GenerationConfig(
        bos_token_id=KIMI_BOS_ID, eos_token_id=KIMI_EOS_ID, pad_token_id=KIMI_PAD_ID, do_sample=False
    )
    return model.eval()


def tiny_model_id(seed: int = 0) -> str:
    """The model id stores and exports record for the tiny target (its weights are a function of it)."""
    return f"eagle-forge/tiny-kimi-seed{seed}"


def _is_complete(path: Path, fingerprint: str) -> bool:
    marker = path / COMPLETE_MARKER
    if not marker.is_file() or not (path / "config.json").is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if recorded.get("fingerprint") != fingerprint:
        return False
    files = recorded.get("files", {})
    # Sizes catch a truncated copy; the marker is written last, so a crash leaves no marker.
    return bool(files) and all((path / f).is_file() and (path / f).stat().st_size == n for f, n in files.items())


def publish_tiny_model(path: str | Path, spec: Any, make: Callable[[Any], torch.nn.Module], seed: int = 0) -> Path:
    """Save ``make(spec)`` to ``path`` unless a complete copy of the same ``spec`` (its ``fingerprint()``, recorded
    with the file sizes in ``COMPLETE_MARKER``) is there; ``seed``, when not 0, must be the spec's.

    Published as a new version of ``path``: it always resolves to a whole model, a process still loading the
    previous one keeps it, and of concurrent builders one that finds a model published meanwhile drops its copy.
    """
    if spec.seed != seed and seed != 0:
        raise ValueError("pass the seed either as `seed` or inside `spec`, not both")
    # Only the parent is resolved: ``path`` itself is the published link, never one version behind it.
    path = Path(path).expanduser()
    path = path.parent.resolve() / path.name
    fingerprint = spec.fingerprint()
    if _is_complete(path, fingerprint):
        return path
    staged = stage_directory(path)
    try:
        model: Any = make(spec)
        with quiet_transformers():
            model.save_pretrained(staged, safe_serialization=True)
        files = {p.name: p.stat().st_size for p in staged.iterdir() if p.is_file()}
        (staged / COMPLETE_MARKER).write_text(
            json.dumps({"fingerprint": fingerprint, "spec": asdict(spec), "files": files}, indent=2)
        )
        if not _is_complete(path, fingerprint):  # else someone else finished first
            publish_directory(path, staged)
    finally:
        discard_staged(staged)
    return path


def build_tiny_target(path: str | Path, seed: int = 0, spec: TinyTargetSpec | None = None) -> Path:
    """Save the tiny target to ``path`` unless a complete copy with the same spec is there (``publish_tiny_model``)."""
    return publish_tiny_model(path, spec or TinyTargetSpec(seed=seed), make_tiny_target, seed)
