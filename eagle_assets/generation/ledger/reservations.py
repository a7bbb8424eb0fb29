"""Admission on the ledger: reserving requests in order until one does not fit (the dollar bound, the datasets'
token budgets, the key's credit), the outlook at a budget's tail, and the account-wide in-flight cap."""

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from eagle_assets.generation.admission import (
    LengthModel,
    Moments,
    OpenGroup,
    expected_usd,
    fair_shares,
    held_usd,
    token_admission,
)
from eagle_assets.generation.ledger.base import reconnecting
from eagle_assets.generation.ledger.database import Cursor
from eagle_assets.generation.ledger.owners import OwnersRole
from eagle_assets.generation.ledger.records import (
    GLOBAL,
    NANO,
    Denial,
    Outlook,
    Reservation,
    ReservationRequest,
    dataset_scope,
    to_nano,
)

DEAD_OWNER_CHECK_S = 5.0


@dataclass
class _Open:
    """What is open on the ledger, aggregated as admission needs it (one snapshot per transaction)."""

    spent: float
    hard_usd: float
    all_usd: float
    groups: dict[str, OpenGroup] = field(default_factory=dict)


@dataclass(frozen=True)
class _Tokens:
    """A dataset's output tokens when a reservation transaction began: produced, and open on the ledger (requests
    and their max_tokens); ``seed``: the other datasets' answers, for a fresh one (admission's first wave)."""

    produced: int
    open_count: int
    open_max_tokens: int
    seed: Moments | None


@dataclass(frozen=True)
class _Last:
    """A dataset's last request in a prefix, and how many of its requests (and their max_tokens) come before it:
    the token check asks about the last one with the others already open."""

    request: ReservationRequest
    before: int = 0
    before_max_tokens: int = 0


def _with_requests(base: _Open, requests: list[ReservationRequest], hard: bool) -> tuple[_Open, dict[str, _Last]]:
    """What would be open with ``requests`` added to ``base``, and each dataset's last request among them."""
    snap = _Open(base.spent, base.hard_usd, base.all_usd, dict(base.groups))
    lasts: dict[str, _Last] = {}
    for r in requests:
        snap.all_usd += r.worst_usd
        if hard:
            snap.hard_usd += r.worst_usd
        else:
            prompt_usd = r.worst_usd if r.prompt_usd is None else r.prompt_usd
            g = snap.groups.get(r.dataset, OpenGroup())
            snap.groups[r.dataset] = g.plus(r.worst_usd, prompt_usd, r.price, r.max_tokens)
        prev = lasts.get(r.dataset)
        lasts[r.dataset] = (
            _Last(r) if prev is None else _Last(r, prev.before + 1, prev.before_max_tokens + prev.request.max_tokens)
        )
    return snap, lasts


def longest_fit(n: int, check: Callable[[int], Denial | None]) -> tuple[int, Denial | None]:
    """How many of ``n`` requests fit, in order, and why one more does not (None: all ``n`` fit). Every condition of
    ``check(k)`` only tightens as ``k`` grows, so bisection finds the longest prefix, usually in one call."""
    denial = check(n)
    if denial is None:
        return n, None
    lo, hi = 0, n  # the first lo fit; the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        why = check(mid)
        if why is None:
            lo = mid
        else:
            hi, denial = mid, why
    return lo, denial


