"""Each deployment gives every host its own scratch (``EAGLE_FORGE_SCRATCH``) off the shared home, and the code
puts DuckDB's spill and the embedded simulator there when it reads that environment."""

from pathlib import Path, PurePosixPath

import pytest
import yaml
from dagster_k8s.models import k8s_model_from_dict, k8s_snake_case_dict
from kubernetes.client import V1EnvVar, V1Volume, V1VolumeMount

from eagle_assets import layout
from resources.duckdb.resource import DuckDBResource

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _k8s(model, snippet):
    return k8s_model_from_dict(model, k8s_snake_case_dict(model, snippet))


def _under(path: str, folder: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(folder))


def test_k8s_scratch_is_on_the_pods_empty_dir_not_on_the_shared_home():
    (dep,) = yaml.safe_load((DEPLOY / "k8s" / "values.yaml").read_text())["dagster-user-deployments"]["deployments"]
    env = {
        e.name: e.value for e in (k8s_model_from_dict(V1EnvVar, k8s_snake_case_dict(V1EnvVar, e)) for e in dep["env"])
    }
    volumes = {v["name"]: k8s_model_from_dict(V1Volume, k8s_snake_case_dict(V1Volume, v)) for v in dep["volumes"]}
    mounts = [k8s_model_from_dict(V1VolumeMount, k8s_snake_case_dict(V1VolumeMount, m)) for m in dep["volumeMounts"]]
    scratch = env["EAGLE_FORGE_SCRATCH"]
    (mount,) = [m for m in mounts if _under(scratch, m.mount_path)]
    assert volumes[mount.name].empty_dir is not None
    assert not _under(scratch, env["EAGLE_FORGE_HOME"])


def test_compose_scratch_is_off_the_shared_volume():
    compose = yaml.safe_load((DEPLOY / "docker" / "docker-compose.yaml").read_text())
    code = compose["services"]["eagle_forge_code"]
    env = code["environment"]
    shared = [v.split(":")[1] for v in code["volumes"] if v.startswith("eagle-forge-home:")]
    assert shared == [env["EAGLE_FORGE_HOME"]]
    assert not _under(env["EAGLE_FORGE_SCRATCH"], shared[0])


def test_the_scratch_setting_moves_duckdb_spill_and_the_simulator(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "shared_home"))
    monkeypatch.delenv("EAGLE_FORGE_SCRATCH", raising=False)
    assert Path(str(DuckDBResource().settings().temp_directory)) == tmp_path / "shared_home" / "duckdb_tmp"  # as before
    monkeypatch.setenv("EAGLE_FORGE_SCRATCH", str(tmp_path / "local"))
    assert Path(str(DuckDBResource().settings().temp_directory)) == tmp_path / "local" / "duckdb_tmp"
    assert layout.simulator_dir() == tmp_path / "local" / "simulator"
