"""What a set of token targets will cost before any of it is bought, and what to do when it does not fit.

Plain numbers in, numbers out: the ``generation_plan`` asset gathers the inputs and records the plan, generation
reads its decision (``plan_gate``); docs/generation-and-budget.md says what it shows and assumes. Per dataset,
with ``n`` prompts pending, ``R`` tokens left, answer lengths of mean ``μ`` (standard error ``se``) and spread
``σ``: all ``n`` answered give ``n·μ ± z·sqrt((n·se)² + n·σ²)``; the run stops at the target or the prompts,
whichever comes first (tokens ``min(T, n·μ)``, requests ``min(n, T/μ)``, ``T`` where admission really stops:
``token_target_stop``); prompt tokens are the exact counts of the first ``requests`` prompts; wall time is
``latency × max(1, requests / in_flight)`` (Little's law). The plan *fits* when the 95% upper end of its dollars
fits what is available; otherwise it proposes targets that do.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, astuple, dataclass, field, replace
from itertools import accumulate
from typing import Any

from eagle_assets.errors import GenerationError
from eagle_assets.generation.admission import AdmissionPolicy, Moments, bernstein_deviation

OVERRUN_CHOICES = ("wait", "scale_down", "proceed")
PROPOSAL_RULES = ("equal", "proportional")
Z95 = 1.96
PLAN_VERSION = 1


class PlanInputError(GenerationError, ValueError):
    """An input the plan cannot be made from: the message names it."""


# --- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthStats:
    """Answer lengths in output tokens, and where the numbers come from (shown in the plan)."""

    mean: float
    sd: float
    mean_se: float  # standard error of ``mean``
    samples: int  # measured answers behind it; 0 for a configured prior
    source: str
    variance_ucb: float | None = None  # admission's upper bound of the variance (None: ``sd²``)

    def __post_init__(self) -> None:
        if not self.mean > 0 or self.sd < 0 or self.mean_se < 0:
            raise PlanInputError(f"answer lengths need a positive mean and non-negative spreads ({self.source})")

    @staticmethod
    def measured(m: Moments, source: str) -> "LengthStats":
        if m.n < 2 or m.mean <= 0:
            raise PlanInputError(f"{source}: {m.n} answers are too few to measure lengths from")
        sd = math.sqrt(m.variance)
        policy = AdmissionPolicy()
        spread = math.sqrt(max(0.0, m.fourth_central - m.variance**2) / m.n)
        return LengthStats(m.mean, sd, sd / math.sqrt(m.n), m.n, source, m.variance + policy.variance_z * spread)

    @staticmethod
    def prior(mean: float, sd: float, mean_error: float, source: str = "configured prior") -> "LengthStats":
        """``mean_error``: how far off the prior's mean may be, as a fraction of it (its 1-sigma error)."""
        return LengthStats(mean, sd, mean_error * mean, 0, f"{source}: mean {mean:,.0f} ± {100 * mean_error:.0f}%")


def choose_length_stats(
    dataset: str,
    model: str,
    ledger_lengths: Mapping[str, tuple[str, Moments]],
    min_samples: int,
    prior: LengthStats,
    finished: bool = False,
    pilot: int = 0,
) -> LengthStats:
    """The dataset's own answers in the ledger (``pilot`` of them bought for this plan), else those of the
    other datasets of the same model, else the configured prior. Own answers count from ``min_samples`` (the
    caller passes the pilot's size when a smaller pilot was asked for), or from two once the dataset is
    finished (nothing is left to estimate)."""
    own_model, own = ledger_lengths.get(dataset, (model, Moments()))
    if own_model not in (model, ""):  # answered by another model: says nothing about this one
        own = Moments()
    if own.n >= max(2, min_samples) or (finished and own.n >= 2):
        what = f"pilot of {pilot}, " if pilot else ""
        unknown = ", model not recorded" if not own_model else ""
        return LengthStats.measured(own, f"{dataset}'s answers in the ledger ({what}{own.n:,} in all{unknown})")
    pooled = Moments()
    names: list[str] = []
    for d, (m_, moments) in sorted(ledger_lengths.items()):
        if d != dataset and m_ == model and model and moments.n:
            pooled, names = pooled + moments, [*names, d]
    if pooled.n >= min_samples:
        return LengthStats.measured(pooled, f"other datasets of {model} ({', '.join(names)}: {pooled.n:,} answers)")
    return prior


@dataclass(frozen=True)
class PriceModel:
    """USD per token: expected (the routing mix), and the dearest allowed endpoint (every request falling back)."""

    prompt: float
    completion: float
    max_prompt: float
    max_completion: float
    source: str


