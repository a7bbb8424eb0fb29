"""Names and paths have one home each: keys, groups, pools and tags in ``eagle_assets.keys``, paths under the home
in ``eagle_assets.layout``; so imports go one way, from the assets and sensors to those two, never between assets.

An asset module (one that defines assets) imports no other asset module, and a sensor imports none at all: what
one needs of another (its key, its pool, where it wrote) is in ``keys`` or ``layout``, and what they share (the
checks' specs, failures, the account's observation) is in a module that defines no asset. The imports are read
with ``ast``, as in ``test_import_direction``; the keys are those of the loaded ``Definitions``.
"""

import ast
import inspect
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets import keys, layout
from tests.packaging.test_import_direction import ROOT, imports_of, module_name, owner, production_files, within

ASSETS_PACKAGE = "eagle_assets.assets"
SENSORS = "sensors"
ASSET_DECORATORS = {"asset", "multi_asset", "observable_source_asset", "graph_asset", "graph_multi_asset"}
# Where a tag, pool or group name may be spelled out: its home. ``k8s_placement`` spells node labels and
# ``target.tiny`` a model id that share the ``eagle-forge/`` prefix; they are not tags and are not checked.
NAMES_HOME = "eagle_assets.keys"
TAG_NAMES = {keys.STAGE_TAG, keys.DATASET_TAG, keys.RUNS_ON_TAG, keys.TRIGGER_TAG, keys.POOL_TAG, keys.K8S_CONFIG_TAG}
# Only these read the home itself; everyone else asks layout for a path under it.
HOME_READERS = {"eagle_assets.settings", "eagle_assets.layout"}


def _source(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _called_name(node: ast.expr) -> str | None:
    """``dg.asset(...)``, ``asset``, ``dg.asset`` → ``asset``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def defines_assets(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_called_name(d) in ASSET_DECORATORS for d in node.decorator_list)
        for node in ast.walk(tree)
    )


def asset_modules() -> set[str]:
    return {
        module_name(path)
        for path in production_files()
        if within(module_name(path), ASSETS_PACKAGE) and defines_assets(_source(path))
    }


def _edges(package: str):
    for path in production_files():
        name = module_name(path)
        if within(name, package):
            yield from imports_of(path.read_text(), name, path.name == "__init__.py")


# --- the import direction ----------------------------------------------------------------------------------------


def test_the_asset_modules_are_those_definitions_wires():
    found = asset_modules()
    wired = {
        owner(e.target, found) or e.target
        for e in imports_of((ROOT / "eagle_assets/definitions.py").read_text(), "eagle_assets.definitions")
        if within(e.target, ASSETS_PACKAGE) and e.target.count(".") > 2
    }
    assert wired <= found, f"definitions imports assets from modules not found as asset modules: {wired - found}"
    # Not vacuous: decorated functions and the source asset built inside a function are both found.
    assert {"eagle_assets.assets.account", "eagle_assets.assets.draft", "eagle_assets.assets.generation"} <= found
    assert "eagle_assets.assets.checks" not in found and "eagle_assets.assets.failures" not in found


def test_no_module_of_the_assets_package_imports_an_asset_module():
    modules = asset_modules()
    bad = sorted(
        f"{e.importer}:{e.line} imports {e.target}"
        for e in _edges(ASSETS_PACKAGE)
        if (target := owner(e.target, modules)) is not None and target != e.importer
    )
    assert bad == [], "keys, pools, tags, groups: eagle_assets.keys; paths: layout; shared logic: a module of no asset"


def test_no_sensor_imports_an_asset_module():
    modules = asset_modules()
    bad = sorted(
        f"{e.importer}:{e.line} imports {e.target}" for e in _edges(SENSORS) if owner(e.target, modules) is not None
    )
    assert bad == [], "a sensor refers to assets by key (eagle_assets.keys), never through their modules"
    # Not vacuous: the sensors do name assets and read their checks.
    targets = {e.target for e in _edges(SENSORS)}
    assert "eagle_assets.keys.DRAFT_KEY" in targets and "eagle_assets.assets.hidden_state_checks" in targets


# --- one home for the names and the paths ------------------------------------------------------------------------


def _spelled_out(tree: ast.Module) -> list[tuple[int, str]]:
    """Asset keys built, tag names written, and literal keys, groups and pools given to Dagster."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if _called_name(node) == "AssetKey":
                found.append((node.lineno, "AssetKey(...)"))
            for kw in node.keywords:
                if kw.arg in ("key", "group_name", "pool") and isinstance(kw.value, ast.Constant | ast.List):
                    found.append((node.lineno, f"{kw.arg}={ast.unparse(kw.value)}"))
        elif isinstance(node, ast.Constant) and node.value in TAG_NAMES:
            found.append((node.lineno, repr(node.value)))
    return found


def test_keys_groups_pools_and_tags_are_spelled_out_only_in_keys():
    bad = [
        f"{module_name(path)}:{line} {what}"
        for path in production_files()
        if module_name(path) != NAMES_HOME
        for line, what in _spelled_out(_source(path))
    ]
    assert bad == [], "name it once in eagle_assets.keys and import it from there"
    assert _spelled_out(ast.parse("dg.asset(key=dg.AssetKey(['x']), pool='gpu', tags={'eagle-forge/stage': 's'})"))


def test_only_settings_and_layout_read_the_home():
    bad = [
        f"{module_name(path)}:{node.lineno}"
        for path in production_files()
        if module_name(path) not in HOME_READERS
        for node in ast.walk(_source(path))
        if (isinstance(node, ast.Attribute) and node.attr == "forge_home")
        or (isinstance(node, ast.Name) and node.id == "forge_home")
        or (isinstance(node, ast.alias) and node.name == "forge_home")
    ]
    assert bad == [], "a path under the home is composed in eagle_assets.layout"


def test_every_asset_of_the_definitions_is_named_in_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))  # the bundled samples are written on load
    from eagle_assets import definitions

    constants = {v for v in vars(keys).values() if isinstance(v, dg.AssetKey)}
    per_dataset = {
        f(name) for name in definitions.DATASETS for f in (keys.generated_asset_key, keys.tokenized_asset_key)
    }
    groups = {v for k, v in vars(keys).items() if k.endswith("_GROUP")}
    pools = {v for k, v in vars(keys).items() if k.endswith("_POOL")}
    seen: set[dg.AssetKey] = set()
    for asset in definitions.defs.assets or []:
        if isinstance(asset, dg.SourceAsset):
            seen.add(asset.key)
            assert asset.group_name in groups
            continue
        assert isinstance(asset, dg.AssetsDefinition)
        seen |= set(asset.keys)
        assert set(asset.group_names_by_key.values()) <= groups, asset.keys
        assert set(asset.node_def.pools) <= pools, asset.keys
        for tags in asset.tags_by_key.values():
            ours = {k for k in tags if not k.startswith("dagster/")}
            assert ours <= TAG_NAMES, asset.keys
            if keys.STAGE_TAG in tags:
                assert tags[keys.STAGE_TAG] in groups  # a step's stage is its group
    assert seen <= constants | per_dataset, f"keys not named in eagle_assets.keys: {seen - constants - per_dataset}"
    assert constants <= seen, f"keys naming no asset of the definitions: {constants - seen}"
    hidden_states = next(a for a in definitions.defs.assets or [] if keys.HIDDEN_STATES_KEY in getattr(a, "keys", ()))
    assert isinstance(hidden_states, dg.AssetsDefinition) and hidden_states.partitions_def == keys.CORPUS_SHARDS


