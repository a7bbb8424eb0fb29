"""Generate one partition: admit prompts under the budget, retry what is transient, journal the rest.

The loop's promises, in order of importance:
1. never spend past the dollar budget: every request is reserved in the shared ledger before it is
   sent — at its worst case in ``hard`` mode, else within the statistical bound of ``admission``
   (passed with probability below 1e-6 per run);
2. never lose or duplicate a finished response (journal fsync before anything counts);
3. keep up to ``max_in_flight`` requests busy — one number for the whole account, leased from the
   ledger — adapting down on 429s;
4. stop cleanly (in-flight requests finish, everything is persisted) when money runs out.

Admission runs ahead of the requests: a dispatcher reserves prompts in chunks into a ready queue, and each worker
takes the next prompt as soon as its answer is handled, so a wave of 2000 answers is not followed by 2000 task
creations before the next requests go out. Each decision is a module of its own, a class the next builds on
(``job``, ``core``, ``stops``, ``progress``, ``skips``, ``commits``, ``attempts``, ``dispatch``, ``loop``).
"""

from eagle_assets.generation.runner.job import (
    ChatClient,
    GenerationSettings,
    PartitionJob,
    PartitionReport,
    PromptTokenEstimator,
    StopReason,
)
from eagle_assets.generation.runner.loop import PartitionRunner
from eagle_assets.generation.runner.progress import format_duration

__all__ = [
    "ChatClient",
    "GenerationSettings",
    "PartitionJob",
    "PartitionReport",
    "PartitionRunner",
    "PromptTokenEstimator",
    "StopReason",
    "format_duration",
]
