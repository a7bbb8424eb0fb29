"""What ``draft_benchmark`` runs: the in-process loop on the tiny target, or a serving engine on the real one.

The asset (``eagle_assets/assets/draft.py``) picks the backend from the ``serving`` resource; what each measures:
docs/draft-and-benchmark.md. A failed serving run fails the step and still shows what it measured.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from eagle_assets.assets.failures import fail
from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS, PromptSetError
from eagle_assets.benchmarks.reference import REFERENCES, comparable
from eagle_assets.benchmarks.results import SetResult, reference_table, results_table
from eagle_assets.benchmarks.serving_benchmark import EnginePlan
from eagle_assets.layout import benchmark_runs_dir, corpus_split_dir
from eagle_assets.markdown import table
from resources.serving.acceptance import AcceptanceTally
from resources.serving.commands import SettingsError, SpeculativeSettings
from resources.serving.resource import ServingEngineResource
from resources.target.resource import TargetModelResource

SERVING_SETS = ("mtbench", "gsm8k", "humaneval", "heldout")
HUB_SETS = tuple(n for n, spec in PROMPT_SETS.items() if spec.hub is not None)
INPROCESS_MAX_NEW_TOKENS = 48


class BenchmarkConfig(dg.Config):
    sets: list[str] = Field(
        default_factory=list,
        description="mtbench, gsm8k, humaneval, heldout; empty: heldout in process, all four through an engine",
    )
    num_prompts: int = Field(16, ge=1, description="held-out prompts (the corpus's eval split)")
    mtbench_prompts: int = Field(80, ge=1, description="MT-Bench questions (both turns each)")
    gsm8k_prompts: int = Field(
        PROMPT_SETS["gsm8k"].default_prompts,
        ge=1,
        description="GSM8K test questions, the first N after the five few-shot examples (500: the reference's)",
    )
    humaneval_prompts: int = Field(164, ge=1)
    max_new_tokens: int = Field(0, ge=0, description="per turn; 0: each set's default (in process: 48)")
    num_steps: int = Field(3, ge=1, description="draft steps (K tokens proposed per verification)")
    eagle_topk: int = Field(1, ge=1, description="branches per step (SGLang trees; 1 elsewhere)")
    num_draft_tokens: int = Field(4, ge=2, description="tokens verified per step, root included (steps + 1 for topk 1)")
    batch_size: int = Field(1, ge=1, description="requests in flight (the server's batch)")
    temperature: float = Field(0.0, ge=0.0)
    thinking: bool = Field(True, description="the target's thinking setting as served (K2.5: on)")
    revisions: dict[str, str] = Field(
        default_factory=dict,
        description="per Hub set, a commit (or branch) to read instead of the pinned one, e.g. {mtbench: <sha>}",
    )

    def speculative(self) -> SpeculativeSettings:
        return SpeculativeSettings(self.num_steps, self.eagle_topk, self.num_draft_tokens)

    def limit(self, name: str) -> int:
        return {
            "mtbench": self.mtbench_prompts,
            "gsm8k": self.gsm8k_prompts,
            "humaneval": self.humaneval_prompts,
            "heldout": self.num_prompts,
        }[name]


def held_out_prompts(n: int) -> list[list[int]]:
    """Prompt ids (chat template + generation prompt) of the eval split: never trained on."""
    import polars as pl

    files = sorted(corpus_split_dir("eval").glob("shard-*.parquet"))
    if not files:
        raise fail("the corpus has no eval split: re-materialize it with eval_fraction > 0")
    frame = pl.concat([pl.read_parquet(f, columns=["input_ids", "prompt_len"]) for f in files]).head(n)
    return [ids[:k] for ids, k in zip(frame["input_ids"].to_list(), frame["prompt_len"].to_list(), strict=True)]


def _positions(num_steps: int) -> list[str]:
    return [f"pos {i + 1}" for i in range(num_steps)]


def _position_plot(rates: dict[str, list[float]], num_steps: int) -> dg.MetadataValue:
    from eagle_assets.plots import grouped_bars_md

    title = "share of verifications accepting each draft position"
    return dg.MetadataValue.md(grouped_bars_md(rates, _positions(num_steps), title, "accepted"))


def _rate_table(rows: dict[str, AcceptanceTally], num_steps: int) -> str:
    lines = []
    for name, t in rows.items():
        rates = t.position_rates or [0.0] * num_steps
        lines.append([name, f"{t.tau or 0:.3f}", *(f"{r:.3f}" for r in rates)])
    return table(["draft", "τ (tokens per verification)", *_positions(num_steps)], lines)


def run_inprocess(
    context: dg.AssetExecutionContext, config: BenchmarkConfig, target: TargetModelResource, export: Path
) -> dg.MaterializeResult:
    import torch

    from eagle_assets.draft.export import load_draft
    from eagle_assets.draft.model import Eagle3Draft
    from eagle_assets.draft.speculative import evaluate_acceptance
    from eagle_assets.target.loader import load_target

    spec = config.speculative()
    try:
        spec.validate("inprocess")
    except SettingsError as exc:
        raise fail(f"in-process benchmark: {exc}") from exc
    if config.batch_size != 1 or config.temperature != 0.0:
        raise fail("the in-process loop decodes one greedy sequence at a time: batch_size 1, temperature 0")
    if set(config.sets) - {"heldout"}:
        raise fail(
            f"the in-process backend runs the held-out prompts only, not {sorted(set(config.sets) - {'heldout'})}: "
            "MT-Bench, GSM8K and HumanEval run through a serving backend (the serving resource)"
        )
    k = spec.num_steps
    max_new = config.max_new_tokens or INPROCESS_MAX_NEW_TOKENS
    device = target.torch_device()
    model = load_target(target.model_dir(), device=device)
    embed = model.get_input_embeddings().weight.detach().float()
    trained = load_draft(export, embed_weight=embed, device=device)
    torch.manual_seed(0)
    untrained = Eagle3Draft(trained.config, embed.cpu()).to(device)
    untrained.set_vocab(trained.vocab)
    prompts = held_out_prompts(config.num_prompts)
    tallies: dict[str, AcceptanceTally] = {}
    new_tokens = 0
    for name, draft in (("trained", trained), ("untrained", untrained)):
        stats = evaluate_acceptance(model, draft, prompts, max_new, num_draft_tokens=k)
        tallies[name] = AcceptanceTally.from_rounds(stats.accepted, k, stats.new_tokens)
        new_tokens = new_tokens or stats.new_tokens
        rates = [round(r, 3) for r in tallies[name].position_rates or []]
        context.log.info(f"{name}: acceptance length τ {tallies[name].tau:.3f}, per position {rates}")
    del model, trained, untrained  # the engine's memory back before vLLM loads the target
    engine_md: dict[str, Any] = {}
    if target.backend == "vllm":  # the same prompts through the real engine the GPU half runs on
        tallies["trained (vLLM)"] = served_tally(target, export, prompts, max_new, k)
        vllm_tau = tallies["trained (vLLM)"].tau or 0.0
        context.log.info(f"trained (vLLM): acceptance length τ {vllm_tau:.3f} beside {tallies['trained'].tau:.3f}")
        engine_md["acceptance_length_vllm"] = dg.MetadataValue.float(round(vllm_tau, 4))
    return dg.MaterializeResult(
        metadata={
            **engine_md,
            "backend": dg.MetadataValue.text("inprocess"),
            "acceptance_length": dg.MetadataValue.float(round(tallies["trained"].tau or 0.0, 4)),
            "acceptance_length_untrained": dg.MetadataValue.float(round(tallies["untrained"].tau or 0.0, 4)),
            "per_position_accept_rate": dg.MetadataValue.json(
                [round(r, 4) for r in tallies["trained"].position_rates or []]
            ),
            "acceptance": dg.MetadataValue.md(_rate_table(tallies, k)),
            "acceptance_plot": _position_plot({n: t.position_rates or [] for n, t in tallies.items()}, k),
            "prompts": dg.MetadataValue.int(len(prompts)),
            "new_tokens": dg.MetadataValue.int(new_tokens),
            "settings": dg.MetadataValue.json(
                {
                    "backend": "inprocess",
                    "num_steps": k,
                    "eagle_topk": 1,
                    "num_draft_tokens": k + 1,
                    "batch_size": 1,
                    "temperature": 0.0,
                    "max_new_tokens": max_new,
                    "sets": ["heldout"],
                }
            ),
        }
    )


def served_tally(
    target: TargetModelResource, export: Path, prompts: list[list[int]], max_new: int, k: int
) -> AcceptanceTally:
    """The exported draft served by an in-process vLLM engine on ``prompts``: its counters' tally."""
    from resources.serving.vllm_engine import served_tally as engine_tally

    return engine_tally(
        str(target.model_dir()),
        str(export),
        prompts,
        max_new,
        k,
        tp_size=target.tensor_parallel_size,
        dtype=target.engine_dtype(),
        on_cuda=target.torch_device().type == "cuda",
    )