@dataclass(frozen=True)
class EndpointPrice:
    provider: str  # display name, as responses name it
    prompt: float  # USD per token
    completion: float


def price_model(allowed: Sequence[EndpointPrice], mix: Mapping[str, int] | None = None) -> PriceModel:
    """Expected prices from the providers that served the answers so far (``mix``: provider → answers), among
    the endpoints allowed now; without any, the cheapest allowed endpoint (``sort: price`` goes there first)."""
    if not allowed:
        raise PlanInputError("no allowed endpoint: nothing can be bought, so nothing can be planned")
    dearest_p, dearest_c = max(e.prompt for e in allowed), max(e.completion for e in allowed)
    by_name: dict[str, EndpointPrice] = {}
    for e in allowed:  # a provider with several allowed endpoints is priced at its dearest
        have = by_name.get(e.provider.lower())
        if have is None or e.completion > have.completion:
            by_name[e.provider.lower()] = e
    seen = {k.lower(): v for k, v in (mix or {}).items() if k and k.lower() in by_name and v > 0}
    total = sum(seen.values())
    if total:
        p = sum(by_name[k].prompt * v for k, v in seen.items()) / total
        c = sum(by_name[k].completion * v for k, v in seen.items()) / total
        shares = ", ".join(f"{by_name[k].provider} {100 * v / total:.0f}%" for k, v in sorted(seen.items()))
        return PriceModel(p, c, dearest_p, dearest_c, f"routing of {total:,} answers so far: {shares}")
    cheapest = min(allowed, key=lambda e: (e.completion, e.prompt))
    return PriceModel(
        cheapest.prompt,
        cheapest.completion,
        dearest_p,
        dearest_c,
        f"cheapest allowed endpoint ({cheapest.provider}: ${cheapest.prompt * 1e6:.2f} / "
        f"${cheapest.completion * 1e6:.2f} per M prompt / output tokens)",
    )


@dataclass(frozen=True)
class DatasetInput:
    name: str
    token_target: int  # the requested output-token target, whole dataset
    produced_tokens: int  # already produced (the ledger)
    spent_usd: float  # already spent on it (the ledger)
    pending: int  # requests not answered yet (every turn of an every_turn conversation is one)
    prompt_tokens: Sequence[int]  # prompt lengths of the first pending requests, in asking order (a prefix is fine)
    lengths: LengthStats
    latency_s: float  # mean seconds per answer
    latency_source: str
    max_tokens: int | None = None  # per request; None: the target is taken as met exactly (no overshoot guard)

    def __post_init__(self) -> None:
        if self.token_target < 0 or self.pending < 0 or len(self.prompt_tokens) > self.pending:
            raise PlanInputError(f"{self.name}: negative target or pending count, or more prompt lengths than prompts")
        if self.pending and not self.prompt_tokens:
            raise PlanInputError(f"{self.name}: {self.pending} prompts pending but no prompt token counts")
        if not self.latency_s > 0:
            raise PlanInputError(f"{self.name}: the latency per answer must be positive ({self.latency_source})")


# --- projection ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """An expected value and its interval."""

    expected: float
    low: float
    high: float

    def scaled(self, k: float) -> "Span":
        return Span(self.expected * k, self.low * k, self.high * k)

    def __add__(self, other: "Span") -> "Span":
        return Span(self.expected + other.expected, self.low + other.low, self.high + other.high)


@dataclass(frozen=True)
class DatasetProjection:
    name: str
    token_target: int
    bound: str  # "target": the token target ends it; "prompts": the prompts run out first; "done"
    requests: Span
    output_tokens: Span
    prompt_tokens: Span
    usd: Span
    usd_dearest: float  # the upper end, every request at the dearest allowed endpoint
    wall_s: float  # alone, at the in-flight cap
    spent_usd: float  # already spent before this plan
    produced_tokens: int
    lengths_source: str
    latency_s: float
    latency_source: str


def requests_needed(lengths: LengthStats, tokens_left: int, pending: int) -> int:
    """How many pending prompts the interval's upper end may need: their prompt lengths are all that must be
    counted exactly (a 10M-token target needs ~3,000 of a 100,000-prompt file)."""
    r = _requests(lengths, tokens_left, pending)
    return min(pending, math.ceil(r.high) + 1)


