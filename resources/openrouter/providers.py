"""Provider policy: which of the model's endpoints may serve our data, and what it can cost.

Kimi K2.5's native weights are INT4; providers that re-quantize to fp4/nvfp4 produce different
outputs, and a draft model trained on them would learn the wrong distribution. The policy is sent
to OpenRouter as routing preferences *and* checked against every response, because routing is a
preference, not a guarantee.
"""

from dataclasses import dataclass, field
from typing import Any

DEFAULT_QUANTIZATIONS = ("int4", "int8", "fp8", "fp16", "bf16", "fp32")
DEFAULT_IGNORED = ("fireworks", "baseten")


class NoAllowedProviderError(RuntimeError):
    """Every endpoint of the model is excluded by the policy: refuse to start."""


@dataclass(frozen=True)
class Endpoint:
    provider_name: str
    tag: str
    quantization: str
    prompt_price: float  # USD per token
    completion_price: float
    max_completion_tokens: int | None
    status: int

    @property
    def slug(self) -> str:
        return self.tag.split("/", 1)[0].lower() if self.tag else self.provider_name.lower()


@dataclass(frozen=True)
class ProviderPolicy:
    quantizations: tuple[str, ...] = DEFAULT_QUANTIZATIONS
    ignore: tuple[str, ...] = DEFAULT_IGNORED
    sort: str | None = "price"

    def allows(self, ep: Endpoint) -> bool:
        ignored = {x.lower() for x in self.ignore}
        return (
            ep.quantization.lower() in {q.lower() for q in self.quantizations}
            and ep.slug not in ignored
            and ep.provider_name.lower() not in ignored
            and ep.tag.lower() not in ignored
        )

    def routing(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "quantizations": list(self.quantizations),
            "ignore": list(self.ignore),
            "allow_fallbacks": True,
        }
        if self.sort:
            body["sort"] = self.sort
        return body


def parse_endpoints(payload: dict[str, Any]) -> list[Endpoint]:
    out = []
    for ep in (payload.get("data") or {}).get("endpoints") or []:
        pricing = ep.get("pricing") or {}
        out.append(
            Endpoint(
                provider_name=str(ep.get("provider_name") or ep.get("name") or "?"),
                tag=str(ep.get("tag") or ""),
                quantization=str(ep.get("quantization") or "unknown"),
                prompt_price=float(pricing.get("prompt") or 0.0),
                completion_price=float(pricing.get("completion") or 0.0),
                max_completion_tokens=ep.get("max_completion_tokens"),
                status=int(ep.get("status") or 0),
            )
        )
    return out


@dataclass
class ProviderTable:
    """The endpoints seen at start, split by the policy; prices for worst-case reservations."""

    endpoints: list[Endpoint]
    policy: ProviderPolicy
    allowed: list[Endpoint] = field(init=False)

    def __post_init__(self) -> None:
        self.allowed = [e for e in self.endpoints if self.policy.allows(e)]

    def require_allowed(self) -> None:
        if not self.allowed:
            seen = ", ".join(f"{e.provider_name} ({e.quantization})" for e in self.endpoints) or "none"
            raise NoAllowedProviderError(
                f"no endpoint is allowed by the provider policy (quantizations={list(self.policy.quantizations)},"
                f" ignore={list(self.policy.ignore)}); endpoints seen: {seen}"
            )

    def is_allowed_name(self, provider_name: str | None) -> bool:
        """Responses name the provider by display name; unknown names are not trusted."""
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

    def price_of(self, provider_name: str | None) -> tuple[float, float]:
        name = (provider_name or "").lower()
        for e in self.endpoints:
            if name in (e.provider_name.lower(), e.slug):
                return e.prompt_price, e.completion_price
        return max(e.prompt_price for e in self.endpoints), max(e.completion_price for e in self.endpoints)

    def render(self) -> str:
        rows = ["provider             tag                    quant   $/M in  $/M out  allowed"]
        for e in sorted(self.endpoints, key=lambda e: e.completion_price):
            rows.append(
                f"{e.provider_name[:20]:<20} {e.tag[:22]:<22} {e.quantization:<7} {e.prompt_price * 1e6:>6.2f}"
                f"  {e.completion_price * 1e6:>7.2f}  {'yes' if self.policy.allows(e) else 'NO'}"
            )
        return "\n".join(rows)
