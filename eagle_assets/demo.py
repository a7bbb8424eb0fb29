"""The embedded default, end to end: ``python -m eagle_assets.demo``.

No key and no GPU: the OpenRouter resource points at the bundled simulator on 127.0.0.1, which
answers with the tiny target model built on this machine. Every stage is materialized into the
persistent Dagster instance under ``$EAGLE_FORGE_HOME``, in the order a backfill would take:
generation + tokens per dataset × shard (with their checks), the corpus, the hidden states per corpus
shard, the draft model and its benchmark. ``dagster dev -w workspace.yaml`` afterwards shows the same
runs, partitions, checks and plots. Re-running skips what is already materialized.
"""

import argparse
import multiprocessing
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg

from eagle_assets import layout
from eagle_assets.errors import Systemic
from eagle_assets.instance import configure_pools, ensure_dagster_home
from eagle_assets.settings import EnvSettingError, check_environment

if TYPE_CHECKING:
    from eagle_assets.datasets.config import DatasetSpec

# The demo prints one line per step and each failure's cause itself; Dagster's own console would repeat
# every traceback. The run logs (with tracebacks) stay in the instance for `dagster dev`.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# Sized so that the whole demo fits in minutes on 2 CPU cores.
CORPUS_CONFIG = {"max_samples_per_shard": 160, "eval_fraction": 0.05}
# The plan's pilot: about one shard per dataset (16 prompts; for B5 its conversations, whole), bought by the plan
# and kept as those partitions' data, so the plan projects the rest from the demo's own answers instead of the
# configured prior (10x off here). It costs nothing on the simulator and little time: generation skips it after.
PLAN_CONFIG = {"generation_plan": {"config": {"pilot_prompts": 16}}}
PLAN_TOLERANCE = 0.10  # the demo says whether what generation spent and produced is within this of the plan
# Generation partitions in flight at once, each in a worker process of its own (Dagster captures a run's output
# by redirecting its process's stdout, so two runs cannot share a process). A partition mostly waits: on the
# simulator's latency and on the tiny target, which decodes whatever requests are waiting as one batch; three at
# once overlap that waiting and fill its batches, while each worker's start (importing the definitions) costs
# about 4 CPU-seconds, paid during the pilot.
GENERATION_WORKERS = 3


# Not the project's errors, but systemic by nature: a run config Dagster refuses, or code that does not
# import, fails every partition the same way. The project's own say so by their class (``Systemic``).
SYSTEMIC_FOREIGN = frozenset({"DagsterInvalidConfigError", "ModuleNotFoundError", "ImportError"})


def systemic_names() -> frozenset[str]:
    """Names of the classes whose failure would repeat for every partition: every project error marked
    ``Systemic`` in ``eagle_assets.errors`` (the loaded ones: a class that was raised was loaded), and the
    foreign ones above. Names, because names are what Dagster records of a failure's chain."""
    names, todo = set(SYSTEMIC_FOREIGN), [Systemic]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


def failure_cause(result: dg.ExecuteInProcessResult) -> tuple[str, set[str]]:
    """The innermost error message of the first failed step, and every exception class in its chain."""
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        classes: set[str] = set()
        message = ""
        while error is not None:
            classes.add(error.cls_name or "")
            message = (error.message or "").strip() or message
            error = error.cause
        return message, classes
    return "no step failed, yet the run did not succeed", set()


@dataclass(frozen=True)
class Outcome:
    """One materialization as the demo reports it; plain data, so that a worker process can send it back."""

    label: str
    ok: bool
    elapsed: float
    cause: str = ""
    classes: frozenset[str] = frozenset()