def load_prompt_sets(config: BenchmarkConfig, names: list[str], log: Any) -> tuple[list[Any], dict[str, str]]:
    """Every requested set as conversations, with the source each came from (Hub sets: repo@commit)."""
    from eagle_assets.benchmarks.hub_sets import load_hub_set
    from eagle_assets.benchmarks.prompt_sets import conversations_from_rows, heldout_conversations
    from eagle_assets.benchmarks.serving_benchmark import SetPlan

    wrong = sorted(n for n in config.revisions if n not in PROMPT_SETS or PROMPT_SETS[n].hub is None)
    if wrong:
        raise PromptSetError(f"revisions name {wrong}, which are not Hub sets ({', '.join(HUB_SETS)})")
    plans, sources = [], {}
    for name in names:
        spec = PROMPT_SETS[name]
        max_new = config.max_new_tokens or spec.default_max_new_tokens
        if spec.hub is None:
            convs = heldout_conversations(held_out_prompts(config.limit(name)))
            sources[name] = "corpus eval split"
        else:
            hub = replace(spec.hub, revision=config.revisions.get(name, spec.hub.revision))
            rows, source = load_hub_set(hub)
            convs = conversations_from_rows(name, rows, config.limit(name))
            sources[name] = source
        log(f"{spec.label}: {len(convs)} conversations, {sum(c.turns for c in convs)} turns from {sources[name]}")
        plans.append(SetPlan(name, convs, max_new))
    return plans, sources


