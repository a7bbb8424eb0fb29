"""Which engine benchmarks the draft, and how to reach it: the ``serving`` resource of ``draft_benchmark``.

The backends and the ``EAGLE_FORGE_SERVING*`` variables that set them for the sensor's runs:
docs/draft-and-benchmark.md, "The benchmark's two backends".
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field

from eagle_assets.errors import ConfigError
from eagle_assets.settings import REPO_ROOT, ServingBackend, current_settings
from resources.serving.commands import EnginePlan, LaunchSettings, SpeculativeSettings


class ServingEngineResource(dg.ConfigurableResource):
    """The serving engine the draft is benchmarked through (or the in-process loop)."""

    backend: ServingBackend = Field(default="inprocess", description="inprocess | sglang | vllm")
    url: str = Field(
        default="", description="attach to this running server (with the draft); empty: start one per pass"
    )
    baseline_url: str = Field(default="", description="attach: the same target served without speculation")
    run_baseline: bool = Field(default=True, description="also run every set without the draft (throughput, speedup)")
    model_path: str = Field(
        default="", description="target checkpoint the server loads; empty: the target resource's path"
    )
    tp_size: int = Field(default=8, ge=1, description="tensor-parallel GPUs of a started server")
    host: str = Field(default="127.0.0.1", description="interface a started server listens on")
    port: int = Field(default=0, ge=0, description="port of a started server; 0: a free one")
    trust_remote_code: bool = True
    extra_args: list[str] = Field(default_factory=list, description="appended to the engine's command line")
    launcher: list[str] = Field(
        default_factory=list,
        description="command that starts the engine; empty: python -m sglang.launch_server / vllm serve",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of a started server")
    startup_timeout_s: float = Field(default=3600.0, gt=0, description="loading a 1T target takes a while")
    health_poll_s: float = Field(default=2.0, gt=0)
    request_timeout_s: float = Field(default=3600.0, gt=0)
    check_draft_path: bool = Field(
        default=True, description="attach: refuse a server whose draft path is not the export"
    )

    @property
    def serves(self) -> bool:
        return self.backend != "inprocess"

    def plan(self, spec: SpeculativeSettings, draft_path: Path, model_path: Path | None, batch_size: int) -> EnginePlan:
        if self.backend == "inprocess":
            raise ValueError("the in-process backend has no serving plan")
        launch = None
        if not self.url:
            model = self.model_path or (str(model_path) if model_path else "")
            if not model:
                raise ValueError("starting a server needs the target checkpoint: set model_path or the target's path")
            launch = LaunchSettings(
                model_path=model,
                host=self.host,
                port=self.port,
                tp_size=self.tp_size,
                batch_size=batch_size,
                trust_remote_code=self.trust_remote_code,
                extra_args=tuple(self.extra_args),
                launcher=tuple(self.launcher),
            )
        elif self.run_baseline and not self.baseline_url:
            raise ValueError(
                "attached to a running server, the baseline pass needs baseline_url (the target without the "
                "draft); or set run_baseline: false to report no speedup"
            )
        return EnginePlan(
            engine=self.backend,
            spec=spec,
            draft_path=str(draft_path),
            launch=launch,
            url=self.url,
            baseline_url=self.baseline_url,
            run_baseline=self.run_baseline,
            check_draft_path=self.check_draft_path,
            startup_timeout_s=self.startup_timeout_s,
            health_poll_s=self.health_poll_s,
            request_timeout_s=self.request_timeout_s,
            env=dict(self.env),
            cwd=REPO_ROOT,
        )


class ServingConfigError(ConfigError, ValueError):
    """The serving environment variables name an engine run that cannot be what was meant."""


def serving_from_env() -> ServingEngineResource:
    """The serving resource the definitions (so the training sensor's runs) use, from the settings. Refuses to start
    an engine without a model path: one started on the tiny target's folder would measure nothing meant."""
    s = current_settings()
    if s.serving != "inprocess" and not s.serving_url and not s.serving_model_path:
        raise ServingConfigError(
            f"EAGLE_FORGE_SERVING={s.serving} starts the engine (no EAGLE_FORGE_SERVING_URL to attach to), but"
            " EAGLE_FORGE_SERVING_MODEL_PATH is not set: name the target checkpoint the engine loads (e.g."
            " /models/Kimi-K2.5), or attach to a running server with EAGLE_FORGE_SERVING_URL and"
            " EAGLE_FORGE_SERVING_BASELINE_URL"
        )
    return ServingEngineResource(
        backend=s.serving,
        url=s.serving_url,
        baseline_url=s.serving_baseline_url,
        model_path=s.serving_model_path,
        tp_size=s.serving_tp_size,
    )
