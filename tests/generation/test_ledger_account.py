"""The account's budget and in-flight cap live in the ledger: hosts configured apart are refused, not split.

Each ledger test runs on SQLite and on a real PostgreSQL (``ledger_at``).
"""

import os
import signal

import dagster as dg
import pytest

from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.ledger import AccountSettings, AccountSettingsConflict, BudgetLedger
from eagle_assets.generation.partition_runs import open_ledger
from resources.duckdb.resource import DuckDBResource
from tests.generation.forked import CTX, process
from tests.generation.holders import hold_account
from tests.generation.test_dagster_generation import resource_for, write_prompts

A100 = AccountSettings(100.0, 2000)


def test_a_second_owner_with_another_budget_is_refused(ledger_at):
    at = ledger_at("l")
    first = BudgetLedger(at, account=A100)
    try:
        with pytest.raises(AccountSettingsConflict) as err:
            BudgetLedger(at, account=AccountSettings(800.0, 2000))
        msg = str(err.value)
        assert "$800.00" in msg and "$100.00" in msg and first.owner in msg and "EAGLE_FORGE_BUDGET_USD" in msg
        assert first.account_settings() == A100  # the refused run changed nothing
        with first.db.read() as cur:  # and left no owner behind
            assert cur.execute("SELECT COUNT(*) FROM owners").fetchone()[0] == 1
    finally:
        first.close()


def test_a_second_owner_with_another_in_flight_cap_is_refused(ledger_at):
    at = ledger_at("l")
    first = BudgetLedger(at, account=A100)
    try:
        with pytest.raises(AccountSettingsConflict, match=r"max_in_flight 16,000.*max_in_flight 2,000"):
            BudgetLedger(at, account=AccountSettings(100.0, 16_000))
        same = BudgetLedger(at, account=AccountSettings(100.0, 2000))  # configured alike: welcome
        same.close()
    finally:
        first.close()


def test_a_raise_after_a_top_up_is_taken_once_no_run_holds_the_old_budget(ledger_at):
    at = ledger_at("l")
    first = BudgetLedger(at, account=A100)
    assert first.account_change is None  # the first settings of a ledger are no change
    first.close()
    raised = BudgetLedger(at, account=AccountSettings(150.0, 2000))
    try:
        assert raised.account_settings() == AccountSettings(150.0, 2000)
        assert raised.account_change is not None and "$100.00" in raised.account_change
        assert "$150.00" in raised.account_change and raised.owner in raised.account_change
        history = raised.account_history()
        assert [(before, after) for _, _, _, before, after in history] == [
            (None, A100),
            (A100, AccountSettings(150.0, 2000)),
        ]
        assert history[1][1] == raised.owner and history[1][2] == raised.host  # who changed it, and where
        granted, denial = raised.reserve_many(
            [("B1", "B1/0", f"p{i}", 50.0, 10) for i in range(3)], budget_usd=150.0, token_budget=None
        )
        assert len(granted) == 3 and denial is None  # the raised budget is the one in force
    finally:
        raised.close()


def test_owners_that_only_read_neither_set_nor_block_the_settings(ledger_at):
    at = ledger_at("l")
    observer = BudgetLedger(at)
    try:
        assert observer.account_settings() is None
        run = BudgetLedger(at, account=A100)
        run.close()
        other = BudgetLedger(at, account=AccountSettings(300.0, 500))  # the observer holds no settings
        other.close()
        assert observer.account_settings() == AccountSettings(300.0, 500)
    finally:
        observer.close()


def test_a_dead_run_does_not_hold_the_settings(ledger_at):
    at = ledger_at("l")
    ready = CTX.Event()
    p = process(hold_account, at, A100, ready)
    p.start()
    try:
        assert ready.wait(60)
        with pytest.raises(AccountSettingsConflict, match=f"pid {p.pid}"):
            BudgetLedger(at, account=AccountSettings(200.0, 2000))
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    after = BudgetLedger(at, account=AccountSettings(200.0, 2000))  # its process is gone from this pid space
    after.close()


def test_a_caller_passing_other_settings_than_it_registered_is_refused(ledger_at):
    led = BudgetLedger(ledger_at("l"), account=A100)
    try:
        with pytest.raises(AccountSettingsConflict, match="budget_usd 250"):
            led.reserve_many([("B1", "B1/0", "p", 1.0, 10)], budget_usd=250.0, token_budget=None)
        with pytest.raises(AccountSettingsConflict, match="max_in_flight 4000"):
            led.lease_slots(10, 0, 4000)
        assert led.lease_slots(10, 0, 2000) == 10
    finally:
        led.close()


def test_runs_open_the_ledger_with_the_resource_settings(tmp_path):
    """``open_ledger(spends=True)`` is what every partition run uses: it registers the resource's settings."""
    home = resource_for("http://127.0.0.1:1/api/v1", database_url=str(tmp_path / "ledger.sqlite"), budget_usd=40.0)
    with open_ledger(home, spends=True) as ledger:
        assert ledger.account == AccountSettings(40.0, 32) == ledger.account_settings()
        other = resource_for("http://127.0.0.1:1/api/v1", database_url=str(tmp_path / "ledger.sqlite"))
        with pytest.raises(AccountSettingsConflict, match=r"\$100\.00.*\$40\.00"), open_ledger(other, spends=True):
            pass
        with open_ledger(other) as reader:  # the plan and the account snapshot only read
            assert reader.account is None


def test_a_materialization_configured_apart_fails_before_spending(tmp_path, monkeypatch):
    """Through Dagster: a run whose budget disagrees with a live run's fails naming both, and spends nothing."""
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EAGLE_FORGE_DATABASE_URL", raising=False)
    ledger_file = tmp_path / "ledger.sqlite"
    live = BudgetLedger(ledger_file, account=AccountSettings(100.0, 32))
    try:
        spec = DatasetSpec("P1", write_prompts(tmp_path / "p1.jsonl", 5, "acct"), 10**9, 5)
        # Nothing listens on port 1: a run that got past the ledger would fail on the endpoint table instead.
        res = resource_for("http://127.0.0.1:1/api/v1", database_url=str(ledger_file), budget_usd=500.0)
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                [build_generated_asset(spec)],
                partition_key="0000",
                instance=instance,
                resources={"openrouter": res, "duckdb": DuckDBResource()},
                raise_on_error=False,
            )
            assert not result.success
            failure = result.get_step_failure_events()[0].step_failure_data.error
            text = str(failure.to_string() if failure else "")
        assert "AccountSettingsConflict" in text and "$500.00" in text and "$100.00" in text
        assert live.totals().usd_spent == 0 and live.account_settings() == AccountSettings(100.0, 32)
    finally:
        live.close()
