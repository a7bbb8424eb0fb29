"""The ``alignment`` check: the store holds exactly the corpus shard's samples, ids and masks, in order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eagle_assets.corpus.outcome import CheckOutcome
from eagle_assets.hidden_states.check_verdict import Verdict, failed, outcome, where_of
from eagle_assets.hidden_states.fidelity_spec import ALIGNMENT
from eagle_assets.hidden_states.samples import HiddenStateSample, input_fingerprint
from eagle_assets.hidden_states.store_shard import StoreShard


def check_alignment(
    shard: StoreShard, samples: Sequence[HiddenStateSample], prompt_lens: Sequence[int], partition: str
) -> CheckOutcome:
    where = where_of(partition, shard.name)
    damage = shard.damage()
    if damage:
        return failed(ALIGNMENT, where, "; ".join(damage))
    v = Verdict()
    ids_store = shard.tensor("input_ids").to(torch.int64)
    mask_store = shard.tensor("loss_mask").to(torch.int64)
    offsets = shard.tensor("sample_offsets").tolist()
    t_total = offsets[-1] if offsets else 0
    for feature, width in ((f, shard.meta.width(f)) for f in shard.meta.features):
        shape = shard.header(feature)[feature]["shape"]
        if shape != [t_total, width]:
            v.failures.append(f"{feature} has shape {shape}, the sample offsets need [{t_total}, {width}]")
    if len(ids_store) != t_total or len(mask_store) != t_total:
        v.failures.append(f"{len(ids_store)} input ids and {len(mask_store)} mask entries for {t_total} feature rows")
    stored_ids = list(shard.entry.get("sample_ids", []))
    corpus_ids = [s.sample_id for s in samples]
    if stored_ids != corpus_ids:
        diff = next((k for k, (a, b) in enumerate(zip(stored_ids, corpus_ids, strict=False)) if a != b), None)
        v.failures.append(
            f"{len(stored_ids)} samples stored, {len(corpus_ids)} in the corpus shard"
            + (
                f"; first difference at sample {diff}: {stored_ids[diff]!r} vs {corpus_ids[diff]!r}"
                if diff is not None
                else ""
            )
        )
    if shard.entry.get("input_fingerprint") != input_fingerprint(samples):
        v.failures.append("the store was computed from other inputs than the corpus shard now holds (fingerprint)")
    bad_rows = bad_ids = bad_mask = bad_response = 0
    examples: list[str] = []
    for i, s in enumerate(samples[: len(offsets) - 1]):
        start, end = offsets[i], offsets[i + 1]
        n, corpus_mask = len(s.input_ids), list(s.loss_mask)
        if end - start != n or len(corpus_mask) != n:
            bad_rows += 1
            examples.append(f"{s.sample_id}: {end - start} rows, {n} ids, {len(corpus_mask)} mask entries")
            continue
        if ids_store[start:end].tolist() != list(s.input_ids):
            bad_ids += 1
            examples.append(f"{s.sample_id}: stored input ids differ from the corpus's")
        stored_mask = mask_store[start:end].tolist()
        if stored_mask != corpus_mask:
            bad_mask += 1
            examples.append(f"{s.sample_id}: stored loss mask differs from the corpus's")
        response = [int(t >= prompt_lens[i]) for t in range(n)]
        if stored_mask != response:
            bad_response += 1
            examples.append(
                f"{s.sample_id}: mask covers {sum(stored_mask)} tokens, the response is {n - prompt_lens[i]} "
                f"(prompt_len {prompt_lens[i]})"
            )
    for count, what in (
        (bad_rows, "feature rows ≠ input ids ≠ loss mask"),
        (bad_ids, "input ids not the corpus's"),
        (bad_mask, "loss mask not the corpus's"),
        (bad_response, "loss mask not exactly the response"),
    ):
        if count:
            v.failures.append(f"{count} of {len(samples)} samples with {what}")
    if examples:
        v.failures.append("e.g. " + "; ".join(examples[:3]))
    v.metadata.update(samples=len(samples), tokens=t_total, misaligned_samples=bad_rows + bad_ids + bad_mask)
    return outcome(ALIGNMENT, where, v, f"{len(samples)} samples, {t_total} tokens, masks exactly on the responses")
