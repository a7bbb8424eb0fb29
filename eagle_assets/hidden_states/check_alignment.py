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
    rows, ids, mask, response = (
        "feature rows ≠ input ids ≠ loss mask",
        "input ids not the corpus's",
        "loss mask not the corpus's",
        "loss mask not exactly the response",
    )
    bad = dict.fromkeys((rows, ids, mask, response), 0)
    examples: list[str] = []
    for i, s in enumerate(samples[: len(offsets) - 1]):
        start, end = offsets[i], offsets[i + 1]
        n, corpus_mask = len(s.input_ids), list(s.loss_mask)
        if end - start != n or len(corpus_mask) != n:
            bad[rows] += 1
            examples.append(f"{s.sample_id}: {end - start} rows, {n} ids, {len(corpus_mask)} mask entries")
            continue
        stored_mask = mask_store[start:end].tolist()
        for what, wrong, example in (
            (ids, ids_store[start:end].tolist() != list(s.input_ids), "stored input ids differ from the corpus's"),
            (mask, stored_mask != corpus_mask, "stored loss mask differs from the corpus's"),
            (
                response,
                stored_mask != [int(t >= prompt_lens[i]) for t in range(n)],
                f"mask covers {sum(stored_mask)} tokens, the response is {n - prompt_lens[i]} "
                f"(prompt_len {prompt_lens[i]})",
            ),
        ):
            if wrong:
                bad[what] += 1
                examples.append(f"{s.sample_id}: {example}")
    v.failures += [f"{count} of {len(samples)} samples with {what}" for what, count in bad.items() if count]
    if examples:
        v.failures.append("e.g. " + "; ".join(examples[:3]))
    v.metadata.update(samples=len(samples), tokens=t_total, misaligned_samples=bad[rows] + bad[ids] + bad[mask])
    return outcome(ALIGNMENT, where, v, f"{len(samples)} samples, {t_total} tokens, masks exactly on the responses")
