"""Every file under deploy/ is checked by what reads it: Dagster loads the instance (dagster-postgres on a real
PostgreSQL), dagster-k8s parses the step tags and builds their pods, the Kubernetes client reads the Helm
values' pod snippets, Dagster's workspace schema reads the Compose workspace. (Docker itself is not run.)"""

import json
import shlex
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml
from click.testing import CliRunner
from dagster._cli import cli as dagster_cli
from dagster._core.execution.api import create_execution_plan
from dagster._core.workspace.config_schema import process_workspace_config
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config
from dagster_k8s.models import k8s_model_from_dict, k8s_snake_case_dict
from kubernetes.client import V1EnvVar, V1Job, V1PodSpec, V1ResourceRequirements, V1Volume, V1VolumeMount

from eagle_assets.k8s_placement import executor_from_env

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _yaml(path: Path):
    return yaml.safe_load(path.read_text())


# --- deploy/dagster.yaml ------------------------------------------------------------------------
@pytest.fixture
def deploy_instance(tmp_path, monkeypatch, local_postgres, fresh_pg_database):
    """deploy/dagster.yaml as is, in a DAGSTER_HOME, pointed at a fresh PostgreSQL database (by Unix socket)."""
    db = fresh_pg_database().split("/")[3].split("?")[0]
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    for key, value in {
        "DAGSTER_POSTGRES_HOST": "",  # empty: libpq takes PGHOST, here the server's socket folder
        "PGHOST": local_postgres.socket_dir,
        "DAGSTER_POSTGRES_USER": "postgres",
        "DAGSTER_POSTGRES_PASSWORD": "",
        "DAGSTER_POSTGRES_DB": db,
    }.items():
        monkeypatch.setenv(key, value)
    return home


@dg.asset(pool="gpu", op_tags={"eagle-forge/stage": "probe"})
def deploy_probe() -> int:
    return 1


def test_dagster_loads_the_deploy_instance_on_postgres(deploy_instance):
    instance = dg.DagsterInstance.from_config(str(deploy_instance))
    try:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 16
        limits = {(t["key"], t.get("value")): t["limit"] for t in queue.tag_concurrency_limits}
        assert limits == {("eagle-forge/pool", "openrouter"): 8, ("eagle-forge/pool", "gpu"): 1}
        assert instance.run_monitoring_enabled and instance.run_retries_enabled
        instance.event_log_storage.set_concurrency_slots("gpu", 1)
        assert dg.materialize([deploy_probe], instance=instance).success
    finally:
        instance.dispose()
    # Another host reading the same file sees the run, its materialization and the pool limit.
    other = dg.DagsterInstance.from_config(str(deploy_instance))
    try:
        runs = other.get_runs()
        assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
        assert other.get_latest_materialization_event(dg.AssetKey("deploy_probe")) is not None
        assert other.event_log_storage.get_concurrency_info("gpu").slot_count == 1
    finally:
        other.dispose()


# --- the step tags dagster-k8s reads --------------------------------------------------------------
def _step_config(key: list[str]):
    from eagle_assets.definitions import defs

    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={dg.AssetKey(key)})
    (step,) = create_execution_plan(job).steps
    return get_user_defined_k8s_config(step.tags)  # what k8s_job_executor reads for the step's pod


@pytest.mark.parametrize("key", [["hidden_states"], ["draft_model"], ["draft_benchmark"]])
def test_gpu_steps_request_gpus_on_gpu_nodes(key):
    config = _step_config(key)
    pod = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image="eagle-forge:test", dagster_home="/opt/dagster/home"),
        ["dagster", "api", "execute_step"],
        "eagle-forge-step",
        config,
    ).spec.template.spec
    (container,) = pod.containers
    assert container.resources.limits["nvidia.com/gpu"] == "8"
    assert container.resources.requests["nvidia.com/gpu"] == "8"
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"}
    assert [t.key for t in pod.tolerations] == ["nvidia.com/gpu"]