class Demo:
    def __init__(self, instance: dg.DagsterInstance, defs: dg.Definitions) -> None:
        self.instance, self.defs = instance, defs
        self.resources = dict(defs.resources or {})
        self.failed: list[str] = []
        self.succeeded = 0
        self.last_result: dg.ExecuteInProcessResult | None = None
        self.systemic: str | None = None  # set when a failure would repeat for every partition
        self.summary: list[str] = []  # repeated at the end: the plan against what generation then did

    def materialize(self, keys: Sequence[dg.AssetKey], label: str, partition: str | None = None, config=None) -> bool:
        return self.record(self.run(keys, label, partition, config))

    def run(self, keys: Sequence[dg.AssetKey], label: str, partition: str | None = None, config=None) -> Outcome:
        assets = [self.defs.get_assets_def(k) for k in keys]
        started = time.monotonic()
        result = dg.materialize(
            assets,
            partition_key=partition,
            instance=self.instance,
            resources=self.resources,
            raise_on_error=False,
            run_config={**QUIET, **({"ops": config} if config else {})},
        )
        elapsed = time.monotonic() - started
        self.last_result = result
        if result.success:
            return Outcome(label, True, elapsed)
        cause, classes = failure_cause(result)
        return Outcome(label, False, elapsed, cause, frozenset(classes))

    def record(self, outcome: Outcome) -> bool:
        """Print one step's line and keep its count; a failure that would repeat everywhere sets ``systemic``."""
        if outcome.ok:
            self.succeeded += 1
            print(f"  {outcome.label}: ok ({outcome.elapsed:.1f}s)", flush=True)
            return True
        self.failed.append(outcome.label)
        detail = "\n".join("      " + line for line in outcome.cause.splitlines())
        print(f"  {outcome.label}: FAILED ({outcome.elapsed:.1f}s)\n{detail}", flush=True)
        # After one of these the demo stops instead of repeating the failure for every partition; so does a
        # first failure before anything succeeded (the same setup would meet it again).
        if self.succeeded == 0 or outcome.classes & systemic_names():
            self.systemic = outcome.cause
        return False

    def done(self, key: dg.AssetKey) -> set[str]:
        return set(self.instance.get_materialized_partitions(key))