def token_target_stop(
    target: int,
    lengths: LengthStats,
    max_tokens: int,
    in_flight: int,
    answers_at_end: float,
    tail_fraction: float = 0.1,
) -> Span:
    """Where generation stops on a token target (produced tokens, the whole dataset).

    Near the target the runner starts batches of ``t`` requests (``token_overshoot`` of the target's worth, at
    most ``tail_fraction`` of the cap), each only while ``produced + min(held(t), t·max_tokens)`` stays within
    ``C = target·(1 + token_overshoot)`` (``token_admission``): it ends between ``C − min(held(t), t·max_tokens)``
    and ``C``, expected half a batch above the low end (bench_plan.py: within 1–4%). A run that keeps many
    requests in flight to the end admits further (test_plan.py: 2–3% above the expectation)."""
    policy = AdmissionPolicy()
    mean = lengths.mean
    t = max(1, min(math.ceil(tail_fraction * in_flight), math.ceil(policy.token_overshoot * target / mean)))
    m = max(answers_at_end, 1.0)
    variance = lengths.variance_ucb if lengths.variance_ucb is not None else lengths.sd**2
    held = t * mean + bernstein_deviation(
        variance * (t + t * t / m), max(max_tokens, t * max_tokens / m), policy.token_log_term
    )
    ceiling = target * (1.0 + policy.token_overshoot)
    low = max(0.0, ceiling - min(held, t * max_tokens))
    return Span(min(low + t * mean / 2, ceiling), low, ceiling)


def _requests(s: LengthStats, left: int, n: int) -> Span:
    if n == 0 or left <= 0:
        return Span(0.0, 0.0, 0.0)
    r = left / s.mean
    rel = math.sqrt((s.mean_se / s.mean) ** 2 + (s.sd / s.mean) ** 2 / max(r, 1.0))
    lo, hi = r * max(0.0, 1.0 - Z95 * rel), r * (1.0 + Z95 * rel)
    return Span(min(n, r), min(n, lo), min(n, hi))


def _prompt_tokens_of(cumulative: Sequence[int], count: float) -> float:
    """Prompt tokens of the first ``count`` pending prompts (fractional: interpolated; past the counted
    prefix: extended at the prefix's mean)."""
    if count <= 0 or not cumulative:
        return 0.0
    k = len(cumulative)
    if count >= k:
        return cumulative[-1] + (count - k) * cumulative[-1] / k
    whole = int(count)
    base = cumulative[whole - 1] if whole else 0
    return base + (count - whole) * (cumulative[whole] - base)


def project_dataset(
    inp: DatasetInput,
    prices: PriceModel,
    in_flight: int,
    cumulative: Sequence[int] | None = None,
    tail_fraction: float = 0.1,
) -> DatasetProjection:
    """``cumulative``: running sums of ``inp.prompt_tokens`` when the caller has them (proposals ask many times)."""
    left = max(0, inp.token_target - inp.produced_tokens)
    n, s = inp.pending, inp.lengths
    all_answered, spread = n * s.mean, Z95 * math.sqrt((n * s.mean_se) ** 2 + n * s.sd**2)
    every = Span(all_answered, max(0.0, all_answered - spread), all_answered + spread)
    eps = AdmissionPolicy().token_overshoot
    if inp.max_tokens is None:
        stop = Span(left, left * (1.0 - eps), left * (1.0 + eps))
    else:
        at_end = s.samples + left / s.mean
        whole = token_target_stop(inp.token_target, s, inp.max_tokens, in_flight, at_end, tail_fraction)
        stop = Span(*(max(0.0, v - inp.produced_tokens) for v in astuple(whole)))
    if n == 0 or left == 0 or stop.expected == 0:
        bound = "done"
        tokens = Span(0.0, 0.0, 0.0)
    else:
        bound = "target" if stop.expected <= every.expected else "prompts"
        tokens = Span(min(stop.expected, every.expected), min(stop.low, every.low), min(stop.high, every.high))
    requests = _requests(s, math.ceil(stop.expected) if bound != "done" else 0, n)
    if cumulative is None:
        cumulative = list(accumulate(inp.prompt_tokens))
    prompt = Span(*(_prompt_tokens_of(cumulative, r) for r in astuple(requests)))
    usd = prompt.scaled(prices.prompt) + tokens.scaled(prices.completion)
    dearest = prompt.high * prices.max_prompt + tokens.high * prices.max_completion
    wall = 0.0 if requests.expected == 0 else inp.latency_s * max(1.0, requests.expected / in_flight)
    return DatasetProjection(
        inp.name,
        inp.token_target,
        bound,
        requests,
        tokens,
        prompt,
        usd,
        dearest,
        wall,
        inp.spent_usd,
        inp.produced_tokens,
        s.source,
        inp.latency_s,
        inp.latency_source,
    )


