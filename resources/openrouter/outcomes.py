"""Turn whatever came back from a chat-completion request into one classified outcome.

OpenRouter reports many failures with HTTP 200 and pads bodies with whitespace, and one status covers causes
that call for opposite actions (a 403 is a moderation flag, a guardrail, an exhausted budget or a missing
permission), so the body decides; docs/errors-and-billing.md has the table. A pure function of the raw answer,
so every rule is tested without a network (``tests/fixtures/openrouter`` holds the bodies). ``partial_output``
marks an answer that ended in an error after producing text: OpenRouter documents only zero-completion answers
as unbilled, so such an attempt is settled from ``/generation``, never assumed free.
"""

import email.utils
import enum
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson


class Action(enum.Enum):
    SUCCESS = "success"  # keep the data
    RETRY = "retry"  # transient: back off and try again
    SKIP = "skip"  # this prompt can never succeed (bad request, moderation): record and move on
    STOP_CREDITS = "stop_credits"  # credits or a key/workspace budget exhausted: stop admitting, keep everything
    FATAL = "fatal"  # the whole run is misconfigured (bad key, unknown model, no allowed provider)


@dataclass(frozen=True)
class RawResponse:
    """What the transport saw: a status and body (a torn prefix when ``transport_error`` is set), or the
    exception class that ended the attempt. A streamed answer arrives assembled in ``parsed``."""

    status: int | None
    body: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    transport_error: str | None = None  # "timeout" | "connection" | "stalled" | other short name
    latency_s: float = 0.0
    parsed: dict[str, Any] | None = None
    generation_id: str | None = None


@dataclass(frozen=True)
class Outcome:
    action: Action
    error_class: str  # "ok", "rate_limited", "timeout", ... (a metric label)
    message: str = ""
    retry_after_s: float | None = None
    data: dict[str, Any] | None = None  # the parsed body of a success (or of an answer that ended in an error)
    cost_usd: float | None = None  # ``usage.cost`` (billed even when the data is not kept); None: not given
    partial_output: bool = False  # an error after output: may have been billed, settle from /generation


# --- generation ids ----------------------------------------------------------------------------
# Real bodies start with ``{"id":"gen-…"`` (after optional whitespace padding), so the id is in the
# first bytes even of a body torn halfway; a stream carries it in every chunk, the first included.
_GEN_ID = re.compile(rb'"id"\s*:\s*"(gen-[A-Za-z0-9_\-]{1,120})"')
_PREFIX_BYTES = 4096


def generation_id_from_prefix(data: bytes | None) -> str | None:
    """The ``gen-…`` id near the start of a (possibly torn) body or SSE stream, else None."""
    if not data:
        return None
    m = _GEN_ID.search(data, 0, _PREFIX_BYTES)
    return m.group(1).decode() if m else None


def generation_id_of(raw: RawResponse) -> str | None:
    """Where the generation id of an attempt can be found: the ``X-Generation-Id`` header (it arrives with
    the response head, before any padding or body), a stream's first chunk, else the body's start."""
    if raw.generation_id:
        return raw.generation_id
    header = raw.headers.get("x-generation-id")
    if header:
        return header
    if raw.parsed is not None and isinstance(raw.parsed.get("id"), str) and raw.parsed["id"].startswith("gen-"):
        return raw.parsed["id"]
    return generation_id_from_prefix(raw.body)


