"""Provider policy: which of the model's endpoints may serve our data, how requests are routed to them, and what
they can cost.

Kimi K2.5's native weights are INT4; a provider that re-quantizes to fp4 answers differently, and a draft trained
on it learns the wrong distribution. The policy is sent as routing preferences *and* checked against every
response, because routing is a preference, not a guarantee. A response names only the provider, never the
endpoint, so the allowed endpoints are pinned by their full tags and a provider whose allowed endpoint cannot be
pinned apart from a disallowed one is excluded (docs/generation-and-budget.md). Endpoints that are down are
neither allowed nor priced (their prices would only distort worst cases), and an unknown quantization is refused
unless ``trust_unknown_quantization`` names the provider: nobody can say what weights it runs.
"""

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eagle_assets.errors import OpenRouterError, Systemic

DEFAULT_QUANTIZATIONS = ("int4", "int8", "fp8", "fp16", "bf16", "fp32")
DEFAULT_IGNORED = ("fireworks", "baseten")
UNKNOWN_QUANTIZATION = "unknown"
TRUST_FIELD = "trust_unknown_quantization"  # the resource's config field, named in refusal messages


class NoAllowedProviderError(OpenRouterError, Systemic, RuntimeError):
    """Every endpoint of the model is excluded by the policy: refuse to start."""


@dataclass(frozen=True)
class Endpoint:
    provider_name: str
    tag: str
    quantization: str | None  # None when /endpoints says null
    prompt_price: float  # USD per token
    completion_price: float
    max_completion_tokens: int | None
    status: int
    supported_parameters: tuple[str, ...] | None = None  # None: not listed
    context_length: int | None = None  # prompt + max_tokens must fit (OpenRouter answers 400 otherwise)

    @property
    def slug(self) -> str:
        """The provider slug ``ignore``/``only`` name: the tag's first part (``deepinfra/fp4`` → ``deepinfra``)."""
        return self.tag.split("/", 1)[0].lower() if self.tag else self.provider_name.lower()

    @property
    def quant(self) -> str:
        """Lower-case quantization; null and empty read as ``unknown``."""
        return (self.quantization or UNKNOWN_QUANTIZATION).lower()

    @property
    def serving(self) -> bool:
        """OpenRouter's status: 0 is serving, negative values are degraded or down."""
        return self.status >= 0


@dataclass(frozen=True)
class ProviderPolicy:
    quantizations: tuple[str, ...] = DEFAULT_QUANTIZATIONS
    ignore: tuple[str, ...] = DEFAULT_IGNORED
    sort: str | None = "price"
    require_parameters: bool = True  # providers that lack a sent parameter must not drop it silently
    trust_unknown_quantization: tuple[str, ...] = ()  # provider slugs whose unknown quantization is accepted

    def verdict(self, ep: Endpoint, requested_parameters: Iterable[str] = ()) -> tuple[bool, str]:
        """Whether one endpoint may serve on its own merits, and why (the endpoint table's last column)."""
        ignored = {x.lower() for x in self.ignore}
        if not ep.serving:
            return False, f"status {ep.status}: not serving"
        if ep.slug in ignored or ep.provider_name.lower() in ignored or ep.tag.lower() in ignored:
            return False, "ignored provider"
        if ep.quant == UNKNOWN_QUANTIZATION:
            if ep.slug in {s.lower() for s in self.trust_unknown_quantization}:
                return True, f"quantization {ep.quantization or 'null'}, trusted ({TRUST_FIELD})"
            return False, f"quantization {ep.quantization or 'null'} (trust with {TRUST_FIELD}: [{ep.slug}])"
        if ep.quant not in {q.lower() for q in self.quantizations}:
            return False, f"quantization {ep.quant} not allowed"
        if self.require_parameters and ep.supported_parameters is not None:
            missing = sorted(set(requested_parameters) - set(ep.supported_parameters))
            if missing:
                return False, f"lacks {', '.join(missing)} (require_parameters)"
        return True, "yes"


def _price(value: Any) -> float:
    try:
        price = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, price)  # "-1" marks variable pricing (routers); never a negative cost


