"""How the simulator routes a request: the ``provider`` preferences against its endpoint table.

OpenRouter's routing as documented: ``only``/``ignore`` by slug, full tag or display name,
``quantizations`` (``fp4`` covering the fp4 family), ``require_parameters`` against each endpoint's
``supported_parameters``, ``max_price``, ``sort`` and ``order``; endpoints that are down never serve.
"""

from typing import Any

from resources.simulator.config import SUPPORTED_PARAMETERS, ProviderEndpoint

_FP4_FAMILY = frozenset({"fp4", "mxfp4", "nvfp4"})


def _names(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value.lower()}
    if isinstance(value, list):
        return {str(v).lower() for v in value}
    return set()


def _matches(ep: ProviderEndpoint, names: set[str]) -> bool:
    return ep.slug in names or ep.tag in names or ep.name.lower() in names


def _quant_ok(ep: ProviderEndpoint, wanted: set[str]) -> bool:
    q = (ep.quantization or "unknown").lower()
    return q in wanted or (q in _FP4_FAMILY and "fp4" in wanted)


def _price_limit(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


# Request fields that are model parameters: with ``require_parameters`` an endpoint must list each one sent.
REQUEST_PARAMETERS = frozenset(SUPPORTED_PARAMETERS) | {
    "top_k",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_p",
    "logprobs",
    "top_logprobs",
    "logit_bias",
}


def requested_parameters(body: dict[str, Any]) -> frozenset[str]:
    names = {k for k in body if k in REQUEST_PARAMETERS and body[k] is not None}
    if body.get("max_completion_tokens") is not None:
        names.add("max_tokens")
    return frozenset(names)


def route(
    providers: tuple[ProviderEndpoint, ...], prefs: Any, params: frozenset[str] = frozenset()
) -> list[ProviderEndpoint]:
    """Endpoints allowed by a request's ``provider`` object, best first (empty = 404)."""
    eps = [e for e in providers if e.status == 0]
    if not isinstance(prefs, dict):
        return eps
    if prefs.get("require_parameters") is True and params:
        eps = [e for e in eps if params <= set(e.parameters)]
    quants = _names(prefs.get("quantizations"))
    if quants:
        eps = [e for e in eps if _quant_ok(e, quants)]
    only = _names(prefs.get("only"))
    if only:
        eps = [e for e in eps if _matches(e, only)]
    ignore = _names(prefs.get("ignore"))
    if ignore:
        eps = [e for e in eps if not _matches(e, ignore)]
    max_price = prefs.get("max_price")
    if isinstance(max_price, dict):
        mp, mc = _price_limit(max_price.get("prompt")), _price_limit(max_price.get("completion"))
        eps = [
            e for e in eps if (mp is None or e.prompt_usd_per_m <= mp) and (mc is None or e.completion_usd_per_m <= mc)
        ]
    sort = prefs.get("sort")
    if isinstance(sort, dict):
        sort = sort.get("by")
    if sort == "price":
        eps.sort(key=lambda e: (e.completion_usd_per_m, e.prompt_usd_per_m))
    order = prefs.get("order")
    if isinstance(order, list) and order:
        wanted = [str(o).lower() for o in order]
        first = [e for w in wanted for e in eps if _matches(e, {w})]
        seen = {id(e) for e in first}
        rest = [e for e in eps if id(e) not in seen] if prefs.get("allow_fallbacks", True) is not False else []
        eps = list(dict.fromkeys(first)) + rest
    return eps
