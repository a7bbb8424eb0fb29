"""The serving backends against the loopback stand-ins: real processes, real HTTP, the engines' real shapes."""

import json
import shutil
import sys

import pytest

from eagle_assets.benchmarks.prompt_sets import Conversation
from eagle_assets.benchmarks.serving_benchmark import (
    ServingBenchmarkFailed,
    SetPlan,
    run_serving_benchmark,
)
from eagle_assets.benchmarks.serving_run import Journal
from resources.serving.commands import (
    LaunchSettings,
    SettingsError,
    SpeculativeSettings,
    engine_command,
    free_port,
    sglang_command,
    vllm_command,
)
from resources.serving.errors import ServerStartError
from resources.serving.process import ServerProcess, health_status
from resources.serving.resource import ServingEngineResource
from tests.serving.conftest import FAKE_LAUNCHER

SPEC = SpeculativeSettings(3, 1, 4)
EXPECTED_TAU = 1 + 0.8 + 0.8 * 0.7 + 0.8 * 0.7 * 0.6  # the fakes' default acceptance probabilities


def render(messages):
    """A cheap stand-in for the chat template: a prompt grows with its history, as the real one does."""
    return [1 + (ord(c) % 997) for c in json.dumps(list(messages))][:4000]


def sets(n_chat=3, n_single=4, max_new=64):
    chats = [Conversation(f"c{i}", [f"question {i}", f"follow-up {i}"], "be brief") for i in range(n_chat)]
    single = [Conversation(f"s{i}", prompt_ids=[5, 6, 7, i + 1]) for i in range(n_single)]
    return [SetPlan("mtbench", chats, max_new), SetPlan("heldout", single, max_new)]


