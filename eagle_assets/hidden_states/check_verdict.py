"""What the three fidelity checks share: a verdict of named figures against thresholds, and its outcome."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.fidelity import ShardCalibration
from eagle_assets.hidden_states.store_shard import StoreShard


def where_of(partition: str, shard: str) -> str:
    return f"hidden_states {partition} {shard}"


@dataclass
class Verdict:
    """Named figures with their thresholds; every one that falls short becomes a line of the summary."""

    failures: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def at_least(self, what: str, value: float, threshold: float, derivation: str) -> None:
        if not value >= threshold:  # NaN fails too
            self.failures.append(f"{what} {value:.4f} < {threshold:.4f} ({derivation})")

    def at_most(self, what: str, value: float, threshold: float, derivation: str) -> None:
        if not value <= threshold:  # NaN fails too
            self.failures.append(f"{what} {value:.4f} > {threshold:.4f} ({derivation})")


def outcome(name: str, where: str, verdict: Verdict, ok: str) -> CheckOutcome:
    if verdict.failures:
        summary = f"{where}: {name} FAILED: " + "; ".join(verdict.failures)
        verdict.metadata["failures"] = list(verdict.failures)
        return CheckOutcome(name, False, summary, verdict.metadata)
    return CheckOutcome(name, True, f"{where}: {name} passed: {ok}", verdict.metadata)


def failed(name: str, where: str, why: str) -> CheckOutcome:
    return CheckOutcome(name, False, f"{where}: {name} FAILED: {why}", {})


def unreadable(name: str, where: str, why: Sequence[str]) -> CheckOutcome:
    return failed(name, where, "cannot read the shard: " + "; ".join(why))


def calibration_problem(shard: StoreShard, calib: ShardCalibration | None) -> str | None:
    if calib is None:
        return (
            f"no calibration recorded for {shard.name}: the target was never run in full on it (both extraction "
            "backends calibrate each shard; re-materialize the partition)"
        )
    if calib.input_fingerprint != shard.entry.get("input_fingerprint"):
        return f"the calibration of {shard.name} was made on other inputs than the store holds: re-materialize"
    return None
