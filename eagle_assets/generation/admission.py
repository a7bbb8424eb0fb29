"""Admission maths: what the requests in flight hold of a budget, so that 2000 can be in flight.

Plain numbers in, numbers out: no database, no Dagster, no clock. What the guarantees assume and what they give
(1e-6 overspend per run, the token target, a fresh dataset's seed, the last round) is in
docs/generation-and-budget.md; the derivation is here.

Reserving ``max_tokens`` per request would admit a fifth of what the budget pays for (16,384 against a ~3,000
mean for Kimi K2.5), and fewer as it fills.

Dollars: the open requests of a dataset have unknown completion lengths ``X_i`` in ``[0, M]`` (``M =
max_tokens``), independent draws of mean ``μ`` and variance ``σ²``, each priced at ``c_i`` per token (the dearest
allowed price: routing may fall back to it). With ``μ̂`` the mean of ``m`` completed answers and ``C1 = Σ c_i``,

    S − μ̂·C1 = Σ_i c_i (X_i − μ) − (C1 / m) Σ_j (X_j − μ)        (j over the m answers)

is a sum of independent terms, each at most ``b = max(c_max·M, C1·M/m)``, of variance ``V = σ² (C2 + C1²/m)``
(``C2 = Σ c_i²``; the second part, the error of ``μ̂``, dominates while ``m`` is small). Bernstein gives
``P(S − μ̂·C1 ≥ t) ≤ δ`` for ``t = bL/3 + sqrt((bL/3)² + 2LV)``, ``L = ln(1/δ)``; datasets add up, so one check
covers every dataset and process on the ledger. ``σ`` is replaced by an upper confidence bound from the fourth
moment (``σ̂² + z_var·sqrt((m4 − σ̂⁴)/m)``, at most ``μ(M−μ)``), used from ``min_samples`` answers, and answers
count only from *completed admission cohorts*: short answers come back first, so a partial mean is biased low.
Every admission checks ``spent + held ≤ budget`` in one transaction with ``δ = p/(2N)``, so the union bound over
N admissions gives ``p/2``, and the variance bound (``z_var = 5.5``) below ``p/2`` over 25 doublings of the sample.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from eagle_assets.budget_mode import BUDGET_MODES, BudgetMode

MODES = BUDGET_MODES


@dataclass(frozen=True)
class AdmissionPolicy:
    """How admission trades concurrency against the chance of passing a budget."""

    mode: BudgetMode = "statistical"  # hard: every request held at its worst case
    overspend_probability: float = 1e-6  # per run, for the dollar budget
    max_admissions: int = 1_000_000  # admissions per run the guarantee covers (union bound)
    min_samples: int = 200  # completed answers of a dataset before its statistics are used
    variance_z: float = 5.5  # upper confidence bound of the variance (see the module docstring)
    token_overshoot: float = 0.01  # allowed overshoot of a dataset's token budget, as a fraction of it
    token_overshoot_probability: float = 1e-3  # chance of passing that, per dataset
    cohort_slack: float = 0.01  # share of a cohort still open that may be counted at max_tokens
    seed_mean_factor: float = 2.0  # a fresh dataset's token admission trusts other datasets' answers within this
    token_shortfall: float = 0.0  # share of a token target left unproduced rather than start another round

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"budget mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if not 0.0 < self.overspend_probability < 1.0 or not 0.0 < self.token_overshoot_probability < 1.0:
            raise ValueError("probabilities must be in (0, 1)")
        if self.max_admissions < 1 or self.min_samples < 2:
            raise ValueError("max_admissions must be >= 1 and min_samples >= 2")
        if self.token_overshoot < 0 or self.variance_z < 0 or not 0.0 <= self.cohort_slack < 1.0:
            raise ValueError("token_overshoot, variance_z and cohort_slack must be non-negative (slack < 1)")
        if not 0.0 <= self.token_shortfall < 1.0:
            raise ValueError(f"token_shortfall must be in [0, 1), got {self.token_shortfall}")
        if self.seed_mean_factor < 1.0:
            raise ValueError("seed_mean_factor must be >= 1 (a seed is trusted no more than as measured)")

    @property
    def hard(self) -> bool:
        return self.mode == "hard"

    @property
    def dollar_log_term(self) -> float:
        """``L = ln(1/δ)`` of one admission check: half the run's probability spread over its admissions."""
        return math.log(2.0 * self.max_admissions / self.overspend_probability)

    @property
    def token_log_term(self) -> float:
        return math.log(1.0 / self.token_overshoot_probability)


def bernstein_deviation(variance: float, bound: float, log_term: float) -> float:
    """``t`` with ``P(Σ Y ≥ t) ≤ exp(−log_term)`` for independent centred ``Y ≤ bound``, ``Σ Var Y = variance``.

    Solves ``t² = 2L(V + b·t/3)``, Bernstein's inequality set equal to ``e^{-L}``.
    """
    a = log_term * max(bound, 0.0) / 3.0
    return a + math.sqrt(a * a + 2.0 * log_term * max(variance, 0.0))


