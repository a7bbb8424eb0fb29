"""Generate one partition: admit prompts under the budget, retry what is transient, journal the rest.

The loop's promises, in order of importance:
1. never spend past the dollar budget: every request is reserved in the shared ledger before it is
   sent — at its worst case in ``hard`` mode, else within the statistical bound of ``admission``
   (passed with probability below 1e-6 per run);
2. never lose or duplicate a finished response (journal fsync before anything counts);
3. keep up to ``max_in_flight`` requests busy — one number for the whole account, leased from the
   ledger — adapting down on 429s;
4. stop cleanly (in-flight requests finish, everything is persisted) when money runs out.

Admission runs ahead of the requests: a dispatcher reserves prompts in chunks into a ready queue,
and each worker takes the next prompt as soon as its answer is handled, in the same task step. A
wave of 2000 answers is therefore not followed by 2000 semaphore releases, task creations and loop
passes before the next requests go out.

Where each decision lives (each part is a class the next one builds on; ``PartitionRunner`` joins them):

- ``job``: what a run is given (``GenerationSettings``, ``PartitionJob``, the ``ChatClient`` it asks) and what it
  returns (``PartitionReport``).
- ``core``: the run's shared state, and its cost model: what a prompt reserves in the ledger, what its request says.
- ``stops``: why admission stops (a budget, the credits, a fatal error), whether another batch is worth a round trip
  at the wall, and the stop reason the report ends with.
- ``progress``: the key's cap polled, the progress line, the account's money handed to ``observe``.
- ``skips``: which skips are held, journaled or dropped; the request-wide breaker's verdict.
- ``commits``: the group commit (journal fsync, then the ledger's settlements) and the every_turn turns it releases.
- ``attempts``: one prompt's attempts: send, classify, record (keep, skip, charge until settled, retry, or stop).
- ``dispatch``: admission and waves: how many prompts are worked on at once, reserving ahead of the workers, the
  wall, waiting on other runs.
- ``loop``: the partition's run from the journal's opening to its report, and the settlements before and after.
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
