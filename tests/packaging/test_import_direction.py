"""Imports go one way: the logic (``eagle_assets.generation``, the assets) uses the resources, never the reverse.

A resource is a client (configuration, a key, an HTTP client), as in Dagster's example projects; what runs a
partition is generation logic that takes the resource as an argument. When a resource imports the logic that
uses it, the two can no longer be read, tested or changed apart, and an import cycle is one edit away. The
imports are read from the source with ``ast`` (nothing is imported), lazy imports inside functions included.
"""

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The packaged code (pyproject's ``packages.find``): what runs in production, as opposed to tests and benchmarks.
PRODUCTION_PACKAGES = ("eagle_assets", "resources", "sensors")
LOGIC = ("eagle_assets.generation", "eagle_assets.assets")
GENERATION, OPENROUTER = "eagle_assets.generation", "resources.openrouter"
# Private Dagster modules allowed, (importing module, private module): the only ones with no public equivalent.
# ``fidelity_failures`` reads the latest asset-check result per *partition*: Dagster 1.13 has no public API for
# that (``DagsterInstance.get_latest_asset_check_evaluation_record`` has no partition filter), so it needs
# ``PartitionKeyFilter`` and the status enum of ``AssetCheckPartitionInfo``, which are not exported by ``dagster``.
ALLOWED_PRIVATE_DAGSTER = {
    ("eagle_assets.assets.hidden_state_checks", "dagster._core.event_api"),
    ("eagle_assets.assets.hidden_state_checks", "dagster._core.storage.asset_check_execution_record"),
}


@dataclass(frozen=True)
class ImportEdge:
    importer: str  # the module that imports
    target: str  # a module it imports, or ``module.name`` for ``from module import name`` (maybe a submodule)
    line: int
    type_only: bool = False  # under ``if TYPE_CHECKING:``: a dependency, but never executed


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[ImportEdge]:
    """Every import in ``source``, at any depth (a function's lazy import counts too), relative ones resolved."""

    def visit(node: ast.AST, type_only: bool) -> Iterator[ImportEdge]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportEdge(module, alias.name, node.lineno, type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            yield ImportEdge(module, base, node.lineno, type_only)
            for alias in node.names:
                if alias.name != "*":
                    yield ImportEdge(module, f"{base}.{alias.name}", node.lineno, type_only)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:
                yield from visit(child, type_only)
        else:
            for child in ast.iter_child_nodes(node):
                yield from visit(child, type_only)

    yield from visit(ast.parse(source), False)


def production_files() -> list[Path]:
    return [path for package in PRODUCTION_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def production_imports() -> list[ImportEdge]:
    edges = []
    for path in production_files():
        edges.extend(imports_of(path.read_text(), module_name(path), path.name == "__init__.py"))
    return edges


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_private_dagster(name: str) -> bool:
    """``dagster._core...``, ``dagster_postgres._x``: a module (or name) below a private part of a Dagster package."""
    top, *rest = name.split(".")
    return top.startswith("dagster") and any(part.startswith("_") for part in rest)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan), each sorted: empty when the graph is acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def owner(name: str, modules: set[str]) -> str | None:
    """The module ``name`` belongs to: itself, or the longest known module it is inside (``pkg.mod.Class``)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


# --- the rules -------------------------------------------------------------------------------------------------


def test_no_resource_imports_the_generation_logic_or_the_assets():
    bad = [
        f"{e.importer}:{e.line} imports {e.target}"
        for e in production_imports()
        if within(e.importer, "resources") and any(within(e.target, logic) for logic in LOGIC)
    ]
    assert bad == [], "a resource is a client: move the logic into eagle_assets.generation and pass it the resource"


def test_generation_and_openrouter_import_each_other_in_one_direction_only():
    modules = {m for m in map(module_name, production_files()) if within(m, GENERATION) or within(m, OPENROUTER)}
    edges = [e for e in production_imports() if e.importer in modules]
    packages: dict[str, set[str]] = {GENERATION: set(), OPENROUTER: set()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        target = owner(e.target, modules)
        if target is None or target == e.importer:
            continue
        if not e.type_only:  # a cycle through a type-only import is never executed
            graph[e.importer].add(target)
        source_package = GENERATION if within(e.importer, GENERATION) else OPENROUTER
        target_package = GENERATION if within(target, GENERATION) else OPENROUTER
        if source_package != target_package:
            packages[source_package].add(target_package)
    # Not vacuous: the runner does use the OpenRouter package (outcomes, providers, the account cap).
    assert OPENROUTER in packages[GENERATION]
    assert cycles(packages) == [], f"the sub-packages import each other: {packages}"
    assert cycles(graph) == [], "modules of these sub-packages import each other when they are imported"


def test_production_code_imports_no_private_dagster_module():
    private = {(e.importer, e.target) for e in production_imports() if is_private_dagster(e.target)}
    allowed = {
        (importer, target)
        for importer, target in private
        for a_importer, a_module in ALLOWED_PRIVATE_DAGSTER
        if importer == a_importer and within(target, a_module)
    }
    assert sorted(private - allowed) == [], "use the public API (``import dagster as dg``)"
    used = {(i, m) for i, m in ALLOWED_PRIVATE_DAGSTER if any(i == a and within(t, m) for a, t in allowed)}
    assert used == ALLOWED_PRIVATE_DAGSTER, "an allowed private import is gone: remove it from the allowance"


# --- the reader itself -------------------------------------------------------------------------------------------


def test_imports_are_read_at_any_depth_with_relative_ones_resolved():
    source = (
        "import os.path\n"
        "from . import sibling\n"
        "from ..other import thing\n"
        "def f():\n"
        "    from eagle_assets.generation import runner\n"
    )
    targets = {e.target for e in imports_of(source, "pkg.sub.mod")}
    assert {"os.path", "pkg.sub.sibling", "pkg.other", "pkg.other.thing", "eagle_assets.generation.runner"} <= targets
    assert {e.target for e in imports_of("from .x import y\n", "pkg.sub", is_package=True)} == {
        "pkg.sub.x",
        "pkg.sub.x.y",
    }
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.b\nelse:\n    import c\n"
    assert {e.target: e.type_only for e in imports_of(typed, "m")} == {
        "typing": False,
        "typing.TYPE_CHECKING": False,
        "a.b": True,
        "c": False,
    }


@pytest.mark.parametrize(
    ("name", "private"),
    [
        ("dagster._core.events", True),
        ("dagster._core.events.DagsterEventType", True),
        ("dagster_postgres._internal", True),
        ("dagster", False),
        ("dagster.DagsterEventType", False),
        ("dagster_k8s.executor", False),
        ("pydantic._internal", False),
    ],
)
def test_private_dagster_names(name, private):
    assert is_private_dagster(name) is private


def test_cycles_are_found_and_acyclic_graphs_pass():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert owner("eagle_assets.generation.runner.PartitionRunner", {"eagle_assets.generation.runner"}) == (
        "eagle_assets.generation.runner"
    )


# --- no circles anywhere -----------------------------------------------------------------------------------------


def room(module: str) -> str:
    """The room a module lives in: a sub-package of ``eagle_assets`` or ``resources`` (``eagle_assets.generation``),
    a top-level module of ``eagle_assets`` (``eagle_assets.layout``), or ``sensors`` as a whole."""
    parts = module.split(".")
    if parts[0] == "sensors" or len(parts) < 2:
        return parts[0]
    return ".".join(parts[:2])


def product_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports when it runs (type-only imports are never executed)."""
    modules = set(map(module_name, production_files()))
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in production_imports():
        target = owner(e.target, modules)
        if target is not None and target != e.importer and not e.type_only:
            graph[e.importer].add(target)
    return graph


def test_no_import_circle_among_product_modules():
    found = cycles(product_graph())
    assert found == [], "modules that import each other (a circle): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_circle_among_rooms():
    """Folders import one another in one direction: a circle of rooms is a circle of modules one edit away."""
    rooms: dict[str, set[str]] = {}
    for importer, targets in product_graph().items():
        rooms.setdefault(room(importer), set()).update(room(t) for t in targets if room(t) != room(importer))
    found = cycles(rooms)
    assert found == [], "rooms that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_rooms_are_folders_top_level_modules_or_sensors():
    assert room("eagle_assets.generation.ledger.reservations") == "eagle_assets.generation"
    assert room("eagle_assets.layout") == "eagle_assets.layout"
    assert room("resources.openrouter.client") == "resources.openrouter"
    assert room("sensors.training") == "sensors"