# --- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Money:
    """What the plan is set against (USD)."""

    budget_usd: float
    spent_usd: float  # the ledger, all datasets
    held_usd: float  # held by requests in flight now
    key_remaining_usd: float | None  # None: no cap visible on the key
    cap_source: str
    reserve_usd: float  # left unspent by the budget's tail

    @property
    def budget_left_usd(self) -> float:
        return self.budget_usd - self.spent_usd - self.held_usd

    @property
    def available_usd(self) -> float:
        left = self.budget_left_usd
        if self.key_remaining_usd is not None:
            left = min(left, self.key_remaining_usd)
        return max(0.0, left - self.reserve_usd)


def tail_reserve_usd(
    in_flight: int, lengths: LengthStats, prices: PriceModel, tail_fraction: float, policy: AdmissionPolicy
) -> float:
    """What a budget's tail leaves unspent: the last wave under ``tail_fraction`` of the cap is not started, and
    the statistical hold of a full cap keeps ``z·σ·√n`` at the dearest price (nothing in hard mode, where
    worst cases are held instead: that shows in the wave, not in a reserve)."""
    per_request = lengths.mean * prices.completion
    wave = tail_fraction * in_flight * per_request
    if policy.hard:
        return wave
    margin = math.sqrt(2 * policy.dollar_log_term) * lengths.sd * math.sqrt(in_flight) * prices.max_completion
    return wave + margin


@dataclass(frozen=True)
class Plan:
    datasets: list[DatasetProjection]
    money: Money
    in_flight: int
    prices_source: str
    on_overrun: str
    proposal_rule: str
    proposals: dict[str, dict[str, int]] = field(default_factory=dict)  # rule → dataset → target
    version: int = PLAN_VERSION

    @property
    def total_usd(self) -> Span:
        return sum((d.usd for d in self.datasets), Span(0.0, 0.0, 0.0))

    @property
    def total_tokens(self) -> Span:
        return sum((d.output_tokens for d in self.datasets), Span(0.0, 0.0, 0.0))

    @property
    def total_requests(self) -> Span:
        return sum((d.requests for d in self.datasets), Span(0.0, 0.0, 0.0))

    @property
    def wall_s(self) -> float:
        """All datasets at once, sharing the in-flight cap."""
        reqs = self.total_requests.expected
        if reqs == 0:
            return 0.0
        latency = sum(d.latency_s * d.requests.expected for d in self.datasets) / reqs
        return latency * max(1.0, reqs / self.in_flight)

    @property
    def fits(self) -> bool:
        return self.total_usd.high <= self.money.available_usd

    @property
    def decision(self) -> str:
        return "fits" if self.fits else self.on_overrun

    def targets(self) -> dict[str, int]:
        if self.decision == "scale_down":
            return dict(self.proposals[self.proposal_rule])
        return {d.name: d.token_target for d in self.datasets}

    def summary(self) -> str:
        t, m = self.total_usd, self.money
        key = "no cap visible" if m.key_remaining_usd is None else f"${m.key_remaining_usd:,.2f}"
        head = (
            f"projected ${t.expected:,.2f} (95%: ${t.low:,.2f}–${t.high:,.2f}) for {self.total_tokens.expected:,.0f}"
            f" output tokens against ${m.available_usd:,.2f} available (budget left ${m.budget_left_usd:,.2f},"
            f" key {key}, less ${m.reserve_usd:,.2f} the budget's tail leaves)"
        )
        if self.fits:
            return f"fits: {head}"
        return f"does not fit: {head}; on_overrun={self.on_overrun}"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            decision=self.decision,
            fits=self.fits,
            targets=self.targets(),
            summary=self.summary(),
            total_usd=asdict(self.total_usd),
            available_usd=self.money.available_usd,
        )
        return out


def make_plan(
    inputs: Sequence[DatasetInput],
    prices: PriceModel,
    money: Money,
    in_flight: int,
    on_overrun: str = "wait",
    proposal_rule: str = "proportional",
    tail_fraction: float = 0.1,
) -> Plan:
    """``tail_fraction``: the runner's (``GenerationSettings.tail_fraction``): it sizes a target's last batch."""
    if on_overrun not in OVERRUN_CHOICES:
        raise PlanInputError(f"on_overrun must be one of {', '.join(OVERRUN_CHOICES)}, not {on_overrun!r}")
    if proposal_rule not in PROPOSAL_RULES:
        raise PlanInputError(f"proposal must be one of {', '.join(PROPOSAL_RULES)}, not {proposal_rule!r}")
    if in_flight < 1:
        raise PlanInputError("in_flight must be positive")
    names = [i.name for i in inputs]
    if len(set(names)) != len(names):
        raise PlanInputError(f"a dataset is listed twice: {names}")
    projections = [project_dataset(i, prices, in_flight, tail_fraction=tail_fraction) for i in inputs]
    plan = Plan(projections, money, in_flight, prices.source, on_overrun, proposal_rule)
    if plan.fits:
        return plan
    proposals = {
        rule: propose_targets(inputs, prices, money.available_usd, in_flight, rule, tail_fraction)
        for rule in PROPOSAL_RULES
    }
    return replace(plan, proposals=proposals)