# --- helpers -----------------------------------------------------------------------------------
def _seconds(value: Any, now: float) -> float | None:
    """A ``Retry-After`` value: seconds (a number or its text), or an HTTP date."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    if isinstance(value, str):
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is not None:
            return max(0.0, when.timestamp() - now)
    return None


def _reset_at(value: Any, now: float) -> float | None:
    """An ``X-RateLimit-Reset`` value: epoch milliseconds (OpenRouter's), epoch seconds, or a delay."""
    try:
        reset = float(value)
    except (TypeError, ValueError):
        return None
    if reset >= 1e11:
        reset = reset / 1000.0 - now
    elif reset >= 1e9:
        reset -= now
    return max(0.0, reset)


def _retry_after(
    headers: dict[str, str], meta: dict[str, Any], now: float | None, avail: dict[str, Any]
) -> float | None:
    """The server's wait hint, wherever it put it (docs/errors-and-billing.md, "Retries")."""
    t = time.time() if now is None else now
    given = meta.get("headers")
    meta_headers = {str(k).lower(): v for k, v in given.items()} if isinstance(given, dict) else {}
    for value in (
        headers.get("retry-after"),
        meta.get("retry_after_seconds"),
        avail.get("retry_after"),
        avail.get("retry_after_seconds"),
        meta_headers.get("retry-after"),
    ):
        got = _seconds(value, t)
        if got is not None:
            return got
    for value in (headers.get("x-ratelimit-reset"), meta_headers.get("x-ratelimit-reset")):
        if value not in (None, ""):
            got = _reset_at(value, t)
            if got is not None:
                return got
    return None


@dataclass(frozen=True)
class _ErrorFields:
    code: int | None
    message: str
    meta: dict[str, Any]
    retryable: bool | None
    availability: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # ``reason`` of the metadata, else of the error itself; lower case


# Messages that only say "the provider said no": the provider's own words are in ``metadata.raw``.
_GENERIC = re.compile(r"^(provider returned error|upstream error from provider)\.?$", re.I)


def _dict_at(holder: dict[str, Any], key: str) -> dict[str, Any]:
    """``holder[key]`` when it is an object, else an empty one: an answer may give any JSON (or nothing) there."""
    value = holder.get(key)
    return value if isinstance(value, dict) else {}


def _error_fields(body: dict[str, Any]) -> _ErrorFields:
    err = body.get("error")
    if not isinstance(err, dict):
        return _ErrorFields(None, "" if err is None else str(err)[:300], {}, None)
    raw_code = err.get("code")
    try:
        code = int(raw_code) if raw_code is not None else None
    except (TypeError, ValueError):
        code = None
    meta = _dict_at(err, "metadata")
    availability = _dict_at(err, "availability")
    meta_availability = _dict_at(meta, "availability")
    retryable = None
    for holder in (err, meta, availability, meta_availability):
        if isinstance(holder.get("retryable"), bool):
            retryable = holder["retryable"]
            break
    message = str(err.get("message", ""))
    raw = meta.get("raw")
    if raw and _GENERIC.match(message.strip()):
        message = f"{message}: {raw}"  # "Provider returned error" alone names nothing
    reason = str(meta.get("reason") or err.get("reason") or "").lower()
    return _ErrorFields(code, message[:300], meta, retryable, availability or meta_availability, reason)


def _usage_cost(body: dict[str, Any]) -> float | None:
    """``usage.cost`` in USD; None when the answer does not say (0 is a cost: free, discounted, BYOK)."""
    usage = body.get("usage")
    if not isinstance(usage, dict) or usage.get("cost") is None:
        return None
    try:
        return max(0.0, float(usage["cost"]))
    except (TypeError, ValueError):
        return None


def _produced(body: dict[str, Any], choice: dict[str, Any]) -> bool:
    """Whether an answer that ended in an error had produced output first (text, tool calls, tokens)."""
    msg = _dict_at(choice, "message")
    if any(msg.get(k) for k in ("content", "reasoning", "reasoning_content", "tool_calls")):
        return True
    usage = _dict_at(body, "usage")
    try:
        return int(usage.get("completion_tokens") or 0) > 0
    except (TypeError, ValueError):
        return True  # unreadable: assume it was billed


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

# "Key limit exceeded (total limit)", "Budget limit exceeded (monthly limit). Contact your org admin.",
# "Workspace budget exceeded", "spending limit reached", "daily spend cap of $50 reached": a cap on money,
# not on this prompt. Only for bodies without ``limit_source`` (read first, see ``_money_limit``).
_BUDGET = re.compile(
    r"\b(budget|key limit|spend(?:ing)? (?:limit|cap)|credit limit)\b.*\b(exceeded|reached|exhausted)\b", re.I
)
# ``error.metadata.limit_source``: which cap on money refused the request.
IN_FLIGHT_SOURCE = "openrouter_in_flight_budget"
_BUDGET_SOURCES = frozenset({"openrouter_key_limit", "openrouter_workspace_budget", "openrouter_guardrail_budget"})
_CREDITS_SOURCE = "openrouter_credits"
# ``reason`` (in the metadata or the error): one request whose worst case exceeds the whole in-flight
# budget will never pass it (lower max_tokens or add credits); an exhausted in-flight budget will.
_NEVER_FITS = frozenset({"weight_exceeds_budget"})
_IN_FLIGHT_REASONS = frozenset({"in_flight_budget_exhausted"})
_UNKNOWN_MODEL = re.compile(
    r"not a valid model|model[^.]{0,80}\b(not found|does not exist|unknown)\b|no such model", re.I
)
_NO_ROUTE = re.compile(r"no allowed providers|no endpoints found|no available (model )?provider", re.I)
_PERMISSION = re.compile(
    r"permission|not allowed|not permitted|management key|forbidden|access denied|not authori[sz]ed", re.I
)
_CONTENT_BLOCK = re.compile(r"guardrail|blocked|injection|jailbreak|sensitive|pii\b", re.I)


def _money_limit(status: int, e: _ErrorFields, retry_after: float | None) -> Outcome | None:
    """A 402/403 read by ``limit_source`` and ``reason``, before any wording; None when neither says."""
    source = str(e.meta.get("limit_source") or "").lower()
    reason = e.reason
    if not source and not reason:
        return None
    text = e.message
    if reason in _NEVER_FITS:
        return Outcome(
            Action.STOP_CREDITS,
            "credits_exhausted",
            f"{text or reason} (one request's worst case exceeds the in-flight budget: lower max_tokens or add"
            " credits)",
        )
    if source == IN_FLIGHT_SOURCE or reason in _IN_FLIGHT_REASONS:
        return Outcome(Action.RETRY, "in_flight_budget", text, retry_after or 1.0)
    if source in _BUDGET_SOURCES:
        cls = "budget_exceeded" if status == 403 else "credits_exhausted"
        return Outcome(Action.STOP_CREDITS, cls, text or f"{source} reached ({status})")
    if source == _CREDITS_SOURCE or source.startswith("openrouter_"):
        # The credits, or a cap on money not described yet: stop resumable rather than skip or retry.
        return Outcome(Action.STOP_CREDITS, "credits_exhausted", text or f"{source} reached ({status})")
    return None


def _forbidden(e: _ErrorFields) -> Outcome:
    """403: budget (stop, resumable), moderation or a content guardrail (skip), permission (fatal)."""
    text = e.message
    if _BUDGET.search(text):
        return Outcome(Action.STOP_CREDITS, "budget_exceeded", text or "key or workspace budget exceeded (403)")
    if "reasons" in e.meta or "flagged_input" in e.meta or re.search(r"flagged|moderation", text, re.I):
        return Outcome(Action.SKIP, "moderation", text)
    if _CONTENT_BLOCK.search(text) and not _PERMISSION.search(text):
        return Outcome(Action.SKIP, "guardrail_blocked", text)
    # Missing permissions, or a 403 nobody has described: every prompt would get it, and skipping
    # them all would end the partition "completed" with nothing bought. Stop and let a person look.
    return Outcome(Action.FATAL, "forbidden", text or "forbidden (403)")


def classify_status(
    status: int, code_body: dict[str, Any] | None, headers: dict[str, str], now: float | None = None
) -> Outcome:
    """Classify an error status (HTTP status, or the ``code`` inside a 200 error body)."""
    e = _error_fields(code_body or {})
    out = _classify_status(status, e, headers, now)
    if e.retryable is True and out.action in (Action.SKIP, Action.FATAL, Action.STOP_CREDITS):
        return Outcome(Action.RETRY, out.error_class, out.message, _retry_after(headers, e.meta, now, e.availability))
    if e.retryable is False and out.action is Action.RETRY and out.error_class != "in_flight_budget":
        return Outcome(Action.FATAL, out.error_class, f"not retryable: {out.message or out.error_class}")
    return out


def _classify_status(status: int, e: _ErrorFields, headers: dict[str, str], now: float | None) -> Outcome:
    message = e.message
    retry_after = _retry_after(headers, e.meta, now, e.availability)
    if status in (402, 403):
        limited = _money_limit(status, e, retry_after)
        if limited is not None:
            return limited
    if status == 402:
        return Outcome(Action.STOP_CREDITS, "credits_exhausted", message or "insufficient credits (402)")
    if status == 401:
        return Outcome(Action.FATAL, "unauthorized", "the API key was rejected (401)")
    if status == 403:
        return _forbidden(e)
    if status == 400:
        if _UNKNOWN_MODEL.search(message):
            return Outcome(Action.FATAL, "unknown_model", message)
        return Outcome(Action.SKIP, "bad_request", message)
    if status == 404:
        if _NO_ROUTE.search(message):
            return Outcome(
                Action.FATAL,
                "no_allowed_provider",
                f"{message} (the provider policy and routing leave no endpoint: see the endpoint table)",
            )
        if _UNKNOWN_MODEL.search(message):
            return Outcome(Action.FATAL, "unknown_model", message)
        return Outcome(Action.FATAL, "not_found", message or "endpoint or model not found (404)")
    if status in _TRANSIENT_STATUS:
        return Outcome(Action.RETRY, _TRANSIENT_STATUS[status], message, retry_after)
    if status >= 500:
        return Outcome(Action.RETRY, "server_error", message, retry_after)
    return Outcome(Action.SKIP, f"http_{status}", message)


def _parse(raw: RawResponse) -> Any:
    if raw.parsed is not None:
        return raw.parsed
    if not raw.body:
        return None
    try:
        return orjson.loads(raw.body.strip())
    except orjson.JSONDecodeError:
        return None


def classify(raw: RawResponse, now: float | None = None) -> Outcome:
    """``now`` (epoch seconds) only matters to wait hints given as dates; tests pin it."""
    if raw.transport_error is not None:
        return Outcome(Action.RETRY, raw.transport_error, "")
    assert raw.status is not None
    body = _parse(raw)
    if raw.status != 200:
        return classify_status(raw.status, body if isinstance(body, dict) else None, raw.headers, now)
    if not isinstance(body, dict):
        return Outcome(Action.RETRY, "malformed", "unparseable or truncated JSON body")
    if "error" in body and not body.get("choices"):
        e = _error_fields(body)
        inner = classify_status(e.code or 502, body, raw.headers, now)
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
    if choice.get("finish_reason") == "error" or (isinstance(body.get("error"), dict) and not choice.get("message")):
        err = choice.get("error") if isinstance(choice.get("error"), dict) else body.get("error")
        message = str(err.get("message", ""))[:300] if isinstance(err, dict) else ""
        return Outcome(
            Action.RETRY,
            "finish_error",
            message,
            data=body,
            cost_usd=_usage_cost(body),
            partial_output=_produced(body, choice),
        )
    if not isinstance(choice.get("message"), dict):
        return Outcome(Action.RETRY, "malformed", "choice without message")
    return Outcome(Action.SUCCESS, "ok", data=body, cost_usd=_usage_cost(body))
