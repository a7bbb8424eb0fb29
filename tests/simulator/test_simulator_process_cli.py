"""The simulator as a process: its state file across restarts, a spawned child process, and the CLI
(loopback-only hosts, flag parsing, and configs that round-trip through the flags).
"""

import json
from pathlib import Path

import aiohttp
import pytest

from resources.simulator.__main__ import config_from_args
from resources.simulator.config import (
    DEFAULT_PROVIDERS,
    LatencyConfig,
    ProviderEndpoint,
    SimulatorConfig,
    is_loopback_host,
)
from resources.simulator.faults import FaultConfig
from tests.simulator.harness import config_to_args, spawn_simulator_process
from tests.simulator.sim_helpers import get_json, payload, post, simulator

# --------------------------------------------------------------------------------------------
# Persistence, processes, CLI


async def test_state_file_keeps_the_balance_across_restarts(tmp_path: Path):
    state_file = tmp_path / "sim" / "state.json"
    async with aiohttp.ClientSession() as s:
        with simulator(credits=5.0, state_file=state_file) as sim:
            assert (await post(s, sim.base_url, payload("persist me")))[0] == 200
            sim.topup(2.5)
            usage = sim.stats()["credits"]["usage"]
        saved = json.loads(state_file.read_text())
        assert saved["limit"] == 7.5 and saved["usage"] == pytest.approx(usage) and usage > 0
        with simulator(credits=100.0, state_file=state_file) as sim:
            _, key = await get_json(s, f"{sim.base_url}/key")
    assert key["data"]["limit"] == 7.5 and key["data"]["usage"] == pytest.approx(usage)
    assert not [p for p in state_file.parent.iterdir() if p.name != "state.json"]  # no temp files left


async def test_spawned_process_serves_and_persists(tmp_path: Path):
    state_file = tmp_path / "state.json"
    args = [
        "--port",
        "0",
        "--credits",
        "3",
        "--state-file",
        str(state_file),
        "--latency-fixed",
        "0.01",
        "--fault",
        "whitespace_padding=1.0",
        "--seed",
        "7",
    ]
    proc = spawn_simulator_process(args, ready_timeout=30)
    try:
        assert proc.base_url.startswith("http://127.0.0.1:") and proc.base_url.endswith("/api/v1")
        async with aiohttp.ClientSession() as s:
            status, _, raw = await post(s, proc.base_url, payload("from a child process"))
            assert status == 200 and raw[:1].isspace()
        proc.topup(1.0)
        spent = proc.stats()["credits"]["usage"]
    finally:
        assert proc.terminate() == 0
    assert json.loads(state_file.read_text())["limit"] == 4.0
    with spawn_simulator_process(["--port", "0", "--state-file", str(state_file)]) as again:
        async with aiohttp.ClientSession() as s:
            _, key = await get_json(s, f"{again.base_url}/key")
    assert key["data"]["limit"] == 4.0 and key["data"]["usage"] == pytest.approx(spent)


def test_cli_refuses_non_loopback_hosts_and_parses_flags(tmp_path: Path):
    for host in ("0.0.0.0", "192.168.1.5", "example.com", "::"):
        assert not is_loopback_host(host)
        with pytest.raises(SystemExit):
            config_from_args(["--host", host])
    for host in ("127.0.0.1", "127.1.2.3", "localhost", "::1"):
        assert is_loopback_host(host)
    with pytest.raises(ValueError):
        SimulatorConfig(host="0.0.0.0")
    cfg = config_from_args(
        [
            "--port",
            "0",
            "--credits",
            "12",
            "--state-file",
            str(tmp_path / "s.json"),
            "--latency-lognormal",
            "0.4",
            "0.5",
            "--fault",
            "rate_limit=0.05",
            "--fault",
            "stall_seconds=3",
            "--admit-rate",
            "500",
            "--seed",
            "9",
            "--key",
            "k1",
        ]
    )
    assert cfg.credits == 12 and cfg.latency.median_s == 0.4 and cfg.latency.sigma == 0.5 and cfg.seed == 9
    assert cfg.faults.rate_limit == 0.05 and cfg.faults.stall_seconds == 3 and cfg.faults.admit_rate_per_s == 500
    assert cfg.accepted_keys == frozenset({"k1"})
    with pytest.raises(SystemExit):
        config_from_args(["--fault", "rate_limit=2"])


def test_config_round_trips_through_cli_flags(tmp_path: Path):
    cfg = SimulatorConfig(
        port=0,
        seed=3,
        credits=1.25,
        state_file=tmp_path / "s.json",
        accepted_keys=frozenset({"a", "b"}),
        latency=LatencyConfig.lognormal(0.2, 0.7, 0.01, 9.0),
        mean_completion_tokens=50,
        generation_404_ms=20,
        faults=FaultConfig(rate_limit=0.1, stall=0.05, stall_seconds=2, admit_rate_per_s=100, admit_retry_after=False),
        providers=(
            *DEFAULT_PROVIDERS[:2],
            ProviderEndpoint("Acme", "acme", "fp8", 0.3, 1.1),
            ProviderEndpoint("Acme", "acme", None, 0.2, 1.0, status=-2, endpoint_tag="acme/fast"),
            ProviderEndpoint("Bolt", "bolt", "int4", 0.3, 1.2, supported_parameters=("max_tokens", "tools")),
        ),
        unlimited_key=True,
        management_keys=frozenset({"mk"}),
        workspace_budget_usd=2.5,
        leading_space_rate=0.5,
        generation_id_header=False,
        plain_head_first=False,
        request_wide_400="Reasoning is mandatory for this endpoint and cannot be disabled.",
        usage_chunk_with_choice_rate=0.25,
    )
    assert config_from_args(config_to_args(cfg)) == cfg
    assert config_from_args(config_to_args(SimulatorConfig())) == SimulatorConfig()
    fixed = SimulatorConfig(latency=LatencyConfig.fixed(0.05))
    assert config_from_args(config_to_args(fixed)).latency == fixed.latency