def _results_metadata(
    results: list[SetResult], config: BenchmarkConfig, engine: str, max_new: dict[str, int]
) -> dict[str, Any]:
    from eagle_assets.plots import tau_comparison_md, throughput_md

    spec = config.speculative()
    facts = [r.facts(max_new[r.name]) for r in results]
    verdict = comparable(engine, spec, config.temperature, config.thinking, facts)
    run_title = f"{engine} {spec.num_steps}/{spec.eagle_topk}/{spec.num_draft_tokens}, batch {config.batch_size}"
    md: dict[str, Any] = {
        "acceptance": dg.MetadataValue.md(results_table(results, spec.num_steps)),
        "reference": dg.MetadataValue.md(reference_table(results, f"this draft ({engine})", verdict)),
        "comparable": dg.MetadataValue.bool(verdict.ok),
        "comparability": dg.MetadataValue.text(verdict.describe()),
        "per_set": dg.MetadataValue.json([r.summary() for r in results]),
        "warnings": dg.MetadataValue.json({r.name: r.warnings for r in results if r.warnings}),
    }
    for r in results:
        if r.tau is not None:
            md[f"acceptance_length_{r.name}"] = dg.MetadataValue.float(round(r.tau, 4))
        if r.speedup is not None:
            md[f"speedup_{r.name}"] = dg.MetadataValue.float(round(r.speedup, 4))
        if r.draft.tokens_per_s is not None:
            md[f"tokens_per_s_{r.name}"] = dg.MetadataValue.float(round(r.draft.tokens_per_s, 2))
    headline = next((r for r in results if r.name == "mtbench" and r.tau is not None), None)
    headline = headline or next((r for r in results if r.tau is not None), None)
    if headline is not None:
        md["acceptance_length"] = dg.MetadataValue.float(round(headline.tau or 0.0, 4))
        md["per_position_accept_rate"] = dg.MetadataValue.json([round(x, 4) for x in headline.position_rates or []])
    labels = {n: PROMPT_SETS[n].label for n in ("mtbench", "gsm8k", "humaneval")}
    md["acceptance_plot"] = dg.MetadataValue.md(
        tau_comparison_md(
            {r.name: r.tau for r in results},
            {ref.draft: ref.tau for ref in REFERENCES},
            labels,
            f"τ, {run_title}; {verdict.short()}",
        )
    )
    md["throughput_plot"] = dg.MetadataValue.md(
        throughput_md(
            {r.label: r.draft.tokens_per_s for r in results},
            {r.label: None if r.baseline is None else r.baseline.tokens_per_s for r in results},
            {r.label: r.speedup for r in results},
            f"output tokens/s, {run_title}",
        )
    )
    with_rates = {r.label: r.position_rates for r in results if r.position_rates}
    if with_rates:
        md["per_position_plot"] = _position_plot(with_rates, spec.num_steps)
    return md


