"""The serving benchmark against the loopback stand-ins: ``python benchmarks/bench_serving.py``.

Both engines' stand-ins are started as the benchmark starts real servers, with a known acceptance
probability per draft position, and the full draft + baseline run goes through them. Printed:

- τ and per-position acceptance as the benchmark read them (SGLang ``meta_info``, vLLM ``/metrics``
  deltas), as ratios to what the stand-ins were configured to produce (the exact counts the stand-ins
  drew, recomputed from the request journal, and the analytic expectation);
- the benchmark client's CPU per request, as a ratio to bare aiohttp POSTs of the same payloads to the
  same server (the baseline, measured in the same run).

Throughput figures against stand-ins say nothing about an engine; only the arithmetic and the client cost
are measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle_assets.benchmarks.prompt_sets import Conversation
from eagle_assets.benchmarks.serving_benchmark import SetPlan, run_serving_benchmark
from resources.serving.commands import LaunchSettings, SpeculativeSettings, engine_command, free_port
from resources.serving.process import ServerProcess
from resources.serving.resource import ServingEngineResource
from tests.serving.conftest import FAKE_LAUNCHER, write_draft
from tests.serving.fake_engines import ENV


def expected_rates(probs: list[float]) -> list[float]:
    out, p = [], 1.0
    for q in probs:
        p *= q
        out.append(p)
    return out


async def bare_posts(url: str, payloads: list[dict], concurrency: int) -> float:
    """CPU seconds of plain aiohttp POSTs (JSON body, JSON answer), as the baseline of the client's cost."""
    slots = asyncio.Semaphore(concurrency)
    cpu = time.process_time()
    async with aiohttp.ClientSession() as session:

        async def one(p: dict) -> None:
            async with slots, session.post(url, json=p) as resp:
                await resp.json()

        await asyncio.gather(*(one(p) for p in payloads))
    return time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--probs", default="0.8,0.7,0.6", help="acceptance probability per draft position")
    args = parser.parse_args()
    probs = [float(x) for x in args.probs.split(",")]
    steps = len(probs)
    spec = SpeculativeSettings(steps, 1, steps + 1)
    os.environ[ENV] = json.dumps({"accept_probs": probs, "step_time_s": 0.0005})
    convs = [Conversation(f"p{i}", prompt_ids=[11, 12, 13, i % 997 + 1, i // 997 + 1]) for i in range(args.prompts)]
    sets = [SetPlan("heldout", convs, args.max_new_tokens)]
    want = expected_rates(probs)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        draft = write_draft(work / "export")
        model = work / "target"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"num_hidden_layers": 61, "vocab_size": 128}))
        for engine in ("sglang", "vllm"):
            resource = ServingEngineResource(
                backend=engine, model_path=str(model), tp_size=1, launcher=FAKE_LAUNCHER[engine], health_poll_s=0.2
            )
            plan = resource.plan(spec, draft, None, args.batch)
            cpu = time.process_time()
            run = run_serving_benchmark(
                plan,
                sets,
                lambda m: [],
                batch_size=args.batch,
                temperature=0.0,
                run_dir=work / engine,
                log=lambda m: None,
            )
            cpu = time.process_time() - cpu
            (r,) = run.results
            t = r.draft.tally
            assert t is not None and r.position_rates is not None and r.tau is not None
            drawn = t.accepted / t.verifications if t.accepted is not None else float("nan")
            analytic_tau = 1 + sum(want)
            requests = len(r.draft.records) + len(r.baseline.records if r.baseline else [])
            # baseline cost: the same number of requests as bare POSTs to a fresh server of the same engine
            port = free_port()
            launch = LaunchSettings(str(model), port=port, tp_size=1, launcher=tuple(FAKE_LAUNCHER[engine]))
            path = "/generate" if engine == "sglang" else "/v1/completions"
            with ServerProcess(
                engine, engine_command(engine, launch, None, None), launch.base_url, work / f"{engine}-bare.log"
            ).start(60, 0.2):
                payloads: list[dict[str, Any]]
                if engine == "sglang":
                    payloads = [
                        {"input_ids": c.prompt_ids, "sampling_params": {"max_new_tokens": args.max_new_tokens}}
                        for c in convs
                    ]
                else:
                    payloads = [
                        {"model": str(model), "prompt": c.prompt_ids, "max_tokens": args.max_new_tokens} for c in convs
                    ]
                bare = asyncio.run(bare_posts(launch.base_url + path, payloads * 2, args.batch))
            print(
                f"{engine}: τ {r.tau:.4f} ({t.definition}); 1 + drawn accepted/verification {1 + drawn:.4f}, "
                f"analytic {analytic_tau:.4f} (τ/analytic {r.tau / analytic_tau:.4f}); per position "
                + " ".join(f"{m:.3f}/{e:.3f}" for m, e in zip(r.position_rates, want, strict=True))
                + f" (measured/configured); {t.verifications} verifications"
            )
            print(
                f"{engine}: client CPU {1000 * cpu / requests:.3f} ms/request over {requests} requests "
                f"(server starts included) vs bare aiohttp {1000 * bare / (2 * len(convs)):.3f} ms "
                f"({cpu / requests / (bare / (2 * len(convs))):.2f}×)"
            )


if __name__ == "__main__":
    main()
