"""The OpenRouter stand-in: an aiohttp app speaking the subset of the API this project relies on.

It exists to exercise the generation engine against everything the real service does to a
client (429 storms, 200-with-error bodies, padded or truncated JSON, dropped connections, billing
of abandoned requests, routing that ignores preferences) without spending money. It answers in
the real shapes (``tests/fixtures/openrouter`` holds them): no generation-id header (the id is the
body's first field and every stream chunk's), 404 when routing leaves no endpoint, 403 once a
workspace budget is spent, unlimited keys whose /key limit is null (and /credits for management
keys only), ``content: null`` beside tool calls, leading spaces in reasoning and content, and
streams whose usage comes in a last chunk with ``choices: []``. It has to stay
cheap enough per request that 2000 requests in flight on a 2-core machine measure the client, not
the simulator: responses are prepared once per prompt and cached, JSON goes through orjson and
nothing is logged per request.
"""

import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import os
import random
import re
import secrets
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from resources.simulator.config import (
    MODEL_NAME,
    ProviderEndpoint,
    SimulatorConfig,
    per_token_string,
)
from resources.simulator.faults import EARLY_FAULTS, FAULT_NAMES, UNBILLED_FAULTS, FaultConfig, FaultPicker, TokenBucket
from resources.simulator.responses import (
    ChatRequest,
    Completion,
    KimiStyleGenerator,
    PreparedResponse,
    ResponseCache,
    ResponseGenerator,
    TokenAccountant,
    _text_of,
    request_content_hash,
)

_JSON = "application/json"
_PROCESSING = b": OPENROUTER PROCESSING\n\n"
_DONE = b"data: [DONE]\n\n"
_MARKER = re.compile(r"\[\[sim:([A-Za-z0-9_=]+)\]\]")
_FP4_FAMILY = frozenset({"fp4", "mxfp4", "nvfp4"})
_SPACE_DRAW = 1 << 32
STATE_VERSION = 1


# --------------------------------------------------------------------------------------------
# Account and persistence


class StateFileError(RuntimeError):
    """The state file exists but cannot be read: refuse to start rather than reset the balance."""


def _atomic_write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass
class Account:
    limit: float
    usage: float = 0.0

    @property
    def remaining(self) -> float:
        return self.limit - self.usage


@dataclass(slots=True)
class GenerationRecord:
    """One generation, compact: a long run keeps hundreds of thousands for /generation and stats."""

    id: str
    content_hash: str
    provider_name: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    finish_reason: str
    cost: float  # what was charged (0 when not billed)
    streamed: bool
    cancelled: bool
    latency_ms: int
    generation_ms: int
    created: float  # epoch seconds
    completed_at: float  # monotonic, for the "not found yet" window

    @property
    def billed(self) -> bool:
        return self.cost > 0

    def api_data(self, model: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": model,
            "provider_name": self.provider_name,
            "total_cost": self.cost,
            "usage": self.cost,
            "is_byok": False,
            "upstream_inference_cost": None,
            "tokens_prompt": self.prompt_tokens,
            "tokens_completion": self.completion_tokens,
            "native_tokens_prompt": self.prompt_tokens,
            "native_tokens_completion": self.completion_tokens,
            "native_tokens_reasoning": self.reasoning_tokens,
            "native_tokens_cached": 0,
            "finish_reason": self.finish_reason,
            "native_finish_reason": self.finish_reason,
            "latency": self.latency_ms,
            "generation_time": self.generation_ms,
            "moderation_latency": 0,
            "streamed": self.streamed,
            "cancelled": self.cancelled,
            "created_at": datetime.fromtimestamp(self.created, UTC).isoformat(),
            "origin": "",
            "app_id": None,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "content_hash": self.content_hash,
            "provider": self.provider_name,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "billed": self.cost > 0,
            "streamed": self.streamed,
            "cancelled": self.cancelled,
        }


@dataclass
class SimulatorStats:
    requests_received: int = 0
    admitted: int = 0
    admit_rejected: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    billed_usd: float = 0.0
    billed_requests: int = 0
    by_outcome: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_finish_reason: Counter[str] = field(default_factory=Counter)
    by_provider: Counter[str] = field(default_factory=Counter)
    billed_by_hash: Counter[str] = field(default_factory=Counter)
    generations: list[GenerationRecord] = field(default_factory=list)


