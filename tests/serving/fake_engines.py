"""Loopback stand-ins for an SGLang and a vLLM server with EAGLE-3 speculation, in the engines' real shapes.

Run as the engines are run, with their own flags (unknown flags are refused, as the engines refuse
them, so a typo in a built command fails here too)::

    python -m tests.serving.fake_engines sglang --model-path M --port P --speculative-algorithm EAGLE3 ...
    python -m tests.serving.fake_engines vllm M --port P --speculative-config '{"method": "eagle3", ...}'

What they answer, taken from the engines' sources (see ``resources/serving/sglang_meta.py`` and
``resources/serving/vllm_metrics.py`` for the versions):

- SGLang: ``GET /health`` (503 while starting, then 200), ``/get_model_info``, ``/get_server_info``
  (the server args, ``internal_states``, ``version``), ``POST /generate`` answering
  ``{"text", "output_ids", "meta_info"}`` with ``completion_tokens``, ``spec_verify_ct``,
  ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``, the histogram and their aliases, and
  ``POST /flush_cache``. Errors are ``{"error": {"message"}}`` with status 400.
- vLLM: ``GET /health``, ``/version``, ``/v1/models``, ``/metrics`` (the counters in
  ``prometheus_client``'s text format: ``# HELP``/``# TYPE``, ``_total`` and ``_created`` samples,
  ``model_name``/``engine`` labels), ``POST /v1/completions`` with a token-id prompt.

Both load the draft folder at start as the engine would (``tests/draft/engine_loaders.py``, the
project's re-implementation of both loaders) and, when it is refused, stop before listening the way
each engine stops: SGLang's scheduler prints its traceback and the launcher kills its own process tree
(SIGKILL), vLLM exits with 1. Behaviour is set by ``$EAGLE_FORGE_FAKE_ENGINE`` (JSON of
:class:`FakeBehaviour`): the acceptance probability of each draft position (conditional on the earlier
ones), a death after N generations or at the Nth request to a path, the time of one decode step, a slow
start, an SGLang that counts proposed drafts otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ENV = "EAGLE_FORGE_FAKE_ENGINE"
EOS_ID = 163_586
THINK_END = "</think>"
WORDS = ("the", "draft", "model", "tokens", "accepted", "target", "verifies", "each", "step", "answer")


@dataclass
class FakeBehaviour:
    accept_probs: list[float] = field(default_factory=lambda: [0.8, 0.7, 0.6])  # P(pos j | pos < j accepted)
    die_after_requests: int | None = None  # os._exit on the request after this many generations
    step_time_s: float = 0.001  # one target forward (verification or plain decode step)
    load_s: float = 0.0  # before the port is bound (loading weights)
    starting_s: float = 0.0  # port bound, /health answers 503 (SGLang's ServerStatus.Starting)
    stop_probability: float = 0.0  # chance an answer ends early with EOS instead of at max tokens
    seed: int = 0
    die_at: dict[str, int] = field(default_factory=dict)  # os._exit on the Nth request to this path (1-based)
    proposed_per_verification: int | None = None  # SGLang: a release that counts proposals otherwise

    @classmethod
    def from_env(cls) -> FakeBehaviour:
        return cls(**json.loads(os.environ.get(ENV) or "{}"))


def _rng(prompt: list[int], seed: int, salt: str) -> random.Random:
    digest = hashlib.blake2b(json.dumps([prompt, seed, salt]).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


@dataclass
class Decoded:
    output_ids: list[int]
    text: str
    finish: dict[str, Any]
    histogram: list[int]  # verifications by accepted drafts (SGLang's spec_correct_drafts_histogram)
    steps: int  # target forwards after prefill


async def decode(prompt: list[int], max_new: int, steps: int, b: FakeBehaviour) -> Decoded:
    """The first token from prefill, then verifications that emit accepted drafts + 1 (or 1 token per step)."""
    rng = _rng(prompt, b.seed, "decode")
    length = max_new
    stop = rng.random() < b.stop_probability
    if stop:
        length = rng.randint(1, max_new)
    histogram: list[int] = []
    emitted, forwards = 1, 0
    while emitted < length:
        k = 0
        while k < steps and rng.random() < b.accept_probs[k]:
            k += 1
        if steps:
            histogram.extend([0] * (k + 1 - len(histogram)))
            histogram[k] += 1
        emitted += k + 1
        forwards += 1
    await asyncio.sleep(b.step_time_s * (forwards + 1))
    ids = [1000 + rng.randrange(5000) for _ in range(length)]
    words = [WORDS[i % len(WORDS)] for i in ids]
    cut = len(words) // 2
    text = " ".join(words[:cut]) + THINK_END + " ".join(words[cut:])
    finish = {"type": "stop", "matched": EOS_ID} if stop else {"type": "length", "length": length}
    return Decoded(ids, text, finish, histogram, forwards)


def _refuse_as_sglang(exc: Exception, draft: str) -> None:
    """SGLang loads weights in its scheduler process (``[TP0]``): the scheduler prints the traceback and
    SIGQUITs the launcher, whose ``launch_phase_sigquit_handler`` logs and ``kill_process_tree``s itself
    (SIGKILL, so the launcher's exit status is -9, not 1)."""
    print("[TP0] Scheduler hit an exception: Traceback (most recent call last):", file=sys.stderr)
    print('  File "sglang/srt/managers/scheduler.py", in run_scheduler_process', file=sys.stderr)
    print('  File "sglang/srt/models/llama_eagle3.py", in load_weights', file=sys.stderr)
    print(f"{type(exc).__name__}: draft model {draft} could not be loaded: {exc}", file=sys.stderr)
    print("Received sigquit from a child process. It usually means the child failed.", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _refuse_as_vllm(exc: Exception, draft: str) -> None:
    """vLLM's engine core fails its start and the API server exits with 1."""
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "vllm/model_executor/model_loader/default_loader.py", in load_weights', file=sys.stderr)
    print(f"{type(exc).__name__}: draft model {draft} could not be loaded: {exc}", file=sys.stderr)
    print("RuntimeError: Engine core initialization failed. See root cause above.", file=sys.stderr, flush=True)
    sys.exit(1)


def _check_draft(draft: str | None, model: str, engine: str) -> None:
    """Load the draft as the engine would; exit as the engine exits when it refuses it."""
    if draft is None:
        return
    from tests.draft.engine_loaders import EngineLoadError, load_folder

    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
        load_folder(draft, engine, int(cfg["num_hidden_layers"]))
    except (OSError, KeyError, ValueError, EngineLoadError) as exc:
        (_refuse_as_sglang if engine == "sglang" else _refuse_as_vllm)(exc, draft)


class Server:
    def __init__(self, behaviour: FakeBehaviour) -> None:
        self.b = behaviour
        self.started = time.monotonic()
        self.generations = 0
        self.calls: dict[str, int] = {}

    def starting(self) -> bool:
        return time.monotonic() - self.started < self.b.starting_s

    def count_request(self) -> None:
        if self.b.die_after_requests is not None and self.generations >= self.b.die_after_requests:
            print(f"fatal: simulated crash after {self.generations} requests", file=sys.stderr, flush=True)
            os._exit(3)
        self.generations += 1

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.starting() else 200)

    @web.middleware
    async def dying(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """``die_at``: crash on the Nth request to a path, as a server that dies between two sets would."""
        n = self.calls[request.path] = self.calls.get(request.path, 0) + 1
        if self.b.die_at.get(request.path) == n:
            print(f"fatal: simulated crash at request {n} to {request.path}", file=sys.stderr, flush=True)
            os._exit(3)
        response: web.StreamResponse = await handler(request)
        return response


class FakeSGLang(Server):
    def __init__(self, args: argparse.Namespace, behaviour: FakeBehaviour) -> None:
        super().__init__(behaviour)
        self.args = args
        self.spec = args.speculative_algorithm is not None
        self.totals = [0, 0]  # completion tokens, verifications (for internal_states)

    @property
    def steps(self) -> int:
        return self.args.speculative_num_steps if self.spec else 0

    async def server_info(self, request: web.Request) -> web.Response:
        a = self.args
        avg = self.totals[0] / self.totals[1] if self.totals[1] else 0.0
        return web.json_response(
            {
                "model_path": a.model_path,
                "tp_size": a.tp_size,
                "host": a.host,
                "port": a.port,
                "speculative_algorithm": a.speculative_algorithm,
                "speculative_draft_model_path": a.speculative_draft_model_path,
                "speculative_num_steps": a.speculative_num_steps,
                "speculative_eagle_topk": a.speculative_eagle_topk,
                "speculative_num_draft_tokens": a.speculative_num_draft_tokens,
                "cuda_graph_max_bs": a.cuda_graph_max_bs,
                "max_running_requests": a.max_running_requests,
                "internal_states": [{"avg_spec_accept_length": avg, "last_gen_throughput": 0.0}],
                "version": "0.5.0-fake",
            }
        )

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": self.args.model_path, "tokenizer_path": self.args.model_path, "is_generation": True}
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\n")

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = body.get("input_ids")
        params = body.get("sampling_params") or {}
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            return web.json_response({"error": {"message": "input_ids must be a non-empty list of ints"}}, status=400)
        max_new = params.get("max_new_tokens", 128)
        self.count_request()
        d = await decode(ids, max_new, self.steps, self.b)
        meta: dict[str, Any] = {
            "id": hashlib.md5(json.dumps(ids).encode()).hexdigest(),
            "finish_reason": d.finish,
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(d.output_ids),
            "cached_tokens": 0,
            "e2e_latency": self.b.step_time_s * (d.steps + 1),
        }
        if self.spec and d.steps:
            n = self.args.speculative_num_draft_tokens
            correct = sum(k * c for k, c in enumerate(d.histogram))
            per_verification = self.b.proposed_per_verification
            proposed = d.steps * (n - 1 if per_verification is None else per_verification)
            meta.update(
                spec_accept_rate=correct / (d.steps * (n - 1)),
                spec_accept_length=len(d.output_ids) / d.steps,
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=proposed,
                spec_verify_ct=d.steps,
                spec_accepted_drafts=correct,
                spec_proposed_drafts=proposed,
                spec_correct_drafts_histogram=d.histogram,
                spec_accept_histogram=d.histogram,
            )
            self.totals[0] += len(d.output_ids)
            self.totals[1] += d.steps
        return web.json_response({"text": d.text, "output_ids": d.output_ids, "meta_info": meta})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.dying])
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_route("*", "/flush_cache", self.flush_cache)
        app.router.add_post("/generate", self.generate)
        return app


