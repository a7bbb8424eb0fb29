"""The fidelity checks' names and settings, without torch: the Dagster definitions import this at load time."""

import math
from dataclasses import asdict, dataclass
from typing import Any

ALIGNMENT = "alignment"
AUX_LAYERS = "aux_layers"
NEXT_TOKEN = "last_state_next_token"
CHECKS: dict[str, str] = {
    ALIGNMENT: "every sample: feature rows = input ids = loss mask, ids and mask are the corpus's, the mask covers "
    "exactly the response; no truncated shard file",
    AUX_LAYERS: "aux [T, 3H] and last [T, H], finite; each stored layer is the one it claims (signatures against the "
    "target run in full), the layers differ from each other and from the last state; norms recorded",
    NEXT_TOKEN: "the stored last state through the target's head predicts the next response token as the target run "
    "in full does (top-1 agreement, top-1 consistency, mean log-probability, per-position log-probability deviation)",
}


@dataclass(frozen=True)
class FidelityConfig:
    """How much of a shard the checks look at, and how close to the target a store must be."""

    positions: int = 256  # scored positions per shard, for the calibration sample and again spread over the shard
    calibration_samples: int = 4  # samples the target runs in full on
    fraction: float = 0.9  # a store's figure must reach this fraction of the target's (log-probs: + ln fraction)
    signature_positions: int = 32  # positions whose random projections identify each stored layer
    signature_dims: int = 16
    full_scan_bytes: int = 1 << 30  # shards up to this size are scanned whole for NaN/inf, larger ones sampled
    seed: int = 0
    # A correct store's log-probs may differ from the target's, position by position, by this many times what
    # one rounding of the true last state to the store's precision moves them (the calibration's noise floor).
    deviation_factor: float = 4.0
    # An engine calibration (vLLM's, for a target too large for this process) has no per-layer reference: True
    # accepts aux layers checked for shape,
    # finiteness and repetition only, and says so in the check's summary and metadata; False fails them.
    allow_unreferenced_aux: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"fraction must be in (0, 1), got {self.fraction}")
        if self.positions < 1 or self.calibration_samples < 1 or self.signature_positions < 1:
            raise ValueError("positions, calibration_samples and signature_positions must be positive")
        if self.signature_dims < 1:
            raise ValueError("signature_dims must be positive")
        if not self.deviation_factor >= 1.0:
            raise ValueError(
                f"deviation_factor must be >= 1 (a multiple of the noise floor), got {self.deviation_factor}"
            )

    @property
    def logprob_margin(self) -> float:
        """Nats a mean log-probability may fall short of the target's: the actual tokens at least ``fraction``
        as likely (geometric mean)."""
        return -math.log(self.fraction)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
