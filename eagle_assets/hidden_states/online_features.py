"""Which per-batch function an online run's stream calls: the extraction's own, in process or through vLLM.

Online and offline features are the same numbers because they come from the same function (``HFFeatureExtractor``
over the target loaded beside the draft, or the ``VLLMFeatureClient`` over one engine), and the gate calibrates as
the offline backend does. ``train_cli`` resolves ``online_stream`` by name (``TokensData.stream``), so that the draft
package never imports this one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from eagle_assets.draft.data import Row
from eagle_assets.draft.online_stream import OnlineFeatureStream, RowFeatures
from eagle_assets.draft.run_config import TargetSpec, TokensData
from eagle_assets.hidden_states.fidelity import Calibrate
from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.online_fidelity import fidelity_gate
from eagle_assets.hidden_states.pipeline import BatchFn
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import StoreMeta, dtype_from_name
from eagle_assets.target.architecture import read_target_dims


def extraction_features(batch_fn: BatchFn) -> RowFeatures:
    """The stream's per-batch function over an extraction's: rows become samples (a row's id is its dataset index)."""

    def features(rows: Sequence[Row], indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        samples = [
            HiddenStateSample(f"row-{i}", r["input_ids"].tolist(), r["loss_mask"].to(torch.int64).tolist())
            for r, i in zip(rows, indices, strict=True)
        ]
        return batch_fn(samples)

    return features


def hf_features(
    model: Any, layers: AuxLayers, *, store_dtype: torch.dtype, last_kind: str, config: FidelityConfig | None = None
) -> tuple[BatchFn, Calibrate]:
    """The in-process extraction's per-batch function and the calibration the offline HF path records."""
    from eagle_assets.hidden_states.calibration import calibrate_shard
    from eagle_assets.hidden_states.extract_hf import HFFeatureExtractor

    extractor = HFFeatureExtractor(model, layers, last_kind=last_kind, out_dtype=store_dtype)
    return extractor, partial(
        calibrate_shard, model, layers, store_dtype=store_dtype, last_kind=last_kind, config=config
    )


def vllm_features(
    model_path: str,
    layers: AuxLayers,
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    store_dtype: torch.dtype,
    options: Mapping[str, Any],
    scratch_root: Path,
    engine: Any = None,
    config: FidelityConfig | None = None,
) -> tuple[BatchFn, Calibrate]:
    """The vLLM extraction's client (its engine started on first use, or ``engine``: a test's shared one) and the
    engine calibration; ``options`` are ``VLLMEngineConfig`` fields (``tp_size``, ``max_seq_len``, ...)."""
    from eagle_assets.hidden_states.extract_vllm import VLLMEngineConfig, VLLMFeatureClient

    opts = {"scratch_dir": str(scratch_root / "vllm-handoff"), **options}
    client = VLLMFeatureClient(
        VLLMEngineConfig(model_path=model_path, layers=layers, **opts), engine=engine, out_dtype=store_dtype
    )
    calibrate = client.calibrator(head, store_dtype, config)
    return client, calibrate


def online_stream(
    spec: TokensData,
    *,
    target: TargetSpec,
    layer_ids: Sequence[int],
    dataset: Any,
    head: Callable[[torch.Tensor], torch.Tensor],
    model: Any = None,
    device: torch.device | str = "cpu",
    scratch_root: str | Path | None = None,
    engine: Any = None,
    batch_fn: BatchFn | None = None,
) -> OnlineFeatureStream:
    """The stream of an online run (``train_cli``'s tokens data): per-batch function, prefetch depth, gate.
    ``batch_fn`` replaces the backend's per-batch function, not its calibration (tests: producers the gate stops)."""
    if not target.path:
        raise ValueError("online features need target.path")
    dims = read_target_dims(target.path)
    layers = AuxLayers(tuple(layer_ids), dims.num_layers)
    store_dtype = dtype_from_name(spec.feature_dtype)
    fidelity = FidelityConfig(**spec.fidelity_config)
    root = Path(scratch_root) if scratch_root is not None else Path(spec.path).parent / "online-scratch"
    if spec.backend == "hf":
        if model is None:
            raise ValueError("the hf backend needs the target loaded in this process")
        produce, calibrate = hf_features(
            model, layers, store_dtype=store_dtype, last_kind=target.last_kind, config=fidelity
        )
    else:
        if target.last_kind != "pre_norm":
            raise ValueError("vLLM returns the final norm's input: target.last_kind must be 'pre_norm'")
        produce, calibrate = vllm_features(
            target.path,
            layers,
            head,
            store_dtype=store_dtype,
            options=spec.vllm,
            scratch_root=root,
            engine=engine,
            config=fidelity,
        )
        if spec.calibrate_in_process:  # as the offline vLLM partition does: the target run in full, here
            from eagle_assets.target.loader import load_target

            full = model if model is not None else load_target(target.path, device, dtype_from_name(target.dtype))
            _, calibrate = hf_features(
                full, layers, store_dtype=store_dtype, last_kind=target.last_kind, config=fidelity
            )
    gate = None
    if spec.fidelity:
        meta = StoreMeta(
            model_id=target.path,
            hidden_size=dims.hidden_size,
            layers=layers,
            dtype=store_dtype,
            last_kind=target.last_kind,
        )
        gate = fidelity_gate(meta, calibrate, head, config=fidelity, scratch_root=root, device=device)
    return OnlineFeatureStream(
        dataset,
        extraction_features(batch_fn or produce),
        depth=spec.prefetch,
        gate=gate,
        gate_rows=fidelity.calibration_samples,
    )
