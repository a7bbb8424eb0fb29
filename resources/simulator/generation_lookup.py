"""``GET /generation?id=gen-…``: what one generation was billed, as OpenRouter reports it.

A generation is "not found" (404) for ``generation_404_ms`` after it completed, as real lookups are
until OpenRouter has indexed it: callers must settle such attempts later.
"""

import time

from aiohttp import web

from resources.simulator.config import SimulatorConfig
from resources.simulator.state import SimulatorState
from resources.simulator.wire import authorized, error_body, json_response, unauthorized


class GenerationLookupRoutes:
    def __init__(self, config: SimulatorConfig, state: SimulatorState) -> None:
        self.config = config
        self.state = state

    async def generation(self, request: web.Request) -> web.Response:
        if not authorized(self.config, request):
            return unauthorized(self.state)
        gen_id = request.query.get("id", "")
        if not gen_id:
            return json_response(400, error_body(400, "Missing required parameter: id"))
        rec = self.state.generations.get(gen_id)
        if rec is None or (time.monotonic() - rec.completed_at) * 1000 < self.state.generation_404_ms:
            return json_response(404, error_body(404, f"Generation {gen_id} not found"))
        return json_response(200, {"data": rec.api_data(self.config.model_permaslug)})
