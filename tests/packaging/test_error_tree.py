"""One error tree, mapped to Dagster in one place.

Every exception class the packaged code defines derives from ``EagleForgeError`` (so a caller can tell a
refusal the project meant from a bug), keeps a standard-library base (so every ``except ValueError`` written
before the tree still catches it), and is drawn in ``eagle_assets.errors``' docstring where its class says it
is. Classes are found in the source with ``ast``, so a new one cannot be forgotten by a list kept here.
"""

import ast
import builtins
import importlib
import re
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets import errors
from eagle_assets.assets.failures import fail, project_errors_fail
from eagle_assets.errors import EagleForgeError, EagleForgeWarning, Resumable
from eagle_assets.generation.ledger import LedgerLeaseLost
from eagle_assets.generation.partition_fence import FenceLostError
from eagle_assets.generation.plan import PlanRefusal
from eagle_assets.hidden_states.store_format import StoreError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("eagle_assets", "resources", "sensors")
# Exceptions outside the tree on purpose, each with why: control flow that never reaches a user.
OUTSIDE_THE_TREE = {
    # The simulator's way of answering 400 from inside its request handler; it never leaves the server.
    "resources.simulator.wire.BadRequest",
}
# Subclasses of these are exceptions (or warnings) whatever the project calls them.
BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
# The one class that was a bare ``Exception`` before the tree, so has no other standard-library base to keep.
WAS_BARE_EXCEPTION = {"eagle_assets.benchmarks.serving_run.PassInterrupted"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined_classes() -> dict[str, list[str]]:
    """``module.Class`` -> the last dotted part of each base, for every class in the packaged code."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                    found[f"{module_name(path)}.{node.name}"] = bases
    return found


def project_exceptions() -> list[str]:
    """Every class whose bases lead, through project classes, to a built-in exception or warning."""
    classes = defined_classes()
    by_name: dict[str, list[str]] = {}
    for qualified, bases in classes.items():
        by_name.setdefault(qualified.rsplit(".", 1)[1], []).extend(bases)

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in BUILTIN_EXCEPTIONS:
            return True
        if name in seen or name not in by_name:
            return False
        return any(is_exception(b, seen | {name}) for b in by_name[name])

    return sorted(q for q, bases in classes.items() if any(is_exception(b) for b in bases))


def load(qualified: str) -> type:
    module, name = qualified.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def tree_edges() -> list[tuple[str, str]]:
    """(child, parent) for every line of the drawing in ``eagle_assets.errors``' docstring."""
    drawing = errors.__doc__.split("::", 1)[1].split("\n\n    EagleForgeWarning")
    edges: list[tuple[str, str]] = []
    for block in (drawing[0], "    EagleForgeWarning" + drawing[1].split("\n\n")[0]):
        stack: list[str] = []
        for raw in block.splitlines():
            line = raw[4:]
            if not line.strip():
                continue
            branch = re.search(r"[├└]── ", line)
            name = re.match(r"\w+", line[branch.end() :] if branch else line).group(0)
            depth = branch.start() // 4 + 1 if branch else 0
            del stack[depth:]
            if stack:
                edges.append((name, stack[-1]))
            stack.append(name)
    return edges


def test_the_scan_finds_the_exceptions_it_should():
    found = project_exceptions()
    # Not vacuous: direct subclasses of built-ins, of project classes, warnings, and one defined in resources/.
    for name in (
        "eagle_assets.datasets.config.DatasetConfigError",
        "eagle_assets.datasets.hub_source.HubSourceError",
        "eagle_assets.draft.export.EngineEmbeddingWarning",
        "resources.serving.errors.SpeculationMissing",
        "resources.simulator.wire.BadRequest",
    ):
        assert name in found
    assert "eagle_assets.generation.plan.Plan" not in found  # a dataclass is not an exception
    assert len(found) > 40


def test_every_project_exception_is_in_the_tree_and_keeps_a_standard_library_base():
    outside, bare = [], []
    for qualified in project_exceptions():
        cls = load(qualified)
        if issubclass(cls, Warning):
            assert issubclass(cls, EagleForgeWarning), f"{qualified}: derive it from EagleForgeWarning"
            continue
        if qualified in OUTSIDE_THE_TREE:
            assert not issubclass(cls, EagleForgeError), f"{qualified} is in the tree now: drop it from the allow-list"
            continue
        if not issubclass(cls, EagleForgeError):
            outside.append(qualified)
        stdlib = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
        # The tree's own bases (eagle_assets.errors) are never raised: they have no standard-library base to keep.
        if not stdlib and qualified not in WAS_BARE_EXCEPTION and cls.__module__ != errors.__name__:
            bare.append(qualified)
    assert outside == [], "derive these from eagle_assets.errors (and draw them in its docstring)"
    assert bare == [], "keep the standard-library base each had (ValueError, RuntimeError...) as a second base"


def test_the_docstring_draws_every_class_where_its_class_says_it_is():
    edges = tree_edges()
    drawn = {name for edge in edges for name in edge}
    defined = {q.rsplit(".", 1)[1] for q in project_exceptions() if q not in OUTSIDE_THE_TREE}
    defined |= {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    assert defined - drawn == set(), "draw these in eagle_assets.errors' docstring"
    assert drawn - defined == set(), "the drawing names classes that do not exist (any more)"
    classes = {q.rsplit(".", 1)[1]: load(q) for q in project_exceptions()}
    classes |= {n: v for n, v in vars(errors).items() if isinstance(v, type)}
    wrong = [f"{child} under {parent}" for child, parent in edges if not issubclass(classes[child], classes[parent])]
    assert wrong == [], "the drawing and the classes disagree"
    assert ("LedgerLeaseLost", "LeaseLost") in edges and ("LeaseLost", "Resumable") in edges  # the parse works


def test_the_errors_module_is_a_leaf():
    tree = ast.parse((ROOT / "eagle_assets" / "errors.py").read_text())
    imported = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imported == [], "eagle_assets.errors imports nothing, so that resources/ may import it too"


def test_a_project_error_becomes_a_final_failure_chained_to_it():
    refusal = PlanRefusal("the plan is stale: re-materialize generation_plan")
    with pytest.raises(dg.Failure) as info, project_errors_fail():
        raise refusal
    assert info.value.allow_retries is False
    assert info.value.description == str(refusal)
    assert info.value.__cause__ is refusal
    prefix = "store not usable: "
    with pytest.raises(dg.Failure, match=r"^store not usable: no index$") as info, project_errors_fail(prefix):
        raise StoreError("no index")
    assert info.value.allow_retries is False


@pytest.mark.parametrize(
    "error",
    [
        LedgerLeaseLost("ledger owner declared dead. Rerun the partition."),
        FenceLostError("partition K1/0000: this run's ledger owner was declared dead"),
        ValueError("not the project's: a bug, shown as it is"),
    ],
)
def test_resumable_and_foreign_errors_pass_through_unchanged(error):
    with pytest.raises(type(error)) as info, project_errors_fail():
        raise error
    assert info.value is error
    assert isinstance(error, Resumable) or not isinstance(error, EagleForgeError)


def test_lost_leases_stay_what_every_except_caught_before():
    assert issubclass(LedgerLeaseLost, RuntimeError) and issubclass(FenceLostError, RuntimeError)
    assert issubclass(LedgerLeaseLost, Resumable) and issubclass(FenceLostError, Resumable)
    assert not issubclass(PlanRefusal, Resumable)


def test_fail_is_final_and_keeps_its_metadata():
    failure = fail("budget exhausted — 3 of 60 prompts done, resumable", {"prompts_done": 3})
    assert failure.allow_retries is False and failure.description.startswith("budget exhausted")
    assert failure.metadata["prompts_done"].value == 3
    with pytest.raises(TypeError):  # no flag to forget: a retryable failure would need its own class
        fail("try again later", allow_retries=True)


def test_assets_build_their_failures_in_one_place():
    """No ``dg.Failure(...)`` in the assets but through ``failures.fail``: retryability is decided there."""
    direct = []
    for path in sorted((ROOT / "eagle_assets").rglob("*.py")):
        if path.name == "failures.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Failure":
                direct.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert direct == [], "raise eagle_assets.assets.failures.fail(...) instead"
