"""Backend 1: target features from a Hugging Face causal LM, in this process.

For targets that fit one device; Kimi K2.5 needs tensor parallelism (``extract_vllm.py``). The same numbers as
``model(..., output_hidden_states=True)`` (``tests/hidden_states/test_extract_hf.py`` compares them), cheaper:
only the decoder runs, because over a 163,840-token vocabulary the head dominates a small model's cost and its
[batch, seq, vocab] logits would take 10.7 GB in fp32 at 16k tokens; forward pre-hooks capture the three aux
layers' inputs (HF index i = input of layer i) instead of every hidden state; features are cast to the store dtype
on the device before one copy to the host per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eagle_assets.hidden_states.layers import AuxLayers, resolve_aux_layers
from eagle_assets.hidden_states.pipeline import ExtractReport, Progress, ShardsInput, run_extraction
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import FEATURES, StoreMeta
from eagle_assets.target.architecture import decoder_layers_of, decoder_of, final_norm_of, num_decoder_layers


def hidden_size_of(model: nn.Module) -> int:
    cfg: Any = getattr(model, "config", None)  # an HF config, of whichever class: read by duck typing
    cfg = getattr(cfg, "text_config", None) or cfg
    return int(cfg.hidden_size)


def pad_batch(
    batch: Sequence[HiddenStateSample], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Right-pad to the longest sample; positions of real tokens stay 0..L-1, as in a lone forward."""
    lengths = [len(s) for s in batch]
    longest = max(lengths)
    ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for b, s in enumerate(batch):
        ids[b, : lengths[b]] = torch.as_tensor(list(s.input_ids), dtype=torch.long)
        mask[b, : lengths[b]] = 1
    return ids.to(device), mask.to(device), lengths


class HFFeatureExtractor:
    """A ``BatchFn`` over an HF causal LM. ``capture="output_hidden_states"`` asks the decoder for every hidden state
    instead of hooking the aux layers: it exists to verify the hooks."""

    def __init__(
        self,
        model: nn.Module,
        layers: AuxLayers,
        *,
        features: Sequence[str] = FEATURES,
        last_kind: str = "post_norm",
        out_dtype: torch.dtype = torch.bfloat16,
        capture: str = "hooks",
        pad_id: int | None = None,
    ):
        if capture not in ("hooks", "output_hidden_states"):
            raise ValueError("capture must be 'hooks' or 'output_hidden_states'")
        if capture == "output_hidden_states" and last_kind != "post_norm":
            raise ValueError("output_hidden_states only exposes the post-norm last hidden state; use hooks")
        self.model = model.eval()
        self.decoder = decoder_of(model)
        self.layer_modules = decoder_layers_of(self.decoder)
        if layers.num_layers != len(self.layer_modules):
            raise ValueError(f"aux layers chosen for {layers.num_layers} layers, model has {len(self.layer_modules)}")
        self.layers = layers
        self.features = tuple(features)
        self.last_kind = last_kind
        self.out_dtype = out_dtype
        self.capture = capture
        cfg = getattr(model, "config", None)
        self.pad_id = int(pad_id if pad_id is not None else (getattr(cfg, "pad_token_id", None) or 0))
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def forward_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Padded batch → ``{"aux": [B, S, n_aux*H], "last": [B, S, H]}`` on the model's device."""
        if self.capture == "output_hidden_states":
            out = self.decoder(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_hidden_states=True
            )
            hs = out.hidden_states
            aux = torch.cat([hs[i] for i in self.layers.hf_indices], dim=-1)
            return {"aux": aux, "last": hs[-1]}

        captured: dict[int | str, torch.Tensor] = {}
        handles = []

        def grab(key: int | str) -> Callable[..., None]:
            def hook(_mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                captured[key] = args[0] if args else kwargs["hidden_states"]

            return hook

        try:
            for i in sorted(set(self.layers.hf_indices)):
                handles.append(self.layer_modules[i].register_forward_pre_hook(grab(i), with_kwargs=True))
            if "last" in self.features and self.last_kind == "pre_norm":
                handles.append(
                    final_norm_of(self.decoder).register_forward_pre_hook(grab("pre_norm"), with_kwargs=True)
                )
            out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        missing = [i for i in self.layers.hf_indices if i not in captured]
        if missing:
            raise RuntimeError(f"layers {missing} never ran: is this model's decoder a plain layer stack?")
        result = {"aux": torch.cat([captured[i] for i in self.layers.hf_indices], dim=-1)}
        if "last" in self.features:
            result["last"] = captured["pre_norm"] if self.last_kind == "pre_norm" else out.last_hidden_state
        return result

    def __call__(self, batch: Sequence[HiddenStateSample]) -> list[dict[str, torch.Tensor]]:
        ids, mask, lengths = pad_batch(batch, self.pad_id, self.device)
        feats = self.forward_features(ids, mask)
        # Cast on the device (half the bytes over PCIe in bf16), then one copy per tensor.
        host = {k: feats[k].to(self.out_dtype).cpu() for k in self.features}
        return [{k: host[k][b, :n] for k in self.features} for b, n in enumerate(lengths)]


def extract_hf(
    model: nn.Module | str | Path,
    shards: ShardsInput,
    out_dir: str | Path,
    *,
    model_id: str | None = None,
    layers: AuxLayers | Sequence[int] | None = None,
    layer_convention: str = "hf",
    dtype: torch.dtype = torch.bfloat16,
    with_last: bool = True,
    last_kind: str = "post_norm",
    max_tokens_per_batch: int = 16384,
    device: str | torch.device | None = None,
    progress: Callable[[Progress], None] | None = None,
    check_space: bool = True,
    reserve_bytes: int = 0,
) -> ExtractReport:
    """Extract and store the features of every corpus shard; resumable (finished shards are skipped).

    ``model``: a loaded HF causal LM, or a local directory loaded without its head on ``device`` (default: CUDA
    when there is one) in bf16 on a GPU, fp32 on CPU. ``dtype`` is the *store* dtype; ``layers`` default to
    EAGLE-3's [2, N//2, N-3] HF indices.
    """
    if isinstance(model, str | Path):
        from eagle_assets.target.loader import load_target

        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        mdt = torch.bfloat16 if dev.type == "cuda" else torch.float32
        model_id = model_id or str(model)
        loaded: nn.Module = load_target(model, dev, mdt, with_head=False)  # only the decoder runs here
        model = loaded
    elif device is not None:
        model = model.to(device)
    if model_id is None:
        cfg = getattr(model, "config", None)
        model_id = getattr(cfg, "name_or_path", None) or type(model).__name__
    aux_layers = resolve_aux_layers(num_decoder_layers(model), layers, convention=layer_convention)
    features = FEATURES if with_last else ("aux",)
    meta = StoreMeta(
        model_id=str(model_id),
        hidden_size=hidden_size_of(model),
        layers=aux_layers,
        dtype=dtype,
        features=features,
        last_kind=last_kind,
        extra={"backend": "hf", "capture": "hooks"},
    )
    extractor = HFFeatureExtractor(model, aux_layers, features=features, last_kind=last_kind, out_dtype=dtype)
    return run_extraction(
        shards,
        out_dir,
        meta,
        extractor,
        max_tokens_per_batch=max_tokens_per_batch,
        progress=progress,
        check_space=check_space,
        reserve_bytes=reserve_bytes,
    )
