"""The training sensor with a serving backend configured through the environment: what its runs select,
the benchmark config they carry, and the engine command line that config plans, on a real instance."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.assets.checks import check_specs
from eagle_assets.assets.draft import TINY_TARGET_BENCHMARK_CONFIG, TINY_TARGET_TRAIN_CONFIG
from eagle_assets.assets.draft_benchmark import SERVING_SETS, BenchmarkConfig, plan_serving
from eagle_assets.definitions import sensor_run_config, training_sensor
from eagle_assets.hidden_states.fidelity_spec import CHECKS
from eagle_assets.keys import BENCHMARK_KEY, CORPUS_SHARDS, DRAFT_KEY, HIDDEN_STATES_KEY
from eagle_assets.settings import EnvSettingError
from resources.serving.commands import engine_command
from resources.serving.resource import ServingConfigError, ServingEngineResource, serving_from_env
from resources.target.resource import TargetModelResource

REPO = Path(__file__).resolve().parents[2]
KIMI = "/models/Kimi-K2.5"
SGLANG_ENV = {
    "EAGLE_FORGE_SERVING": "sglang",
    "EAGLE_FORGE_SERVING_MODEL_PATH": KIMI,
    "EAGLE_FORGE_SERVING_TP_SIZE": "4",  # not the resource's default 8: the variable is read
}


@pytest.fixture
def serving_from(monkeypatch: pytest.MonkeyPatch):
    """``serving_from_env`` with exactly ``env``'s serving variables set."""

    def read(env: dict[str, str]) -> ServingEngineResource:
        for name in [n for n in os.environ if n.startswith("EAGLE_FORGE_SERVING")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return serving_from_env()

    return read


@dg.asset(
    key=HIDDEN_STATES_KEY,
    partitions_def=CORPUS_SHARDS,
    check_specs=check_specs(HIDDEN_STATES_KEY, CHECKS, blocking=True, partitions_def=CORPUS_SHARDS),
)
def stored_hidden_states() -> dg.MaterializeResult:
    """A shard's store as the sensor sees it: materialized, its fidelity checks passed (no target run here)."""
    return dg.MaterializeResult(
        check_results=[dg.AssetCheckResult(asset_key=HIDDEN_STATES_KEY, check_name=n, passed=True) for n in CHECKS]
    )


def run_request(sensor: dg.SensorDefinition) -> dg.RunRequest:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_SHARDS.name, ["train-00000"])
        assert dg.materialize([stored_hidden_states], partition_key="train-00000", instance=instance).success
        result = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SensorResult), result
    (request,) = result.run_requests
    return request


def test_with_sglang_configured_the_sensor_benchmarks_at_the_reference_settings_on_the_named_model(
    tmp_path, serving_from
):
    serving = serving_from(SGLANG_ENV)
    request = run_request(training_sensor(TargetModelResource(), serving))
    assert request.asset_selection == [DRAFT_KEY, BENCHMARK_KEY]
    ops = request.run_config["ops"]
    assert ops["draft_model"]["config"] == TINY_TARGET_TRAIN_CONFIG  # the definitions' target is the tiny one
    bench = ops["draft_benchmark"]["config"]
    assert bench != TINY_TARGET_BENCHMARK_CONFIG
    config = BenchmarkConfig(**bench)
    assert (config.num_steps, config.eagle_topk, config.num_draft_tokens) == (3, 1, 4)
    assert (config.temperature, config.max_new_tokens, config.sets) == (0.0, 0, [])  # every set, its own limits
    assert (config.mtbench_prompts, config.gsm8k_prompts, config.humaneval_prompts) == (80, 500, 164)
    assert SERVING_SETS == ("mtbench", "gsm8k", "humaneval", "heldout")

    # what the asset would start: the named checkpoint on the named GPUs, never the tiny target's folder
    export = tmp_path / "export"
    plan = plan_serving(serving, config.speculative(), TargetModelResource(), export, config.batch_size)
    assert plan.launch is not None
    cmd = engine_command("sglang", plan.launch, plan.draft_path, plan.spec)
    assert cmd[cmd.index("--model-path") + 1] == KIMI and cmd[cmd.index("--tp-size") + 1] == "4"
    spec_flags = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    assert [cmd[cmd.index(f) + 1] for f in spec_flags] == ["3", "1", "4"]
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == str(export)
    assert cmd[cmd.index("--cuda-graph-max-bs") + 1] == "1"


def test_without_a_serving_backend_the_tiny_target_keeps_its_small_in_process_benchmark(serving_from):
    request = run_request(training_sensor(TargetModelResource(), serving_from({})))
    assert request.run_config["ops"]["draft_benchmark"]["config"] == TINY_TARGET_BENCHMARK_CONFIG
    assert request.asset_selection == [DRAFT_KEY, BENCHMARK_KEY]
    # a real target and no engine: training only, with the defaults
    assert sensor_run_config(False, serving_from({})) == {}
    real = sensor_run_config(False, serving_from({**SGLANG_ENV, "EAGLE_FORGE_SERVING": "vllm"}))
    assert list(real["ops"]) == ["draft_benchmark"]


def test_starting_an_engine_without_a_model_path_is_refused_loudly(serving_from):
    with pytest.raises(ServingConfigError, match="EAGLE_FORGE_SERVING_MODEL_PATH is not set"):
        serving_from({"EAGLE_FORGE_SERVING": "sglang"})
    attached = serving_from({"EAGLE_FORGE_SERVING": "vllm", "EAGLE_FORGE_SERVING_URL": "http://127.0.0.1:1"})
    assert attached.url and not attached.model_path  # attaching needs no checkpoint
    with pytest.raises(EnvSettingError, match="EAGLE_FORGE_SERVING_TP_SIZE='eight' is malformed"):
        serving_from({**SGLANG_ENV, "EAGLE_FORGE_SERVING_TP_SIZE": "eight"})
    assert serving_from({**SGLANG_ENV, "EAGLE_FORGE_SERVING_TP_SIZE": ""}).tp_size == 8


def _load_definitions(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The definitions as ``dagster dev`` loads them, in a process with ``env`` on top of this one's."""
    script = (
        "import json\n"
        "from eagle_assets import definitions as d\n"
        "print(json.dumps({'serving': d.SERVING.model_dump(), 'sensors': [s.name for s in d.defs.sensors or []]}))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_FORGE_SERVING")}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_definitions_read_the_serving_environment_and_refuse_a_start_without_a_model():
    ok = _load_definitions(SGLANG_ENV)
    assert ok.returncode == 0, ok.stderr[-2000:]
    loaded = json.loads(ok.stdout.strip().splitlines()[-1])
    assert (loaded["serving"]["backend"], loaded["serving"]["model_path"], loaded["serving"]["tp_size"]) == (
        "sglang",
        KIMI,
        4,
    )
    assert "draft_training" in loaded["sensors"]
    refused = _load_definitions({"EAGLE_FORGE_SERVING": "sglang"})
    assert refused.returncode != 0
    assert "ServingConfigError" in refused.stderr and "EAGLE_FORGE_SERVING_MODEL_PATH is not set" in refused.stderr
