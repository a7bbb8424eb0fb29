"""The two halves of ``BudgetLedger.reserve_many``'s decision: what a prefix of requests adds to what is open, and
the longest prefix that fits. The ledger's own tests cover the decision end to end."""

import pytest

from eagle_assets.generation.ledger import Denial, ReservationRequest
from eagle_assets.generation.ledger.reservations import _Open, _with_requests, longest_fit


def test_longest_fit_bisects_to_the_last_prefix_that_passes():
    asked: list[int] = []

    def fits_up_to(limit: int):
        def check(k: int) -> Denial | None:
            asked.append(k)
            return None if k <= limit else Denial("usd", f"{k} > {limit}")

        return check

    assert longest_fit(10, fits_up_to(10)) == (10, None) and asked == [10]  # everything fits: one call
    fit, denial = longest_fit(10, fits_up_to(6))
    assert fit == 6 and denial is not None and denial.detail == "7 > 6"  # why the next one does not fit
    assert longest_fit(10, fits_up_to(-1)) == (0, Denial("usd", "1 > -1"))
    assert longest_fit(0, fits_up_to(5)) == (0, None)


def test_a_prefix_adds_its_worst_cases_and_names_each_datasets_last_request():
    base = _Open(spent=1.0, hard_usd=0.5, all_usd=0.5)
    reqs = [
        ReservationRequest("A", "A/0", "a0", 0.3, 100, 0.1, 0.002),
        ReservationRequest("B", "B/0", "b0", 0.2, 50, 0.05, 0.003),
        ReservationRequest("A", "A/0", "a1", 0.4, 200, 0.2, 0.001),
        ReservationRequest("A", "A/0", "a2", 0.5, 300, 0.2, 0.001),
    ]
    snap, lasts = _with_requests(base, reqs, hard=False)
    assert snap.all_usd == pytest.approx(0.5 + 1.4) and snap.hard_usd == 0.5 and base.groups == {}
    assert (snap.groups["A"].count, snap.groups["A"].max_tokens, snap.groups["B"].count) == (3, 300, 1)
    assert list(lasts) == ["A", "B"]  # in order of first appearance, as the token check asks them
    assert (lasts["A"].request.prompt_id, lasts["A"].before, lasts["A"].before_max_tokens) == ("a2", 2, 300)
    assert (lasts["B"].request.prompt_id, lasts["B"].before, lasts["B"].before_max_tokens) == ("b0", 0, 0)
    hard, _ = _with_requests(base, reqs, hard=True)
    assert hard.hard_usd == pytest.approx(0.5 + 1.4) and hard.groups == {}