def vllm_metrics_text(
    model_name: str,
    drafts: int | None,
    accepted_per_pos: list[int] | None = None,
    generation_tokens: int = 0,
    engines: int = 1,
) -> str:
    """A /metrics body as vLLM's ``prometheus_client`` counters print it (each engine with the same counts)."""
    lines: list[str] = []

    def counter(name: str, doc: str, values: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name}_total {doc}")
        lines.append(f"# TYPE {name}_total counter")
        for labels, v in values:
            body = ",".join(f'{k}="{lv}"' for k, lv in labels.items())
            lines.append(f"{name}_total{{{body}}} {float(v)}")
        lines.append(f"# HELP {name}_created {doc}")
        lines.append(f"# TYPE {name}_created gauge")
        for labels, _ in values:
            body = ",".join(f'{k}="{lv}"' for k, lv in labels.items())
            lines.append(f"{name}_created{{{body}}} 1.7e+09")

    per = [{"model_name": model_name, "engine": str(e)} for e in range(engines)]
    lines += [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
    ]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="{model_name}"}} 0.0' for e in range(engines)]
    counter("vllm:generation_tokens", "Number of generation tokens processed.", [(lb, generation_tokens) for lb in per])
    if drafts is not None:
        pos = accepted_per_pos or []
        counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [(lb, drafts) for lb in per])
        counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [(lb, drafts * len(pos)) for lb in per])
        counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [(lb, sum(pos)) for lb in per])
        counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [({**lb, "position": str(j)}, n) for lb in per for j, n in enumerate(pos)],
        )
    return "\n".join(lines) + "\n"


