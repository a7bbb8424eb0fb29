"""SIGKILL a `dagster asset materialize` of an every_turn dataset mid-conversation, rerun it, check the books:
no turn lost, no journaled turn bought again, and the resumed turns built on the answers journaled before.

Both runs take Dagster's in_process executor (``--config-json``): the step runs in the CLI's own process rather
than a spawned child that imports dagster and the definitions again; the group's SIGKILL ends it the same way."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from eagle_assets.generation.journal import scan
from eagle_assets.settings import REPO_ROOT
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.simulator.harness import run_simulator_in_thread

CONVERSATIONS, TURNS = 24, 4


def write_set(path: Path) -> None:
    with path.open("wb") as f:
        for i in range(CONVERSATIONS):
            turns = []
            for k in range(TURNS):
                turns.append({"from": "human", "value": f"Chat {i}, question {k + 1}: say something about {i * k}."})
                turns.append({"from": "gpt", "value": "the set's own answer"})
            f.write(orjson.dumps({"id": f"mt{i:02d}", "conversations": turns}) + b"\n")


def journal_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_sigkill_mid_conversation_resumes_at_the_next_turn_buying_nothing_twice(tmp_path):
    data = tmp_path / "mt.jsonl"
    write_set(data)
    (tmp_path / "datasets.yaml").write_text(
        f"datasets:\n  MT: {{path: {data}, regenerate: every_turn, shard_size: {CONVERSATIONS}}}\n"
    )
    home, journal = tmp_path / "home", tmp_path / "home" / "journal" / "MT" / "0000.journal"
    (tmp_path / "dagster_home").mkdir()
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.4), mean_completion_tokens=30, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim:
        env = {
            **os.environ,
            "EAGLE_FORGE_HOME": str(home),
            "EAGLE_FORGE_DATASETS": str(tmp_path / "datasets.yaml"),
            "EAGLE_FORGE_SIM_PORT": sim.base_url.split(":")[2].split("/")[0],
            "EAGLE_FORGE_MAX_TOKENS": "4096",
            "EAGLE_FORGE_MAX_IN_FLIGHT": "64",
            "DAGSTER_HOME": str(tmp_path / "dagster_home"),
            "PYTHONPATH": str(REPO_ROOT),
        }
        cmd = [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "eagle_assets.definitions"]
        cmd += ["--select", "generated/MT", "--partition", "0000"]
        cmd += ["--config-json", '{"execution": {"config": {"in_process": {}}}}']
        log = (tmp_path / "life.log").open("ab")
        proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, start_new_session=True, stdout=log, stderr=log)
        deadline = time.monotonic() + 180
        while proc.poll() is None and journal_lines(journal) < CONVERSATIONS + 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "life.log").read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        at_kill = sim.stats(0)  # one read: what was billed so far, and what was still being answered
        time.sleep(1.0)  # the simulator bills what was in flight at the kill
        before = {r["prompt_id"]: r for r in scan(journal).records}
        finished = {pid.split("#")[0] for pid in before if pid.endswith(f"#t{TURNS}")}
        mid = {pid.split("#")[0] for pid in before} - finished
        assert mid, "the kill should land with conversations part-way"
        stats = sim.stats(None)
        hash_of = {g["id"]: g["content_hash"] for g in stats["generations"]}
        bought_before = {pid: stats["billed_by_hash"][hash_of[r["generation_id"]]] for pid, r in before.items()}

        final = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]

        records = scan(journal).records
        ids = [r["prompt_id"] for r in records]
        expected = {f"mt{i:02d}#t{k}" for i in range(CONVERSATIONS) for k in range(1, TURNS + 1)}
        assert len(ids) == len(set(ids)) and set(ids) == expected  # nothing lost, nothing journaled twice
        assert set(before) <= set(ids)
        after = sim.stats(None)
        # No turn journaled before the kill was asked again (its request was billed exactly as often as before).
        for pid, n in bought_before.items():
            assert after["billed_by_hash"][hash_of[before[pid]["generation_id"]]] == n, pid
        # The rerun bought the turns not journaled before the kill, and at most the answers that were in flight
        # at the kill (billed by the simulator after it) besides: every turn journaled before was bought once.
        remaining = len(expected) - len(before)
        billed_since_kill = after["billed_requests"] - at_kill["billed_requests"]
        assert remaining <= billed_since_kill <= remaining + at_kill["in_flight"], (remaining, at_kill["in_flight"])
        # A conversation cut at the kill went on from its journaled turns.
        by_id = {r["prompt_id"]: r for r in records}
        for cid in mid:
            done = sorted(int(pid.split("#t")[1]) for pid in before if pid.startswith(cid + "#"))
            nxt = by_id[f"{cid}#t{done[-1] + 1}"]
            history = [m["content"] for m in nxt["messages"] if m["role"] == "assistant"]
            assert history == [before[f"{cid}#t{k}"]["content"] for k in done]
