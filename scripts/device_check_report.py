"""What ``scripts/device_check.py`` records: its checks' verdicts, the log, the stages' seconds, and the host.

Why it is a module of its own: the runbook outgrew one file, and this bookkeeping is the part every stage shares
and none of them computes. ``Check`` is one verdict (a diagnostic when ``counts`` is false), ``Report`` writes the
log lines (stdout and ``device_check.log``) and collects the verdicts, ``Report.stage`` times a stage and turns its
exception into a failed check; ``environment`` and ``third_party_modules`` describe the host for
``device_check.json``. It imports nothing of the project, so the corpus and the stages can both use it.
"""

from __future__ import annotations

import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

# The runbook's own modules beside this one: loaded from scripts/, yet not third-party.
HELPER_MODULES = {"device_check_report", "device_check_corpus"}


@dataclass
class Check:
    name: str
    passed: bool
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)
    counts: bool = True  # False: a diagnostic, reported but not in the exit status


class Report:
    """Log lines (stdout and the log file, with seconds since the start) and the checks' verdicts."""

    def __init__(self, out: Path):
        self.started = time.monotonic()
        self.file: TextIO = (out / "device_check.log").open("w")
        self.checks: list[Check] = []
        self.stages: dict[str, float] = {}
        self.facts: dict[str, Any] = {}

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:7.1f}s] {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()

    def check(self, check: Check) -> Check:
        self.checks.append(check)
        verdict = "PASS" if check.passed else ("FAIL" if check.counts else "FAIL (diagnostic)")
        self.log(f"{verdict} {check.name}: {check.summary}")
        return check

    def stage(self, name: str) -> _Stage:
        return _Stage(self, name)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.counts and not c.passed]


class _Stage:
    """Times a stage; an exception becomes a failed check named after the stage (with its traceback in the log)."""

    def __init__(self, report: Report, name: str):
        self.report, self.name = report, name
        self.ok = False

    def __enter__(self) -> _Stage:
        self.t0 = time.monotonic()
        self.report.log(f"--- {self.name}")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        seconds = time.monotonic() - self.t0
        self.report.stages[self.name] = round(seconds, 2)
        if exc is None:
            self.ok = True
            self.report.log(f"--- {self.name}: {seconds:.1f}s")
            return False
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit: not ours to swallow
        self.report.file.write("".join(traceback.format_exception(kind, exc, tb)))
        self.report.check(Check(f"stage:{self.name}", False, f"raised {type(exc).__name__}: {exc}"))
        return True


def third_party_modules() -> list[str]:
    """Top-level modules loaded from outside the standard library and this repository."""
    std = set(sys.stdlib_module_names)
    # tests: the greedy-path check runs the tests' own reference loop (tests.draft.helpers) on the device's stack
    ours = {"eagle_assets", "resources", "sensors", "tests", "__main__", *HELPER_MODULES}
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    return sorted(t for t in tops if t not in std and t not in ours and not t.startswith("_"))


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env