# --- completion-length statistics ------------------------------------------------------------
@dataclass(frozen=True)
class Moments:
    """Power sums of completion lengths: mergeable across processes and cheap to keep in SQLite."""

    n: int = 0
    s1: float = 0.0
    s2: float = 0.0
    s3: float = 0.0
    s4: float = 0.0

    @staticmethod
    def of(values: Iterable[float]) -> "Moments":
        n, s1, s2, s3, s4 = 0, 0.0, 0.0, 0.0, 0.0
        for x in values:
            x = float(x)
            x2 = x * x
            n, s1, s2, s3, s4 = n + 1, s1 + x, s2 + x2, s3 + x2 * x, s4 + x2 * x2
        return Moments(n, s1, s2, s3, s4)

    def __add__(self, other: "Moments") -> "Moments":
        return Moments(self.n + other.n, self.s1 + other.s1, self.s2 + other.s2, self.s3 + other.s3, self.s4 + other.s4)

    @property
    def mean(self) -> float:
        return self.s1 / self.n if self.n else 0.0

    @property
    def variance(self) -> float:
        if self.n < 2:
            return 0.0
        return max(0.0, (self.s2 - self.s1 * self.s1 / self.n) / (self.n - 1))

    @property
    def fourth_central(self) -> float:
        if not self.n:
            return 0.0
        mu = self.mean
        e2, e3, e4 = self.s2 / self.n, self.s3 / self.n, self.s4 / self.n
        return max(0.0, e4 - 4 * mu * e3 + 6 * mu * mu * e2 - 3 * mu**4)


@dataclass(frozen=True)
class LengthModel:
    """What admission uses of a dataset's answers: the mean and an upper bound of the variance."""

    samples: int
    mean: float
    variance_ucb: float

    @staticmethod
    def from_moments(m: Moments, policy: AdmissionPolicy, max_tokens: int) -> "LengthModel | None":
        """None until ``min_samples`` answers: the caller then holds the worst case."""
        if m.n < policy.min_samples:
            return None
        mean = min(m.mean, float(max_tokens))
        var = m.variance
        spread = math.sqrt(max(0.0, m.fourth_central - var * var) / m.n)
        # A length in [0, M] with mean μ has variance at most μ(M − μ) (Bhatia–Davis).
        cap = max(mean * (max_tokens - mean), 0.0)
        return LengthModel(m.n, mean, min(var + policy.variance_z * spread, cap) if cap else var)

    @staticmethod
    def seeded(seed: Moments, policy: AdmissionPolicy, max_tokens: int) -> "LengthModel | None":
        """A fresh dataset's token model from other datasets' answers, mean scaled by ``seed_mean_factor`` and the
        variance bound by its square; only token admission uses it (docs/generation-and-budget.md)."""
        base = LengthModel.from_moments(seed, policy, max_tokens)
        if base is None:
            return None
        k = policy.seed_mean_factor
        mean = min(k * base.mean, float(max_tokens))
        cap = max(mean * (max_tokens - mean), 0.0)
        return LengthModel(base.samples, mean, min(k * k * base.variance_ucb, cap) if cap else 0.0)


def cohort_moments(
    folded: Moments,
    settled: Sequence[tuple[int, float]],
    open_: Sequence[tuple[int, int]],
    slack: float,
) -> Moments:
    """Moments of the answers of the longest *complete* admission cohort.

    ``folded``: answers before the oldest open admission; ``settled``: ``(seq, tokens)`` of later answers;
    ``open_``: ``(seq, max_tokens)`` still running. The cohort ``seq < K`` is used up to the largest ``K`` whose
    open requests are at most ``slack`` of it, counted at ``max_tokens``: one straggler cannot freeze the
    statistics, and none can make them optimistic.
    """
    events = sorted([(s, 0, float(t)) for s, t in settled] + [(s, 1, float(m)) for s, m in open_])
    best = folded
    n, s1, s2, s3, s4 = folded.n, folded.s1, folded.s2, folded.s3, folded.s4
    opened = 0
    for i, (seq, is_open, x) in enumerate(events):
        x2 = x * x
        n, s1, s2, s3, s4 = n + 1, s1 + x, s2 + x2, s3 + x2 * x, s4 + x2 * x2
        opened += is_open
        boundary = i + 1 == len(events) or events[i + 1][0] != seq
        if boundary and opened <= slack * n:
            best = Moments(n, s1, s2, s3, s4)
    return best


