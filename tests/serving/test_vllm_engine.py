"""The trained draft served by the real vLLM engine (the CPU build): it loads the export as it is, its greedy output
is the target's own, and its τ, read from vLLM's counters, beats the untrained draft's by more than a token.

One engine for the module (a start costs 8–15 s here); the untrained figure is the in-process loop's on the same
prompts (an untrained draft is accepted about never: τ ≈ 1).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from eagle_assets.draft.export import export_draft
from eagle_assets.draft.speculative import evaluate_acceptance
from resources.serving.vllm_engine import (
    WARMUP_LOGGER,
    core_in_process,
    cpu_engine_environment,
    engine_kwargs,
    run_prompts,
    start_engine,
    stop_engine,
)
from tests.draft.helpers import TINY_VOCAB, draft_for, generate_greedy, tiny_llama, trained_draft
from tests.vllm_engines import require_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
require_vllm()

PROMPT, NEW, STEPS = 6, 24, 3


class _Probe(logging.Filter):
    """What reaches its logger, and what the logger's other filters let through. A filter, not a handler: vLLM
    resets the handlers of its loggers while an engine starts (``dictConfig``), not their filters."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger, self.seen, self.passed = logger, [], []

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen.append(record.getMessage())
        if all(f.filter(record) for f in self.logger.filters if f is not self):
            self.passed.append(record.getMessage())
        return True


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny target (head_dim 32), its trained draft exported, and one vLLM engine serving both."""
    work = tmp_path_factory.mktemp("vllm-serving")
    target = tiny_llama(seed=0, heads=2)
    prompts = torch.randint(0, TINY_VOCAB, (52, PROMPT), generator=torch.Generator().manual_seed(1))
    draft = trained_draft(target, prompts[:48], 26)
    target.save_pretrained(work / "target")
    export = export_draft(draft, work / "export", dtype=torch.float32)
    kwargs = engine_kwargs(str(work / "target"), str(export), STEPS, dtype="float32", max_model_len=256)
    # vLLM's chat-template warm-up, which has no tokenizer here, logs its failure at every start: it is dropped
    probe = _Probe(logging.getLogger(WARMUP_LOGGER))
    probe.logger.addFilter(probe)
    try:
        engine = start_engine(kwargs, cpu_engine_environment(1))
    finally:
        probe.logger.removeFilter(probe)
    assert "Chat template warmup failed" in probe.seen and "Chat template warmup failed" not in probe.passed
    from vllm import envs

    sockets = Path(envs.VLLM_RPC_BASE_PATH)  # as the engine's core read it, in this process
    try:
        assert sockets.name.startswith("eagle-forge-vllm-") and sockets.is_dir()  # not the system's /tmp
        assert list(sockets.glob("vllm_dist_*"))  # the executor's rendezvous file, in there too
        yield target, draft, prompts[48:].tolist(), engine
    finally:
        stop_engine(engine)
    assert not sockets.exists()  # stopping the engine removed its socket folder


def test_the_served_draft_beats_the_untrained_by_more_than_a_token(served):
    target, draft, held_out, engine = served
    run = run_prompts(engine, held_out, NEW, STEPS)
    for prompt, output in zip(held_out, run.outputs, strict=True):  # speculation never changes greedy output
        assert output == generate_greedy(target, prompt, NEW, eos_id=None)
    untrained = evaluate_acceptance(target, draft_for(target), held_out, NEW, num_draft_tokens=STEPS)
    in_process = evaluate_acceptance(target, draft, held_out, NEW, num_draft_tokens=STEPS)
    tau = run.tally.tau
    print(f"tau: vLLM {tau:.2f}, in-process {in_process.tau:.2f}, untrained {untrained.tau:.2f}")
    assert tau is not None and tau > untrained.tau + 1.0, (tau, untrained.tau, run.tally)
    assert run.tally.position_rates is not None and len(run.tally.position_rates) == STEPS
    assert abs(tau - in_process.tau) < 0.5, (tau, in_process.tau)  # the same draft, the same prompts
    assert os.environ.get("VLLM_NO_USAGE_STATS") == "1"  # no usage report leaves this machine
    assert core_in_process(engine) and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # set while starting only
