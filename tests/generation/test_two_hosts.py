"""Two hosts on one machine against one PostgreSQL, one of them SIGKILLed: the small version of
``benchmarks/two_hosts.py`` (2 datasets, one per process tree, each host with its own DAGSTER_HOME on
dagster-postgres, its own scratch and pid space, flock off; a replacement host takes the dead one's
partition over once its leases expire; then a top-up and a rerun to the end).

One dataset of 300 prompts per host, not two of 150: each partition's Dagster run costs ~3 CPU s whatever its
size, and the ten runs of four datasets made this test cost ~60 CPU s (~40 now), with the same prompts, budget
and checks. The databases are made on the session's PostgreSQL. The long run (8 datasets of 3,000 prompts at
2,000 in flight) is ``python benchmarks/two_hosts.py``, which exits non-zero when a goal is not met."""

import pytest

from benchmarks.two_hosts import TwoHostConfig, run_two_hosts


@pytest.mark.slow
def test_two_hosts_one_killed_share_one_account(tmp_path, local_postgres):
    cfg = TwoHostConfig(
        datasets=2,
        prompts=300,
        concurrency=32,
        latency_median_s=0.1,
        max_tokens=64,
        mean_tokens=45,
        lease_s=3.0,
        # Below 200 answers a dataset's requests each hold their worst case: the budget (60% of what all prompts
        # cost) must stay well above what 32 worst cases hold (a fifth of it here), or a host that starts while
        # the other holds it all stops at once; and an early kill, while host-b surely still runs.
        budget_share=0.6,
        kill_at=0.1,
        launcher="fork",
        time_limit_s=280,
    )
    r = run_two_hosts(cfg, tmp_path, log=lambda _: None, pg=local_postgres)
    assert r["returncodes"]["host-a (top-up)"] == 0
    assert r["returncodes"]["host-a"] == r["returncodes"]["host-c"] == 2  # both stopped by the budget, resumably
    assert r["budget_stops"] == {"host-a": True, "host-c": True}
    assert r["samples"] > 0 and r["samples_over_cap"] == 0 and r["peak_in_flight"] <= cfg.concurrency
    # Both hosts want more than the cap (300 prompts each at 0.1 s), so the account-wide cap binds: the
    # sum reaches near it (32 of 32 on an idle machine, 28 under a full test suite beside: a starved client leaves
    # slots empty for a moment), far above one host's fair half.
    assert r["peak_in_flight"] >= 0.75 * cfg.concurrency
    assert r["spent_phase_1_usd"] <= r["budget_phase_1_usd"] + 1e-9
    assert r["billed_phase_1_usd"] <= r["spent_phase_1_usd"] + 1e-9
    assert r["records_lost"] == 0 and r["records_duplicated"] == 0
    assert set(r["records"].values()) == {cfg.prompts}
    assert r["bought_twice_not_orphaned"] == []  # only what the dead host had in flight was bought again
    assert sum(r["b_records_at_kill"].values()) >= cfg.kill_at * cfg.prompts  # host-b's one dataset
    # The dead host's owners were recovered from another pid space (by its lease: tests/generation/test_leases.py
    # checks against the ledger's own clock that this never happens before the lease lapses), and host-c took
    # its partitions over to the budget stop above; how many seconds that took is the benchmark's figure.
    assert r["leases_recovered_s"] is not None
    assert r["open_at_end"] == 0
