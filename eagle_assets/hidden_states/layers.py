"""Which target layers feed the EAGLE-3 draft, and how each engine spells them.

Canonical: the index into HF's ``output_hidden_states`` (0 = the embeddings, i = the input of decoder layer i);
EAGLE-3 takes [2, N//2, N-3] (Kimi K2/K2.5: [2, 30, 58]). An SGLang id names a layer *output* (``hf_index - 1``),
vLLM's is the HF index (why, and why N is excluded: docs/sglang-hidden-states.md, "Layer ids: the +1"). Stores and
exported configs record every spelling, never one bare list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle_assets.target.architecture import validate_aux_layer_ids

CONVENTION = "hf_output_hidden_states_index"


def default_hf_indices(num_layers: int) -> tuple[int, int, int]:
    """The reference low/mid/high choice, as HF ``output_hidden_states`` indices."""
    if num_layers < 4:
        raise ValueError(f"EAGLE-3 default layers need at least 4 decoder layers, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class AuxLayers:
    """The low/mid/high feature layers of one target, canonical as HF indices."""

    hf_indices: tuple[int, ...]
    num_layers: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "hf_indices", validate_aux_layer_ids(self.hf_indices, self.num_layers))

    @classmethod
    def default(cls, num_layers: int) -> AuxLayers:
        return cls(default_hf_indices(num_layers), num_layers)

    @classmethod
    def from_sglang_ids(cls, ids: Iterable[int], num_layers: int) -> AuxLayers:
        """From explicit SGLang ids (``eagle_aux_hidden_state_layer_ids`` of an SGLang draft config)."""
        return cls(tuple(int(i) + 1 for i in ids), num_layers)

    @classmethod
    def from_vllm_ids(cls, ids: Iterable[int], num_layers: int) -> AuxLayers:
        return cls(tuple(int(i) for i in ids), num_layers)

    @property
    def n_aux(self) -> int:
        return len(self.hf_indices)

    @property
    def decoder_layer_inputs(self) -> tuple[int, ...]:
        """Decoder layers whose input is captured (same numbers as the HF indices)."""
        return self.hf_indices

    @property
    def decoder_layer_outputs(self) -> tuple[int, ...]:
        """Decoder layers whose output is captured (-1 = the embeddings)."""
        return tuple(i - 1 for i in self.hf_indices)

    @property
    def sglang_ids(self) -> tuple[int, ...]:
        """Explicit ids for SGLang (it adds +1 internally)."""
        return tuple(i - 1 for i in self.hf_indices)

    @property
    def vllm_ids(self) -> tuple[int, ...]:
        return self.hf_indices

    def to_dict(self) -> dict[str, Any]:
        """What stores and exported draft configs record: every spelling, named."""
        return {
            "convention": CONVENTION,
            "num_hidden_layers": self.num_layers,
            "hf_indices": list(self.hf_indices),
            "decoder_layer_inputs": list(self.decoder_layer_inputs),
            "decoder_layer_outputs": list(self.decoder_layer_outputs),
            "sglang_eagle_aux_hidden_state_layer_ids": list(self.sglang_ids),
            "vllm_eagle_aux_hidden_state_layer_ids": list(self.vllm_ids),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AuxLayers:
        if d.get("convention") != CONVENTION:
            raise ValueError(f"unknown aux-layer convention {d.get('convention')!r} (expected {CONVENTION!r})")
        layers = cls(tuple(d["hf_indices"]), int(d["num_hidden_layers"]))
        for key, derived in (
            ("sglang_eagle_aux_hidden_state_layer_ids", layers.sglang_ids),
            ("vllm_eagle_aux_hidden_state_layer_ids", layers.vllm_ids),
        ):
            if key in d and tuple(d[key]) != derived:
                raise ValueError(f"{key}={d[key]} contradicts hf_indices={list(layers.hf_indices)}")
        return layers


def resolve_aux_layers(
    num_layers: int,
    layers: AuxLayers | Sequence[int] | None = None,
    *,
    convention: str = "hf",
) -> AuxLayers:
    """``None`` (the default), an ``AuxLayers``, or a list in ``convention``: ``"hf"``, ``"sglang"`` or ``"vllm"``."""
    if layers is None:
        return AuxLayers.default(num_layers)
    if isinstance(layers, AuxLayers):
        if layers.num_layers != num_layers:
            raise ValueError(f"aux layers were chosen for {layers.num_layers} layers, target has {num_layers}")
        return layers
    if convention == "hf":
        return AuxLayers(tuple(layers), num_layers)
    if convention == "sglang":
        return AuxLayers.from_sglang_ids(layers, num_layers)
    if convention == "vllm":
        return AuxLayers.from_vllm_ids(layers, num_layers)
    raise ValueError(f"unknown convention {convention!r}: use 'hf', 'sglang' or 'vllm'")
