"""The demo stops at a failure that would repeat for every partition, and decides which those are from the
error tree (``eagle_assets.errors.Systemic``), not from a list of names kept in the demo."""

import importlib
from collections.abc import Iterator

import dagster as dg
import pytest

from eagle_assets.assets.failures import project_errors_fail
from eagle_assets.demo import SYSTEMIC_FOREIGN, Demo, systemic_names
from eagle_assets.errors import Systemic
from eagle_assets.generation.plan import PlanRefusal
from eagle_assets.tokenization.tokenizer_source import TokenizerFilesError

SHARDS = ["0000", "0001", "0002"]


class NotInTheTree(RuntimeError):
    """A failure that is not the project's: a bug, or the environment."""


def failing_on(name: str, shard: str, error: Exception) -> dg.AssetsDefinition:
    @dg.asset(name=name, partitions_def=dg.StaticPartitionsDefinition(SHARDS))
    def _asset(context: dg.AssetExecutionContext) -> None:
        if context.partition_key == shard:
            with project_errors_fail():  # as the assets turn a project error into a failure
                raise error

    return _asset


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def run_like_the_demo(demo: Demo, asset: dg.AssetsDefinition) -> list[str]:
    """The demo's loop over one dataset's shards: stop as soon as a failure is systemic."""
    tried = []
    for shard in SHARDS:
        tried.append(shard)
        demo.materialize([asset.key], f"{asset.key.to_user_string()}/{shard}", partition=shard)
        if demo.systemic:
            break
    return tried


def test_the_systemic_names_come_from_the_tree():
    # The walk finds the loaded classes (one that was raised was loaded); the demo imports the definitions,
    # hence every module that raises, before its first step. Here: the modules of the classes named below.
    for module in (
        "eagle_assets.budget_mode",
        "eagle_assets.datasets.config",
        "resources.openrouter.client",
        "resources.openrouter.configured",
        "resources.openrouter.providers",
        "resources.openrouter.secret",
        "resources.simulator.embedded",
    ):
        importlib.import_module(module)

    names = systemic_names()
    # marked one by one, and every setting error through ConfigError
    for name in ("TokenizerFilesError", "NoAllowedProviderError", "EmbeddedSimulatorError", "OpenRouterHTTPError"):
        assert name in names
    for name in ("EnvSettingError", "MissingApiKeyError", "DatasetConfigError", "BudgetModeError"):
        assert name in names
    assert names >= SYSTEMIC_FOREIGN
    # a refusal about this run's plan, a lost lease, an error of one prompt: not systemic
    for name in ("PlanRefusal", "LedgerLeaseLost", "RowError", "EagleForgeError", "NotInTheTree"):
        assert name not in names
    assert issubclass(TokenizerFilesError, Systemic) and not issubclass(PlanRefusal, Systemic)


def test_a_tokenizer_files_error_stops_the_demo_after_its_first_failure(instance, capsys):
    asset = failing_on("tokenized_here", "0001", TokenizerFilesError("no tokenizer files under /nowhere"))
    demo = Demo(instance, dg.Definitions(assets=[asset]))
    assert run_like_the_demo(demo, asset) == ["0000", "0001"]  # 0002 is not tried: it would fail alike
    assert demo.succeeded == 1 and demo.failed == ["tokenized_here/0001"]
    assert demo.systemic is not None and demo.systemic.endswith(
        "TokenizerFilesError: no tokenizer files under /nowhere"
    )
    assert "tokenized_here/0001: FAILED" in capsys.readouterr().out


def test_an_error_outside_the_tree_is_not_systemic_once_a_partition_succeeded(instance):
    asset = failing_on("flaky_here", "0001", NotInTheTree("one partition's bad luck"))
    demo = Demo(instance, dg.Definitions(assets=[asset]))
    assert run_like_the_demo(demo, asset) == SHARDS  # the others still run
    assert demo.succeeded == 2 and demo.failed == ["flaky_here/0001"] and demo.systemic is None


def test_a_project_error_not_marked_systemic_does_not_stop_the_demo_either(instance):
    asset = failing_on("planned_here", "0001", PlanRefusal("the plan is stale"))
    demo = Demo(instance, dg.Definitions(assets=[asset]))
    assert run_like_the_demo(demo, asset) == SHARDS
    assert demo.systemic is None


def test_any_error_on_the_first_partition_stops_the_demo(instance):
    asset = failing_on("first_here", "0000", NotInTheTree("broken from the start"))
    demo = Demo(instance, dg.Definitions(assets=[asset]))
    assert run_like_the_demo(demo, asset) == ["0000"]  # nothing has succeeded: the same setup would meet it again
    assert demo.systemic is not None and demo.systemic.endswith("NotInTheTree: broken from the start")
