"""Acceptance counts from one SGLang ``/generate`` answer's ``meta_info``.

Field names, the commit they follow and their older aliases: docs/draft-and-benchmark.md, "Engine versions
followed". Neither τ nor the per-position rates use ``spec_num_proposed_drafts``, and a newer release may count
proposals otherwise, so a different count is a recorded warning (:func:`meta_info_warnings`), not a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resources.serving.acceptance import AcceptanceError, AcceptanceTally, reached_from_histogram
from resources.serving.errors import EngineResponseError


def _count(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or int(value) != value:
        raise EngineResponseError(f"meta_info.{key} is {value!r}, not a count")
    return int(value)


def completion_tokens(meta: Mapping[str, Any]) -> int:
    n = _count(meta, "completion_tokens")
    if n is None:
        raise EngineResponseError(f"meta_info has no completion_tokens (keys: {sorted(meta)})")
    return n


def _proposed(meta: Mapping[str, Any]) -> int | None:
    proposed = _count(meta, "spec_num_proposed_drafts")
    return _count(meta, "spec_proposed_drafts") if proposed is None else proposed


def meta_info_warnings(meta: Mapping[str, Any], num_draft_tokens: int) -> list[str]:
    """What in an answer differs from the SGLang these fields follow without making its counts wrong.

    Each message is the same for every answer it applies to, so a run records it once with a count."""
    proposed = _proposed(meta)
    verify = _count(meta, "spec_verify_ct") or 0
    if proposed is None or proposed == verify * (num_draft_tokens - 1):
        return []
    return [
        f"spec_num_proposed_drafts is not spec_verify_ct × {num_draft_tokens - 1} (--speculative-num-draft-tokens "
        f"{num_draft_tokens} − 1) as at SGLang 001067ff: this release counts proposals otherwise; "
        "τ and the per-position rates do not use it"
    ]


def tally_from_meta_info(meta: Mapping[str, Any], num_steps: int) -> AcceptanceTally:
    """One request's counts; ``num_steps`` is the server's ``--speculative-num-steps``."""
    output = completion_tokens(meta)
    verify = _count(meta, "spec_verify_ct")
    if verify is None:
        if any(k.startswith("spec_") for k in meta):
            raise EngineResponseError(f"meta_info has speculative fields but no spec_verify_ct: {sorted(meta)}")
        verify = 0  # no verification in this request (or no speculation: the run's total shows it)
    accepted = _count(meta, "spec_num_correct_drafts")
    if accepted is None:
        accepted = _count(meta, "spec_accepted_drafts")
    histogram = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))
    reached = None
    if histogram is not None:
        if not isinstance(histogram, list) or not all(isinstance(v, int) and v >= 0 for v in histogram):
            raise EngineResponseError(f"meta_info.spec_correct_drafts_histogram is {histogram!r}, not a list of counts")
        if sum(histogram) != verify:
            raise EngineResponseError(f"histogram {histogram} counts {sum(histogram)} verifications, not {verify}")
        reached = reached_from_histogram(histogram, num_steps)
        if accepted is None:
            accepted = sum(reached)
    elif verify == 0:
        reached = [0] * num_steps
        accepted = 0 if accepted is None else accepted
    try:
        return AcceptanceTally(num_steps, "output_per_verification", verify, accepted, reached, output).check()
    except AcceptanceError as exc:
        raise EngineResponseError(f"impossible speculative counts in meta_info: {exc}") from None