# --- layout --------------------------------------------------------------------------------------------------------

EXAMPLE_ARGUMENTS = {
    "dataset": "B1",
    "shard": "0000",
    "partition_key": "train-00001",
    "split": "train",
    "seed": 3,
    "name": "tiny-0123456789ab-layers-1-2-3",
}


def _layout_paths() -> list[str]:
    return [
        name
        for name, f in vars(layout).items()
        if inspect.isfunction(f) and f.__module__ == layout.__name__ and "home" in inspect.signature(f).parameters
    ]


# This host's scratch (``layout.scratch_root``): the one exception to the rule, and only when EAGLE_FORGE_SCRATCH
# names a folder; then these lie under it, whatever the home.
SCRATCH_PATHS = {"scratch_root", "simulator_dir", "duckdb_tmp_dir", "handoff_dir"}


def _paths_of(name: str, home: Path | None) -> tuple[Path, ...]:
    f = getattr(layout, name)
    args = {p: EXAMPLE_ARGUMENTS[p] for p in inspect.signature(f).parameters if p != "home"}
    path = f(**args) if home is None else f(**args, home=home)
    return path if isinstance(path, tuple) else (path,)


def test_the_scratch_exception_names_layout_functions():
    assert set(_layout_paths()) >= SCRATCH_PATHS


@pytest.mark.parametrize("name", _layout_paths())
@pytest.mark.parametrize("scratch", [False, True], ids=["no-scratch", "scratch-set"])
def test_every_layout_path_is_under_the_home_it_is_given(name, scratch, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "configured"))
    if scratch:
        monkeypatch.setenv("EAGLE_FORGE_SCRATCH", str(tmp_path / "local-disk"))
    else:
        monkeypatch.delenv("EAGLE_FORGE_SCRATCH", raising=False)
    for home, expected in ((tmp_path / "given", tmp_path / "given"), (None, tmp_path / "configured")):
        if scratch and name in SCRATCH_PATHS:
            expected = tmp_path / "local-disk"
        for p in _paths_of(name, home):
            assert p.is_relative_to(expected), (name, p)


def test_a_corpus_shard_and_its_partition_key_name_each_other(tmp_path):
    key = layout.shard_partition_key("train/shard-00003.parquet")
    assert key == "train-00003"
    assert layout.shard_file(key, home=tmp_path) == tmp_path / "corpus" / "train" / "shard-00003.parquet"
    assert layout.partition_paths("B1", "0007", home=tmp_path) == (
        tmp_path / "journal" / "B1" / "0007.journal",
        tmp_path / "generated" / "B1" / "0007.parquet",
    )
