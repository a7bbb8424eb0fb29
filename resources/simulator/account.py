"""``GET /key`` (and the older ``/auth/key``) and ``GET /credits``: the account as OpenRouter shows it.

``/credits`` answers management keys only; any other key gets the 403 OpenRouter's spec documents.
"""

from aiohttp import web

from resources.simulator.config import SimulatorConfig
from resources.simulator.state import SimulatorState
from resources.simulator.wire import authorized, error_body, json_response, unauthorized


class AccountRoutes:
    def __init__(self, config: SimulatorConfig, state: SimulatorState) -> None:
        self.config = config
        self.state = state

    async def key(self, request: web.Request) -> web.Response:
        if not authorized(self.config, request):
            return unauthorized(self.state)
        return json_response(200, {"data": self.state.key_data()})

    async def credits(self, request: web.Request) -> web.Response:
        if not authorized(self.config, request):
            return unauthorized(self.state)
        if request.headers.get("Authorization", "")[7:].strip() not in self.config.management_keys:
            return json_response(403, error_body(403, "Only management keys can perform this operation"))
        a = self.state.account
        return json_response(200, {"data": {"total_credits": a.limit, "total_usage": a.usage}})