@pytest.mark.parametrize("key", [["tokenized", "B1"], ["corpus"]])
def test_tokenization_and_corpus_steps_run_on_cpu_nodes(key):
    config = _step_config(key)
    assert config.pod_spec_config["node_selector"] == {"eagle-forge/node-pool": "cpu"}
    assert config.container_config["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}


def test_generation_steps_run_on_cpu_nodes_and_the_cluster_shape_comes_from_the_environment(monkeypatch):
    config = _step_config(["generated", "B1"])
    assert config.pod_spec_config["node_selector"] == {"eagle-forge/node-pool": "cpu"}
    assert "nvidia.com/gpu" not in json.dumps(config.container_config)
    from eagle_assets.k8s_placement import gpu_step_tags

    monkeypatch.setenv("EAGLE_FORGE_K8S_GPUS", "4")
    monkeypatch.setenv("EAGLE_FORGE_K8S_GPU_NODE_SELECTOR", "pool=h200,zone=a")
    tags = get_user_defined_k8s_config({k: json.dumps(v) for k, v in gpu_step_tags().items()})
    assert tags.container_config["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert tags.pod_spec_config["node_selector"] == {"pool": "h200", "zone": "a"}
    monkeypatch.setenv("EAGLE_FORGE_K8S_GPU_NODE_SELECTOR", "h200")
    with pytest.raises(ValueError, match="key=value"):
        gpu_step_tags()


def test_the_k8s_executor_is_chosen_by_the_environment(monkeypatch):
    from dagster_k8s import k8s_job_executor

    monkeypatch.delenv("EAGLE_FORGE_EXECUTOR", raising=False)
    assert executor_from_env() is None
    monkeypatch.setenv("EAGLE_FORGE_EXECUTOR", "k8s")
    assert executor_from_env() is k8s_job_executor
    monkeypatch.setenv("EAGLE_FORGE_EXECUTOR", "celery")
    with pytest.raises(ValueError, match="EAGLE_FORGE_EXECUTOR"):
        executor_from_env()


# --- deploy/k8s/values.yaml -----------------------------------------------------------------------
def _k8s(model, snippet):
    return k8s_model_from_dict(model, k8s_snake_case_dict(model, snippet))


def test_helm_values_are_kubernetes_objects_and_agree_with_the_instance_file():
    values = _yaml(DEPLOY / "k8s" / "values.yaml")
    (dep,) = values["dagster-user-deployments"]["deployments"]
    env = {e.name: e.value for e in (_k8s(V1EnvVar, e) for e in dep["env"])}
    assert env["EAGLE_FORGE_EXECUTOR"] == "k8s" and env["EAGLE_FORGE_HOME"].startswith("/shared/")
    assert dep["envSecrets"] == [{"name": "eagle-forge"}]  # the key, the ledger URL and its password
    volumes = {v.name: v for v in (_k8s(V1Volume, v) for v in dep["volumes"])}
    mounts = {m.mount_path: m.name for m in (_k8s(V1VolumeMount, m) for m in dep["volumeMounts"])}
    assert volumes[mounts[env["EAGLE_FORGE_HOME"]]].persistent_volume_claim is not None  # shared, RWX
    assert volumes[mounts[env["TMPDIR"]]].empty_dir is not None  # scratch: per node
    _k8s(V1ResourceRequirements, dep["resources"])
    assert dep["dagsterApiGrpcArgs"] == ["--module-name", "eagle_assets.definitions"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    run_pod = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["podSpecConfig"]
    assert _k8s(V1PodSpec, {"containers": [], **run_pod}).node_selector == {"eagle-forge/node-pool": "cpu"}
    assert values["postgresql"]["enabled"] is False
    queue = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    runs = _yaml(DEPLOY / "dagster.yaml")["concurrency"]["runs"]
    assert queue["maxConcurrentRuns"] == runs["max_concurrent_runs"]
    assert queue["tagConcurrencyLimits"] == runs["tag_concurrency_limits"]


# --- deploy/docker --------------------------------------------------------------------------------
def test_compose_file_wires_webserver_daemon_code_server_and_postgres():
    compose = _yaml(DEPLOY / "docker" / "docker-compose.yaml")
    services = compose["services"]
    assert set(services) == {"postgresql", "dagster_init", "eagle_forge_code", "dagster_webserver", "dagster_daemon"}
    pg_env = services["postgresql"]["environment"]
    workspace = _yaml(DEPLOY / "docker" / "workspace.yaml")
    process_workspace_config(workspace)  # Dagster's own schema
    (server,) = [entry["grpc_server"] for entry in workspace["load_from"]]
    code = services["eagle_forge_code"]
    command = code["command"]
    assert server["host"] == "eagle_forge_code" and str(server["port"]) == command[command.index("-p") + 1]
    assert command[command.index("-m") + 1] == "eagle_assets.definitions"
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    home = next(line.split("=", 1)[1] for line in dockerfile.splitlines() if line.startswith("ENV DAGSTER_HOME="))
    for name in ("eagle_forge_code", "dagster_webserver", "dagster_daemon"):
        svc = services[name]
        assert f"../dagster.yaml:{home}/dagster.yaml:ro" in svc["volumes"]
        env = svc["environment"]
        assert env["DAGSTER_POSTGRES_HOST"] == "postgresql"
        assert (env["DAGSTER_POSTGRES_USER"], env["DAGSTER_POSTGRES_PASSWORD"], env["DAGSTER_POSTGRES_DB"]) == (
            pg_env["POSTGRES_USER"],
            pg_env["POSTGRES_PASSWORD"],
            pg_env["POSTGRES_DB"],
        )
        assert svc["depends_on"]["postgresql"]["condition"] == "service_healthy"
        if name != "eagle_forge_code":
            assert "/opt/eagle-forge/deploy/docker/workspace.yaml" in svc["command"]
    ledger_db = code["environment"]["EAGLE_FORGE_DATABASE_URL"].rsplit("/", 1)[1]
    assert f"CREATE DATABASE {ledger_db};" in (DEPLOY / "docker" / "init-ledger.sql").read_text()
    assert "WORKDIR /opt/eagle-forge" in dockerfile


# --- the one-shot instance setup (pools before the first runs) -------------------------------------
def _init_commands(command: list[str]) -> list[list[str]]:
    """``sh -c "dagster … && dagster …"`` → each dagster command's arguments (after ``dagster``)."""
    assert command[:2] == ["sh", "-c"]
    steps = [shlex.split(part) for part in command[2].split("&&")]
    assert all(step[0] == "dagster" for step in steps)
    return [step[1:] for step in steps]


def _pool_limits_of_the_run_queue() -> dict[str, int]:
    runs = _yaml(DEPLOY / "dagster.yaml")["concurrency"]["runs"]
    return {t["value"]: t["limit"] for t in runs["tag_concurrency_limits"] if t["key"] == "eagle-forge/pool"}


def test_compose_sets_the_pools_once_before_anything_claims_them(deploy_instance, monkeypatch):
    """The init service's commands, run by Dagster's own CLI on a fresh PostgreSQL instance, leave both pools'
    rows in place (so no two runs race to create them), with the run queue's limits; every Dagster service waits
    for it to complete."""
    services = _yaml(DEPLOY / "docker" / "docker-compose.yaml")["services"]
    init = services["dagster_init"]
    for name in ("eagle_forge_code", "dagster_webserver", "dagster_daemon"):
        assert services[name]["depends_on"]["dagster_init"]["condition"] == "service_completed_successfully"
    assert "../dagster.yaml:/opt/dagster/home/dagster.yaml:ro" in init["volumes"]
    assert init["image"] == services["eagle_forge_code"]["image"]
    monkeypatch.setenv("DAGSTER_HOME", str(deploy_instance))
    for args in _init_commands(init["command"]):
        result = CliRunner().invoke(dagster_cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    instance = dg.DagsterInstance.from_config(str(deploy_instance))
    try:
        storage = instance.event_log_storage
        limits = {pool: storage.get_concurrency_info(pool).slot_count for pool in storage.get_concurrency_keys()}
    finally:
        instance.dispose()
    assert limits == _pool_limits_of_the_run_queue() == {"openrouter": 8, "gpu": 1}


def test_the_k8s_init_job_runs_the_same_setup_with_the_chart_instance():
    job = _yaml(DEPLOY / "k8s" / "init-pools-job.yaml")
    model = _k8s(V1Job, job)
    pod = model.spec.template.spec
    (container,) = pod.containers
    compose_init = _yaml(DEPLOY / "docker" / "docker-compose.yaml")["services"]["dagster_init"]
    assert _init_commands(container.command) == _init_commands(compose_init["command"])
    values = _yaml(DEPLOY / "k8s" / "values.yaml")
    (dep,) = values["dagster-user-deployments"]["deployments"]
    assert container.image == f"{dep['image']['repository']}:{dep['image']['tag']}"
    env = {e.name: e for e in container.env}
    (mount,) = container.volume_mounts
    assert mount.mount_path == f"{env['DAGSTER_HOME'].value}/dagster.yaml"
    (volume,) = pod.volumes
    assert volume.name == mount.name and volume.config_map.name == "dagster-instance"
    assert env["DAGSTER_PG_PASSWORD"].value_from.secret_key_ref.name == "dagster-postgresql-secret"
    assert pod.restart_policy == "OnFailure"
    assert "kubectl apply -f deploy/k8s/init-pools-job.yaml" in (DEPLOY / "k8s" / "values.yaml").read_text()


def test_the_image_leaves_local_state_and_caches_out():
    """The Compose build context is the repository, whose .dockerignore keeps the venv, the home (a ledger,
    journals), git, caches and test output out of the image."""
    compose = _yaml(DEPLOY / "docker" / "docker-compose.yaml")
    build = compose["services"]["eagle_forge_code"]["build"]
    assert (DEPLOY / "docker" / build["context"]).resolve() == REPO
    ignored = {
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()[:1] not in ("", "#")
    }
    wanted = {".venv", ".eagle_forge", ".git", "test-artifacts", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
    assert wanted <= ignored and "**/__pycache__" in ignored
    assert "COPY . ." in (DEPLOY / "docker" / "Dockerfile").read_text()
