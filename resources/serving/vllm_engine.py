"""The exported draft served by a real vLLM engine in this process: τ and per-position acceptance from vLLM's own
spec-decode counters, on the token ids the in-process loop is given.

No server and no tokenizer (``skip_tokenizer_init``): prompts go in as ids, greedy, so the figures are comparable
with the in-process loop's on the same prompts. The counters are read as ``/metrics`` would show them (this
process's Prometheus registry, where vLLM's frontend records them) before and after the run, so the delta and its
checks are the HTTP path's (``vllm_metrics.SpecDecodeCounters``). vLLM is imported only when an engine starts.

Every engine of the project starts here (``start_engine``: the extraction's, online training's, the served
draft's), so how one is sized (``seq_len_for``) and what a CPU engine needs (``cpu_engine_environment``) live here
too.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from eagle_assets.errors import ConfigError
from resources.serving.acceptance import AcceptanceTally
from resources.serving.vllm_metrics import SpecDecodeCounters


def cpu_engine_environment(tp_size: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settings a CPU engine needs that vLLM's defaults get wrong on a small machine: a KV cache of 1 GiB (the
    default sized one TP worker out of memory at 11.8 GB here) and, at tp > 1, one share of this process's cores per
    rank ("Not enough allowed NUMA nodes" otherwise), and loopback as the host's address (at tp > 1 vLLM names its
    workers' queue by this host's first network address otherwise, where a CPU engine runs on one machine). What
    the environment already sets wins."""
    env = dict(os.environ if environ is None else environ)
    out = {
        "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_HOST_IP": env.get("VLLM_HOST_IP", "127.0.0.1"),
    }
    if tp_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < tp_size:
            raise ConfigError(f"tensor_parallel_size {tp_size} needs as many cores, this process may use {cores}")
        share = len(cores) // tp_size
        out["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            ",".join(str(c) for c in cores[r * share : (r + 1) * share]) for r in range(tp_size)
        )
    return out


# vLLM's C++ rotary kernel on CPU (``RotaryEmbedding.forward_cpu``, the path ``enforce_eager`` takes) rotates 3-D
# ``[tokens, heads, dim]`` queries wrongly; 2-D ones (Llama's) come out right. DeepSeek-V3's attention, Kimi K2.5's,
# hands it exactly that (``q[..., nope:]``): measured on the tiny Kimi text target, features 0.4-2.6% off
# transformers' with the kernel, equal (within 2.4e-7) with PyTorch's own rotation, at tp 1 and 2.
CPU_NATIVE_OPS = ("-rotary_embedding",)


