"""SIGKILL a running `dagster asset materialize` at random moments, restart, and check the books.

The small version of ``benchmarks/soak.py``: real Dagster CLI process groups, the simulator in its own
process (answering in OpenRouter's real shapes), loopback only. The lives run their step in the CLI's own process
(``SoakConfig.in_process``): one Python start less per life; the group's SIGKILL ends it the same way. The long
statistical run (20,000 prompts at 2000 in flight, 5 kills, a 3,000-prompt storm) is ``python benchmarks/soak.py``
(``--stream`` for SSE), which prints its figures and exits non-zero when a guarantee fails."""

import pytest

from benchmarks.soak import SoakConfig, broken_guarantees, run_soak


def check(result: dict, cfg: SoakConfig) -> None:
    assert broken_guarantees(result, cfg) == []  # what benchmarks/soak.py's exit status holds a long run to
    assert result["final_run_ok"]
    assert result["records_lost"] == 0
    assert result["records_duplicated"] == 0
    assert result["records"] == cfg.prompts
    assert result["simulator_billed_usd"] <= result["spent_usd"] + 1e-9 <= cfg.budget_usd + 1e-9
    assert result["output_tokens"] <= cfg.token_budget
    # Only what was in flight at a kill can have been bought twice.
    assert result["rebought_in_flight_at_kills"] <= cfg.kills * cfg.concurrency
    assert result["streamed_share_of_last_200"] == (1.0 if cfg.stream else 0.0)
    # While /generation did not know them, the kills' orphans and uncertain attempts stayed charged; once it
    # did, one settlement pass brought the books to what was billed (what still differs: no id was seen).
    st = result["settlement"]
    assert st["uncertain_after"] == 0 and st["charged_after_usd"] <= st["charged_before_usd"] + 1e-9
    assert st["kill_cost_after_usd"] <= st["kill_cost_before_usd"] + 1e-9
    assert st["charged_after_usd"] == pytest.approx(result["spent_usd"])
    # Held against the key's usage counter, the requests killed before their head cost what the key was billed:
    # the books end within 5% of the bill (before the counter, what the admission bound held for them stayed).
    assert st["charged_after_usd"] <= 1.05 * result["simulator_billed_usd"] + 1e-6
    assert st["key_usage_refunded_usd"] is not None  # the final pass did read the key's counter
    assert st["kill_cost_headless_after_usd"] <= st["kill_cost_headless_before_usd"] + 1e-9


@pytest.mark.slow
def test_sigkill_without_faults_loses_and_duplicates_nothing(tmp_path):
    cfg = SoakConfig(
        prompts=500,
        kills=2,
        concurrency=64,
        latency_median_s=0.1,
        faults={},
        budget_usd=3.0,
        max_tokens=128,
        storm_prompts=0,
        seed=3,
        time_limit_s=240,
        in_process=True,
    )
    result = run_soak(cfg, tmp_path, log=lambda _: None)
    check(result, cfg)
    assert len(result["kills"]) == 2 and all(k["at_records"] > 0 for k in result["kills"])
    st = result["settlement"]
    # Requests in flight at a kill had named their generation in the head: settled to what was billed, not
    # charged their worst case for good.
    assert st["resolved"] > 0 and st["kill_cost_after_usd"] < st["kill_cost_before_usd"]
    assert st["by_kind_after"].get("orphan_settled", 0) > 0


@pytest.mark.slow
def test_small_soak_with_mixed_faults_streaming(tmp_path):
    """Streamed: faults and SIGKILLs land mid-stream, and cut streams are settled by their generation id.

    1,000 prompts at 200 in flight (3,000 at 500 before: a third of the CPU, the same checks; the long run is
    ``benchmarks/soak.py --stream``). No 429 storm here: one more Dagster run of its own, where the engine's storm
    test (``test_engine_sim.py::test_429_storm_adapts_concurrency_and_completes``) already holds that behaviour and
    the benchmark's second phase measures its goodput through the CLI."""
    cfg = SoakConfig(
        stream=True,
        prompts=1000,
        kills=2,
        concurrency=200,
        latency_median_s=0.4,
        budget_usd=100.0,
        token_budget=10_000_000,
        storm_prompts=0,
        seed=11,
        time_limit_s=300,
        in_process=True,
    )
    result = run_soak(cfg, tmp_path, log=lambda _: None)
    check(result, cfg)
    assert result["requests_sent_to_simulator"] > cfg.prompts  # the faults really were retried