class SimulatorState:
    """Everything mutable: account, faults, stats, generations. Owned by the server's event loop."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.account = Account(limit=config.credits)
        self.stats = SimulatorStats()
        self.generations: OrderedDict[str, GenerationRecord] = OrderedDict()
        self.picker = FaultPicker(config.faults, config.seed)
        self.latency_rng = random.Random(config.seed * 104729 + 3)
        self.bucket: TokenBucket | None = None
        self.workspace_budget: float | None = config.workspace_budget_usd
        self.faults = config.faults
        self.set_faults(config.faults)
        self._dirty = False
        self.stopping = False  # set before shutdown cancels handlers: those are not abandoned by a client
        if config.state_file is not None:
            self._load(Path(config.state_file))

    # -- faults / credits ------------------------------------------------------------------
    def set_faults(self, faults: FaultConfig) -> None:
        self.faults = faults
        self.picker.configure(faults)
        rate = faults.admit_rate_per_s
        self.bucket = TokenBucket(rate, faults.admit_burst) if rate is not None else None

    def topup(self, amount_usd: float) -> None:
        if amount_usd <= 0:
            raise ValueError("top-up amount must be positive")
        self.account.limit += amount_usd
        self._dirty = True
        self.flush()

    def key_data(self) -> dict[str, Any]:
        a = self.account
        unlimited = self.config.unlimited_key
        return {
            "label": self.config.key_label,
            "limit": None if unlimited else a.limit,
            "limit_remaining": None if unlimited else a.remaining,
            "limit_reset": None,
            "usage": a.usage,
            "usage_daily": a.usage,
            "usage_weekly": a.usage,
            "usage_monthly": a.usage,
            "byok_usage": 0,
            "is_free_tier": False,
            "is_management_key": False,
            "is_provisioning_key": False,
            "include_byok_in_limit": False,
            "rate_limit": {"requests": -1, "interval": "10s", "note": "This field is deprecated and safe to ignore."},
        }

    def set_workspace_budget(self, amount_usd: float | None) -> None:
        """Raise (or lift, with None) the workspace budget that answers 403 once usage reaches it."""
        self.workspace_budget = amount_usd

    # -- billing ----------------------------------------------------------------------------
    def record_generation(
        self,
        gen_id: str,
        content_hash: str,
        provider: ProviderEndpoint,
        prompt_tokens: int,
        completion_tokens: int,
        reasoning_tokens: int,
        finish_reason: str,
        *,
        billed: bool,
        streamed: bool,
        cancelled: bool,
        started: float,
        generation_s: float,
    ) -> float:
        """Store the generation and bill it when ``billed``; returns the cost charged (0 if not)."""
        cost = prompt_tokens * provider.prompt_price + completion_tokens * provider.completion_price
        charged = cost if billed and completion_tokens > 0 else 0.0
        st = self.stats
        if charged:
            self.account.usage += charged
            st.billed_usd += charged
            st.billed_requests += 1
            st.billed_by_hash[content_hash] += 1
            self._dirty = True
        now = time.monotonic()
        rec = GenerationRecord(
            gen_id,
            content_hash,
            provider.name,
            prompt_tokens,
            completion_tokens,
            reasoning_tokens,
            finish_reason,
            charged,
            streamed,
            cancelled,
            round((now - started) * 1000),
            round(generation_s * 1000),
            time.time(),
            now,
        )
        keep = self.config.max_generations_kept
        self.generations[gen_id] = rec
        if len(self.generations) > keep:
            self.generations.popitem(last=False)
        st.generations.append(rec)
        if len(st.generations) > keep:
            del st.generations[: max(1, keep // 10)]
        st.by_finish_reason[finish_reason] += 1
        st.by_provider[provider.name] += 1
        return charged

    # -- persistence ------------------------------------------------------------------------
    def _load(self, path: Path) -> None:
        if not path.exists():
            self._dirty = True  # write the initial balance so that a restart finds it
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self.account.limit = float(data["limit"])
            self.account.usage = float(data["usage"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateFileError(f"cannot read simulator state file {path}: {exc}") from exc

    def flush(self) -> None:
        path = self.config.state_file
        if path is None or not self._dirty:
            return
        self._dirty = False
        _atomic_write_json(
            Path(path),
            {
                "version": STATE_VERSION,
                "limit": self.account.limit,
                "usage": self.account.usage,
                "billed_requests_since_start": self.stats.billed_requests,
                "saved_at": datetime.now(UTC).isoformat(),
            },
        )

    # -- stats ------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        in_flight = self.stats.in_flight
        self.stats = SimulatorStats(in_flight=in_flight, peak_in_flight=in_flight)

    def snapshot(self, generations_limit: int | None = None) -> dict[str, Any]:
        st = self.stats
        gens = (
            st.generations
            if generations_limit is None
            else st.generations[-generations_limit:]
            if generations_limit
            else []
        )
        return {
            "requests_received": st.requests_received,
            "admitted": st.admitted,
            "admit_rejected": st.admit_rejected,
            "in_flight": st.in_flight,
            "peak_in_flight": st.peak_in_flight,
            "by_outcome": dict(st.by_outcome),
            "by_status": dict(st.by_status),
            "by_finish_reason": dict(st.by_finish_reason),
            "by_provider": dict(st.by_provider),
            "billed_usd": st.billed_usd,
            "billed_requests": st.billed_requests,
            "billed_by_hash": dict(st.billed_by_hash),
            "hashes_billed_more_than_once": sorted(h for h, n in st.billed_by_hash.items() if n > 1),
            "credits": {"limit": self.account.limit, "usage": self.account.usage, "remaining": self.account.remaining},
            "faults": self.faults.to_dict(),
            "generations": [g.summary() for g in gens],
        }


# --------------------------------------------------------------------------------------------
# Routing


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
REQUEST_PARAMETERS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "reasoning",
        "include_reasoning",
        "stop",
        "response_format",
        "structured_outputs",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_p",
        "logprobs",
        "top_logprobs",
        "logit_bias",
    }
)


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


# --------------------------------------------------------------------------------------------
# HTTP


def _seconds_header(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type=_JSON, headers=headers)


def _error_body(code: int | str, message: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    return {"error": err}


class _BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


STATE_KEY: web.AppKey[SimulatorState] = web.AppKey("simulator_state", SimulatorState)


class Simulator:
    """Request handlers; one instance per app, sharing the ``SimulatorState``."""

    def __init__(self, config: SimulatorConfig, state: SimulatorState, generator: ResponseGenerator | None) -> None:
        self.config = config
        self.state = state
        self.accountant = TokenAccountant(load_kimi_tokenizer(config.tokenizer_dir))
        if generator is None and config.tiny_target_dir is not None:
            from resources.simulator.model_generator import tiny_target_generator  # imports torch

            generator = tiny_target_generator(config, self.accountant.tokenizer)
        self.generator: ResponseGenerator = generator or KimiStyleGenerator(
            config.seed, config.mean_completion_tokens, config.tool_call_probability
        )
        # A generator that blocks (a model forward) offers ``submit(request) -> concurrent Future``
        # and is awaited off the event loop; the template generator stays inline (no await, no thread).
        self._submit: Callable[[ChatRequest], concurrent.futures.Future[Completion]] | None = getattr(
            self.generator, "submit", None
        )
        self.cache = ResponseCache(config.cache_size)
        self._route_cache: dict[bytes, list[ProviderEndpoint]] = {}
        self._models = {config.model_slug, config.model_permaslug}
        self._id_prefix = secrets.token_hex(4)
        self._counter = itertools.count(1)
        # A model-backed generator's text is the model's own output: it gets no leading spaces.
        self._leading_space_rate = config.leading_space_rate if self._submit is None else 0.0

    # -- helpers ----------------------------------------------------------------------------
    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return False
        key = header[7:].strip()
        if not key:
            return False
        accepted = self.config.accepted_keys
        return accepted is None or key in accepted

    def _answer(self, status: int, outcome: str, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
        st = self.state.stats
        st.by_outcome[outcome] += 1
        st.by_status[str(status)] += 1
        return _json_response(status, payload, headers)

    def _unauthorized(self) -> web.Response:
        return self._answer(401, "unauthorized", _error_body(401, "No auth credentials found"))

    def _new_id(self) -> str:
        return f"gen-{int(time.time())}-{self._id_prefix}{next(self._counter):010d}"

    def _routes_for(self, prefs: Any, params: frozenset[str]) -> list[ProviderEndpoint]:
        try:
            key = (b"" if prefs is None else orjson.dumps(prefs, option=orjson.OPT_SORT_KEYS), params)
        except TypeError:
            return route(self.config.providers, prefs, params)
        hit = self._route_cache.get(key)
        if hit is None:
            hit = route(self.config.providers, prefs, params)
            if len(self._route_cache) < 1024:
                self._route_cache[key] = hit
        return hit

    def _no_route(self, prefs: Any, params: frozenset[str]) -> web.Response:
        """404, worded as OpenRouter words it, naming why routing left no endpoint."""
        serving = [e for e in self.config.providers if e.status == 0]
        if isinstance(prefs, dict) and prefs.get("require_parameters") is True:
            relaxed = route(self.config.providers, {**prefs, "require_parameters": False}, params)
            if relaxed:
                return self._answer(
                    404,
                    "no_provider",
                    _error_body(
                        404,
                        "No endpoints found that can handle the requested parameters. To learn more about"
                        " provider routing, visit: https://openrouter.ai/docs/guides/routing/provider-selection",
                    ),
                )
        requested = sorted(_names(prefs.get("only"))) if isinstance(prefs, dict) else []
        tail = (
            f", but your request's provider.only preference permits only: {', '.join(requested)}" if requested else ""
        )
        return self._answer(
            404,
            "no_provider",
            _error_body(
                404,
                f"No allowed providers are available for the selected model. Providers serving"
                f" {self.config.model_permaslug}: {', '.join(sorted({e.slug for e in serving}))}{tail}.",
                {
                    "available_providers": sorted({e.slug for e in serving}),
                    "requested_providers": requested,
                    "routing_funnel": [{"step": "Initial Endpoints", "endpoint_count": len(serving)}],
                    "failed_routing_step": "Filter by Provider Preferences",
                },
            ),
        )

    @staticmethod
    def _cache_key(req: ChatRequest, exclude_reasoning: bool) -> tuple[Any, ...]:
        choice_key = req.tool_choice if isinstance(req.tool_choice, str | None) else orjson.dumps(req.tool_choice)
        return (req.content_hash, req.max_tokens, exclude_reasoning, choice_key)

    def _account(self, req: ChatRequest, completion: Completion, exclude_reasoning: bool) -> PreparedResponse:
        prompt_tokens = self.accountant.prompt_tokens(req.messages, req.tools)
        if self._leading_space_rate and self._leading_space(req.content_hash):
            # Some Kimi providers start both fields with a space; it is text like any other (counted, kept).
            completion = Completion(
                " " + completion.reasoning if completion.reasoning else "",
                " " + completion.content if completion.content else "",
                completion.tool_calls,
                completion.finish_reason,
            )
        return self.accountant.prepare(completion, prompt_tokens, req.max_tokens, exclude_reasoning)

    def _prepare(self, req: ChatRequest, exclude_reasoning: bool) -> PreparedResponse:
        key = self._cache_key(req, exclude_reasoning)
        prepared = self.cache.get(key)
        if prepared is None:
            prepared = self._account(req, self.generator.generate(req), exclude_reasoning)
            self.cache.put(key, prepared)
        return prepared

    async def _prepare_off_loop(self, req: ChatRequest, exclude_reasoning: bool) -> PreparedResponse:
        assert self._submit is not None
        key = self._cache_key(req, exclude_reasoning)
        prepared = self.cache.get(key)
        if prepared is None:
            # Shielded: a client that gives up must not cancel a generation other requests share.
            completion = await asyncio.shield(asyncio.wrap_future(self._submit(req)))
            prepared = self._account(req, completion, exclude_reasoning)
            self.cache.put(key, prepared)
        return prepared

    def _leading_space(self, content_hash: str) -> bool:
        """A fixed draw per prompt (text never depends on the attempt), at ``leading_space_rate``."""
        digest = hashlib.blake2b(f"space:{self.config.seed}:{content_hash}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") < self._leading_space_rate * _SPACE_DRAW

    def _usage(self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int, cost: float) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "cost": cost,
            "is_byok": False,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "cost_details": {"upstream_inference_cost": None},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens, "image_tokens": 0},
        }

    def _parse(self, body: Any) -> tuple[ChatRequest, str | None, bool, bool, Any, frozenset[str]]:
        """Validate the body: the request, a forced marker, stream flag, reasoning exclusion, routing, parameters."""
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequest("No model specified")
        if model not in self._models:
            raise _BadRequest(f"{model} is not a valid model ID")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest('Input required: specify "messages" as a non-empty array')
        marker: str | None = None
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _BadRequest('Each message needs a string "role"')
            if m["role"] == "user":
                text = _text_of(m.get("content"))
                if "[[sim:" in text:
                    found = _MARKER.search(text)
                    if found:
                        marker = found.group(1)
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise _BadRequest('"tools" must be an array')
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise _BadRequest("max_tokens must be a positive integer")
        reasoning = body.get("reasoning")
        exclude = bool(reasoning.get("exclude")) if isinstance(reasoning, dict) else False
        req = ChatRequest(messages, tools, body.get("tool_choice"), max_tokens, request_content_hash(messages, tools))
        return req, marker, bool(body.get("stream")), exclude, body.get("provider"), requested_parameters(body)

    # -- chat completions -------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        st = self.state.stats
        st.requests_received += 1
        st.in_flight += 1
        if st.in_flight > st.peak_in_flight:
            st.peak_in_flight = st.in_flight
        try:
            return await self._chat(request)
        finally:
            self.state.stats.in_flight -= 1

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        state = self.state
        faults = state.faults
        if not self._authorized(request):
            return self._unauthorized()
        bucket = state.bucket
        if bucket is not None and not bucket.try_take():
            state.stats.admit_rejected += 1
            headers = {"Retry-After": _seconds_header(faults.retry_after_s)} if faults.admit_retry_after else None
            return self._answer(
                429, "admit_rejected", _error_body(429, "Rate limit exceeded: too many requests"), headers
            )
        state.stats.admitted += 1
        try:
            raw = await request.read()
            req, marker, stream, exclude, prefs, params = self._parse(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return self._answer(400, "bad_request", _error_body(400, "Invalid JSON in request body"))
        except _BadRequest as exc:
            return self._answer(400, "bad_request", _error_body(400, exc.message))

        forced_fault: str | None = None
        if marker is not None:
            if marker == "400":
                return self._answer(
                    400,
                    "bad_request",
                    _error_body(
                        400, "Provider returned error: invalid request", {"provider_name": None, "raw": "simulated 400"}
                    ),
                )
            if marker == "403guardrail":
                return self._answer(
                    403,
                    "guardrail_blocked",
                    _error_body(403, "Request blocked: prompt injection patterns detected"),
                )
            if marker == "403":
                return self._answer(
                    403,
                    "moderation",
                    _error_body(
                        403,
                        f"{self.config.model_slug} requires moderation on OpenRouter. Your input was flagged for"
                        ' "violence"',
                        {
                            "reasons": ["violence"],
                            "flagged_input": "[[sim:403]]",
                            "provider_name": "Moderation",
                            "model_slug": self.config.model_slug,
                        },
                    ),
                )
            if marker.startswith("fault=") and marker[6:] in FAULT_NAMES:
                forced_fault = marker[6:]

        candidates = self._routes_for(prefs, params)
        if not candidates:
            return self._no_route(prefs, params)
        budget = state.workspace_budget
        if budget is not None and state.account.usage >= budget:
            return self._answer(
                403,
                "budget_exceeded",
                _error_body(403, "Budget limit exceeded (total limit). Contact your org admin."),
            )
        fault = forced_fault or state.picker.draw()
        provider = candidates[0]
        if fault == "disallowed_provider":
            provider = self._outside(candidates) or provider

        try:
            if self._submit is None:
                prepared = self._prepare(req, exclude)
            else:
                prepared = await self._prepare_off_loop(req, exclude)
        except ValueError as exc:  # the chat template could not render the prompt (PromptRenderError)
            return self._answer(400, "bad_request", _error_body(400, f"Provider returned error: {exc}"))
        reserve_tokens = req.max_tokens if req.max_tokens is not None else provider.max_completion_tokens
        needed = prepared.prompt_tokens * provider.prompt_price + reserve_tokens * provider.completion_price
        if state.account.remaining < needed:
            spare = max(0.0, state.account.remaining - prepared.prompt_tokens * provider.prompt_price)
            affordable = int(spare / provider.completion_price) if provider.completion_price > 0 else 0
            return self._answer(
                402,
                "insufficient_credits",
                _error_body(
                    402,
                    f"This request requires more credits, or fewer max_tokens. You requested up to {reserve_tokens} "
                    f"tokens, but can only afford {affordable}. To increase, visit "
                    "https://openrouter.ai/settings/credits and add more credits",
                    {"limit_source": "openrouter_credits"},
                ),
            )

        if fault in EARLY_FAULTS:
            return self._early_fault(fault, faults, provider)
        if stream:
            return await self._stream(request, req, prepared, provider, fault, started)
        return await self._complete(request, req, prepared, provider, fault, started)

    def _outside(self, candidates: list[ProviderEndpoint]) -> ProviderEndpoint | None:
        """An endpoint routing should have excluded, under a display name no candidate shares (a
        violation the client can see; one under a shared name is what pinning by tag prevents)."""
        names = {e.name.lower() for e in candidates}
        pool = [e for e in self.config.providers if e.name.lower() not in names and e.status == 0]
        return self.state.picker.choice(pool) if pool else None

    def _early_fault(self, fault: str, faults: FaultConfig, provider: ProviderEndpoint) -> web.Response:
        if fault == "inflight_402":
            return self._answer(
                402,
                fault,
                _error_body(
                    402,
                    "Your in-flight spending budget is exhausted; retry when earlier requests finish",
                    {"limit_source": "openrouter_in_flight_budget"},
                ),
                {"Retry-After": "1"},
            )
        headers = None
        if fault == "rate_limit":
            headers = {
                "Retry-After": _seconds_header(faults.retry_after_s),
                "X-RateLimit-Reset": str(int((time.time() + faults.retry_after_s) * 1000)),
            }
        return self._answer(
            429,
            fault,
            _error_body(
                429,
                f"{provider.name} is temporarily rate-limited upstream. Please retry shortly.",
                {
                    "provider_name": provider.name,
                    "raw": f"{provider.slug}: rate limit exceeded",
                    "error_type": "rate_limit",
                },
            ),
            headers,
        )

    def _server_error(self, provider: ProviderEndpoint) -> web.Response:
        status = (500, 502, 503)[self.state.picker.randrange(3)]
        messages = {
            500: "Internal Server Error",
            502: "Provider returned an invalid response",
            503: "Provider is unavailable",
        }
        headers = {"Retry-After": "1"} if status == 503 else None
        return self._answer(
            status,
            "server_error",
            _error_body(
                status,
                messages[status],
                {"provider_name": provider.name, "raw": "upstream error", "error_type": "provider_error"},
            ),
            headers,
        )

    def _latency(self, fault: str | None) -> float:
        if fault == "stall":
            return self.state.faults.stall_seconds
        return self.config.latency.draw(self.state.latency_rng)

    def _billable(self, fault: str | None, prepared: PreparedResponse) -> bool:
        if fault in UNBILLED_FAULTS:
            return False
        if fault == "truncated_json" and not self.state.faults.bill_truncated_json:
            return False
        return prepared.completion_tokens > 0

    async def _complete(
        self,
        request: web.Request,
        req: ChatRequest,
        prepared: PreparedResponse,
        provider: ProviderEndpoint,
        fault: str | None,
        started: float,
    ) -> web.StreamResponse:
        state = self.state
        gen_id = self._new_id()
        billable = self._billable(fault, prepared)
        delay = self._latency(fault)
        try:
            if delay > 0:
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            # The client gave up: OpenRouter still bills a non-streaming request in full, because
            # the upstream generation ran to the end regardless.
            if billable and not state.stopping:
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    prepared.completion_tokens,
                    prepared.reasoning_tokens,
                    prepared.finish_reason,
                    billed=True,
                    streamed=False,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
                state.stats.by_outcome["abandoned"] += 1
            raise
        headers = None  # OpenRouter sends no generation-id header: the id is the body's first field
        if fault == "server_error":
            return self._server_error(provider)
        if fault == "timeout_408":
            return self._answer(
                408,
                fault,
                _error_body(
                    408, "Request timed out upstream", {"provider_name": provider.name, "error_type": "timeout"}
                ),
            )
        if fault == "drop_connection":
            return await self._drop(request)
        if fault == "error_body":
            code: int | str = (502, "502", 503)[state.picker.randrange(3)]
            return self._answer(
                200,
                fault,
                _error_body(
                    code,
                    "Upstream error from provider",
                    {"provider_name": provider.name, "raw": "connection reset", "error_type": "provider_error"},
                ),
                headers,
            )
        if fault == "finish_error":
            partial = prepared.content[: len(prepared.content) // 2]
            done_tokens = prepared.completion_tokens // 2
            state.record_generation(
                gen_id,
                req.content_hash,
                provider,
                prepared.prompt_tokens,
                done_tokens,
                prepared.reasoning_tokens,
                "error",
                billed=False,
                streamed=False,
                cancelled=False,
                started=started,
                generation_s=delay,
            )
            message = {**prepared.message, "content": partial}
            message.pop("tool_calls", None)
            body = self._body(
                gen_id,
                provider,
                {
                    "logprobs": None,
                    "finish_reason": "error",
                    "native_finish_reason": "error",
                    "index": 0,
                    "message": message,
                    "error": {
                        "code": 502,
                        "message": "Provider disconnected mid-generation",
                        "metadata": {"provider_name": provider.name},
                    },
                },
                self._usage(prepared.prompt_tokens, done_tokens, prepared.reasoning_tokens, 0.0),
            )
            return self._answer(200, fault, body, headers)

        cost = state.record_generation(
            gen_id,
            req.content_hash,
            provider,
            prepared.prompt_tokens,
            prepared.completion_tokens,
            prepared.reasoning_tokens,
            prepared.finish_reason,
            billed=billable,
            streamed=False,
            cancelled=False,
            started=started,
            generation_s=delay,
        )
        body = self._body(
            gen_id,
            provider,
            prepared.choice,
            self._usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.reasoning_tokens, cost),
        )
        data = orjson.dumps(body)
        outcome = "ok" if fault is None else fault
        if fault == "truncated_json":
            data = data[: len(data) // 2]
        elif fault == "whitespace_padding":
            data = (b"\n", b"\n\n", b"   \n", b"\n \n  ")[state.picker.randrange(4)] + data
        st = state.stats
        st.by_outcome[outcome] += 1
        st.by_status["200"] += 1
        return web.Response(body=data, content_type=_JSON, headers=headers)

    def _body(
        self, gen_id: str, provider: ProviderEndpoint, choice: dict[str, Any], usage: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": gen_id,
            "provider": provider.name,
            "model": self.config.model_permaslug,
            "object": "chat.completion",
            "created": int(time.time()),
            "choices": [choice],
            "system_fingerprint": None,
            "usage": usage,
        }

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        """Close the TCP connection without a byte of response, like a crashed edge node."""
        st = self.state.stats
        st.by_outcome["drop_connection"] += 1
        st.by_status["none"] += 1
        transport = request.transport
        if transport is not None:
            transport.abort()
        # The aborted connection cancels this handler (handler_cancellation); should a runner
        # without it host the app, the error raised below goes nowhere either.
        await asyncio.sleep(5)
        raise ConnectionResetError("simulated dropped connection")

    # -- streaming --------------------------------------------------------------------------
    async def _stream(
        self,
        request: web.Request,
        req: ChatRequest,
        prepared: PreparedResponse,
        provider: ProviderEndpoint,
        fault: str | None,
        started: float,
    ) -> web.StreamResponse:
        state = self.state
        cfg = self.config
        if fault == "server_error":
            await self._sleep(self._latency(None))
            return self._server_error(provider)
        if fault == "timeout_408":
            await self._sleep(self._latency(None))
            return self._answer(
                408, fault, _error_body(408, "Request timed out upstream", {"provider_name": provider.name})
            )
        gen_id = self._new_id()
        created = int(time.time())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        deltas = prepared.stream_deltas(cfg.stream_chunks)
        billable = self._billable(fault, prepared)
        total_delay = self._latency(None)
        sent = 0
        base = {
            "id": gen_id,
            "provider": provider.name,
            "model": cfg.model_permaslug,
            "object": "chat.completion.chunk",
            "created": created,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            payload = {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "finish_reason": finish,
                        "native_finish_reason": finish,
                        "logprobs": None,
                    }
                ],
                **extra,
            }
            return b"data: " + orjson.dumps(payload) + b"\n\n"

        try:
            await resp.write(_PROCESSING)
            if fault == "whitespace_padding":
                await resp.write(_PROCESSING)
            if fault == "stall":
                await asyncio.sleep(state.faults.stall_seconds)
            await self._sleep_with_comments(resp, total_delay * 0.3)
            per_chunk = total_delay * 0.7 / max(1, len(deltas))
            cut = (
                len(deltas) // 2
                if fault in ("drop_connection", "finish_error", "error_body", "truncated_json")
                else None
            )
            for i, delta in enumerate(deltas):
                if cut is not None and i == cut:
                    break
                if per_chunk > 0:
                    await asyncio.sleep(per_chunk)
                await resp.write(chunk(delta))
                sent += 1
            if fault == "drop_connection":
                # The id went out with the first chunk: /generation knows the attempt (unbilled: no answer).
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    prepared.completion_tokens * sent // max(1, len(deltas)),
                    prepared.reasoning_tokens,
                    prepared.finish_reason,
                    billed=False,
                    streamed=True,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
                sent = len(deltas) + 1  # settled above: the disconnect below must not bill it again
                return await self._drop(request)
            if fault == "truncated_json":
                if billable:
                    state.record_generation(
                        gen_id,
                        req.content_hash,
                        provider,
                        prepared.prompt_tokens,
                        prepared.completion_tokens,
                        prepared.reasoning_tokens,
                        prepared.finish_reason,
                        billed=True,
                        streamed=True,
                        cancelled=False,
                        started=started,
                        generation_s=total_delay,
                    )
                line = chunk(deltas[min(sent, len(deltas) - 1)])
                await resp.write(line[: len(line) // 2])
                state.stats.by_outcome[fault] += 1
                state.stats.by_status["200"] += 1
                transport = request.transport
                if transport is not None:
                    transport.abort()
                return resp
            if fault in ("finish_error", "error_body"):
                done_tokens = prepared.completion_tokens * sent // max(1, len(deltas))
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    done_tokens,
                    prepared.reasoning_tokens,
                    "error",
                    billed=False,
                    streamed=True,
                    cancelled=False,
                    started=started,
                    generation_s=total_delay,
                )
                err = _error_body(502, "Provider disconnected mid-generation", {"provider_name": provider.name})
                await resp.write(chunk({"role": "assistant", "content": ""}, "error", **err))
                await resp.write(_DONE)
                state.stats.by_outcome[fault] += 1
                state.stats.by_status["200"] += 1
                await resp.write_eof()
                return resp
            cost = state.record_generation(
                gen_id,
                req.content_hash,
                provider,
                prepared.prompt_tokens,
                prepared.completion_tokens,
                prepared.reasoning_tokens,
                prepared.finish_reason,
                billed=billable,
                streamed=True,
                cancelled=False,
                started=started,
                generation_s=total_delay,
            )
            sent = len(deltas) + 1  # billed in full from here on
            usage = self._usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.reasoning_tokens, cost)
            await resp.write(chunk({"role": "assistant", "content": ""}, prepared.finish_reason))
            # Usage comes last, in a chunk of its own with no choices.
            await resp.write(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n" + _DONE)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            if sent <= len(deltas) and billable and not state.stopping:
                # A cancelled stream is billed for what was generated so far.
                done = prepared.completion_tokens * sent // max(1, len(deltas))
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    done,
                    min(done, prepared.reasoning_tokens),
                    prepared.finish_reason,
                    billed=True,
                    streamed=True,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
                state.stats.by_outcome["stream_abandoned"] += 1
            raise
        outcome = "ok" if fault is None else fault
        state.stats.by_outcome[outcome] += 1
        state.stats.by_status["200"] += 1
        return resp

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def _sleep_with_comments(self, resp: web.StreamResponse, seconds: float) -> None:
        interval = self.config.processing_comment_interval_s
        while seconds > 0:
            step = min(interval, seconds)
            await asyncio.sleep(step)
            seconds -= step
            if seconds > 0:
                await resp.write(_PROCESSING)

    # -- account and metadata ---------------------------------------------------------------
    async def key(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        return _json_response(200, {"data": self.state.key_data()})

    async def credits(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        if request.headers.get("Authorization", "")[7:].strip() not in self.config.management_keys:
            return _json_response(403, _error_body(403, "Only management keys can perform this operation"))
        a = self.state.account
        return _json_response(200, {"data": {"total_credits": a.limit, "total_usage": a.usage}})

    async def generation(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized()
        gen_id = request.query.get("id", "")
        if not gen_id:
            return _json_response(400, _error_body(400, "Missing required parameter: id"))
        rec = self.state.generations.get(gen_id)
        if rec is None or (time.monotonic() - rec.completed_at) * 1000 < self.config.generation_404_ms:
            return _json_response(404, _error_body(404, f"Generation {gen_id} not found"))
        return _json_response(200, {"data": rec.api_data(self.config.model_permaslug)})

    async def endpoints(self, request: web.Request) -> web.Response:
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if model not in self._models:
            return _json_response(404, _error_body(404, f"Model {model} not found"))
        return _json_response(200, endpoints_payload(self.config))

    # -- admin ------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return _json_response(200, {"status": "ok"})

    async def admin_topup(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            self.state.topup(float(body["amount"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return _json_response(400, _error_body(400, f"bad top-up: {exc}"))
        return _json_response(200, {"data": self.state.key_data()})

    async def admin_budget(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            amount = body.get("amount")
            self.state.set_workspace_budget(None if amount is None else float(amount))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            return _json_response(400, _error_body(400, f"bad budget: {exc}"))
        return _json_response(200, {"workspace_budget_usd": self.state.workspace_budget})

    async def admin_stats(self, request: web.Request) -> web.Response:
        raw = request.query.get("generations")
        limit = int(raw) if raw is not None and raw.isdigit() else None
        snap = self.state.snapshot(limit)
        snap["cache"] = {"size": len(self.cache), "hits": self.cache.hits, "misses": self.cache.misses}
        generator_stats = getattr(self.generator, "stats", None)
        if isinstance(generator_stats, dict):  # a model-backed generator: batches, tokens, forward seconds
            snap["generator"] = dict(generator_stats)
        return _json_response(200, snap)

    async def admin_faults(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object of fault settings")
            faults = FaultConfig.from_mapping(body)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return _json_response(400, _error_body(400, f"bad fault config: {exc}"))
        self.state.set_faults(faults)
        return _json_response(200, {"faults": faults.to_dict()})

    async def admin_reset_stats(self, request: web.Request) -> web.Response:
        self.state.reset_stats()
        return _json_response(200, {"ok": True})


def endpoints_payload(config: SimulatorConfig) -> dict[str, Any]:
    return {
        "data": {
            "id": config.model_slug,
            "name": MODEL_NAME,
            "created": 1769472000,
            "description": "Kimi K2.5 (simulated endpoints)",
            "architecture": {
                "tokenizer": "Other",
                "instruct_type": None,
                "modality": "text+image->text",
                "input_modalities": ["text", "image"],
                "output_modalities": ["text"],
            },
            "endpoints": [
                {
                    "name": f"{e.name} | {config.model_permaslug}",
                    "model_name": MODEL_NAME,
                    "context_length": e.context_length,
                    "pricing": {
                        "prompt": per_token_string(e.prompt_usd_per_m),
                        "completion": per_token_string(e.completion_usd_per_m),
                        "request": "0",
                        "image": "0",
                        "web_search": "0",
                        "internal_reasoning": "0",
                        "discount": 0,
                    },
                    "provider_name": e.name,
                    "tag": e.tag,
                    "quantization": e.quantization,
                    "max_completion_tokens": e.max_completion_tokens,
                    "max_prompt_tokens": None,
                    "supported_parameters": list(e.parameters),
                    "status": e.status,
                    "uptime_last_30m": e.uptime_last_30m,
                    "supports_implicit_caching": False,
                }
                for e in config.providers
            ],
        }
    }


async def _flush_loop(state: SimulatorState, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        state.flush()


def build_app(config: SimulatorConfig, generator: ResponseGenerator | None = None) -> web.Application:
    """The simulator as an aiohttp app; ``app[STATE_KEY]`` is its ``SimulatorState``.

    Host it with ``handler_cancellation=True`` (``start_server`` does): billing an abandoned
    request and dropping a connection both rely on a disconnect cancelling its handler.
    """
    state = SimulatorState(config)
    sim = Simulator(config, state, generator)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = state
    api = "/api/v1"
    app.router.add_post(f"{api}/chat/completions", sim.chat_completions)
    app.router.add_get(f"{api}/key", sim.key)
    app.router.add_get(f"{api}/auth/key", sim.key)
    app.router.add_get(f"{api}/credits", sim.credits)
    app.router.add_get(f"{api}/generation", sim.generation)
    app.router.add_get(f"{api}/models/{{author}}/{{slug}}/endpoints", sim.endpoints)
    app.router.add_get("/health", sim.health)
    app.router.add_post("/_sim/topup", sim.admin_topup)
    app.router.add_post("/_sim/budget", sim.admin_budget)
    app.router.add_get("/_sim/stats", sim.admin_stats)
    app.router.add_post("/_sim/faults", sim.admin_faults)
    app.router.add_post("/_sim/reset_stats", sim.admin_reset_stats)

    async def persistence(app: web.Application) -> Any:
        state.flush()
        task = asyncio.create_task(_flush_loop(state, config.state_flush_interval_s))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        state.flush()

    if config.state_file is not None:
        app.cleanup_ctx.append(persistence)
    return app


@dataclass
class RunningServer:
    runner: web.AppRunner
    state: SimulatorState
    host: str
    port: int

    @property
    def root_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/api/v1"

    async def stop(self) -> None:
        self.state.stopping = True
        await self.runner.cleanup()
        self.state.flush()


async def start_server(
    config: SimulatorConfig, generator: ResponseGenerator | None = None, shutdown_timeout_s: float = 1.0
) -> RunningServer:
    """Bind and start serving on the current loop (port 0 picks a free port)."""
    app = build_app(config, generator)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=config.backlog, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    return RunningServer(runner, app[STATE_KEY], config.host, port)