class ReservationsRole(OwnersRole):
    _last_dead_check: float

    @reconnecting(idempotent=True)
    def outlook(self, request: ReservationRequest, batch: int) -> Outlook:
        """Numbers for the decision to stop at a budget's tail (see ``Outlook``)."""
        with self.db.read() as cur:
            snap = self._open(cur)
            moments = {d: self._moments(cur, d) for d in {*snap.groups, request.dataset}}
            open_expected: float | None = 0.0
            for d, g in snap.groups.items():
                one = expected_usd([(g, self._model(moments[d], g.max_tokens))])
                if one is None or open_expected is None:
                    open_expected = None
                    continue
                paid, priced = cur.execute("SELECT paid, priced FROM lengths WHERE dataset = ?", (d,)).fetchone()
                open_expected += one * (min(1.0, paid / priced) if priced > 0 else 1.0)
            model = self._model(moments[request.dataset], request.max_tokens)
            prompt_usd = request.worst_usd if request.prompt_usd is None else request.prompt_usd
            g = OpenGroup.of(batch, request.worst_usd, prompt_usd, request.price, request.max_tokens)
            batch_held = g.worst_usd if self.policy.hard else held_usd([(g, model)], self.policy)
            row = cur.execute(
                "SELECT tokens_spent, in_flight FROM totals WHERE scope = ?", (dataset_scope(request.dataset),)
            ).fetchone()
        produced, open_count = row or (0, 0)
        return Outlook(
            None if open_expected is None or self.policy.hard else snap.spent + snap.hard_usd + open_expected,
            batch_held,
            None if model is None else produced + open_count * model.mean,
            None if model is None else model.mean,
        )

    @reconnecting(idempotent=True)
    def open_held_usd(self) -> float:
        """What the open reservations hold of the dollar budget now (the admission check's left side, less spend)."""
        with self.db.read() as cur:
            snap = self._open(cur)
            return self._held(cur, snap, {}) - snap.spent

    def _open(self, cur: Cursor) -> _Open:
        (spent,) = cur.execute("SELECT usd_spent FROM totals WHERE scope = ?", (GLOBAL,)).fetchone() or (0,)
        snap = _Open(spent / NANO, 0.0, 0.0)
        rows = cur.execute(
            "SELECT dataset, hard, COUNT(*), SUM(usd), SUM(prompt_usd), SUM(price), SUM(price * price), MAX(price),"
            " MAX(tokens) FROM reservations GROUP BY dataset, hard"
        ).fetchall()
        for dataset, hard, count, usd, prompt, p1, p2, pmax, tmax in rows:
            snap.all_usd += usd / NANO
            if hard:
                snap.hard_usd += usd / NANO
            else:
                snap.groups[dataset] = OpenGroup(count, usd / NANO, prompt / NANO, p1, p2, pmax, tmax)
        return snap

    def _held(self, cur: Cursor, snap: _Open, models: dict[str, Moments]) -> float:
        """``spent`` plus what everything open holds, under this ledger's policy."""
        if self.policy.hard:
            return snap.spent + snap.all_usd
        for d in snap.groups:
            if d not in models:
                models[d] = self._moments(cur, d)
        groups = [(g, self._model(models[d], g.max_tokens)) for d, g in snap.groups.items()]
        return snap.spent + snap.hard_usd + held_usd(groups, self.policy)

    @reconnecting(idempotent=False)
    def reserve_many(
        self,
        requests: Iterable[ReservationRequest | tuple[str, str, str, float, int]],
        *,
        budget_usd: float,
        token_budget: int | None,
        account_cap_usd: float | None = None,
        min_grant: int = 1,
    ) -> tuple[list[Reservation], Denial | None]:
        """Reserve requests in order until one does not fit; all or nothing below ``min_grant``.

        ``account_cap_usd``: the most the ledger's total spend may reach on the key's remaining credit (a denial on
        it reads ``credits``). A plain tuple ``(dataset, partition, prompt_id, usd, tokens)`` costs a fixed ``usd``.
        """
        if self.account is not None:
            self._check_account("budget_usd", to_nano(budget_usd) / NANO, to_nano(self.account.budget_usd) / NANO)
        reqs = [r if isinstance(r, ReservationRequest) else ReservationRequest(*r) for r in requests]
        cap, cap_reason = budget_usd, "usd"
        if account_cap_usd is not None and account_cap_usd < budget_usd:
            cap, cap_reason = account_cap_usd, "credits"
        with self.db.tx() as cur:
            self._assert_alive(cur)
            base = self._open(cur)
            moments: dict[str, Moments] = {}
            tokens = {} if token_budget is None else self._dataset_tokens(cur, {r.dataset for r in reqs}, moments)

            def check(k: int) -> Denial | None:
                """Why the first ``k`` requests do not all fit (the dollar cap first, then each dataset's tokens)."""
                snap, lasts = _with_requests(base, reqs[:k], self.policy.hard)
                denial = self._dollar_denial(cur, snap, moments, cap, cap_reason)
                if denial is None and token_budget is not None:
                    denial = self._token_denial(lasts, tokens, moments, token_budget)
                return denial

            fit, denial = longest_fit(len(reqs), check)
            if denial is not None and fit < min_grant:
                return [], Denial(denial.reason, denial.detail, fit=fit)
            granted = [(r, r.worst_usd if r.prompt_usd is None else r.prompt_usd) for r in reqs[:fit]]
            out = self._insert_many(cur, granted, self.policy.hard)
        if denial is not None:
            denial = Denial(denial.reason, denial.detail, fit=len(out))
        return out, denial

    def _dataset_tokens(self, cur: Cursor, datasets: Iterable[str], moments: dict[str, Moments]) -> dict[str, _Tokens]:
        """Each dataset's output tokens as the transaction began; its answers' moments go into ``moments``."""
        out = {}
        for d in datasets:
            row = cur.execute(
                "SELECT tokens_spent, in_flight, tokens_reserved FROM totals WHERE scope = ?", (dataset_scope(d),)
            ).fetchone()
            produced, open_count, open_max_tokens = row or (0, 0, 0)
            moments[d] = self._moments(cur, d)
            fresh = moments[d].n < self.policy.min_samples and not self.policy.hard
            out[d] = _Tokens(produced, open_count, open_max_tokens, self._seed_moments(cur, d) if fresh else None)
        return out

    def _dollar_denial(
        self, cur: Cursor, snap: _Open, moments: dict[str, Moments], cap: float, cap_reason: str
    ) -> Denial | None:
        """Why what ``snap`` holds, on top of what was spent, does not fit under ``cap``, or None."""
        need = self._held(cur, snap, moments)
        if to_nano(need) <= to_nano(cap):
            return None
        what = "budget" if cap_reason == "usd" else "the key's remaining credit"
        return Denial(
            cap_reason,
            f"${snap.spent:.4f} spent + ${need - snap.spent:.4f} held by requests in flight would pass"
            f" ${cap:.2f} ({what}{', worst case' if self.policy.hard else ''})",
        )

    def _token_denial(
        self, lasts: dict[str, _Last], tokens: dict[str, _Tokens], moments: dict[str, Moments], token_budget: int
    ) -> Denial | None:
        """Why some dataset's last request would pass its token budget with its others open, or None."""
        for d, last in lasts.items():
            t = tokens[d]
            decision = token_admission(
                produced=t.produced,
                open_count=t.open_count + last.before,
                open_max_tokens=t.open_max_tokens + last.before_max_tokens,
                new_max_tokens=last.request.max_tokens,
                budget=token_budget,
                model=self._model(moments[d], last.request.max_tokens)
                or (None if t.seed is None else LengthModel.seeded(t.seed, self.policy, last.request.max_tokens)),
                policy=self.policy,
            )
            if not decision.admit:
                return Denial("tokens", decision.detail)
        return None

    def _insert_many(
        self, cur: Cursor, granted: list[tuple[ReservationRequest, float]], hard: bool
    ) -> list[Reservation]:
        if not granted:
            return []
        next_seq: dict[str, int] = {}
        for r, _ in granted:
            if r.dataset not in next_seq:
                cur.execute("INSERT INTO lengths(dataset) VALUES (?) ON CONFLICT DO NOTHING", (r.dataset,))
                (next_seq[r.dataset],) = cur.execute(
                    "SELECT next_seq FROM lengths WHERE dataset = ?", (r.dataset,)
                ).fetchone()
        out, rows = [], []
        deltas: dict[str, dict[str, int]] = {}
        now = time.time()
        for r, prompt_usd in granted:
            seq = next_seq[r.dataset]
            next_seq[r.dataset] = seq + 1
            ident = (uuid.uuid4().hex, r.dataset, r.partition, r.prompt_id)
            res = Reservation(*ident, r.worst_usd, r.max_tokens, seq, hard, prompt_usd, r.price)
            out.append(res)
            held = (to_nano(r.worst_usd), r.max_tokens, now, seq, int(hard), to_nano(prompt_usd), r.price, 0)
            rows.append((res.id, self.owner, r.dataset, r.partition, r.prompt_id, *held))
            for scope in (GLOBAL, dataset_scope(r.dataset)):
                d = deltas.setdefault(scope, dict(usd_reserved=0, tokens_reserved=0, in_flight=0))
                d["usd_reserved"] += to_nano(r.worst_usd)
                d["tokens_reserved"] += r.max_tokens
                d["in_flight"] += 1
        cur.executemany(
            "INSERT INTO reservations (id, owner, dataset, partition, prompt_id, usd, tokens, created, seq, hard,"
            " prompt_usd, price, sent) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        cur.executemany("UPDATE lengths SET next_seq = ? WHERE dataset = ?", [(v, k) for k, v in next_seq.items()])
        self._bump_many(cur, deltas)
        return out

    @reconnecting(idempotent=True)
    def lease_slots(self, want: int, in_use: int, capacity: int) -> int:
        """How many requests this process may have in flight now, out of ``capacity`` for the whole ledger: a fair
        share of what every process wants, never more than the others leave free. A process above its share keeps
        the slots it uses until its requests finish, so the sum held never passes the capacity."""
        if self.account is not None:
            self._check_account("max_in_flight", capacity, self.account.max_in_flight)
        if time.monotonic() - self._last_dead_check > min(DEAD_OWNER_CHECK_S, self.lease_s / 10):
            self.recover_dead_owners()
        with self.db.tx(durable=False) as cur:  # re-leased every 0.1 s: soft state
            self._assert_alive(cur)
            rows = cur.execute("SELECT owner, want, held FROM slots WHERE owner != ?", (self.owner,)).fetchall()
            wants = {o: w for o, w, _ in rows}
            wants[self.owner] = want
            share = fair_shares(wants, capacity)[self.owner]
            limit = max(0, min(share, capacity - sum(h for _, _, h in rows)))
            cur.execute(
                "INSERT INTO slots (owner, want, held) VALUES (?,?,?)"
                " ON CONFLICT(owner) DO UPDATE SET want = excluded.want, held = excluded.held",
                (self.owner, want, max(in_use, limit)),
            )
        return limit