def _positive_or_none(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def parse_endpoints(payload: dict[str, Any]) -> list[Endpoint]:
    out = []
    for ep in (payload.get("data") or {}).get("endpoints") or []:
        pricing = ep.get("pricing") or {}
        quant = ep.get("quantization")
        params = ep.get("supported_parameters")
        try:
            status = int(ep.get("status") or 0)
        except (TypeError, ValueError):
            status = -1  # an unreadable status is not "serving"
        out.append(
            Endpoint(
                provider_name=str(ep.get("provider_name") or ep.get("name") or "?"),
                tag=str(ep.get("tag") or ""),
                quantization=str(quant) if quant not in (None, "") else None,
                prompt_price=_price(pricing.get("prompt")),
                completion_price=_price(pricing.get("completion")),
                max_completion_tokens=ep.get("max_completion_tokens"),
                status=status,
                supported_parameters=tuple(str(p) for p in params) if isinstance(params, list) else None,
                context_length=_positive_or_none(ep.get("context_length")),
            )
        )
    return out


@dataclass
class ProviderTable:
    """The endpoints seen at start, split by the policy; the routing that pins the allowed ones; prices.

    An endpoint lacking one of ``requested_parameters`` would never be routed to (``require_parameters``), so it
    is not counted as allowed either.
    """

    endpoints: list[Endpoint]
    policy: ProviderPolicy
    requested_parameters: tuple[str, ...] = ()
    allowed: list[Endpoint] = field(init=False)
    reasons: dict[int, str] = field(init=False)  # index in ``endpoints`` → verdict text
    excluded_providers: list[str] = field(init=False)  # slugs excluded because they mix allowed and not

    def __post_init__(self) -> None:
        verdicts = [self.policy.verdict(e, self.requested_parameters) for e in self.endpoints]
        self.reasons = {i: why if good else f"NO: {why}" for i, (good, why) in enumerate(verdicts)}
        ok = {i for i, (good, _) in enumerate(verdicts) if good}
        by_name: dict[str, list[int]] = defaultdict(list)
        for i, e in enumerate(self.endpoints):
            by_name[e.provider_name.lower()].append(i)
        tag_count: dict[str, int] = defaultdict(int)
        for e in self.endpoints:
            tag_count[e.tag.lower()] += 1
        excluded: set[str] = set()
        for members in by_name.values():
            good = [i for i in members if i in ok]
            bad = [i for i in members if i not in ok]
            if not good or not bad:
                continue
            others = ", ".join(f"{self.endpoints[i].tag or '?'} ({self.endpoints[i].quant})" for i in bad)
            if all(self._pinnable(self.endpoints[i], tag_count, len(members)) for i in good):
                for i in good:
                    self.reasons[i] = f"yes, pinned by tag (same name also lists {others})"
                continue
            name = self.endpoints[good[0]].provider_name
            for i in good:
                ok.discard(i)
                self.reasons[i] = (
                    f"NO: {name} also lists {others} and responses name only the provider;"
                    " this endpoint's tag cannot pin it apart"
                )
            excluded.add(self.endpoints[good[0]].slug)
        self.allowed = [e for i, e in enumerate(self.endpoints) if i in ok]
        self.excluded_providers = sorted(excluded)

    @staticmethod
    def _pinnable(ep: Endpoint, tag_count: dict[str, int], endpoints_of_provider: int) -> bool:
        """A tag names exactly one endpoint when it is unique and is not the bare provider slug
        (``only: ["deepinfra"]`` would let every DeepInfra endpoint in)."""
        tag = ep.tag.lower()
        if not tag or tag_count[tag] != 1:
            return False
        return "/" in tag or endpoints_of_provider == 1

    # --- routing -------------------------------------------------------------------------------
    def routing(self) -> dict[str, Any]:
        """The ``provider`` object of every request: only the allowed endpoints, by their full tags."""
        quants = list(self.policy.quantizations)
        if any(e.quant == UNKNOWN_QUANTIZATION for e in self.allowed) and UNKNOWN_QUANTIZATION not in quants:
            quants.append(UNKNOWN_QUANTIZATION)  # trusted endpoints must survive OpenRouter's own filter
        body: dict[str, Any] = {
            "only": sorted({e.tag or e.slug for e in self.allowed}),
            "quantizations": quants,
            "ignore": sorted(set(self.policy.ignore) | set(self.excluded_providers)),
            "allow_fallbacks": True,  # fallbacks stay inside ``only``
            "require_parameters": self.policy.require_parameters,
        }
        if self.policy.sort:
            body["sort"] = self.policy.sort
        return body

    def removed_by_require_parameters(self) -> list[tuple[Endpoint, list[str]]]:
        """Endpoints that would serve but for a parameter we send and they do not list, with those parameters:
        ``require_parameters`` removes them from routing, which must never happen unseen (the reference
        endpoint, Moonshot's own, may list neither ``temperature`` nor ``top_p``)."""
        if not self.policy.require_parameters:
            return []
        out = []
        relaxed = dataclasses.replace(self.policy, require_parameters=False)
        for e in self.endpoints:
            if e.supported_parameters is None or not relaxed.verdict(e, self.requested_parameters)[0]:
                continue
            missing = sorted(set(self.requested_parameters) - set(e.supported_parameters))
            if missing:
                out.append((e, missing))
        return out

    def require_allowed(self) -> None:
        if self.allowed:
            return
        seen = (
            "; ".join(
                f"{e.provider_name} [{e.tag or '?'}, {e.quantization or 'null'}]: {self.reasons[i]}"
                for i, e in enumerate(self.endpoints)
            )
            or "none"
        )
        hint = ""
        unknown = sorted({e.slug for e in self.endpoints if e.quant == UNKNOWN_QUANTIZATION and e.serving})
        if unknown:
            hint = (
                f" To accept a provider whose quantization is unknown, name its slug in the resource config"
                f" field {TRUST_FIELD} (e.g. {TRUST_FIELD}: [{unknown[0]}])."
            )
        raise NoAllowedProviderError(
            f"no endpoint is allowed by the provider policy (quantizations={list(self.policy.quantizations)},"
            f" ignore={list(self.policy.ignore)}); endpoints seen: {seen}.{hint}"
        )

    # --- responses -----------------------------------------------------------------------------
    def is_allowed_name(self, provider_name: str | None) -> bool:
        """Responses name the provider by display name (any case); unknown names are not trusted."""
        if not provider_name:
            return False
        name = provider_name.lower()
        return any(name in (e.provider_name.lower(), e.slug) for e in self.allowed)

    @property
    def max_prompt_price(self) -> float:
        return max(e.prompt_price for e in self.allowed)

    @property
    def max_completion_price(self) -> float:
        return max(e.completion_price for e in self.allowed)

    @property
    def max_context_length(self) -> int | None:
        """The largest context an allowed endpoint takes (routing picks one that fits); None when one is unlisted."""
        lengths = [e.context_length for e in self.allowed]
        if not lengths or any(n is None for n in lengths):
            return None
        return max(n for n in lengths if n is not None)

    def price_of(self, provider_name: str | None) -> tuple[float, float]:
        """Prices to charge a response by when it carries no cost: its provider's dearest serving
        endpoint (a name may cover several), else the dearest serving endpoint of all."""
        name = (provider_name or "").lower()
        priced = [e for e in self.endpoints if e.serving] or self.allowed
        mine = [e for e in priced if name in (e.provider_name.lower(), e.slug)] or priced
        return max(e.prompt_price for e in mine), max(e.completion_price for e in mine)

    def render(self) -> str:
        rows = [
            "provider             tag                    quant    status  $/M in  $/M out  allowed",
        ]
        order = sorted(range(len(self.endpoints)), key=lambda i: self.endpoints[i].completion_price)
        for i in order:
            e = self.endpoints[i]
            rows.append(
                f"{e.provider_name[:20]:<20} {e.tag[:22]:<22} {(e.quantization or 'null')[:8]:<8} {e.status:>6}"
                f"  {e.prompt_price * 1e6:>6.2f}  {e.completion_price * 1e6:>7.2f}  {self.reasons[i]}"
            )
        route = self.routing()
        rows.append(
            f"routing: only={route['only']} ignore={route['ignore']} quantizations={route['quantizations']}"
            f" require_parameters={route['require_parameters']}"
        )
        return "\n".join(rows)
