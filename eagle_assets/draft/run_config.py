"""A draft training run's configuration, typed once: the ``draft_model`` asset, ``run.json`` and the trainer share it.

Every section of the run file is a pydantic model that forbids unknown keys (as SpecForge's ``config/schema.py``
does): a misspelt key fails validation with its name before anything is loaded, and each default is written here
only, so the asset and ``train_cli`` cannot disagree on one. The asset builds a ``DraftRunConfig``, writes it as
``run.json`` and Dagster Pipes hands that file to the training process, which validates it back.

``TrainKnobs`` are the hyperparameters the platform's users set: the asset's Dagster config inherits them
(same names, bounds and defaults) and passes them to ``TrainConfig`` by name.

No torch here: the Dagster definitions import this module when they load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_READER = "eagle_assets.hidden_states.store:HiddenStateStore"
DType = Literal["bfloat16", "float16", "float32"]


class _Section(BaseModel):
    """A section of the run file: an unknown key is an error that names it."""

    model_config = ConfigDict(extra="forbid")


class TrainKnobs(BaseModel):
    """The training hyperparameters a user of the platform sets (also fields of the asset's Dagster config).

    No ``model_config`` of its own: the Dagster config class that inherits these keeps Dagster's.
    """

    lr: float = Field(default=1e-4, gt=0)
    epochs: int = Field(default=1, ge=1)
    max_steps: int = Field(default=0, ge=0, description="0: epochs × steps per epoch; sets the schedule length")
    warmup_ratio: float = Field(default=0.015, ge=0, lt=1)
    batch_size: int = Field(default=1, ge=1, description="rows per rank per micro-batch")
    grad_accum: int = Field(default=1, ge=1)
    grad_clip: float = Field(default=0.5, ge=0, description="max gradient norm (0: no clipping)")
    ttt_steps: int = Field(default=7, ge=1, description="training-time-test unroll K")
    step_weight: float = Field(default=0.8, gt=0, le=1, description="loss weight decay per TTT step")
    checkpoint_every: int = Field(default=0, ge=0, description="steps between checkpoints (0: only at the end)")
    seed: int = Field(default=0, description="shuffle seed")


class TrainConfig(TrainKnobs, _Section):
    """Everything the ``Trainer`` reads: the user's knobs plus the settings only a run file or a test changes."""

    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    min_lr_ratio: float = 0.0
    max_length: int = Field(default=0, ge=0, description="truncate rows in the trainer (0: never)")
    shuffle: bool = True
    pad_id: int = 0
    bf16: bool = Field(default=True, description="bf16 autocast (CUDA only)")
    attn_impl: Literal["auto", "eager", "sdpa"] = "auto"
    checkpoint_dir: str = Field(
        default="", description="'': <output_dir>/checkpoints in a run, no checkpoints otherwise"
    )
    keep_checkpoints: int = 2
    eval_every: int = 0
    target_chunk_tokens: int = 1024


class TargetSpec(_Section):
    path: str | None = Field(default=None, description="local Hugging Face checkpoint of the target")
    last_kind: Literal["post_norm", "pre_norm"] = "post_norm"
    dtype: DType = Field(default="bfloat16", description="the target's dtype when it runs online (tokens data)")


class EmbeddingsSpec(_Section):
    kind: Literal["target", "synthetic", "random"] | None = Field(
        default=None, description="None: synthetic for synthetic data, else the target's; any other is exported"
    )
    seed: int = 0


class VocabSpec(_Section):
    kind: Literal["from_data", "identity", "file"] = "from_data"
    path: str | None = Field(default=None, description="kind file: a checkpoint with d2t, or an export folder")
    force_ids: list[int] = Field(default_factory=list, description="target ids always in the draft vocabulary")

    @model_validator(mode="after")
    def _file_has_a_path(self) -> VocabSpec:
        if self.kind == "file" and not self.path:
            raise ValueError("vocab kind 'file' needs a path")
        return self


class StoreData(_Section):
    """Offline features from a hidden-state store, read by ``reader`` (``module:Class``, resolved at run time)."""

    kind: Literal["store"]
    path: str
    reader: str = DEFAULT_READER
    reader_kwargs: dict[str, Any] = Field(default_factory=dict)
    max_length: int | None = Field(default=None, description="truncate samples (None: never)")


DEFAULT_ONLINE_STREAM = "eagle_assets.hidden_states.online_features:online_stream"


class TokensData(_Section):
    """Token rows (JSON lines); the target computes the features online, through the extraction's per-batch
    function (``backend``), a bounded prefetch queue and the fidelity gate (``eagle_assets/draft/online_stream.py``).
    """

    kind: Literal["tokens"]
    path: str
    max_length: int | None = Field(default=None, description="truncate samples (None: never)")
    backend: Literal["hf", "vllm"] = Field(
        default="hf", description="hf: the target in this process; vllm: the vLLM extraction's engine"
    )
    feature_dtype: DType = Field(
        default="bfloat16", description="features rounded to this dtype, as the offline store keeps them"
    )
    prefetch: int = Field(default=2, ge=1, description="global batches of features computed ahead (bounded)")
    fidelity: bool = Field(default=True, description="the three fidelity checks on the first batches, before step 1")
    fidelity_config: dict[str, Any] = Field(default_factory=dict, description="FidelityConfig fields")
    vllm: dict[str, Any] = Field(default_factory=dict, description="VLLMEngineConfig fields (backend vllm)")
    calibrate_in_process: bool = Field(
        default=False, description="backend vllm: the gate's calibration runs the target here (per-layer references)"
    )
    stream: str = Field(default=DEFAULT_ONLINE_STREAM, description="module:function building the stream")


class SyntheticData(_Section):
    kind: Literal["synthetic"]
    n_samples: int = Field(default=64, ge=1)
    length: tuple[int, int] = (12, 24)
    seed: int = 0


DataSpec = Annotated[StoreData | TokensData | SyntheticData, Field(discriminator="kind")]


class ExportSpec(_Section):
    dtype: DType = "bfloat16"


class DraftRunConfig(_Section):
    """One training run: what ``train_cli`` and ``pipes_train`` read (``--config run.json``)."""

    seed: int = Field(default=0, description="the draft's initialisation")
    model: dict[str, Any] | None = Field(
        default=None, description="Eagle3Config fields; or omit and give target.path + draft_vocab_size"
    )
    draft_vocab_size: int | None = None
    aux_layer_ids: list[int] | None = Field(
        default=None, description="HF output_hidden_states indices (with target.path)"
    )
    target: TargetSpec = Field(default_factory=TargetSpec)
    embeddings: EmbeddingsSpec = Field(default_factory=EmbeddingsSpec)
    vocab: VocabSpec = Field(default_factory=VocabSpec)
    data: DataSpec
    train: TrainConfig = Field(default_factory=TrainConfig)
    output_dir: str | None = Field(default=None, description="checkpoints/, metrics.jsonl, export/")
    export: ExportSpec | None = Field(default=None, description="one folder for SGLang and vLLM (see export.py)")
    log_every: int = Field(default=1, ge=0, description="print a line every n steps (0: never)")

    @field_validator("model")
    @classmethod
    def _model_fields_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            from eagle_assets.draft.model import Eagle3Config  # torch: only when a run file names a shape

            unknown = sorted(set(value) - set(Eagle3Config.__dataclass_fields__))
            if unknown:
                raise ValueError(f"unknown model keys {unknown}: not fields of Eagle3Config")
        return value

    @model_validator(mode="after")
    def _complete(self) -> DraftRunConfig:
        if self.model is None and not (self.target.path and self.draft_vocab_size):
            raise ValueError("give either 'model' or 'target.path' (+ 'draft_vocab_size')")
        if self.data.kind in ("store", "tokens") and not self.target.path:
            raise ValueError(f"{self.data.kind} data needs target.path (the target's head or the target itself)")
        if self.embeddings.kind == "synthetic" and self.data.kind != "synthetic":
            raise ValueError("synthetic embeddings need synthetic data")
        return self

    @property
    def embeddings_kind(self) -> Literal["target", "synthetic", "random"]:
        return self.embeddings.kind or ("synthetic" if self.data.kind == "synthetic" else "target")

    @property
    def out(self) -> Path | None:
        return Path(self.output_dir) if self.output_dir else None


def load_config(path: str | Path) -> DraftRunConfig:
    """A run file (JSON, or YAML by suffix), validated."""
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        return DraftRunConfig.model_validate(yaml.safe_load(text))
    return DraftRunConfig.model_validate(json.loads(text))
