"""Failures that would hit every partition show their real cause in seconds, and the demo's simulator is
stopped by its pid, not by a pattern."""

import json
import os
import shutil
import socket
from pathlib import Path

import dagster as dg
import orjson
import psutil
import pytest

from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.tokenization.tokenizer_source import BUNDLED_DIR
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource
from resources.simulator.embedded import (
    EmbeddedSimulatorError,
    ensure_embedded_simulator,
    is_up,
    pid_file,
    stop_embedded_simulator,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EAGLE_FORGE_SIM_GENERATOR", "kimi-style")  # no torch in the child: starts in ~2 s
    return tmp_path / "home"


def test_missing_tokenizer_fails_the_materialization_in_seconds_naming_the_path(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = tmp_path / "tokenizer"
    shutil.copytree(BUNDLED_DIR, tok)
    monkeypatch.setenv("EAGLE_FORGE_TOKENIZER", str(tok))
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(orjson.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + b"\n")
    asset = build_generated_asset(DatasetSpec("F1", prompts, 10**6, 10))
    port = free_port()
    resource = OpenRouterResource(
        base_url=f"http://127.0.0.1:{port}/api/v1", api_key_file="", start_embedded_simulator=True
    )
    shutil.rmtree(tok)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [asset],
            partition_key="0000",
            instance=instance,
            resources={"openrouter": resource, "duckdb": DuckDBResource()},
            raise_on_error=False,
        )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error, messages, classes = failure.step_failure_data.error, [], []
    while error is not None:
        messages.append(error.message)
        classes.append(error.cls_name)
        error = error.cause
    assert any(str(tok) in m for m in messages), messages
    # Fast because nothing slow ran before it: the named error, in the one attempt, before the simulator was
    # started (no child to wait for), nothing journaled; not a bound on the seconds it took.
    assert "TokenizerFilesError" in classes, classes
    kinds = [e.event_type_value for e in result.all_events]
    assert kinds.count("STEP_START") == 1 and "STEP_UP_FOR_RETRY" not in kinds and "STEP_RESTARTED" not in kinds
    assert not pid_file().exists() and not (home / "simulator" / "simulator.log").exists()
    assert not list(home.rglob("*.journal"))
    assert not is_up(resource.base_url)


def test_a_simulator_that_exits_is_reported_with_its_last_lines(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLE_FORGE_SIM_CREDITS", "not-a-number")
    with pytest.raises(EmbeddedSimulatorError, match="invalid float value: 'not-a-number'") as info:
        ensure_embedded_simulator(f"http://127.0.0.1:{free_port()}/api/v1", wait_s=120)
    # Reported from the child's exit (its code and last lines), not from the 120 s deadline running out.
    assert "exited with code 2" in str(info.value) and "did not answer" not in str(info.value)


def test_the_started_simulator_is_stopped_by_its_pid(home: Path) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/api/v1"
    pid = ensure_embedded_simulator(base_url)
    try:
        assert pid is not None and is_up(base_url)
        assert ensure_embedded_simulator(base_url) is None  # already answering: nothing new started
        recorded = json.loads(pid_file().read_text())
        assert recorded["pid"] == pid and recorded["port"] == int(base_url.split(":")[2].split("/")[0])
        assert stop_embedded_simulator() == pid
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not is_up(base_url) and not pid_file().exists()
        # It flushed its balance on SIGTERM, so a restart keeps the account.
        assert json.loads((home / "simulator" / "state.json").read_text())
    finally:
        if psutil.pid_exists(pid or -1):
            psutil.Process(pid).kill()


def test_a_recycled_pid_is_never_stopped(home: Path) -> None:
    pid_file().parent.mkdir(parents=True, exist_ok=True)
    me = psutil.Process(os.getpid())
    pid_file().write_text(json.dumps({"pid": me.pid, "create_time": me.create_time() - 1000, "port": 1}))
    assert stop_embedded_simulator() is None
    assert me.is_running()
