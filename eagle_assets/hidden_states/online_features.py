"""Which per-batch function an online run's stream calls: the extraction's own, in process or through SGLang.

Online and offline features are the same numbers because they come from the same function (``HFFeatureExtractor``
over the target loaded beside the draft, or one ``SGLangEngineClient`` per pass), and the gate calibrates as the
offline backend does. ``train_cli`` resolves ``online_stream`` by name (``TokensData.stream``), so that the draft
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

EngineFactory = Callable[[str, dict[str, Any]], Any]  # (role, sglang.Engine kwargs) -> an engine


def extraction_features(batch_fn: BatchFn) -> RowFeatures:
    """The stream's per-batch function over an extraction's: rows become samples (a row's id is its dataset index)."""

    def features(rows: Sequence[Row], indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        samples = [
            HiddenStateSample(f"row-{i}", r["input_ids"].tolist(), r["loss_mask"].to(torch.int64).tolist())
            for r, i in zip(rows, indices, strict=True)
        ]
        return batch_fn(samples)

    return features


def joined_passes(aux: BatchFn, last: BatchFn) -> BatchFn:
    """Both features from the two SGLang passes' clients, request by request as the extraction sends them."""

    def both(batch: Sequence[HiddenStateSample]) -> list[dict[str, torch.Tensor]]:
        return [{**a, **b} for a, b in zip(aux(batch), last(batch), strict=True)]

    return both


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


def sglang_features(
    model_path: str,
    layers: AuxLayers,
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    store_dtype: torch.dtype,
    options: Mapping[str, Any],
    scratch_root: Path,
    engine_factory: EngineFactory | None = None,
    config: FidelityConfig | None = None,
) -> tuple[BatchFn, Calibrate]:
    """Both SGLang passes' clients and the engine calibration; ``engine_factory(role, engine kwargs)`` starts an
    engine (default: ``sglang.Engine`` on first use; tests give the stand-in)."""
    from eagle_assets.hidden_states.calibration_sglang import calibrate_shard_engine
    from eagle_assets.hidden_states.capture_draft import capture_draft_name, ensure_capture_draft
    from eagle_assets.hidden_states.extract_sglang import SGLangCaptureConfig, SGLangEngineClient

    opts = dict(options)
    if not opts.get("draft_path"):
        name = capture_draft_name(model_path, layers)
        opts["draft_path"] = str(ensure_capture_draft(scratch_root / name, model_path, layers))
    capture = SGLangCaptureConfig(model_path=model_path, layers=layers, **opts)
    hidden = read_target_dims(model_path).hidden_size
    clients = {
        role: SGLangEngineClient(
            capture,
            role,
            hidden_size=hidden,
            engine=engine_factory(role, capture.engine_kwargs(role)) if engine_factory is not None else None,
            out_dtype=store_dtype,
        )
        for role in ("aux", "last")
    }

    def generate(**request: Any) -> Any:  # the last pass's engine, started on first use
        return clients["last"].engine.generate(**request)

    calibrate = partial(
        calibrate_shard_engine,
        generate,
        layers,
        head,
        hidden_size=hidden,
        store_dtype=store_dtype,
        compute_dtype=capture.compute_dtype,
        config=config,
    )
    return joined_passes(clients["aux"], clients["last"]), calibrate


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
    engine_factory: EngineFactory | None = None,
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
        if target.last_kind != "post_norm":
            raise ValueError("SGLang returns the post-norm last state only (target.last_kind 'post_norm')")
        produce, calibrate = sglang_features(
            target.path,
            layers,
            head,
            store_dtype=store_dtype,
            options=spec.sglang,
            scratch_root=root,
            engine_factory=engine_factory,
            config=fidelity,
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
