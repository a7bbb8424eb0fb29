"""The command lines that start SGLang and vLLM with (or, for the baseline pass, without) the EAGLE-3 draft.

Pure functions, so the exact argv is tested. Flags follow the engines' CLIs, launched as SpecForge's
``benchmarks/bench_eagle3.py`` launches SGLang (batch size = CUDA-graph batch = running requests); what the
settings mean and the runbook: docs/draft-and-benchmark.md.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eagle_assets.errors import ConfigError

Engine = Literal["sglang", "vllm"]


class SettingsError(ConfigError, ValueError):
    """Speculative settings an engine (or the in-process loop) cannot run as asked."""


@dataclass(frozen=True)
class SpeculativeSettings:
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4

    def validate(self, backend: str) -> SpeculativeSettings:
        if min(self.num_steps, self.eagle_topk, self.num_draft_tokens) < 1:
            raise SettingsError(f"steps, topk and draft tokens must be >= 1: {self}")
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            # SGLang silently resets it to steps + 1 for topk 1; the recorded settings would then be wrong.
            raise SettingsError(
                f"with topk 1 the target verifies num_steps + 1 = {self.num_steps + 1} tokens per step, "
                f"not num_draft_tokens {self.num_draft_tokens}"
            )
        if backend != "sglang" and self.eagle_topk != 1:
            raise SettingsError(f"{backend} drafts chains only: eagle_topk must be 1, got {self.eagle_topk}")
        return self


@dataclass(frozen=True)
class LaunchSettings:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 8
    batch_size: int = 1
    trust_remote_code: bool = True
    extra_args: tuple[str, ...] = ()
    launcher: tuple[str, ...] = field(default=())  # empty: the engine's own entry point

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _launch(s: LaunchSettings, engine: Engine, model_and_tp: list[str]) -> list[str]:
    """What both engines' command lines start with: the entry point, model, tensor parallelism, address."""
    entry = (sys.executable, "-m", "sglang.launch_server") if engine == "sglang" else ("vllm", "serve")
    cmd = [*(s.launcher or entry), *model_and_tp, "--host", s.host, "--port", str(s.port)]
    return [*cmd, "--trust-remote-code"] if s.trust_remote_code else cmd


def sglang_command(s: LaunchSettings, draft: str | None, spec: SpeculativeSettings | None) -> list[str]:
    """``draft=None``: the baseline server, without speculation."""
    cmd = _launch(s, "sglang", ["--model-path", s.model_path, "--tp-size", str(s.tp_size)])
    cmd += ["--cuda-graph-max-bs", str(s.batch_size), "--max-running-requests", str(s.batch_size)]
    if draft is not None:
        if spec is None:
            raise SettingsError("a draft needs speculative settings")
        spec.validate("sglang")
        cmd += [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            draft,
            "--speculative-num-steps",
            str(spec.num_steps),
            "--speculative-eagle-topk",
            str(spec.eagle_topk),
            "--speculative-num-draft-tokens",
            str(spec.num_draft_tokens),
        ]
    return [*cmd, *s.extra_args]


def vllm_command(s: LaunchSettings, draft: str | None, spec: SpeculativeSettings | None) -> list[str]:
    cmd = _launch(s, "vllm", [s.model_path, "--tensor-parallel-size", str(s.tp_size)])
    cmd += ["--max-num-seqs", str(s.batch_size)]
    if draft is not None:
        if spec is None:
            raise SettingsError("a draft needs speculative settings")
        spec.validate("vllm")
        cmd += [
            "--speculative-config",
            json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": spec.num_steps}),
        ]
    return [*cmd, *s.extra_args]


def engine_command(engine: Engine, s: LaunchSettings, draft: str | None, spec: SpeculativeSettings | None) -> list[str]:
    return (sglang_command if engine == "sglang" else vllm_command)(s, draft, spec)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the server binds it a moment later; a race there fails its start loudly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class EnginePlan:
    """How a benchmark pass reaches its engine: servers started with ``launch``, or running at ``url``."""

    engine: Engine
    spec: SpeculativeSettings
    draft_path: str
    launch: LaunchSettings | None = None  # start servers with these settings; None: attach to `url`
    url: str = ""  # the speculating server to attach to
    baseline_url: str = ""  # a server of the same target without speculation, to attach to
    run_baseline: bool = True
    check_draft_path: bool = True
    startup_timeout_s: float = 3600.0
    health_poll_s: float = 2.0
    request_timeout_s: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
