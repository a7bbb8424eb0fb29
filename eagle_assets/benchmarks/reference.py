"""Published acceptance lengths of Kimi EAGLE-3 drafts, shown beside this platform's figures as reference.

All three were reported with SGLang at 3 steps, topk 1, 4 draft tokens (the nvidia figure as "draft
length 3"), τ as SpecForge computes it (completion tokens over verifications). Ours is comparable to
them only when measured the same way; :func:`comparable` says whether it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from resources.serving.commands import SpeculativeSettings

REFERENCE_ENGINE = "sglang"
REFERENCE_SETTINGS = SpeculativeSettings(num_steps=3, eagle_topk=1, num_draft_tokens=4)


@dataclass(frozen=True)
class ReferenceFigures:
    draft: str
    tau: dict[str, float]  # prompt-set name -> τ
    note: str = ""


REFERENCES: tuple[ReferenceFigures, ...] = (
    ReferenceFigures("lightseekorg/kimi-k2.5-eagle3", {"mtbench": 2.687, "gsm8k": 3.201, "humaneval": 3.285}),
    ReferenceFigures("AQ-MedAI Kimi-K2 (SpecBundle)", {"mtbench": 2.39, "gsm8k": 3.27, "humaneval": 3.36}),
    ReferenceFigures("nvidia Kimi-K2.6-Eagle3", {"mtbench": 2.62}, "MT-Bench only, draft length 3"),
)


def comparable(engine: str, settings: SpeculativeSettings, temperature: float) -> bool:
    return engine == REFERENCE_ENGINE and settings == REFERENCE_SETTINGS and temperature == 0.0
