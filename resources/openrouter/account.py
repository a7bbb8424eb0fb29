"""Which cap on the account's money is in force, and how much of it is left.

An unlimited key says null for ``limit_remaining``, yet the account's credits still run out, and only a
management key may read ``/credits``. So: the key's limit, else the credits where ``/credits`` answers, else
nothing visible, and the log says which, because then only ``budget_usd`` and OpenRouter's 402s stop spending.
"""

from dataclasses import dataclass
from typing import Any, Protocol


class AccountClient(Protocol):
    async def key_info(self) -> dict[str, Any]: ...
    async def credits(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class AccountCap:
    remaining_usd: float | None  # None: no cap visible
    source: str  # "key_limit" | "account_credits" | "key_limit+account_credits" | "none"
    detail: str  # one line for the log


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def account_cap(key: dict[str, Any], credits: dict[str, Any] | None, credits_error: str | None = None) -> AccountCap:
    """Combine ``/key`` data with ``/credits`` data (or why there is none); the tighter cap wins."""
    key_left = _number(key.get("limit_remaining"))
    credits_left = None
    if credits:
        total, used = _number(credits.get("total_credits")), _number(credits.get("total_usage"))
        if total is not None and used is not None:
            credits_left = total - used
    if key_left is not None and credits_left is not None:
        left = min(key_left, credits_left)
        return AccountCap(
            left,
            "key_limit+account_credits",
            f"the key's limit (${key_left:.2f} left) and the account's credits (${credits_left:.2f} left):"
            f" ${left:.2f} applies",
        )
    if key_left is not None:
        return AccountCap(key_left, "key_limit", f"the key's limit: ${key_left:.2f} left of ${key.get('limit')}")
    if credits_left is not None:
        return AccountCap(
            credits_left,
            "account_credits",
            f"the account's credits (/credits): ${credits_left:.2f} left; the key itself is unlimited",
        )
    why = f"/credits {credits_error}" if credits_error else "/credits gave nothing"
    return AccountCap(
        None,
        "none",
        f"no account cap visible: the key is unlimited (limit_remaining null) and {why}; only budget_usd and"
        " OpenRouter's own 402s stop spending",
    )


async def read_account_cap(client: AccountClient, ask_credits: bool = True) -> tuple[AccountCap, bool]:
    """``(cap, credits_allowed)``: ``/credits`` is asked only for an unlimited key, and a 401/403 there
    means it never will answer this key (the caller stops asking)."""
    key = await client.key_info()
    if _number(key.get("limit_remaining")) is not None or not ask_credits:
        return account_cap(key, None, None if ask_credits else "not allowed for this key"), ask_credits
    try:
        credits = await client.credits()
    except Exception as exc:  # the cap is best effort; the ledger's budget still holds
        status = getattr(exc, "status", None)
        label = f"answered HTTP {status} (it needs a management key)" if status in (401, 403) else "failed"
        return account_cap(key, None, label), status not in (401, 403)
    return account_cap(key, credits), True
