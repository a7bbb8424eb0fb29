"""``POST /chat/completions``: parse and validate the request, route it, pick a fault, answer.

It exercises the generation engine against everything the real service does to a client (429 storms,
200-with-error bodies, padded or truncated JSON, dropped connections, billing of abandoned requests, routing
that ignores preferences) in the real shapes (``tests/fixtures/openrouter``). The answer itself is
``chat_plain.py`` or ``chat_stream.py``.
"""

import asyncio
import re
import time
from typing import Any

import orjson
from aiohttp import web

from resources.simulator.chat_plain import PlainAnswer
from resources.simulator.chat_stream import StreamAnswer
from resources.simulator.config import ProviderEndpoint, SimulatorConfig
from resources.simulator.faults import EARLY_FAULTS, FAULT_NAMES, FaultConfig
from resources.simulator.responses import (
    ChatRequest,
    PreparedResponse,
    ResponseGenerator,
    _text_of,
    request_content_hash,
)
from resources.simulator.routing import _names, requested_parameters, route
from resources.simulator.state import SimulatorState
from resources.simulator.wire import BadRequest, authorized, error_body, seconds_header, unauthorized

_MARKER = re.compile(r"\[\[sim:([A-Za-z0-9_=]+)\]\]")


class ChatCompletions(PlainAnswer, StreamAnswer):
    """The chat route; ``chat_completions`` is its handler."""

    def __init__(self, config: SimulatorConfig, state: SimulatorState, generator: ResponseGenerator | None) -> None:
        super().__init__(config, state, generator)
        self._route_cache: dict[Any, list[ProviderEndpoint]] = {}
        self._models = {config.model_slug, config.model_permaslug}

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
                    error_body(
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
            error_body(
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

    def _parse(self, body: Any) -> tuple[ChatRequest, str | None, bool, bool, Any, frozenset[str]]:
        """Validate the body: the request, a forced marker, stream flag, reasoning exclusion, routing, parameters."""
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("No model specified")
        if model not in self._models:
            raise BadRequest(f"{model} is not a valid model ID")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest('Input required: specify "messages" as a non-empty array')
        marker: str | None = None
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest('Each message needs a string "role"')
            if m["role"] == "user":
                text = _text_of(m.get("content"))
                if "[[sim:" in text:
                    found = _MARKER.search(text)
                    if found:
                        marker = found.group(1)
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise BadRequest('"tools" must be an array')
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise BadRequest("max_tokens must be a positive integer")
        reasoning = body.get("reasoning")
        exclude = bool(reasoning.get("exclude")) if isinstance(reasoning, dict) else False
        req = ChatRequest(messages, tools, body.get("tool_choice"), max_tokens, request_content_hash(messages, tools))
        return req, marker, bool(body.get("stream")), exclude, body.get("provider"), requested_parameters(body)

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
        refused = self._refused_at_the_door(request, faults)
        if refused is not None:
            return refused
        try:
            raw = await request.read()
            req, marker, stream, exclude, prefs, params = self._parse(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return self._answer(400, "bad_request", error_body(400, "Invalid JSON in request body"))
        except BadRequest as exc:
            return self._answer(400, "bad_request", error_body(400, exc.message))
        if state.request_wide_error is not None:
            # The request itself is refused, whatever the prompt (a parameter the endpoint will not take).
            message = state.request_wide_error
            if state.request_wide_delay_s > 0:
                await asyncio.sleep(state.request_wide_delay_s)
            return self._answer(400, "request_wide_400", error_body(400, message))
        forced_fault: str | None = None
        if marker is not None:
            marked = self._marked_refusal(marker)
            if marked is not None:
                return marked
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
                error_body(403, "Budget limit exceeded (total limit). Contact your org admin."),
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
            return self._answer(400, "bad_request", error_body(400, f"Provider returned error: {exc}"))
        unaffordable = self._unaffordable(req, prepared, provider)
        if unaffordable is not None:
            return unaffordable

        if fault in EARLY_FAULTS:
            return self._early_fault(fault, faults, provider)
        if stream:
            return await self._stream(request, req, prepared, provider, fault, started)
        return await self._complete(request, req, prepared, provider, fault, started)

    def _refused_at_the_door(self, request: web.Request, faults: FaultConfig) -> web.Response | None:
        """401 without a key the account accepts, 429 when the admission bucket is empty; else admitted."""
        if not authorized(self.config, request):
            return unauthorized(self.state)
        state = self.state
        bucket = state.bucket
        if bucket is not None and not bucket.try_take():
            state.stats.admit_rejected += 1
            headers = {"Retry-After": seconds_header(faults.retry_after_s)} if faults.admit_retry_after else None
            return self._answer(
                429, "admit_rejected", error_body(429, "Rate limit exceeded: too many requests"), headers
            )
        state.stats.admitted += 1
        return None

    def _marked_refusal(self, marker: str) -> web.Response | None:
        """The refusal a ``[[sim:...]]`` marker in the prompt asks for (a 400 or a 403), if any."""
        if marker == "400":
            return self._answer(
                400,
                "bad_request",
                error_body(
                    400, "Provider returned error: invalid request", {"provider_name": None, "raw": "simulated 400"}
                ),
            )
        if marker == "403guardrail":
            return self._answer(
                403,
                "guardrail_blocked",
                error_body(403, "Request blocked: prompt injection patterns detected"),
            )
        if marker == "403":
            slug = self.config.model_slug
            return self._answer(
                403,
                "moderation",
                error_body(
                    403,
                    f'{slug} requires moderation on OpenRouter. Your input was flagged for "violence"',
                    {
                        "reasons": ["violence"],
                        "flagged_input": "[[sim:403]]",
                        "provider_name": "Moderation",
                        "model_slug": slug,
                    },
                ),
            )
        return None

    def _unaffordable(
        self, req: ChatRequest, prepared: PreparedResponse, provider: ProviderEndpoint
    ) -> web.Response | None:
        """402 when the credits left cannot pay for the prompt and ``max_tokens`` of output, worded as OpenRouter
        words it (how many tokens they would pay for)."""
        remaining = self.state.account.remaining
        reserve_tokens = req.max_tokens if req.max_tokens is not None else provider.max_completion_tokens
        needed = prepared.prompt_tokens * provider.prompt_price + reserve_tokens * provider.completion_price
        if remaining >= needed:
            return None
        spare = max(0.0, remaining - prepared.prompt_tokens * provider.prompt_price)
        affordable = int(spare / provider.completion_price) if provider.completion_price > 0 else 0
        return self._answer(
            402,
            "insufficient_credits",
            error_body(
                402,
                f"This request requires more credits, or fewer max_tokens. You requested up to {reserve_tokens} "
                f"tokens, but can only afford {affordable}. To increase, visit "
                "https://openrouter.ai/settings/credits and add more credits",
                {"limit_source": "openrouter_credits"},
            ),
        )
