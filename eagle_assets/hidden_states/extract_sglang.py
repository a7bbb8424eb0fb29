"""Backend 2: target features from SGLang, for targets that need tensor parallelism (Kimi K2.5, tp=8).

SGLang is not a dependency: this module imports without it, and only starting an engine needs it. Why features
come from two passes (``aux`` and ``last``, one engine each, resumed independently), what SGLang returns and what
it costs: docs/sglang-hidden-states.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from eagle_assets.errors import ConfigError
from eagle_assets.hidden_states.capture_draft import write_capture_draft
from eagle_assets.hidden_states.fidelity_spec import FidelityConfig
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.pipeline import BatchFn, ExtractReport, Progress, ShardsInput, run_extraction
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.sglang_wire import SGLangResponseError, build_generate_request, features_from_response
from eagle_assets.hidden_states.store_format import StoreMeta, dtype_name
from eagle_assets.target.architecture import read_target_dims

SGLANG_INSTALL = 'pip install "sglang[all]"  (on the GPU host; eagle-forge does not depend on it)'
ROLES = ("aux", "last")


class SGLangUnavailableError(ConfigError, ImportError):
    """SGLang is needed for this backend and is not installed here."""


def import_sglang() -> Any:
    """Import SGLang or raise an error that says how to get it."""
    try:
        import sglang
    except ImportError as exc:
        raise SGLangUnavailableError(
            f"the SGLang hidden-state backend needs SGLang, which is not installed: {SGLANG_INSTALL}. "
            "For targets that fit one device use eagle_assets.hidden_states.extract_hf instead."
        ) from exc
    return sglang


# ----------------------------------------------------------------------------------------------
# Engine / server configuration


@dataclass(frozen=True)
class SGLangCaptureConfig:
    """How the SGLang engine for one capture pass is started.

    SGLang returns the prompt's hidden states only for the tokens of the request's *last* prefill chunk, so
    prefix caching is off and the chunk is sized above ``max_seq_len``: a cached prefix or a chunked prompt would
    misalign rows. ``draft_path``: the capture draft the ``"aux"`` pass needs (``write_capture_draft``).
    """

    model_path: str
    layers: AuxLayers
    tp_size: int = 8
    max_seq_len: int = 8192
    mem_fraction_static: float = 0.80
    trust_remote_code: bool = True
    dtype: str = "auto"
    draft_path: str | None = None
    max_tokens_per_batch: int = 8192
    extra_engine_args: Mapping[str, Any] = field(default_factory=dict)

    def engine_kwargs(self, role: str) -> dict[str, Any]:
        """Keyword arguments for ``sglang.Engine`` (the same names as the server's CLI flags)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        prefill = max(8192, 1 << math.ceil(math.log2(self.max_seq_len)))
        kw: dict[str, Any] = {
            "model_path": self.model_path,
            "tp_size": self.tp_size,
            "trust_remote_code": self.trust_remote_code,
            "dtype": self.dtype,
            "enable_return_hidden_states": True,
            "skip_tokenizer_init": True,  # we send exact token ids; nothing is re-tokenized
            "disable_radix_cache": True,  # a cached prefix would be missing from the returned rows
            "chunked_prefill_size": prefill,  # one chunk per prompt, see the class docstring
            "max_prefill_tokens": prefill,
            "context_length": prefill + 8,
            "mem_fraction_static": self.mem_fraction_static,
            "disable_cuda_graph": True,  # prefill-only traffic: decode graphs only cost memory and startup
        }
        if role == "aux":
            if not self.draft_path:
                raise ValueError(
                    "the 'aux' pass needs draft_path: an EAGLE-3 draft directory whose config names the aux "
                    "layers (write one with write_capture_draft)"
                )
            kw.update(
                {
                    "speculative_algorithm": "EAGLE3",
                    "speculative_draft_model_path": self.draft_path,
                    "speculative_num_steps": 1,
                    "speculative_eagle_topk": 1,
                    "speculative_num_draft_tokens": 2,
                }
            )
        kw.update(self.extra_engine_args)
        return kw

    @property
    def compute_dtype(self) -> torch.dtype:
        """What the engine computes in ("auto": bf16, Kimi's): it bounds how precise a stored state can be."""
        return {"float32": torch.float32, "float16": torch.float16}.get(self.dtype, torch.bfloat16)

    def server_argv(self, role: str, *, host: str = "127.0.0.1", port: int = 30000) -> list[str]:
        """The equivalent ``python -m sglang.launch_server`` command line."""
        argv = ["python", "-m", "sglang.launch_server"]
        for k, v in self.engine_kwargs(role).items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                argv.append(flag)
            elif v is False or v is None:
                continue
            else:
                argv += [flag, str(v)]
        return [*argv, "--host", host, "--port", str(port)]


class SGLangEngineClient:
    """A ``BatchFn`` for one role over an in-process ``sglang.Engine``, started on first use unless given."""

    def __init__(
        self,
        config: SGLangCaptureConfig,
        role: str,
        *,
        hidden_size: int,
        engine: Any | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
    ):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        self.config = config
        self.role = role
        self.width = config.layers.n_aux * hidden_size if role == "aux" else hidden_size
        self.out_dtype = out_dtype
        self._engine = engine

    @property
    def engine(self) -> Any:
        if self._engine is None:
            sglang = import_sglang()
            self._engine = sglang.Engine(**self.config.engine_kwargs(self.role))
        return self._engine

    def __call__(self, batch: Sequence[HiddenStateSample]) -> list[dict[str, torch.Tensor]]:
        req = build_generate_request(batch)
        answers = self.engine.generate(**req)
        if isinstance(answers, Mapping):
            answers = [answers]
        if len(answers) != len(batch):
            raise SGLangResponseError(f"{len(answers)} answers for {len(batch)} prompts")
        return [
            {self.role: features_from_response(a, s, self.width).to(self.out_dtype)}
            for a, s in zip(answers, batch, strict=True)
        ]

    def close(self) -> None:
        if self._engine is not None and hasattr(self._engine, "shutdown"):
            self._engine.shutdown()
        self._engine = None


# ----------------------------------------------------------------------------------------------
# Orchestration


def extract_sglang(
    shards: ShardsInput,
    out_dir: str | Path,
    config: SGLangCaptureConfig,
    *,
    model_id: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    client_factory: Callable[[SGLangCaptureConfig, str, int], BatchFn] | None = None,
    progress: Callable[[Progress], None] | None = None,
    check_space: bool = True,
    calibration: FidelityConfig | None = None,
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, ExtractReport]:
    """Run the ``aux`` pass, then the ``last`` pass, into one store; each pass resumes on its own.

    ``client_factory(config, role, hidden_size)`` makes a pass's ``BatchFn`` (default: ``SGLangEngineClient``,
    whose lazy engine a pass with nothing left to do never starts). With ``calibration``, the ``last`` pass's
    engine also scores every shard's calibration samples before it is shut down (the fidelity checks need them;
    ``head`` defaults to ``load_target_head``); a current calibration on disk is kept.
    """
    dims = read_target_dims(config.model_path)
    if config.layers.num_layers != dims.num_layers:
        raise ValueError(f"layers chosen for {config.layers.num_layers} layers, target has {dims.num_layers}")
    meta = StoreMeta(
        model_id=model_id or str(config.model_path),
        hidden_size=dims.hidden_size,
        layers=config.layers,
        dtype=dtype,
        extra={"backend": "sglang", "tp_size": config.tp_size},
    )
    factory = client_factory or (
        lambda cfg, role, hidden: SGLangEngineClient(cfg, role, hidden_size=hidden, out_dtype=dtype)
    )
    reports: dict[str, ExtractReport] = {}
    for role in ROLES:
        client = factory(config, role, dims.hidden_size)
        try:
            reports[role] = run_extraction(
                shards,
                out_dir,
                meta,
                client,
                group=(role,),
                max_tokens_per_batch=config.max_tokens_per_batch,
                progress=progress,
                check_space=check_space,
            )
            if role == "last" and calibration is not None:
                _calibrate(client, shards, out_dir, config, meta, calibration, head)
        finally:
            close = getattr(client, "close", None)
            if callable(close):
                close()
    return reports


def _calibrate(
    client: BatchFn,
    shards: ShardsInput,
    out_dir: str | Path,
    config: SGLangCaptureConfig,
    meta: StoreMeta,
    fidelity: FidelityConfig,
    head: Callable[[torch.Tensor], torch.Tensor] | None,
) -> None:
    """The store's calibration through the ``last`` engine (its requests also return the final states)."""
    from eagle_assets.hidden_states.calibration_sglang import calibrate_shard_engine, calibration_is_current
    from eagle_assets.hidden_states.fidelity import Calibration, calibrate_shards, read_calibration, write_calibration
    from eagle_assets.hidden_states.pipeline import normalize_shards

    items = normalize_shards(shards)
    if calibration_is_current(read_calibration(out_dir), items, fidelity):
        return
    engine = getattr(client, "engine", None)
    if engine is None or not callable(getattr(engine, "generate", None)):
        raise TypeError("calibrating through SGLang needs the 'last' pass's client to expose engine.generate")
    if head is None:
        from eagle_assets.draft.target import load_target_head

        head = load_target_head(config.model_path, "post_norm")
    one = partial(
        calibrate_shard_engine,
        engine.generate,
        config.layers,
        head,
        hidden_size=meta.hidden_size,
        store_dtype=meta.dtype,
        compute_dtype=config.compute_dtype,
        config=fidelity,
    )
    records = calibrate_shards(items, one)
    write_calibration(out_dir, Calibration(meta.model_id, dtype_name(meta.dtype), "post_norm", fidelity, records))


# ----------------------------------------------------------------------------------------------
# Checks to run on a GPU host (not runnable here: no SGLang, no GPU)


def parity_check(
    model_path: str | Path,
    *,
    tp_size: int = 1,
    n_samples: int = 4,
    length: int = 256,
    work_dir: str | Path = "sglang-parity",
    seed: int = 0,
) -> dict[str, float]:
    """Max |difference| per feature, relative to its max magnitude (bf16 noise: ~1e-2), between both SGLang passes
    and ``extract_hf`` on a few random samples of a target that fits one GPU: what verifies this backend."""
    import random

    from eagle_assets.hidden_states.extract_hf import extract_hf
    from eagle_assets.hidden_states.store import HiddenStateStore

    work = Path(work_dir)
    dims = read_target_dims(model_path)
    layers = AuxLayers.default(dims.num_layers)
    draft = write_capture_draft(work / "capture-draft", model_path, layers)
    cfg = SGLangCaptureConfig(
        model_path=str(model_path), layers=layers, tp_size=tp_size, draft_path=str(draft), max_seq_len=length
    )
    r = random.Random(seed)
    samples = [
        HiddenStateSample(
            f"p{i}", [r.randrange(1000, min(dims.vocab_size, 100_000)) for _ in range(length)], [1] * length
        )
        for i in range(n_samples)
    ]
    extract_sglang([samples], work / "sglang", cfg, model_id="parity", check_space=False)
    extract_hf(model_path, [samples], work / "hf", model_id="parity", layers=layers, check_space=False)
    a, b = HiddenStateStore(work / "sglang", dtype=torch.float32), HiddenStateStore(work / "hf", dtype=torch.float32)
    out = {}
    for feature in ("aux", "last"):
        diffs = [(x[feature] - y[feature]).abs().max() / y[feature].abs().max() for x, y in zip(a, b, strict=True)]
        out[feature] = float(max(diffs))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="SGLang hidden-state backend helpers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("server-cmd", help="print the launch_server command of a pass")
    p.add_argument("--model-path", required=True)
    p.add_argument("--num-layers", type=int, help="default: read config.json")
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--draft-path", default="<capture-draft-dir>")
    p.add_argument("--tp-size", type=int, default=8)
    p.add_argument("--max-seq-len", type=int, default=8192)
    d = sub.add_parser("capture-draft", help="write the zero-weight EAGLE-3 draft that turns on aux capture")
    d.add_argument("--model-path", required=True)
    d.add_argument("--out", required=True)
    c = sub.add_parser("parity", help="compare SGLang features with the HF backend (model must fit one GPU)")
    c.add_argument("--model-path", required=True)
    c.add_argument("--tp-size", type=int, default=1)
    c.add_argument("--work-dir", default="sglang-parity")
    args = ap.parse_args(argv)
    if args.cmd == "server-cmd":
        n = args.num_layers or read_target_dims(args.model_path).num_layers
        cfg = SGLangCaptureConfig(
            model_path=args.model_path,
            layers=AuxLayers.default(n),
            tp_size=args.tp_size,
            draft_path=args.draft_path,
            max_seq_len=args.max_seq_len,
        )
        print(" ".join(cfg.server_argv(args.role)))
    elif args.cmd == "capture-draft":
        dims = read_target_dims(args.model_path)
        print(write_capture_draft(args.out, args.model_path, AuxLayers.default(dims.num_layers)))
    else:
        result = parity_check(args.model_path, tp_size=args.tp_size, work_dir=args.work_dir)
        print(json.dumps(result))
        return 0 if all(v < 5e-2 for v in result.values()) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
