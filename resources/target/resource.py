"""The target model, as the local GPU assets see it: where its weights are and how to run it.

The default is the tiny target built on this machine, the one the embedded simulator answers with; ``path``
names a local Hugging Face checkpoint for the real thing. Nothing here ever fetches from a hub.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Literal

import dagster as dg
from pydantic import Field

from eagle_assets.target.tiny_targets import DEFAULT_TINY_TARGET, TinyTargetName, tiny_target_model_id

if TYPE_CHECKING:  # torch and transformers load only in the steps that run the model
    import torch


class TargetModelResource(dg.ConfigurableResource):
    """The target whose hidden states train the draft, and the engine that computes them."""

    path: str = Field(
        default="", description="local HF checkpoint; empty: the tiny Kimi-vocabulary target built locally"
    )
    tiny_target: TinyTargetName = Field(
        default=DEFAULT_TINY_TARGET,
        description="which tiny target (when path is empty): llama-tiny (fastest) or kimi-k25-tiny (the real shape)",
    )
    tiny_seed: int = Field(default=0, description="seed of the tiny target (when path is empty)")
    backend: Literal["hf", "vllm"] = Field(
        default="hf", description="hf: transformers in this process; vllm: one vLLM engine, one pass (tensor parallel)"
    )
    device: str = Field(default="", description="cuda, cuda:1, cpu; empty: CUDA when present")
    store_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="hidden-state store dtype"
    )
    aux_layers: list[int] = Field(
        default_factory=list, description="HF output_hidden_states indices; empty: EAGLE-3's [2, N//2, N-3]"
    )
    max_tokens_per_batch: int = Field(default=16384, ge=1, description="tokens per extraction batch (padding included)")
    tensor_parallel_size: int = Field(default=1, ge=1, description="the vLLM engine's (8 for Kimi K2.5 on 8 GPUs)")
    calibrate_in_process: bool = Field(
        default=True,
        description="vllm: the calibration runs the target in full here (per-layer references for the aux check); "
        "False where it cannot load here (Kimi K2.5): the engine scores its own input, aux identity unverified",
    )
    reserve_disk_gb: float = Field(default=1.0, ge=0.0, description="disk left free after the store is written")

    def model_dir(self) -> Path:
        """The checkpoint directory, building the tiny target on first use."""
        if self.path:
            path = Path(self.path).expanduser()
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"target model path {path} has no config.json (a local HF checkpoint)")
            return path
        from eagle_assets.target.tiny_targets import build_named_tiny_target, tiny_target_path

        where = tiny_target_path(self.tiny_target, self.tiny_seed)
        return build_named_tiny_target(self.tiny_target, where, self.tiny_seed)

    def model_id(self) -> str:
        if self.path:
            return str(Path(self.path).expanduser())
        return tiny_target_model_id(self.tiny_target, self.tiny_seed)

    def dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.store_dtype)

    def torch_device(self) -> "torch.device":
        import torch

        if self.device:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def engine_dtype(self) -> str:
        """What the vLLM engine computes in: the checkpoint's own dtype on a GPU, fp32 on CPU (as HF loads it)."""
        return "auto" if self.torch_device().type == "cuda" else "float32"

    def layers(self) -> list[int] | None:
        return list(self.aux_layers) or None
