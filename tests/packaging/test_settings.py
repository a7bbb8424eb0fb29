"""One settings model reads every ``EAGLE_FORGE_*`` variable: a typo'd name is refused with the nearest known one
(at the definitions' load and at the demo's start), a malformed value names its variable, nothing else in the
product reads such a variable, and the reference table in docs/configuration.md is the model's."""

import ast
import importlib
import re
import sys

import pytest

from eagle_assets import demo, settings_doc
from eagle_assets.settings import NOT_SETTINGS, EnvSettingError, current_settings, known_names, unknown_names
from tests.packaging.test_import_direction import module_name, production_files

SETTINGS_MODULE = "eagle_assets.settings"
TYPO = "EAGLE_FORGE_BUDGET_US is not a setting; did you mean EAGLE_FORGE_BUDGET_USD?"


def test_a_typo_is_refused_at_the_definitions_load_with_the_nearest_name(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EAGLE_FORGE_BUDGET_US", "5")
    monkeypatch.delitem(sys.modules, "eagle_assets.definitions", raising=False)
    with pytest.raises(EnvSettingError, match=TYPO):
        importlib.import_module("eagle_assets.definitions")


def test_a_typo_stops_the_demo_before_it_starts(monkeypatch, capsys):
    monkeypatch.setenv("EAGLE_FORGE_BUDGET_US", "5")
    assert demo.main([]) == 2
    assert TYPO in capsys.readouterr().err


def test_names_the_product_never_reads_are_not_typos(monkeypatch):
    for name in NOT_SETTINGS:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("EAGLE_FORGE_ZZZZZZ", "1")
    assert unknown_names() == [
        "EAGLE_FORGE_ZZZZZZ is not a setting (see docs/configuration.md for the EAGLE_FORGE_* names)"
    ]
    assert set(NOT_SETTINGS).isdisjoint(known_names())


@pytest.mark.parametrize(
    ("name", "value"),
    [("EAGLE_FORGE_BUDGET_USD", "abc"), ("EAGLE_FORGE_MAX_IN_FLIGHT", "2k"), ("EAGLE_FORGE_LEASE_S", "0.5")],
)
def test_a_malformed_value_names_its_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvSettingError, match=f"{name}='{value}' is malformed"):
        current_settings()


def test_values_are_read_as_they_always_were(monkeypatch):
    for name in known_names():
        monkeypatch.delenv(name, raising=False)
    s = current_settings()
    assert (s.budget_usd, s.max_in_flight, s.lease_s, s.flock, s.stream, s.target) == (
        100.0,
        2000,
        30.0,
        True,
        False,
        "simulator",
    )
    monkeypatch.setenv("EAGLE_FORGE_FLOCK", "maybe")  # on unless switched off
    monkeypatch.setenv("EAGLE_FORGE_JOURNAL_FLOCK", " OFF ")
    monkeypatch.setenv("EAGLE_FORGE_STREAM", "maybe")  # off unless switched on
    monkeypatch.setenv("EAGLE_FORGE_LEASE_S", "  ")  # empty: unset
    monkeypatch.setenv("EAGLE_FORGE_K8S_CPU_NODE_SELECTOR", "pool = cpu, zone=a")
    s = current_settings()
    assert (s.flock, s.journal_flock, s.stream, s.lease_s) == (True, False, False, 30.0)
    assert s.k8s_cpu_node_selector == {"pool": "cpu", "zone": "a"}
    monkeypatch.setenv("EAGLE_FORGE_BUDGET_USD", "")  # an empty budget is a mistake, as it always was
    with pytest.raises(EnvSettingError, match="EAGLE_FORGE_BUDGET_USD"):
        current_settings()


def _reads_the_environment(node: ast.AST) -> bool:
    """``os.environ``, ``os.getenv`` or ``environ``/``getenv`` imported bare."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("environ", "getenv")
    return isinstance(node, ast.Name) and node.id in ("environ", "getenv")


def test_only_the_settings_module_reads_eagle_forge_variables():
    """Outside settings: no ``os.environ``/``getenv`` in a statement that mentions ``EAGLE_FORGE_``, and no
    variable's bare name as a value (``ENV_VAR = "EAGLE_FORGE_X"`` is a name about to be read)."""
    bad = []
    for path in production_files():
        if module_name(path) == SETTINGS_MODULE:
            continue
        tree = ast.parse(path.read_text())
        bad += [
            f"{module_name(path)}:{n.lineno} {n.value}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"EAGLE_FORGE_\w+", n.value)
        ]
        for stmt in ast.walk(tree):
            if not isinstance(stmt, ast.stmt) or isinstance(stmt, ast.FunctionDef | ast.ClassDef | ast.Module):
                continue
            nodes = [n for n in ast.walk(stmt) if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
            names = any(
                isinstance(n, ast.Constant) and isinstance(n.value, str) and "EAGLE_FORGE_" in n.value for n in nodes
            )
            if names and any(_reads_the_environment(n) for n in nodes):
                bad.append(f"{module_name(path)}:{stmt.lineno}")
    assert bad == [], "ask eagle_assets.settings.current_settings() instead of reading the environment"


def test_the_reference_table_is_the_models():
    assert settings_doc.DOC.read_text(encoding="utf-8") == settings_doc.render(), (
        f"docs/configuration.md is out of date: run `{settings_doc.COMMAND}`"
    )
