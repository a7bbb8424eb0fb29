"""What the SGLang backend sends an engine (``generate`` with ``return_hidden_states``) and how it reads the answer.

Shared by the extraction (``extract_sglang.py``) and the engine calibration (``calibration_sglang.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from eagle_assets.errors import TargetError
from eagle_assets.hidden_states.samples import HiddenStateSample


class SGLangResponseError(TargetError, RuntimeError):
    """An SGLang answer does not have the shape this backend relies on."""


def build_generate_request(batch: Sequence[HiddenStateSample]) -> dict[str, Any]:
    """Arguments of one ``Engine.generate`` call (also the ``/generate`` JSON body): what is wanted is the prefill's
    hidden states; one greedy new token, because prefill-only support (``max_new_tokens=0``) differs by version."""
    return {
        "input_ids": [list(map(int, s.input_ids)) for s in batch],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
    }


def features_from_response(response: Mapping[str, Any], sample: HiddenStateSample, width: int) -> torch.Tensor:
    """The prompt-token rows [L, width] of one ``generate`` answer, checked against the request: the prefill's are
    ``meta_info["hidden_states"][0]`` (nested lists, or a tensor); later elements are generated tokens'."""
    meta = response.get("meta_info")
    if not isinstance(meta, Mapping) or "hidden_states" not in meta:
        raise SGLangResponseError(
            "response has no meta_info.hidden_states: start the engine with enable_return_hidden_states=True "
            "and send return_hidden_states=True"
        )
    hs = meta["hidden_states"]
    if hs is None or len(hs) == 0:
        raise SGLangResponseError("meta_info.hidden_states is empty")
    rows = torch.as_tensor(hs[0], dtype=torch.float32)
    if rows.ndim == 1:
        rows = rows[None, :]
    n = len(sample)
    prompt_tokens = meta.get("prompt_tokens")
    if prompt_tokens is not None and int(prompt_tokens) != n:
        raise SGLangResponseError(f"sample {sample.sample_id}: engine saw {prompt_tokens} prompt tokens, we sent {n}")
    if rows.shape[0] != n:
        raise SGLangResponseError(
            f"sample {sample.sample_id}: {rows.shape[0]} hidden-state rows for {n} prompt tokens "
            "(prefix cache on? chunked prefill shorter than the prompt? see SGLangCaptureConfig)"
        )
    if rows.shape[1] != width:
        raise SGLangResponseError(
            f"sample {sample.sample_id}: rows are {rows.shape[1]} wide, expected {width} "
            "(aux pass without aux capture returns H; last pass with aux capture returns n_aux*H)"
        )
    if not torch.isfinite(rows).all():
        raise SGLangResponseError(f"sample {sample.sample_id}: non-finite hidden states")
    return rows