def propose_targets(
    inputs: Sequence[DatasetInput],
    prices: PriceModel,
    money: float,
    in_flight: int,
    rule: str,
    tail_fraction: float = 0.1,
) -> dict[str, int]:
    """Token targets whose projected dollars (the 95% upper end) fit ``money``, by bisection on the level (the
    cost grows with it): ``equal`` adds the same number of tokens to each, ``proportional`` scales every target."""

    def targets_at(level: float) -> dict[str, int]:
        out = {}
        for i in inputs:
            if rule == "equal":
                out[i.name] = min(i.token_target, i.produced_tokens + int(level))
            else:
                out[i.name] = max(i.produced_tokens, min(i.token_target, int(level * i.token_target)))
        return out

    sums = {i.name: list(accumulate(i.prompt_tokens)) for i in inputs}

    def cost(level: float) -> float:
        t = targets_at(level)
        return sum(
            project_dataset(
                replace(i, token_target=t[i.name]),
                prices,
                in_flight,
                cumulative=sums[i.name],
                tail_fraction=tail_fraction,
            ).usd.high
            for i in inputs
        )

    hi = max((i.token_target for i in inputs), default=0) if rule == "equal" else 1.0
    return targets_at(_largest_fitting(cost, 0.0, float(hi), money))


def _largest_fitting(cost: Callable[[float], float], lo: float, hi: float, money: float) -> float:
    if cost(hi) <= money:
        return hi
    for _ in range(40):  # 1e-12 of the range
        mid = (lo + hi) / 2
        if cost(mid) <= money:
            lo = mid
        else:
            hi = mid
    return lo


# --- what generation does with it -----------------------------------------------------------------
class PlanRefusal(GenerationError, RuntimeError):
    """Generation must not start under the recorded plan (it does not fit and says wait, or it is stale)."""


@dataclass(frozen=True)
class GateDecision:
    token_target: int
    note: str  # one line for the run log


def plan_gate(plan: Mapping[str, Any] | None, dataset: str, requested_target: int) -> GateDecision:
    """The token target a partition of ``dataset`` runs with, or ``PlanRefusal``: a plan made for other targets
    than the datasets ask now is stale, since its money check no longer holds."""
    if plan is None:
        return GateDecision(
            requested_target,
            "no generation plan recorded: running to the requested target until the money runs out"
            " (materialize generation_plan to see what the budget buys first)",
        )
    if plan.get("version") != PLAN_VERSION:
        raise PlanRefusal(f"the recorded generation plan has version {plan.get('version')}; re-materialize it")
    mine = next((d for d in plan.get("datasets", []) if d.get("name") == dataset), None)
    if mine is None or int(mine["token_target"]) != requested_target:
        was = "no entry" if mine is None else f"target {int(mine['token_target']):,}"
        raise PlanRefusal(
            f"the generation plan is stale for {dataset}: it has {was}, the dataset asks {requested_target:,} output"
            " tokens now; re-materialize generation_plan"
        )
    decision = plan["decision"]
    if decision == "wait":
        props = plan.get("proposals") or {}
        shown = "; ".join(
            f"{rule}: " + ", ".join(f"{d} {t:,}" for d, t in targets.items()) for rule, targets in props.items()
        )
        raise PlanRefusal(
            f"the generation plan does not fit and says wait: {plan['summary']}. Proposed targets that fit — {shown}."
            " Choose in generation_plan's config: on_overrun: scale_down (with proposal: equal or proportional)"
            " or proceed (spend until the money runs out), or top up / raise budget_usd; then re-materialize"
            " generation_plan."
        )
    target = int(plan["targets"][dataset])
    if decision == "scale_down":
        return GateDecision(
            target, f"generation plan: scaled down ({plan['proposal_rule']}) to {target:,} output tokens for {dataset}"
        )
    return GateDecision(target, f"generation plan: {plan['summary']}")
