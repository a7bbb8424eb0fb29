"""The API key never leaks: not into the Dagster event log or storage, files the project writes,
captured logs, nor exception texts; and a key file readable by others is warned about."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import orjson
import pytest

from eagle_assets.settings import REPO_ROOT
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.openrouter.resource import SIMULATOR_KEY, OpenRouterResource
from resources.openrouter.secret import ApiKey, MissingApiKeyError, check_key_file_permissions, load_api_key
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.simulator.harness import run_simulator_in_thread

CANARY = "sk-or-v1-CANARY7f3a9e21d4c8b6"


def files_containing(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file():
            try:
                if needle in p.read_bytes():
                    hits.append(p)
            except OSError:
                pass
    return hits


def test_api_key_repr_and_missing_key_message(tmp_path, monkeypatch):
    k = ApiKey(CANARY)
    assert CANARY not in repr(k) and CANARY not in str(k) and CANARY not in f"{k}"
    monkeypatch.delenv("EAGLE_TEST_NO_KEY", raising=False)
    with pytest.raises(MissingApiKeyError, match=r"looked in file .*missing.txt or \$EAGLE_TEST_NO_KEY"):
        load_api_key(str(tmp_path / "missing.txt"), "EAGLE_TEST_NO_KEY")
    monkeypatch.setenv("EAGLE_TEST_KEY", CANARY)
    assert load_api_key(str(tmp_path / "missing.txt"), "EAGLE_TEST_KEY").reveal() == CANARY


def test_key_file_permissions_are_checked(tmp_path):
    f = tmp_path / "key.txt"
    f.write_text(CANARY + "\n")
    f.chmod(0o644)
    assert "readable by other users" in check_key_file_permissions(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_api_key(str(f), None).reveal() == CANARY
    assert any("chmod 600" in str(w.message) for w in caught)
    assert all(CANARY not in str(w.message) for w in caught)
    f.chmod(0o600)
    assert check_key_file_permissions(f) is None


def _materialize(
    home: Path, dagster_home: Path, datasets: Path, key_file: Path, port: str, extra: list[str]
) -> subprocess.CompletedProcess[str]:
    """``dagster asset materialize`` of S1's partition, the key in both the key file and the environment."""
    env = {
        **os.environ,
        "EAGLE_FORGE_HOME": str(home),
        "EAGLE_FORGE_DATASETS": str(datasets),
        "EAGLE_FORGE_SIM_PORT": port,
        "DAGSTER_HOME": str(dagster_home),
        "PYTHONPATH": str(REPO_ROOT),
        "EAGLE_FORGE_KEY_FILE": str(key_file),
        "OPENROUTER_API_KEY": CANARY,
    }
    cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_assets.definitions"]
    cmd += ["--select", "generated/S1", "--partition", "0000", *extra]
    return subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("accepted", ["same", "other"])
def test_full_materialization_leaves_no_trace_of_the_key(tmp_path, accepted):
    home, dagster_home = tmp_path / "home", tmp_path / "dh"
    dagster_home.mkdir()
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(
        b"".join(
            orjson.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"hi {i}"}]}) + b"\n"
            for i in range(30)
        )
    )
    datasets = tmp_path / "datasets.yaml"
    datasets.write_text(f"datasets:\n  S1: {{path: {prompts}, shard_size: 30}}\n")
    key_file = tmp_path / "or-key.txt"
    key_file.write_text(CANARY)
    key_file.chmod(0o644)  # deliberately too open: the run must warn, without printing the key
    keys = frozenset({CANARY if accepted == "same" else "sk-or-v1-somebody-else"})
    config = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005),
        accepted_keys=keys,
        tokenizer_dir=resolve_tokenizer_dir(),
        state_file=home / "sim.json",
    )
    # The rejected key's run takes Dagster's in_process executor: its step runs in the CLI's own process, not in a
    # spawned child that imports dagster and the definitions again (~5 CPU s); the accepted key's run keeps the
    # default executor, so the step child's captured output is searched too.
    executor = ["--config-json", '{"execution": {"config": {"in_process": {}}}}'] if accepted == "other" else []
    with run_simulator_in_thread(config) as sim:
        port = sim.base_url.split(":")[2].split("/")[0]
        out = _materialize(home, dagster_home, datasets, key_file, port, executor)
    captured = out.stdout + out.stderr
    if accepted == "same":
        assert out.returncode == 0, captured[-3000:]
        assert "readable by other users" in captured
    else:
        assert out.returncode != 0 and "401" in captured
    assert CANARY not in captured
    needle = CANARY.encode()
    assert files_containing(dagster_home, needle) == []
    leaked = [p for p in files_containing(home, needle) if p != home / "sim.json"]
    assert leaked == []
    assert (home / "journal" / "S1").exists() or accepted == "other"


def test_only_a_missing_key_falls_back_to_the_simulators_on_loopback(tmp_path, monkeypatch):
    """A key file that cannot be read is reported, not taken for an absent key and replaced."""
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    garbled = tmp_path / "key.txt"
    garbled.write_bytes(b"\xff\xfe not UTF-8")
    garbled.chmod(0o600)
    local = {"base_url": "http://127.0.0.1:1/api/v1", "api_key_env": "NO_SUCH_KEY_VAR"}
    with pytest.raises(UnicodeDecodeError):
        OpenRouterResource(api_key_file=str(garbled), **local).api_key()
    assert OpenRouterResource(api_key_file=str(tmp_path / "none"), **local).api_key().reveal() == SIMULATOR_KEY
