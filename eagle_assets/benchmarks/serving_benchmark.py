"""The draft benchmark through a serving engine: a speculative pass, then a baseline pass, over every prompt set.

Each pass gets its own server, started here or attached at a URL, and checked before the pass against what the
benchmark means to measure, so a result is never silently the wrong server's. A server that dies, or answers
wrongly, mid-run ends the benchmark with :class:`ServingBenchmarkFailed`: where, why, and the partial results.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from eagle_assets.benchmarks.formatting import Render
from eagle_assets.benchmarks.prompt_sets import Conversation
from eagle_assets.benchmarks.results import SetResult
from eagle_assets.benchmarks.serving_run import Journal, PassInterrupted, SetPass, run_pass
from resources.serving.clients import EngineClient, SGLangClient, VLLMClient
from resources.serving.commands import EnginePlan, engine_command, free_port
from resources.serving.errors import ServerStartError, ServingError, SpeculationMissing
from resources.serving.process import ServerProcess, health_status

Log = Callable[[str], None]


@dataclass
class SetPlan:
    name: str
    conversations: list[Conversation]
    max_new_tokens: int


@dataclass
class ServingRun:
    results: list[SetResult]
    engine_version: str
    servers: dict[str, str]  # pass -> base URL (and how it was obtained)
    journal: Path


@dataclass
class PassState:
    """The set a pass is at, named by a failure: the server may die before the set's first answer (at the
    cache flush or the counter read), when the last set with answers is the one before."""

    set_name: str = ""


class ServingBenchmarkFailed(ServingError):
    def __init__(self, message: str, partial: list[SetResult], journal: Path) -> None:
        super().__init__(message)
        self.partial = partial
        self.journal = journal


@contextlib.contextmanager
def engine_server(
    plan: EnginePlan, speculative: bool, log_dir: Path, log: Log
) -> Iterator[tuple[str, ServerProcess | None]]:
    """The base URL of a healthy server for one pass, and the process when it was started here."""
    pass_name = "draft" if speculative else "baseline"
    if plan.launch is None:
        url = plan.url if speculative else plan.baseline_url
        if not url:
            raise ServerStartError(
                f"no {pass_name} server to attach to: set the serving resource's "
                f"{'url' if speculative else 'baseline_url'}"
            )
        status = health_status(url.rstrip("/") + "/health")
        if status != 200:
            seen = "nothing answers" if status is None else f"HTTP {status}"
            raise ServerStartError(f"the {pass_name} server at {url} is not healthy ({seen} at /health)")
        log(f"{pass_name} pass: attached to {plan.engine} at {url}")
        yield url.rstrip("/"), None
        return
    launch = plan.launch if plan.launch.port else replace(plan.launch, port=free_port(plan.launch.host))
    cmd = engine_command(
        plan.engine, launch, plan.draft_path if speculative else None, plan.spec if speculative else None
    )
    proc = ServerProcess(
        f"{plan.engine} ({pass_name})",
        cmd,
        launch.base_url,
        log_dir / f"{plan.engine}-{pass_name}.log",
        env=plan.env,
        cwd=plan.cwd,
    )
    log(f"{pass_name} pass: starting {plan.engine}: {' '.join(cmd)}")
    with proc:
        proc.start(plan.startup_timeout_s, plan.health_poll_s, log)
        log(f"{pass_name} pass: {plan.engine} healthy at {launch.base_url} (log {proc.log_path})")
        try:
            yield launch.base_url, proc
        except BaseException:
            proc.death_note = proc.describe_death()  # before stop() below: the server's own exit, not ours
            raise


def _same_path(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


async def check_server(client: EngineClient, plan: EnginePlan, speculative: bool) -> str:
    """Refuse a server that does not run what this pass measures; returns the engine's version."""
    where = f"{client.engine} at {client.base_url}"
    if isinstance(client, SGLangClient):
        info = await client.server_info()
        algo = info.get("speculative_algorithm")
        if not speculative:
            if algo:
                raise SpeculationMissing(
                    f"the baseline server ({where}) speculates ({algo}); it must run without a draft"
                )
            return str(info.get("version", ""))
        if algo != "EAGLE3":
            raise SpeculationMissing(f"{where} runs speculative_algorithm={algo!r}, not EAGLE3")
        want = {
            "speculative_num_steps": plan.spec.num_steps,
            "speculative_eagle_topk": plan.spec.eagle_topk,
            "speculative_num_draft_tokens": plan.spec.num_draft_tokens,
        }
        wrong = {k: (info.get(k), v) for k, v in want.items() if info.get(k) != v}
        if wrong:
            raise SpeculationMissing(f"{where} runs other speculative settings (server, benchmark): {wrong}")
        served = str(info.get("speculative_draft_model_path") or "")
        if plan.check_draft_path and not _same_path(served, plan.draft_path):
            raise SpeculationMissing(
                f"{where} serves the draft {served!r}, not {plan.draft_path!r} (set check_draft_path: false "
                "when it is a copy of the same export)"
            )
        return str(info.get("version", ""))
    assert isinstance(client, VLLMClient)
    try:
        counters = await client.counters()
    except SpeculationMissing:
        if speculative:
            raise
        return await client.version()
    if not speculative:
        raise SpeculationMissing(
            f"the baseline server ({where}) reports spec-decode counters; it must run without a draft"
        )
    if counters.num_speculative_tokens != plan.spec.num_steps:
        raise SpeculationMissing(
            f"{where} drafts {counters.num_speculative_tokens} tokens per step, "
            f"the benchmark asked for {plan.spec.num_steps}"
        )
    return await client.version()


