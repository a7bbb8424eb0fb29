"""Which transformers class loads a target checkpoint, and which of its parts reach the device.

The one loader of every step that runs the target in this process. The checkpoint's config decides the class, never
a list of model names: a config in transformers' causal-LM mapping (Llama, DeepSeek-V3, Qwen3, ...) loads with
``AutoModelForCausalLM``; a wrapper in the image-text-to-text mapping whose ``text_config`` is a causal LM (Kimi
K2.5's ``kimi_k25`` around ``deepseek_v3``, Qwen3.5, Gemma 4, Llava) loads with ``AutoModelForImageTextToText``, so
transformers' own key conversions apply; anything else raises one ``TargetLoadError`` saying why each was refused.

Every step feeds text, so a wrapper is kept as its text causal LM (transformers' class for the ``text_config``, given
the wrapper's decoder and ``lm_head``; vision tower and projector dropped before the model moves): the plain shape
callers rely on (``model.model``, ``model.lm_head``, ``model.config.vocab_size``), with the same logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from eagle_assets.errors import Systemic, TargetError


class TargetLoadError(TargetError, Systemic, ValueError):
    """A checkpoint whose text model is not a causal LM transformers can load (every step that loads it fails alike)."""


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    # save/load print per-file progress bars; a 1-file tiny model only adds noise to demo and test logs.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _describe(config: Any) -> str:
    archs = list(getattr(config, "architectures", None) or [])
    return f"model_type {getattr(config, 'model_type', None)!r}, architectures {archs}"


def _names(mapping: Any) -> set[str]:
    return {n for v in mapping.values() for n in ((v,) if isinstance(v, str) else v)}


def _declared_other(config: Any) -> list[str]:
    """The declared ``architectures`` that transformers defines as something other than a causal LM or a
    vision-language wrapper (``BertModel``, ``BertForMaskedLM``), when every declared one is such a class.

    Names transformers does not define (a release's remote-code class, e.g. ``KimiK25ForConditionalGeneration``)
    say nothing here: the config's class decides then."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    declared = list(getattr(config, "architectures", None) or [])
    fitting = _names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | _names(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    other = [a for a in declared if hasattr(transformers, a) and a not in fitting]
    return other if declared and len(other) == len(declared) else []


def _causal_lm_refusal(config: Any, other: list[str]) -> str | None:
    """Why ``AutoModelForCausalLM`` does not fit this config, or None when it does."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return f"AutoModelForCausalLM: {type(config).__name__} is not in its mapping"
    if other:  # BERT's config maps to BertLMHeadModel, yet a BertModel checkpoint is an encoder
        built = getattr(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], "__name__", "?")
        return f"AutoModelForCausalLM: it would build {built}, but the checkpoint is {other}, not a causal LM"
    return None


def _wrapper_refusal(config: Any, other: list[str]) -> str | None:
    """Why ``AutoModelForImageTextToText`` does not fit this config, or None when it does."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    text = getattr(config, "text_config", None)
    if text is None:
        return "AutoModelForImageTextToText: the config has no text_config"
    if type(text) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        kind = getattr(text, "model_type", None)
        return f"AutoModelForImageTextToText: its text_config ({type(text).__name__}, {kind!r}) is not a causal LM"
    if type(config) not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return f"AutoModelForImageTextToText: {type(config).__name__} is not in its mapping"
    if other:
        return f"AutoModelForImageTextToText: the checkpoint is {other}"
    return None


def loading_class(config: Any) -> tuple[Any, bool]:
    """(the auto class that loads this config, whether it is a wrapper around a text causal LM); or TargetLoadError."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    other = _declared_other(config)
    causal = _causal_lm_refusal(config, other)
    if causal is None:
        return AutoModelForCausalLM, False
    wrapper = _wrapper_refusal(config, other)
    if wrapper is None:
        return AutoModelForImageTextToText, True
    raise TargetLoadError(
        f"cannot load the target as a causal LM ({_describe(config)}); tried {causal}; {wrapper}. "
        "The target must be a decoder-only language model, or a vision-language wrapper around one"
    )


def _text_causal_lm(wrapper: Any) -> Any:
    """The wrapper's text model as transformers' causal LM for its ``text_config``, sharing the wrapper's modules."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    text_config = wrapper.config.text_config
    causal_lm: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(text_config)]
    with torch.device("meta"):  # no memory: every module is replaced by the wrapper's own below
        model = causal_lm(text_config)
    # A causal LM keeps its decoder under ``base_model_prefix`` (transformers' ``set_decoder`` does not set it there).
    setattr(model, model.base_model_prefix, wrapper.get_decoder())
    model.set_output_embeddings(wrapper.get_output_embeddings())
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise TargetLoadError(
            f"{type(wrapper).__name__}: the text causal LM {type(model).__name__} has parts the wrapper does not "
            f"provide ({', '.join(left[:4])}); load it with text_only=False"
        )
    model.generation_config = wrapper.generation_config
    model.config.name_or_path = wrapper.config.name_or_path
    return model


def load_target(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    with_head: bool = True,
    text_only: bool = True,
) -> Any:
    """Load a local checkpoint as a causal LM in eval mode (see the module doc); never touches the network.

    A checkpoint it cannot load raises ``TargetLoadError`` (which class was tried and why it was refused);
    one whose weights leave parameters of the loaded class uninitialised raises it too, naming them.
    """
    from transformers import AutoConfig

    path = Path(path)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise TargetLoadError(f"cannot read the target's config at {path}: {exc}") from exc
    auto_class, wrapped = loading_class(config)
    with quiet_transformers():
        model, info = auto_class.from_pretrained(
            path, config=config, dtype=dtype, local_files_only=True, output_loading_info=True
        )
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise TargetLoadError(
            f"{path} ({_describe(config)}) loaded with {auto_class.__name__} as {type(model).__name__}, but the "
            f"checkpoint has no weights for {len(missing)} parameters ({', '.join(missing[:4])}, ...)"
        )
    if wrapped and text_only:
        model = _text_causal_lm(model)
    if not with_head:
        model.set_output_embeddings(None)
    module: torch.nn.Module = model  # transformers' @wraps(nn.Module.to) hides from mypy that its ``to`` is a method
    return module.to(device).eval()