def plan_serving(
    serving: ServingEngineResource,
    spec: SpeculativeSettings,
    target: TargetModelResource,
    export: Path,
    batch_size: int,
) -> EnginePlan:
    """The engine run: a started server loads the serving resource's ``model_path``, else the target's checkpoint
    (built first when it is the tiny one, so only when nothing else names a model)."""
    model = None if (serving.url or serving.model_path) else target.model_dir()
    return serving.plan(spec, export, model, batch_size)


def run_serving(
    context: dg.AssetExecutionContext,
    config: BenchmarkConfig,
    target: TargetModelResource,
    serving: ServingEngineResource,
    export: Path,
) -> dg.MaterializeResult:
    from eagle_assets.benchmarks.formatting import kimi_renderer
    from eagle_assets.benchmarks.serving_benchmark import ServingBenchmarkFailed, run_serving_benchmark
    from resources.serving.errors import ServingError

    names = list(config.sets or SERVING_SETS)
    unknown = [n for n in names if n not in PROMPT_SETS]
    if unknown:
        raise fail(f"unknown prompt sets {unknown}; known: {', '.join(PROMPT_SETS)}")
    spec = config.speculative()
    try:
        spec.validate(serving.backend)
        plan = plan_serving(serving, spec, target, export, config.batch_size)
        sets, sources = load_prompt_sets(config, names, context.log.info)
    except (SettingsError, PromptSetError, ValueError, OSError) as exc:
        raise fail(f"{serving.backend} benchmark not started: {exc}") from exc
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{context.run.run_id[:8]}"
    run_dir = benchmark_runs_dir() / stamp
    settings_md = {
        "backend": serving.backend,
        "num_steps": spec.num_steps,
        "eagle_topk": spec.eagle_topk,
        "num_draft_tokens": spec.num_draft_tokens,
        "batch_size": config.batch_size,
        "temperature": config.temperature,
        "thinking": config.thinking,
        "max_new_tokens": {s.name: s.max_new_tokens for s in sets},
        "sources": sources,
        "draft": str(export),
        "mode": "attach" if serving.url else "start",
    }
    try:
        run = run_serving_benchmark(
            plan,
            sets,
            kimi_renderer(config.thinking),
            batch_size=config.batch_size,
            temperature=config.temperature,
            run_dir=run_dir,
            log=context.log.info,
        )
    except ServingBenchmarkFailed as exc:
        partial = results_table(exc.partial, spec.num_steps) if exc.partial else "(nothing answered)"
        raise fail(
            str(exc),
            {
                "partial_results": dg.MetadataValue.md(partial),
                "journal": dg.MetadataValue.path(str(exc.journal)),
                "settings": dg.MetadataValue.json(settings_md),
            },
        ) from exc
    except ServingError as exc:
        raise fail(
            f"{serving.backend} benchmark failed: {exc}", {"settings": dg.MetadataValue.json(settings_md)}
        ) from exc
    settings_md["engine_version"] = run.engine_version
    settings_md["servers"] = run.servers
    return dg.MaterializeResult(
        metadata={
            "backend": dg.MetadataValue.text(serving.backend),
            **_results_metadata(run.results, config, serving.backend, {s.name: s.max_new_tokens for s in sets}),
            "settings": dg.MetadataValue.json(settings_md),
            "journal": dg.MetadataValue.path(str(run.journal)),
            "prompts": dg.MetadataValue.int(sum(r.draft.conversations for r in run.results)),
        }
    )
