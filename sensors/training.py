"""When to train the draft: every hidden-state shard it needs is there, and some is newer than the last draft
(offline), or the corpus is there and newer than the last draft (online: no stores are ever written).

Pure: it sees storage ids, not the instance. The run key is derived from the exact set of shard materializations,
so the same data never trains twice (Dagster drops a repeated run key) and a re-materialized shard makes a new key.
"""

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingDecision:
    run: bool
    reason: str
    run_key: str = ""


def decide_training(
    needed: Sequence[str],
    latest_by_partition: Mapping[str, int],
    last_draft_storage_id: int | None,
    unchecked: Mapping[str, str] | None = None,
) -> TrainingDecision:
    """``unchecked``: shards whose fidelity checks did not pass on their latest materialization, and why."""
    if not needed:
        return TrainingDecision(False, "no train shards yet: materialize the corpus")
    missing = [k for k in needed if k not in latest_by_partition]
    if missing:
        return TrainingDecision(
            False, f"waiting for hidden states of {len(missing)} of {len(needed)} shards: {missing[:5]}"
        )
    blocked = [k for k in needed if k in (unchecked or {})]
    if blocked:
        assert unchecked is not None
        detail = " | ".join(f"{k}: {unchecked[k]}" for k in blocked[:3])
        return TrainingDecision(
            False, f"waiting for the fidelity checks of {len(blocked)} of {len(needed)} shards to pass: {detail}"
        )
    newest = max(latest_by_partition[k] for k in needed)
    if last_draft_storage_id is not None and newest < last_draft_storage_id:
        return TrainingDecision(False, "the last draft was trained after every current shard's hidden states")
    blob = ",".join(f"{k}:{latest_by_partition[k]}" for k in sorted(needed))
    key = hashlib.blake2b(blob.encode(), digest_size=10).hexdigest()
    return TrainingDecision(True, f"{len(needed)} shards ready, newer than the last draft", f"draft-{key}")


def decide_online_training(
    needed: Sequence[str], corpus_storage_id: int | None, last_draft_storage_id: int | None
) -> TrainingDecision:
    """Online mode: the target computes the features while the draft trains, so there are no stores to wait for;
    the corpus (its train shards) is all it needs, and a corpus newer than the last draft is a new run."""
    if corpus_storage_id is None or not needed:
        return TrainingDecision(False, "no train shards yet: materialize the corpus")
    if last_draft_storage_id is not None and corpus_storage_id < last_draft_storage_id:
        return TrainingDecision(False, "the last draft was trained after the current corpus")
    blob = f"online:{corpus_storage_id}:" + ",".join(sorted(needed))
    key = hashlib.blake2b(blob.encode(), digest_size=10).hexdigest()
    return TrainingDecision(
        True, f"corpus with {len(needed)} train shards, newer than the last draft (online: no stores)", f"draft-{key}"
    )