class FakeVLLM(Server):
    def __init__(self, args: argparse.Namespace, behaviour: FakeBehaviour) -> None:
        super().__init__(behaviour)
        self.args = args
        self.spec = json.loads(args.speculative_config) if args.speculative_config else None
        self.k = int(self.spec["num_speculative_tokens"]) if self.spec else 0
        self.name = args.served_model_name or args.model
        self.drafts = 0
        self.per_pos = [0] * self.k
        self.generation_tokens = 0

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.11.0-fake"})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "vllm"}
        return web.json_response({"object": "list", "data": [{**card, "root": self.args.model, "parent": None}]})

    async def metrics(self, request: web.Request) -> web.Response:
        text = vllm_metrics_text(self.name, self.drafts if self.spec else None, self.per_pos, self.generation_tokens)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(i, int) for i in prompt):
            return web.json_response(
                {
                    "object": "error",
                    "message": "prompt must be a list of token ids",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                status=400,
            )
        self.count_request()
        d = await decode(prompt, int(body.get("max_tokens") or 16), self.k, self.b)
        if self.spec:
            for k, n in enumerate(d.histogram):
                self.drafts += n
                for j in range(k):
                    self.per_pos[j] += n
        self.generation_tokens += len(d.output_ids)
        finish = "stop" if d.finish["type"] == "stop" else "length"
        return web.json_response(
            {
                "id": f"cmpl-{self.generations}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.name,
                "choices": [
                    {
                        "index": 0,
                        "text": d.text,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "total_tokens": len(prompt) + len(d.output_ids),
                    "completion_tokens": len(d.output_ids),
                    "prompt_tokens_details": None,
                },
            }
        )

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.dying])
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        return app


def sglang_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN"])
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--dtype")
    return p


def vllm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--speculative-config")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--gpu-memory-utilization", type=float)
    return p


def main(argv: list[str]) -> int:
    engine, rest = argv[0], argv[1:]
    behaviour = FakeBehaviour.from_env()
    server: FakeSGLang | FakeVLLM
    if engine == "sglang":
        args = sglang_parser().parse_args(rest)
        if args.speculative_algorithm and not args.speculative_draft_model_path:
            print("ValueError: --speculative-draft-model-path is required", file=sys.stderr)
            return 1
        _check_draft(args.speculative_draft_model_path, args.model_path, "sglang")
        server = FakeSGLang(args, behaviour)
    elif engine == "vllm":
        args = vllm_parser().parse_args(rest)
        spec = json.loads(args.speculative_config) if args.speculative_config else None
        _check_draft(spec["model"] if spec else None, args.model, "vllm")
        server = FakeVLLM(args, behaviour)
    else:
        print(f"unknown engine {engine!r}", file=sys.stderr)
        return 2
    print(f"{engine} fake: loading for {behaviour.load_s}s, behaviour {asdict(behaviour)}", flush=True)
    time.sleep(behaviour.load_s)
    server.started = time.monotonic()
    print(f"{engine} fake: listening on http://{args.host}:{args.port}", flush=True)
    web.run_app(server.app(), host=args.host, port=args.port, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