def test_command_lines_are_the_engines_own():
    s = LaunchSettings("/models/Kimi-K2.5", port=30000, tp_size=8, batch_size=1)
    assert sglang_command(s, "/d/export", SPEC)[3:] == [
        "--model-path",
        "/models/Kimi-K2.5",
        "--tp-size",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--trust-remote-code",
        "--cuda-graph-max-bs",
        "1",
        "--max-running-requests",
        "1",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/d/export",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    assert sglang_command(s, None, None)[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert "--speculative-algorithm" not in sglang_command(s, None, None)
    v = vllm_command(LaunchSettings("/m", port=8000, tp_size=8, batch_size=4, extra_args=("--x",)), "/d", SPEC)
    assert v[:3] == ["vllm", "serve", "/m"] and v[-1] == "--x"
    assert json.loads(v[v.index("--speculative-config") + 1]) == {
        "method": "eagle3",
        "model": "/d",
        "num_speculative_tokens": 3,
    }
    assert v[v.index("--max-num-seqs") + 1] == "4" and "--speculative-config" not in vllm_command(
        LaunchSettings("/m"), None, None
    )
    with pytest.raises(SettingsError, match="num_steps \\+ 1 = 4"):
        sglang_command(s, "/d", SpeculativeSettings(3, 1, 6))
    with pytest.raises(SettingsError, match="chains only"):
        vllm_command(s, "/d", SpeculativeSettings(3, 4, 8))
    SpeculativeSettings(5, 4, 8).validate("sglang")  # trees are SGLang's to run


def test_sglang_attached_servers_tau_positions_and_speedup(tmp_path, draft_export, target_model, fake_behaviour):
    fake_behaviour(step_time_s=0.002)
    port, base_port = free_port(), free_port()
    launch = LaunchSettings(str(target_model), port=port, tp_size=1, launcher=tuple(FAKE_LAUNCHER["sglang"]))
    spec_server = ServerProcess(
        "sglang", engine_command("sglang", launch, str(draft_export), SPEC), launch.base_url, tmp_path / "spec.log"
    )
    base_launch = LaunchSettings(str(target_model), port=base_port, tp_size=1, launcher=tuple(FAKE_LAUNCHER["sglang"]))
    base_server = ServerProcess(
        "sglang baseline",
        engine_command("sglang", base_launch, None, None),
        base_launch.base_url,
        tmp_path / "base.log",
    )
    with spec_server.start(60, 0.2), base_server.start(60, 0.2):
        resource = ServingEngineResource(backend="sglang", url=launch.base_url, baseline_url=base_launch.base_url)
        plan = resource.plan(SPEC, draft_export, None, batch_size=2)
        run = run_serving_benchmark(
            plan, sets(), render, batch_size=2, temperature=0.0, run_dir=tmp_path / "run", log=lambda m: None
        )
        assert run.engine_version == "0.5.0-fake" and run.servers["draft"].endswith("(attached)")
        records = Journal(run.journal).read()
        by_set = {r.name: r for r in run.results}
        mt = by_set["mtbench"]
        draft = [r for r in records if r.pass_name == "draft" and r.set_name == "mtbench"]
        assert len(draft) == 6 and {r.turn for r in draft} == {0, 1}
        # the second turn carries the first answer: its prompt is longer than the first turn's
        first = {r.conversation: r.prompt_tokens for r in draft if r.turn == 0}
        assert all(r.prompt_tokens > first[r.conversation] + 50 for r in draft if r.turn == 1)
        # τ as SpecForge computes it, from what the server reported
        assert mt.tau == pytest.approx(sum(r.completion_tokens for r in draft) / sum(r.verifications for r in draft))
        assert mt.tau == pytest.approx(EXPECTED_TAU, abs=0.35)
        rates = mt.position_rates
        assert len(rates) == 3 and rates[0] > rates[1] > rates[2] > 0
        assert mt.draft.tally.definition == "output_per_verification"
        # baseline: same prompts, no speculation; speedup is the ratio of the two measured throughputs
        assert mt.baseline is not None and len(mt.baseline.records) == 6
        assert mt.speedup == pytest.approx(mt.draft.tokens_per_s / mt.baseline.tokens_per_s)
        assert mt.summary()["complete"] and by_set["heldout"].summary()["requests"] == 4

        # a server with other settings, or another draft, is refused before a single request
        other = resource.plan(SpeculativeSettings(2, 1, 3), draft_export, None, batch_size=1)
        with pytest.raises(ServingBenchmarkFailed, match="other speculative settings"):
            run_serving_benchmark(
                other, sets(), render, batch_size=1, temperature=0.0, run_dir=tmp_path / "r2", log=lambda m: None
            )
        elsewhere = resource.plan(SPEC, tmp_path / "another-export", None, batch_size=1)
        with pytest.raises(ServingBenchmarkFailed, match="serves the draft"):
            run_serving_benchmark(
                elsewhere, sets(), render, batch_size=1, temperature=0.0, run_dir=tmp_path / "r3", log=lambda m: None
            )
        swapped = ServingEngineResource(backend="sglang", url=base_launch.base_url, baseline_url=launch.base_url)
        with pytest.raises(ServingBenchmarkFailed, match="not EAGLE3"):
            run_serving_benchmark(
                swapped.plan(SPEC, draft_export, None, 1),
                sets(),
                render,
                batch_size=1,
                temperature=0.0,
                run_dir=tmp_path / "r4",
                log=lambda m: None,
            )
    with pytest.raises(ValueError, match="baseline_url"):
        ServingEngineResource(backend="sglang", url=launch.base_url).plan(SPEC, draft_export, None, 1)


def test_vllm_started_servers_read_acceptance_from_metrics(tmp_path, draft_export, target_model, fake_behaviour):
    fake_behaviour(step_time_s=0.002)
    resource = ServingEngineResource(
        backend="vllm", tp_size=1, launcher=FAKE_LAUNCHER["vllm"], health_poll_s=0.2, startup_timeout_s=60
    )
    plan = resource.plan(SPEC, draft_export, target_model, batch_size=4)
    lines: list[str] = []
    run = run_serving_benchmark(plan, sets(), render, batch_size=4, temperature=0.0, run_dir=tmp_path, log=lines.append)
    for r in run.results:
        t = r.draft.tally
        assert t.definition == "accepted_per_draft" and t.tau == pytest.approx(1 + t.accepted / t.verifications)
        assert t.tau == pytest.approx(1 + sum(t.position_rates))
        assert t.output_tokens == r.draft.output_tokens and r.baseline is not None and r.speedup
    assert run.results[0].tau == pytest.approx(EXPECTED_TAU, abs=0.35)
    assert run.engine_version == "0.11.0-fake"
    assert any("starting vllm" in m and "--speculative-config" in m for m in lines)
    assert any(m.startswith("draft pass, mtbench: τ") for m in lines)
    # both servers were started here and are gone
    for name in ("draft", "baseline"):
        assert health_status(run.servers[name].split()[0] + "/health", 1) is None
    assert "$ " in (tmp_path / "vllm-draft.log").read_text()


def test_a_server_dying_mid_run_fails_loudly_and_keeps_what_was_answered(
    tmp_path, draft_export, target_model, fake_behaviour
):
    fake_behaviour(die_after_requests=5, step_time_s=0.002)
    resource = ServingEngineResource(
        backend="sglang", tp_size=1, launcher=FAKE_LAUNCHER["sglang"], health_poll_s=0.2, startup_timeout_s=60
    )
    plan = resource.plan(SPEC, draft_export, target_model, batch_size=1)
    with pytest.raises(ServingBenchmarkFailed) as err:
        run_serving_benchmark(plan, sets(), render, batch_size=1, temperature=0.0, run_dir=tmp_path, log=lambda m: None)
    msg = str(err.value)
    assert "draft pass, set mtbench" in msg and "5 requests were answered" in msg
    assert "exited with code 3" in msg and "simulated crash after 5 requests" in msg
    assert len(Journal(err.value.journal).read()) == 5
    (partial,) = err.value.partial
    assert len(partial.draft.records) == 5 and not partial.complete and partial.tau is not None


@pytest.mark.parametrize(
    ("engine", "death", "engine_words"),
    [
        ("vllm", "exited with code 1 before it was healthy", "Engine core initialization failed"),
        # SGLang's launcher kills its own process tree when the scheduler fails: a signal, not an exit code
        ("sglang", "was killed by SIGKILL (exit status -9) before it was healthy", "Scheduler hit an exception"),
    ],
)
def test_a_refused_draft_folder_stops_the_start_with_the_engines_words(
    tmp_path, draft_export, target_model, fake_behaviour, engine, death, engine_words
):
    broken = tmp_path / "export"
    shutil.copytree(draft_export, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["hidden_size"] = cfg["hidden_size"] * 2  # the weights no longer fit the declared geometry
    (broken / "config.json").write_text(json.dumps(cfg))
    resource = ServingEngineResource(backend=engine, tp_size=1, launcher=FAKE_LAUNCHER[engine], health_poll_s=0.2)
    plan = resource.plan(SPEC, broken, target_model, batch_size=1)
    with pytest.raises(ServingBenchmarkFailed) as err:
        run_serving_benchmark(
            plan, sets(), render, batch_size=1, temperature=0.0, run_dir=tmp_path / "r", log=lambda m: None
        )
    msg = str(err.value)
    assert death in msg and "could not be loaded" in msg and engine_words in msg
    assert "in the draft pass:" in msg and "0 requests were answered" in msg
    assert err.value.partial == []


@pytest.mark.parametrize(
    ("engine", "die_at"),
    [
        ("sglang", {"/flush_cache": 2}),  # the cache flush before the second set
        ("vllm", {"/metrics": 4}),  # the server check, before and after the first set, then before the second
    ],
)
def test_a_server_dying_before_a_sets_first_answer_names_that_set(
    tmp_path, draft_export, target_model, fake_behaviour, engine, die_at
):
    fake_behaviour(die_at=die_at, step_time_s=0.001)
    resource = ServingEngineResource(
        backend=engine, tp_size=1, launcher=FAKE_LAUNCHER[engine], health_poll_s=0.2, startup_timeout_s=60
    )
    plan = resource.plan(SPEC, draft_export, target_model, batch_size=2)
    with pytest.raises(ServingBenchmarkFailed) as err:
        run_serving_benchmark(plan, sets(), render, batch_size=2, temperature=0.0, run_dir=tmp_path, log=lambda m: None)
    msg = str(err.value)
    assert f"{engine} benchmark failed in the draft pass, set heldout:" in msg
    assert "6 requests were answered" in msg and "exited with code 3" in msg
    (mtbench,) = err.value.partial  # the set before, complete and kept
    assert mtbench.name == "mtbench" and mtbench.complete and len(mtbench.draft.records) == 6


def test_an_sglang_that_counts_proposed_drafts_otherwise_is_recorded_not_refused(
    tmp_path, draft_export, target_model, fake_behaviour
):
    fake_behaviour(proposed_per_verification=7, step_time_s=0.001)
    resource = ServingEngineResource(
        backend="sglang",
        tp_size=1,
        launcher=FAKE_LAUNCHER["sglang"],
        health_poll_s=0.2,
        startup_timeout_s=60,
        run_baseline=False,
    )
    lines: list[str] = []
    run = run_serving_benchmark(
        resource.plan(SPEC, draft_export, target_model, batch_size=2),
        sets(),
        render,
        batch_size=2,
        temperature=0.0,
        run_dir=tmp_path,
        log=lines.append,
    )
    mt = run.results[0]
    assert mt.tau == pytest.approx(EXPECTED_TAU, abs=0.35) and mt.complete
    ((message, count),) = mt.summary()["warnings"].items()
    assert "spec_num_proposed_drafts is not spec_verify_ct × 3" in message and count == 6  # every answer
    assert any(line.startswith("warning, draft pass, mtbench: spec_num_proposed_drafts") for line in lines)


def test_a_server_that_never_gets_healthy_is_stopped_at_the_timeout(tmp_path, target_model, fake_behaviour):
    fake_behaviour(starting_s=120)
    launch = LaunchSettings(str(target_model), port=free_port(), tp_size=1, launcher=tuple(FAKE_LAUNCHER["sglang"]))
    proc = ServerProcess("sglang", engine_command("sglang", launch, None, None), launch.base_url, tmp_path / "s.log")
    notes: list[str] = []
    with pytest.raises(ServerStartError, match=r"not healthy after 3s \(HTTP 503") as err:
        proc.start(3, 0.2, notes.append, every_s=1)
    assert "listening on" in str(err.value)  # the log tail
    assert notes and "not healthy yet after" in notes[0] and "listening on" in notes[-1]  # progress while loading

    def interrupted(note: str) -> None:
        raise KeyboardInterrupt  # anything raised while waiting (Ctrl-C in the UI's process) stops the server

    second = ServerProcess("sglang", proc.command, launch.base_url, tmp_path / "s2.log")
    with pytest.raises(KeyboardInterrupt):
        second.start(30, 0.2, interrupted, every_s=0.5)
    assert not second.alive()
    assert not proc.alive() and health_status(launch.base_url + "/health", 1) is None
    # and a port someone else holds is refused before anything is spawned
    fake_behaviour()
    busy = ServerProcess("sglang", engine_command("sglang", launch, None, None), launch.base_url, tmp_path / "b.log")
    with busy.start(60, 0.2):
        again = ServerProcess("sglang", ["true"], launch.base_url, tmp_path / "c.log")
        with pytest.raises(ServerStartError, match="already listens"):
            again.start(5)