def with_cpu_native_ops(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` for an engine on vLLM's CPU platform: the custom ops that compute wrongly there
    (``CPU_NATIVE_OPS``) turned off, so vLLM runs their PyTorch forms. An op the caller names itself (on or off)
    is left as the caller set it."""
    out = dict(kwargs)
    compilation = dict(out.get("compilation_config") or {})
    ops = list(compilation.get("custom_ops") or [])
    named = {op.lstrip("+-") for op in ops}
    ops += [op for op in CPU_NATIVE_OPS if op.lstrip("+-") not in named]
    compilation["custom_ops"] = ops
    out["compilation_config"] = compilation
    return out


def seq_len_for(lengths: Iterable[int], multiple: int = 256) -> int:
    """The engine's ``max_model_len`` for these rows: the longest and the one token each request generates,
    rounded up (a KV cache sized for them only). vLLM refuses a prompt as long as ``max_model_len``: a shard whose
    longest row is 512 tokens needs 768."""
    longest = max(lengths, default=0)
    if longest < 1:
        raise ValueError("no rows to size the engine for")
    return -(-(longest + 1) // multiple) * multiple


@dataclass(frozen=True)
class EngineRun:
    """What the engine produced: its tally, each prompt's greedy continuation, the wall time of generation."""

    tally: AcceptanceTally
    outputs: list[list[int]]
    seconds: float


def engine_kwargs(
    target: str, draft: str, num_steps: int, *, tp_size: int = 1, dtype: str = "auto", max_model_len: int = 2048
) -> dict[str, Any]:
    """``vllm.LLM`` arguments: the target with the EAGLE-3 export as its speculator, stats on (the counters)."""
    return {
        "model": target,
        "tensor_parallel_size": tp_size,
        "dtype": dtype,
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "max_model_len": max_model_len,
        "disable_log_stats": False,
        "speculative_config": {"method": "eagle3", "model": draft, "num_speculative_tokens": num_steps},
    }


def _counters() -> SpecDecodeCounters:
    from prometheus_client import REGISTRY, generate_latest

    return SpecDecodeCounters.from_metrics_text(generate_latest(REGISTRY).decode())


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set while the engine starts (its processes inherit them), the caller's environment restored."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
# Where vLLM binds its IPC sockets (the engine's ZeroMQ queues, a TP group's broadcast queue). It defaults to the
# system's temporary folder and never removes them: every engine left a few socket files in /tmp for good, and the
# file its executor's process group meets at (``vllm_dist_<uuid>``, in ``tempfile.gettempdir()``) too.
IPC_DIR = "VLLM_RPC_BASE_PATH"


@contextmanager
def _temporary_folder(path: str | None) -> Iterator[None]:
    """``tempfile``'s folder is ``path`` while the engine starts (its core and executor are built in this process;
    the processes it starts read ``TMPDIR``), so what vLLM leaves in "the" temporary folder is removed with it."""
    saved = tempfile.tempdir
    tempfile.tempdir = path if path is not None else saved
    try:
        yield
    finally:
        tempfile.tempdir = saved


# vLLM's ``LLM()`` warms its chat template up by rendering one, even with ``skip_tokenizer_init`` (every engine
# here: ids go in), where there is no tokenizer to render with: a warning and a traceback at every engine start
# that say nothing about the engine. Only that one is dropped; any other warm-up failure is still logged.
WARMUP_LOGGER = "vllm.renderers.base"


class TokenizerlessWarmup(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage() == "Chat template warmup failed" and "skip_tokenizer_init" in str(error))


def start_engine(kwargs: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Any:
    """A ``vllm.LLM``: the one place every engine of the project starts (extraction, online features, the served
    draft). ``env`` (a CPU engine's settings) is set while it starts, as its processes inherit it.

    The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, unless the environment sets it):
    every caller here drives it synchronously through ``generate``, so a core process of its own overlaps nothing
    and costs a spawned interpreter that imports vLLM again (14 CPU-s here), and at tp=1 a second one for its
    worker: measured here, an engine up in 8.3 s against 27.5-33.5 s. At tp > 1 the workers are processes still;
    ``engine_failed`` sees one die."""
    # vLLM reports usage to its authors' server by default; this project talks to no address but loopback.
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm import LLM, envs
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        kwargs = with_cpu_native_ops(kwargs)

    settings = {IN_PROCESS: os.environ.get(IN_PROCESS, "0"), **(env or {})}
    ipc = None if IPC_DIR in os.environ or IPC_DIR in settings else tempfile.mkdtemp(prefix="eagle-forge-vllm-")
    if ipc is not None:
        settings[IPC_DIR] = ipc
        settings["TMPDIR"] = ipc
    # A core started in this process froze vLLM's view of the environment (envs.enable_envs_cache): thaw it, or
    # this engine would start with the last one's settings (its thread binding, its KV cache size).
    envs.disable_envs_cache()
    # An engine let go without stop_engine is shut down by its finalizer when it is collected, and an in-process
    # core's shutdown tears down this process's tensor-parallel groups: collected in the middle of this engine's
    # construction, it took the new engine's groups with it ("tensor model parallel group is not initialized").
    gc.collect()
    quiet = TokenizerlessWarmup()
    logging.getLogger(WARMUP_LOGGER).addFilter(quiet)
    try:
        with _environment(settings), _temporary_folder(ipc):
            engine: Any = LLM(**kwargs)
    except BaseException:
        if ipc is not None:
            shutil.rmtree(ipc, ignore_errors=True)
        raise
    finally:
        logging.getLogger(WARMUP_LOGGER).removeFilter(quiet)
    if ipc is not None:
        # Removed by stop_engine, or when the engine is collected or the interpreter exits, whichever comes first.
        engine._eagle_forge_ipc = weakref.finalize(engine, shutil.rmtree, ipc, ignore_errors=True)
    return engine


def _client(engine: Any) -> Any:
    """vLLM's engine-core client of an ``LLM`` (in-process or a core process's), or None."""
    return getattr(getattr(engine, "llm_engine", None), "engine_core", None)


def engine_failed(engine: Any) -> bool:
    """Whether a process of ``engine`` died under it: its core process (vLLM's client sets ``engine_dead``) or,
    with the core in this process, a worker (the executor's monitor sets ``is_failed``). vLLM's ``generate`` may
    wait for either forever; callers poll this instead."""
    client = _client(engine)
    if getattr(getattr(client, "resources", None), "engine_dead", False):
        return True
    executor = getattr(getattr(client, "engine_core", None), "model_executor", None)
    return bool(getattr(executor, "is_failed", False))


def core_in_process(engine: Any) -> bool:
    """Whether ``engine``'s core runs in this process (vLLM's in-process client holds the core itself)."""
    return hasattr(_client(engine), "engine_core")


def advance(engine: Any) -> None:
    """One engine step with no new request. What a finished request leaves for the step after it (a KV
    connector's save of its rows, the freeing of its blocks) waits for that step, and with the core in this process
    nothing takes it once ``generate`` has returned; a core process of its own keeps stepping by itself."""
    if core_in_process(engine):
        engine.llm_engine.step()


def stop_engine(engine: Any) -> None:
    """Shut the engine's processes down now rather than at interpreter exit (its memory back for what comes next),
    and remove its socket folder."""
    client = _client(engine)
    if client is not None and callable(getattr(client, "shutdown", None)):
        client.shutdown()
    ipc = getattr(engine, "_eagle_forge_ipc", None)
    if ipc is not None:
        ipc()


def run_prompts(engine: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, num_steps: int) -> EngineRun:
    """Greedy continuations of every prompt (to ``max_new_tokens``: the end-of-turn id does not stop them, as the
    in-process loop's budget does not), and the counters' delta as a tally."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
    before = _counters()
    started = time.perf_counter()
    answers = engine.generate([{"prompt_token_ids": list(map(int, p))} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    outputs = [list(a.outputs[0].token_ids) for a in answers]
    # vLLM's frontend records a step's stats after its outputs: wait until the last tokens are counted.
    deadline = time.monotonic() + 10.0
    total = sum(len(o) for o in outputs)
    delta = _counters().minus(before)
    while delta.generation_tokens < total and time.monotonic() < deadline:
        time.sleep(0.05)
        delta = _counters().minus(before)
    return EngineRun(delta.tally(num_steps, total), outputs, seconds)


def served_tally(
    target: str,
    export: str,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    num_steps: int,
    *,
    tp_size: int = 1,
    dtype: str = "auto",
    on_cuda: bool = False,
) -> AcceptanceTally:
    """The exported draft served with its target in an engine started for these prompts alone (sized for the
    longest, its ``num_steps`` drafts past the last token included; a CPU engine with its CPU settings), stopped
    once they are run: the draft_benchmark asset's figure and the GPU runbook's."""
    longest = seq_len_for(len(p) + max_new_tokens + num_steps for p in prompts)
    kwargs = engine_kwargs(target, export, num_steps, tp_size=tp_size, dtype=dtype, max_model_len=longest)
    engine = start_engine(kwargs, None if on_cuda else cpu_engine_environment(tp_size))
    try:
        return run_prompts(engine, prompts, max_new_tokens, num_steps).tally
    finally:
        stop_engine(engine)
