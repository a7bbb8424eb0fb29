"""Draft training as a Dagster Pipes process: ``python -m eagle_assets.draft.pipes_train --config run.json``.

The same run as ``train_cli`` (also under ``torchrun``), plus what Dagster sees while it runs: rank 0 opens the
Pipes channel, streams a log line per ``log_every`` steps and reports the materialization at the end, with the loss
curve over every step of the run's history. Other ranks stay silent; outside Dagster it trains as ``train_cli``.
"""

import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, open_dagster_pipes

from eagle_assets.draft import distributed as du
from eagle_assets.draft.run_config import DraftRunConfig
from eagle_assets.draft.train import StepMetrics, Trainer
from eagle_assets.draft.train_cli import main as train_cli_main
from eagle_assets.draft.train_cli import run


def read_history(path: Path) -> list[dict[str, Any]]:
    """Step metrics of the run (across resumes: the file is appended to); the last record of a step wins."""
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                m = json.loads(line)
            except json.JSONDecodeError:  # a torn last line after a kill
                continue
            by_step[int(m["step"])] = m
    return [by_step[s] for s in sorted(by_step)]


def _md(value: Any, kind: str) -> dict[str, Any]:
    """A metadata entry as Pipes reports it."""
    return {"raw_value": value, "type": kind}


def training_metadata(history: Sequence[dict[str, Any]], export_dir: Path) -> dict[str, Any]:
    from eagle_assets.plots import line_chart_md

    if not history:
        return {"steps": 0, "export": _md(str(export_dir), "path")}
    last = history[-1]
    k = len(last["acc"])
    tail = history[-max(1, len(history) // 10) :]
    accuracy = {f"step {i + 1}": [(m["step"], m["acc"][i]) for m in history] for i in range(k)}
    return {
        "steps": last["step"],
        "final_loss": _md(round(statistics.fmean(m["loss"] for m in tail), 5), "float"),
        "final_acc_per_step": _md([round(statistics.fmean(m["acc"][i] for m in tail), 4) for i in range(k)], "json"),
        "simulated_tau": _md(round(statistics.fmean(m["sim_tau"] for m in tail), 3), "float"),
        "tokens_per_s": _md(round(statistics.median(m["tokens_per_s"] for m in history), 1), "float"),
        "tokens_seen": _md(int(sum(m["tokens"] for m in history)), "int"),
        "loss_curve": _md(
            line_chart_md({"loss": [(m["step"], m["loss"]) for m in history]}, "training loss", "step", "loss"), "md"
        ),
        "accuracy_curve": _md(line_chart_md(accuracy, "accuracy per TTT step", "step", "top-1 accuracy"), "md"),
        "export": _md(str(export_dir), "path"),
    }


def train_and_report(cfg: DraftRunConfig) -> None:
    """Rank 0 inside a Pipes process reports to Dagster; every other case trains as ``train_cli`` does."""
    if du.current().is_main and DAGSTER_PIPES_CONTEXT_ENV_VAR in os.environ:
        with open_dagster_pipes() as pipes:
            _train_reporting(cfg, pipes)
        return
    run(cfg)


def main(argv: Sequence[str] | None = None) -> int:
    return train_cli_main(argv, train=train_and_report)


def _train_reporting(cfg: DraftRunConfig, pipes: Any) -> None:
    out = cfg.out
    if out is None:
        raise ValueError("a training run reported to Dagster needs output_dir: its metrics and export are read there")
    every = max(1, cfg.log_every)

    def on_step(m: StepMetrics) -> None:
        if m.step % every == 0 or m.step == 1:
            acc = " ".join(f"{a:.3f}" for a in m.acc)
            pipes.log.info(
                f"step {m.step}: loss {m.loss:.4f}, acc per TTT step [{acc}], simulated τ {m.sim_tau:.2f}, "
                f"{m.tokens_per_s:.0f} tokens/s, lr {m.lr:.2e}"
            )

    trainer = run(cfg, on_step=on_step)
    pipes.log.info(f"exported {out / 'export'} (one folder for SGLang and vLLM)")
    metadata = training_metadata(read_history(out / "metrics.jsonl"), out / "export")
    pipes.report_asset_materialization(metadata={**metadata, **online_metadata(trainer)})


def online_metadata(trainer: Trainer) -> dict[str, Any]:
    """An online run's target side (this process's share of it): its tokens/s, the time the trainer waited for it,
    the fidelity checks run on the stream's first rows and the bytes of their scratch store (removed since)."""
    stream = trainer.stream
    if stream is None:
        return {}
    stats = stream.stats
    return {
        "target_tokens_per_s": _md(round(stats.tokens_per_s, 1), "float"),
        "target_seconds": _md(round(stats.seconds, 2), "float"),
        "waited_for_target_s": _md(round(stats.waited_s, 2), "float"),
        "online_fidelity": _md(stats.extra.get("fidelity", {}), "json"),
        "fidelity_scratch_bytes": _md(int(stats.extra.get("fidelity_scratch_bytes", 0)), "int"),
    }


if __name__ == "__main__":
    raise SystemExit(main())