def main(argv: list[str] | None = None) -> int:
    try:
        check_environment()  # a typo'd EAGLE_FORGE_* name, or a malformed value, stops the demo before it starts
    except EnvSettingError as e:
        print(f"eagle-forge: {e}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="*", help="only these datasets (default: all)")
    parser.add_argument("--stop-after", choices=["generation", "corpus", "hidden_states", "draft"], default=None)
    parser.add_argument(
        "--target",
        choices=["llama-tiny", "kimi-k25-tiny"],
        default="llama-tiny",
        help="the tiny target that answers in the simulator and is extracted, trained for and benchmarked against:"
        " llama-tiny (fastest) or kimi-k25-tiny (Kimi K2.5's architecture: MLA, MoE, a vision wrapper)",
    )
    parser.add_argument(
        "--features",
        choices=["offline", "online"],
        default="offline",
        help="offline (default): hidden-state stores, checked, then training; online: no store, the target computes "
        "the features as the draft trains (docs/draft-and-benchmark.md)",
    )
    parser.add_argument(
        "--keep-simulator",
        action="store_true",
        help="leave the simulator this demo started running (for the Dagster UI); by default it is stopped",
    )
    args = parser.parse_args(argv)
    home = ensure_dagster_home()
    demo = load_demo(args.target)  # after DAGSTER_HOME is set, and before any import that warns
    from eagle_assets import definitions
    from eagle_assets.assets.draft import TINY_TARGET_BENCHMARK_CONFIG, TINY_TARGET_TRAIN_CONFIG
    from eagle_assets.keys import BENCHMARK_KEY, CORPUS_KEY, DRAFT_KEY

    configure_pools(demo.instance)
    sim = SimulatorOwnership(demo.resources["openrouter"], keep=args.keep_simulator)
    start = time.monotonic()

    print("1/5 generation (OpenRouter simulator) + exact token ids, per dataset × shard", flush=True)
    generated = generate(demo, definitions.DATASETS, args.datasets, args.target)
    if not generated or demo.failed or args.stop_after == "generation":
        return finish(demo, start, home, sim)

    print("2/5 corpus: re-validate, deduplicate, shuffle, split, shard", flush=True)
    demo.materialize([CORPUS_KEY], "corpus", config={"corpus": {"config": CORPUS_CONFIG}})
    if demo.failed or args.stop_after == "corpus":
        return finish(demo, start, home, sim)

    extract_hidden_states(demo, args.features)
    if demo.failed or args.stop_after == "hidden_states":
        return finish(demo, start, home, sim)

    print(f"4/5 EAGLE-3 draft training, {args.features} features (Dagster Pipes subprocess)", flush=True)
    train_config = {**TINY_TARGET_TRAIN_CONFIG, "features": args.features}
    demo.materialize([DRAFT_KEY], "draft_model", config={"draft_model": {"config": train_config}})
    if demo.failed or args.stop_after == "draft":
        return finish(demo, start, home, sim)

    print("5/5 acceptance length on held-out prompts (speculative decoding against the target)", flush=True)
    if demo.materialize(
        [BENCHMARK_KEY], "draft_benchmark", config={"draft_benchmark": {"config": TINY_TARGET_BENCHMARK_CONFIG}}
    ):
        event = demo.instance.get_latest_materialization_event(BENCHMARK_KEY)
        assert event is not None and event.asset_materialization is not None  # it was just materialized
        md = event.asset_materialization.metadata
        print(
            f"  acceptance length τ: trained {md['acceptance_length'].value:.2f}, "
            f"untrained {md['acceptance_length_untrained'].value:.2f}; per position "
            f"{md['per_position_accept_rate'].value}"
        )
        print(f"  exported draft: {layout.latest_export_dir()}/export (SGLang and vLLM)")
    return finish(demo, start, home, sim)


def load_demo(target: str) -> Demo:
    """The instance and definitions, with the simulator answering as ``target``: the demo's process and each
    generation worker open theirs the same way (DAGSTER_HOME must be set first)."""
    # Dagster flags its own Pipes internals as preview; that is not news for someone running the demo.
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    from eagle_assets import definitions

    demo = Demo(dg.DagsterInstance.get(), definitions.defs)
    use_tiny_target(demo.resources, target)
    return demo


def use_tiny_target(resources: dict, name: str) -> None:
    """Point the target resource and the embedded simulator at the same tiny target (the data is its own)."""
    # Rebuilt, not model_copy'd: Dagster builds a resource again from its config, which a copy leaves as it was.
    target, openrouter = resources["target"], resources["openrouter"]
    if not target.path:
        resources["target"] = type(target)(**{**target.model_dump(), "tiny_target": name})
    resources["openrouter"] = type(openrouter)(**{**openrouter.model_dump(), "simulator_tiny_target": name})


def generate(demo: Demo, datasets: Mapping[str, "DatasetSpec"], only: Sequence[str] | None, target: str) -> bool:
    """Stage 1: the plan (its pilot buys the first shards), then generation + tokens per dataset × shard, a few
    partitions at once, then the plan against what generation spent and produced. False: stop (a failure that
    would repeat)."""
    from eagle_assets.keys import PLAN_KEY

    names = [name for name in datasets if not only or name in only]
    with GenerationWorkers(target) as workers:  # they start while the pilot runs
        demo.materialize([PLAN_KEY], "generation_plan", config=PLAN_CONFIG)
        if demo.systemic:
            return False
        todo = [(name, shard) for name in names for shard in datasets[name].shard_keys()]
        workers.run(demo, [(name, shard) for name, shard in todo if shard not in partitions_done(demo, name)])
    if demo.systemic:
        return False
    demo.summary = plan_against_generation(demo, names)
    for line in demo.summary:
        print(f"  {line}", flush=True)
    return True


def partitions_done(demo: Demo, dataset: str) -> set[str]:
    """The shards of ``dataset`` whose generation and tokens are both materialized: a re-run skips them."""
    from eagle_assets.keys import generated_asset_key, tokenized_asset_key

    return demo.done(generated_asset_key(dataset)) & demo.done(tokenized_asset_key(dataset))


class GenerationWorkers:
    """``GENERATION_WORKERS`` processes, each with the definitions loaded once, materializing one generation
    partition (its generation and tokens assets, one run) at a time. The demo prints each line as a partition
    ends, and hands out a partition only while nothing systemic has failed: at most the ones already in flight
    run after such a failure."""

    def __init__(self, target: str) -> None:
        context = multiprocessing.get_context("spawn")  # not fork: the parent holds the instance's connections
        self.pool = ProcessPoolExecutor(GENERATION_WORKERS, context, initializer=_start_worker, initargs=(target,))

    def __enter__(self) -> "GenerationWorkers":
        for _ in range(GENERATION_WORKERS):  # one task each: the pool starts a worker per task it cannot place
            self.pool.submit(_worker_ready)
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def run(self, demo: Demo, partitions: Sequence[tuple[str, str]]) -> None:
        waiting = list(reversed(partitions))
        running: set[Future[Outcome]] = set()
        while True:
            while waiting and len(running) < GENERATION_WORKERS and not demo.systemic:
                running.add(self.pool.submit(_materialize_partition, *waiting.pop()))
            if not running:
                return
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                demo.record(future.result())


_WORKER: Demo | None = None  # a generation worker's own instance and definitions


def _start_worker(target: str) -> None:
    global _WORKER
    _WORKER = load_demo(target)  # DAGSTER_HOME came with the environment


def _worker_ready() -> None:
    """Nothing: a task that makes the pool start its workers (and their imports) ahead of the first partition."""


def _materialize_partition(dataset: str, shard: str) -> Outcome:
    from eagle_assets.keys import generated_asset_key, tokenized_asset_key

    assert _WORKER is not None  # set by the pool's initializer
    keys = [generated_asset_key(dataset), tokenized_asset_key(dataset)]
    return _WORKER.run(keys, f"{dataset}/{shard}", partition=shard)


def plan_against_generation(demo: Demo, names: Sequence[str]) -> list[str]:
    """The recorded plan's projection beside what generation then spent and produced (from the ledger)."""
    from eagle_assets.generation.partition_runs import open_ledger
    from eagle_assets.generation.plan_file import read_plan
    from eagle_assets.generation.plan_report import plan_outcome

    doc = read_plan()
    if doc is None:
        return []
    with open_ledger(demo.resources["openrouter"]) as ledger:
        totals = {name: ledger.totals(name) for name in names}
    outcome = plan_outcome(doc, {name: (t.usd_spent, t.tokens_spent) for name, t in totals.items()})
    lines = outcome.lines()
    if outcome.projected_usd and outcome.projected_tokens:
        within = "within" if outcome.within(PLAN_TOLERANCE) else "NOT within"
        lines[-1] += f" ({within} {PLAN_TOLERANCE:.0%})"
    return lines


def extract_hidden_states(demo: Demo, features: str) -> None:
    """Stage 3: a store per train shard with its fidelity checks; online, none (the target computes the features as
    the draft trains, and the same checks run on the stream's first rows before its first step)."""
    from eagle_assets.assets.hidden_state_checks import check_summaries
    from eagle_assets.keys import HIDDEN_STATES_KEY
    from eagle_assets.shard_partitions import train_partitions

    if features == "online":
        print("3/5 hidden states: no store (--features online: computed during training, checked on its first rows)")
        return
    print("3/5 hidden states of the tiny target, per corpus shard, with their fidelity checks", flush=True)
    for shard in train_partitions(demo.instance):
        demo.materialize([HIDDEN_STATES_KEY], f"hidden_states/{shard}", partition=shard)
        for _, summary in check_summaries(demo.last_result) if demo.last_result else []:
            print(f"    {summary.split(': ', 1)[-1]}", flush=True)  # the check, passed or FAILED, its figures


class SimulatorOwnership:
    """Whether this demo started the embedded simulator, so that it stops exactly that one at the end."""

    def __init__(self, openrouter, keep: bool) -> None:
        from resources.simulator.embedded import is_up

        self.base_url = openrouter.base_url
        self.embedded = bool(openrouter.start_embedded_simulator)
        self.was_up = self.embedded and is_up(self.base_url)
        self.keep = keep

    def close(self) -> None:
        if not self.embedded:
            return
        from resources.simulator.embedded import is_up, pid_file, stop_embedded_simulator

        if self.was_up:
            print(f"OpenRouter simulator at {self.base_url} was already running before this demo; left as it was")
        elif self.keep and is_up(self.base_url):
            print(f"OpenRouter simulator kept serving at {self.base_url} (pid file {pid_file()})")
        else:
            pid = stop_embedded_simulator()
            if pid is not None:
                print(f"stopped the OpenRouter simulator this demo started (pid {pid}); --keep-simulator keeps it")


def finish(demo: Demo, start: float, home, sim: SimulatorOwnership) -> int:
    if demo.systemic:
        print("\nstopped early: the failure above would repeat for every partition; fix its cause and rerun")
    print(f"\nfinished in {time.monotonic() - start:.1f}s; {len(demo.failed)} failed {demo.failed or ''}")
    for line in demo.summary:
        print(line)
    print(f"outputs under {layout.root()}: generated/, tokenized/, corpus/, hidden_states/, draft/")
    sim.close()
    print(f"Dagster UI: DAGSTER_HOME={home} .venv/bin/dagster dev -w workspace.yaml → http://127.0.0.1:3000")
    return 1 if demo.failed else 0


if __name__ == "__main__":
    sys.exit(main())
