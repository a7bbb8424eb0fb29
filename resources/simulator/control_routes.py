"""``/health`` and the ``/_sim/*`` control routes: top-ups, workspace budget, faults, stats.

Not part of OpenRouter's API: what tests and benchmarks use to steer the stand-in
(``tests/simulator/harness.py``).
"""

import orjson
from aiohttp import web

from resources.simulator.chat import ChatCompletions
from resources.simulator.faults import FaultConfig
from resources.simulator.state import SimulatorState
from resources.simulator.wire import error_body, json_response


class ControlRoutes:
    def __init__(self, state: SimulatorState, chat: ChatCompletions) -> None:
        self.state = state
        self.cache = chat.cache  # the stats report the chat route's response cache and generator
        self.generator = chat.generator

    async def health(self, request: web.Request) -> web.Response:
        return json_response(200, {"status": "ok"})

    async def admin_topup(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            self.state.topup(float(body["amount"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return json_response(400, error_body(400, f"bad top-up: {exc}"))
        return json_response(200, {"data": self.state.key_data()})

    async def admin_budget(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            amount = body.get("amount")
            self.state.set_workspace_budget(None if amount is None else float(amount))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            return json_response(400, error_body(400, f"bad budget: {exc}"))
        return json_response(200, {"workspace_budget_usd": self.state.workspace_budget})

    async def admin_generation_window(self, request: web.Request) -> web.Response:
        """How long /generation answers 404 after a generation completed (``{"ms": …}``)."""
        try:
            body = orjson.loads(await request.read())
            self.state.generation_404_ms = max(0.0, float(body["ms"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return json_response(400, error_body(400, f"bad generation window: {exc}"))
        return json_response(200, {"generation_404_ms": self.state.generation_404_ms})

    async def admin_request_wide_error(self, request: web.Request) -> web.Response:
        """Answer every chat request with a 400 of ``{"message": …}`` from now on (null: stop), after
        ``delay_s`` seconds (optional, 0 by default)."""
        try:
            body = orjson.loads(await request.read())
            message = body["message"]
            if message is not None and not isinstance(message, str):
                raise TypeError("message must be a string or null")
            delay_s = float(body.get("delay_s") or 0.0)
            if delay_s < 0:
                raise ValueError("delay_s must be >= 0")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return json_response(400, error_body(400, f"bad request-wide error: {exc}"))
        self.state.request_wide_error = message
        self.state.request_wide_delay_s = delay_s
        return json_response(200, {"request_wide_error": message, "delay_s": delay_s})

    async def admin_stats(self, request: web.Request) -> web.Response:
        raw = request.query.get("generations")
        limit = int(raw) if raw is not None and raw.isdigit() else None
        snap = self.state.snapshot(limit)
        snap["cache"] = {"size": len(self.cache), "hits": self.cache.hits, "misses": self.cache.misses}
        generator_stats = getattr(self.generator, "stats", None)
        if isinstance(generator_stats, dict):  # a model-backed generator: batches, tokens, forward seconds
            snap["generator"] = dict(generator_stats)
        return json_response(200, snap)

    async def admin_faults(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("expected a JSON object of fault settings")
            faults = FaultConfig.from_mapping(body)
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            return json_response(400, error_body(400, f"bad fault config: {exc}"))
        self.state.set_faults(faults)
        return json_response(200, {"faults": faults.to_dict()})

    async def admin_reset_stats(self, request: web.Request) -> web.Response:
        self.state.reset_stats()
        return json_response(200, {"ok": True})