def make_client(plan: EnginePlan, base_url: str) -> EngineClient:
    if plan.engine == "sglang":
        return SGLangClient(
            base_url, plan.spec.num_steps, plan.spec.num_draft_tokens, request_timeout_s=plan.request_timeout_s
        )
    return VLLMClient(base_url, request_timeout_s=plan.request_timeout_s)


async def _run_sets(
    client: EngineClient,
    plan: EnginePlan,
    sets: Sequence[SetPlan],
    speculative: bool,
    render: Render,
    batch_size: int,
    temperature: float,
    journal: Journal,
    done: list[SetPass],
    state: PassState,
    log: Log,
) -> str:
    pass_name = "draft" if speculative else "baseline"
    version = await check_server(client, plan, speculative)
    for s in sets:
        state.set_name = s.name
        if isinstance(client, SGLangClient):
            await client.flush_cache()
        before = await client.counters() if speculative and isinstance(client, VLLMClient) else None
        step = max(1, sum(c.turns for c in s.conversations) // 10)

        def progress(n: int, total: int, name: str = s.name, step: int = step) -> None:
            if n % step == 0 or n == total:
                log(f"{pass_name} pass, {name}: {n}/{total} requests answered")

        try:
            result = await run_pass(
                client,
                s.name,
                pass_name,
                s.conversations,
                render,
                batch_size=batch_size,
                max_new_tokens=s.max_new_tokens,
                temperature=temperature,
                journal=journal,
                progress=progress,
            )
        except PassInterrupted as exc:
            done.append(exc.partial)
            raise
        done.append(result)
        if not speculative:
            result.tally = None
        elif isinstance(client, VLLMClient):
            assert before is not None
            result.tally = (await client.counters()).minus(before).tally(plan.spec.num_steps, result.output_tokens)
        if speculative and (result.tally is None or result.tally.verifications == 0):
            raise SpeculationMissing(
                f"{s.name}: {len(result.records)} requests answered without a single verification: "
                f"{client.engine} at {client.base_url} did not speculate"
            )
        if speculative and result.tally is not None:
            log(
                f"draft pass, {s.name}: τ {result.tally.tau:.3f} over {result.tally.verifications} verifications, "
                f"{result.output_tokens} tokens in {result.wall_s:.1f}s"
            )
        for message, n in result.warnings.items():
            log(f"warning, {pass_name} pass, {s.name}: {message} ({n} of {len(result.records)} answers)")
    return version


def combine(draft: Sequence[SetPass], baseline: Sequence[SetPass]) -> list[SetResult]:
    by_name = {p.set_name: p for p in baseline}
    return [SetResult(p.set_name, p, by_name.get(p.set_name)) for p in draft]


def run_serving_benchmark(
    plan: EnginePlan,
    sets: Sequence[SetPlan],
    render: Render,
    *,
    batch_size: int,
    temperature: float,
    run_dir: Path,
    log: Log = print,
) -> ServingRun:
    plan.spec.validate(plan.engine)
    if not sets:
        raise ValueError("no prompt set to benchmark")
    journal = Journal(run_dir / "requests.jsonl")
    draft_passes: list[SetPass] = []
    baseline_passes: list[SetPass] = []
    servers: dict[str, str] = {}
    version = ""
    passes = [(True, draft_passes)] + ([(False, baseline_passes)] if plan.run_baseline else [])
    for speculative, done in passes:
        pass_name = "draft" if speculative else "baseline"
        proc: ServerProcess | None = None
        state = PassState()
        try:
            with engine_server(plan, speculative, run_dir, log) as (url, proc):
                servers[pass_name] = url + (" (attached)" if proc is None else " (started)")

                async def go(
                    url: str = url,
                    speculative: bool = speculative,
                    done: list[SetPass] = done,
                    state: PassState = state,
                ) -> str:
                    async with make_client(plan, url) as client:
                        return await _run_sets(
                            client, plan, sets, speculative, render, batch_size, temperature, journal, done, state, log
                        )

                v = asyncio.run(go())
                version = version or v
        except (PassInterrupted, ServingError) as exc:
            cause = exc.cause if isinstance(exc, PassInterrupted) else exc
            answered = sum(len(p.records) for p in draft_passes + baseline_passes)
            where = f"{pass_name} pass, set {state.set_name}" if state.set_name else f"{pass_name} pass"
            why = ""
            if proc is not None and proc.death_note:
                why = "\n" + proc.death_note
            partial = combine(draft_passes, baseline_passes)
            raise ServingBenchmarkFailed(
                f"{plan.engine} benchmark failed in the {where}: {cause}. {answered} requests were answered "
                f"before it; they are kept in {journal.path}.{why}",
                partial,
                journal.path,
            ) from cause
    return ServingRun(combine(draft_passes, baseline_passes), version, servers, journal.path)