# --- dollars -------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpenGroup:
    """Open statistical reservations of one dataset, as sums (what the ledger aggregates)."""

    count: int = 0
    worst_usd: float = 0.0  # Σ worst case (prompt + max_tokens at the dearest price)
    prompt_usd: float = 0.0  # Σ prompt part of the worst case
    price_sum: float = 0.0  # Σ c_i, completion USD per token
    price_sq_sum: float = 0.0  # Σ c_i²
    price_max: float = 0.0
    max_tokens: int = 0

    @staticmethod
    def of(count: int, worst_usd: float, prompt_usd: float, price: float, max_tokens: int) -> "OpenGroup":
        """``count`` requests alike."""
        return OpenGroup(
            count, count * worst_usd, count * prompt_usd, count * price, count * price * price, price, max_tokens
        )

    def plus(self, worst_usd: float, prompt_usd: float, price: float, max_tokens: int) -> "OpenGroup":
        return OpenGroup(
            self.count + 1,
            self.worst_usd + worst_usd,
            self.prompt_usd + prompt_usd,
            self.price_sum + price,
            self.price_sq_sum + price * price,
            max(self.price_max, price),
            max(self.max_tokens, max_tokens),
        )


def held_usd(groups: Iterable[tuple[OpenGroup, LengthModel | None]], policy: AdmissionPolicy) -> float:
    """The Bernstein bound of the open statistical reservations, never above their worst case (which a group
    without a model holds)."""
    worst_without = worst_with = expected = variance = bound = 0.0
    any_model = False
    for g, model in groups:
        if g.count == 0:
            continue
        if model is None:
            worst_without += g.worst_usd
            continue
        any_model = True
        worst_with += g.worst_usd
        expected += g.prompt_usd + model.mean * g.price_sum
        variance += model.variance_ucb * (g.price_sq_sum + g.price_sum * g.price_sum / model.samples)
        bound = max(bound, g.price_max * g.max_tokens, g.price_sum * g.max_tokens / model.samples)
    if not any_model:
        return worst_without
    stat = expected + bernstein_deviation(variance, bound, policy.dollar_log_term)
    return worst_without + min(worst_with, stat)


def expected_usd(groups: Iterable[tuple[OpenGroup, LengthModel | None]]) -> float | None:
    """What the open statistical reservations will cost on average; None while a group has no model yet."""
    total = 0.0
    for g, model in groups:
        if g.count == 0:
            continue
        if model is None:
            return None
        total += g.prompt_usd + model.mean * g.price_sum
    return total


# --- tokens --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenDecision:
    admit: bool
    detail: str = ""


def token_admission(
    *,
    produced: int,
    open_count: int,
    open_max_tokens: int,
    new_max_tokens: int,
    budget: int,
    model: LengthModel | None,
    policy: AdmissionPolicy,
) -> TokenDecision:
    """May one more request of this dataset start? ``open_max_tokens``: Σ max_tokens of those open."""
    worst = produced + open_max_tokens + new_max_tokens
    if worst <= budget:
        return TokenDecision(True)  # fits even if every open answer runs to max_tokens
    if policy.hard or model is None:
        why = "hard mode" if policy.hard else f"fewer than {policy.min_samples} answers measured"
        return TokenDecision(
            False, f"{produced:,} produced + {open_max_tokens:,} at max_tokens in flight of {budget:,} ({why})"
        )
    expected = produced + open_count * model.mean
    if expected >= budget:
        return TokenDecision(
            False,
            f"{produced:,} produced + {open_count} in flight × {model.mean:.0f} expected ≥ {budget:,}",
        )
    n = open_count + 1
    m = model.samples
    deviation = bernstein_deviation(
        model.variance_ucb * (n + n * n / m), max(new_max_tokens, n * new_max_tokens / m), policy.token_log_term
    )
    # Trivially, the answers cannot pass their max_tokens: never hold more than that.
    held = min(n * model.mean + deviation, open_max_tokens + new_max_tokens)
    ceiling = budget * (1.0 + policy.token_overshoot)
    if produced + held > ceiling:
        return TokenDecision(
            False,
            f"{produced:,} produced + {n} in flight could pass {ceiling:,.0f} (budget + "
            f"{100 * policy.token_overshoot:g}%) with probability above {policy.token_overshoot_probability:g}",
        )
    return TokenDecision(True)


# --- the account-wide in-flight cap ----------------------------------------------------------
def fair_shares(wants: Mapping[str, int], capacity: int) -> dict[str, int]:
    """Water-filling: everyone gets what they want up to an equal share; what is left is shared again."""
    shares = {k: 0 for k in wants}
    left = max(0, capacity)
    hungry = sorted((max(0, w), k) for k, w in wants.items() if w > 0)
    while hungry and left > 0:
        level = left // len(hungry)
        if level == 0:
            for _, k in hungry[:left]:  # a few slots left over: the smallest wants first
                shares[k] += 1
            break
        still = []
        for w, k in hungry:
            give = min(w - shares[k], level)
            shares[k] += give
            left -= give
            if shares[k] < w:
                still.append((w, k))
        hungry = still
    return shares
