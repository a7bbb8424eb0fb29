"""Turn whatever came back from a chat-completion request into one classified outcome.

OpenRouter reports many failures with HTTP 200 (an ``error`` body, or ``finish_reason: "error"``)
and pads bodies with whitespace, so the status code alone decides little. Classification is a pure
function of the raw answer, which keeps every rule testable without a network.
"""

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import orjson


class Action(enum.Enum):
    SUCCESS = "success"  # keep the data
    RETRY = "retry"  # transient: back off and try again
    SKIP = "skip"  # this prompt can never succeed (400/403): record and move on
    STOP_CREDITS = "stop_credits"  # credits exhausted: stop admitting, keep everything
    FATAL = "fatal"  # the whole run is misconfigured (bad key, unknown model)


@dataclass(frozen=True)
class RawResponse:
    """What the transport saw: a status and body, or the exception class that ended the attempt."""

    status: int | None
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    transport_error: str | None = None  # "timeout" | "connection" | other short name
    latency_s: float = 0.0


@dataclass(frozen=True)
class Outcome:
    action: Action
    error_class: str  # "ok", "rate_limited", "timeout", ... (a metric label)
    message: str = ""
    retry_after_s: float | None = None
    data: dict[str, Any] | None = None  # parsed success body
    cost_usd: float = 0.0  # billed even when the data is not kept


def _retry_after(headers: dict[str, str], now: float | None = None) -> float | None:
    value = headers.get("retry-after")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
    reset = headers.get("x-ratelimit-reset")
    if reset:
        try:
            return max(0.0, float(reset) / 1000.0 - (now if now is not None else time.time()))
        except ValueError:
            pass
    return None


def _error_fields(body: dict[str, Any]) -> tuple[int | None, str, dict[str, Any]]:
    err = body.get("error")
    if not isinstance(err, dict):
        return None, str(err), {}
    code = err.get("code")
    try:
        code = int(code) if code is not None else None
    except (TypeError, ValueError):
        code = None
    meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
    return code, str(err.get("message", ""))[:300], meta


def _usage_cost(body: dict[str, Any]) -> float:
    usage = body.get("usage") or {}
    try:
        return float(usage.get("cost") or 0.0)
    except (TypeError, ValueError):
        return 0.0


_TRANSIENT_STATUS = {
    408: "timeout",
    429: "rate_limited",
    500: "server_error",
    502: "server_error",
    503: "no_provider",
    504: "timeout",
    520: "server_error",
    524: "timeout",
    529: "server_error",
}


def classify_status(status: int, code_body: dict[str, Any] | None, headers: dict[str, str]) -> Outcome:
    """Classify an error status (HTTP status, or the ``code`` inside a 200 error body)."""
    _code, message, meta = _error_fields(code_body or {})
    retry_after = _retry_after(headers)
    if status == 402:
        if meta.get("limit_source") == "openrouter_in_flight_budget":
            return Outcome(Action.RETRY, "in_flight_budget", message, retry_after or 1.0)
        return Outcome(Action.STOP_CREDITS, "credits_exhausted", message)
    if status == 401:
        return Outcome(Action.FATAL, "unauthorized", "the API key was rejected (401)")
    if status == 400:
        return Outcome(Action.SKIP, "bad_request", message)
    if status == 403:
        return Outcome(Action.SKIP, "moderation", message)
    if status == 404:
        return Outcome(Action.FATAL, "not_found", message or "endpoint or model not found (404)")
    if status in _TRANSIENT_STATUS:
        return Outcome(Action.RETRY, _TRANSIENT_STATUS[status], message, retry_after)
    if status >= 500:
        return Outcome(Action.RETRY, "server_error", message, retry_after)
    return Outcome(Action.SKIP, f"http_{status}", message)


def classify(raw: RawResponse) -> Outcome:
    if raw.transport_error is not None:
        return Outcome(Action.RETRY, raw.transport_error, "")
    assert raw.status is not None
    body: Any = None
    if raw.body:
        try:
            body = orjson.loads(raw.body.strip())
        except orjson.JSONDecodeError:
            body = None
    if raw.status != 200:
        return classify_status(raw.status, body if isinstance(body, dict) else None, raw.headers)
    if not isinstance(body, dict):
        return Outcome(Action.RETRY, "malformed", "unparseable or truncated JSON body")
    if "error" in body and not body.get("choices"):
        code, _, _ = _error_fields(body)
        inner = classify_status(code or 502, body, raw.headers)
        generic = inner.error_class in ("server_error", "no_provider", "timeout")
        return Outcome(
            inner.action,
            "error_body" if generic else inner.error_class,
            inner.message,
            inner.retry_after_s,
            cost_usd=_usage_cost(body),
        )
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Outcome(Action.RETRY, "malformed", "no choices in body")
    choice = choices[0]
    if choice.get("finish_reason") == "error":
        err = choice.get("error") if isinstance(choice.get("error"), dict) else {}
        return Outcome(Action.RETRY, "finish_error", str(err.get("message", ""))[:300], cost_usd=_usage_cost(body))
    if not isinstance(choice.get("message"), dict):
        return Outcome(Action.RETRY, "malformed", "choice without message")
    return Outcome(Action.SUCCESS, "ok", data=body, cost_usd=_usage_cost(body))
