"""The refusals an asset decides itself are final: under a RetryPolicy, Dagster does not try them again.

Each would meet a retry the same way (no exported draft, no eval split), and a generation stop the asset
does not know must neither pass as success nor be bought again by a retry. A bug (an error that is not the
project's) is still retried by the same policy: the control that shows the check is not vacuous.
"""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.assets import generation as generation_asset
from eagle_assets.assets.draft import draft_benchmark
from eagle_assets.assets.draft_benchmark import held_out_prompts
from eagle_assets.assets.failures import fail
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.runner import PartitionReport
from eagle_assets.layout import corpus_dir
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource
from resources.serving.resource import ServingEngineResource
from resources.target.resource import TargetModelResource
from tests.generation.test_dagster_generation import write_prompts

RETRY = dg.RetryPolicy(max_retries=2)


@pytest.fixture
def forge_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def run_with_retries(
    instance: dg.DagsterInstance, asset: dg.AssetsDefinition, resources: dict, partition: str | None = None
) -> tuple[dg.ExecuteInProcessResult, list[dg.DagsterEventType]]:
    """``asset`` alone in a job whose ops may be retried twice; the result and its step events, in order."""
    defs = dg.Definitions(
        assets=[asset],
        jobs=[dg.define_asset_job("with_retries", selection=[asset.key], op_retry_policy=RETRY)],
        resources=resources,
    )
    result = defs.resolve_job_def("with_retries").execute_in_process(
        instance=instance, partition_key=partition, raise_on_error=False
    )
    steps = [e.event_type for e in result.all_events if e.is_step_event]
    return result, steps


def assert_failed_once(result: dg.ExecuteInProcessResult, steps: list[dg.DagsterEventType], text: str) -> None:
    assert not result.success
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in steps, steps
    assert steps.count(dg.DagsterEventType.STEP_FAILURE) == 1
    (failure,) = result.get_step_failure_events()
    assert failure.step_failure_data.error is not None and text in failure.step_failure_data.error.message


def test_fail_makes_final_failures_only():
    assert fail("no exported draft").allow_retries is False
    with pytest.raises(TypeError):
        fail("try again later", allow_retries=True)  # the parameter is gone: nobody can forget it


def test_a_bug_is_still_retried_by_the_policy(instance):
    @dg.asset
    def buggy() -> None:
        raise ValueError("a bug, not a refusal")

    result, steps = run_with_retries(instance, buggy, {})
    assert not result.success and steps.count(dg.DagsterEventType.STEP_UP_FOR_RETRY) == 2


def test_draft_benchmark_without_an_exported_draft_is_not_retried(forge_home, instance):
    resources = {"target": TargetModelResource(), "serving": ServingEngineResource()}
    result, steps = run_with_retries(instance, draft_benchmark, resources)
    assert_failed_once(result, steps, "no exported draft at")


def test_no_eval_split_is_not_retried(forge_home, instance):
    (corpus_dir() / "train").mkdir(parents=True)  # a corpus made with eval_fraction 0
    with pytest.raises(dg.Failure, match="no eval split") as info:
        held_out_prompts(3)
    assert info.value.allow_retries is False

    @dg.asset
    def heldout() -> None:
        held_out_prompts(3)

    result, steps = run_with_retries(instance, heldout, {})
    assert_failed_once(result, steps, "the corpus has no eval split")


def test_a_generation_stop_the_asset_does_not_know_is_final_and_named(tmp_path, forge_home, instance, monkeypatch):
    spec = DatasetSpec("U1", write_prompts(tmp_path / "u1.jsonl", 4), 10**9, 4)
    asset = generation_asset.build_generated_asset(spec)
    bought: list[str] = []

    def run_partition(openrouter, job, log, observe=None) -> PartitionReport:
        bought.append(job.shard)
        return PartitionReport(f"U1/{job.shard}", total=4, ok=1, stop_reason="paused", stop_detail="held by a test")  # type: ignore[arg-type]

    monkeypatch.setattr(generation_asset, "run_partition", run_partition)
    openrouter = OpenRouterResource(base_url="http://127.0.0.1:9/api/v1", api_key_file="")
    result, steps = run_with_retries(instance, asset, {"openrouter": openrouter, "duckdb": DuckDBResource()}, "0000")
    assert_failed_once(result, steps, "a reason this asset does not handle ('paused'): held by a test (1 of 4 done)")
    assert bought == ["0000"]  # asked once: no retry bought it again
