"""The OpenRouter stand-in: an aiohttp app speaking the subset of the API this project relies on.

Each route lives in the module named for what it serves (docs/layout.md maps them); this module
builds the app and serves it.
"""

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from resources.simulator.account import AccountRoutes
from resources.simulator.chat import ChatCompletions
from resources.simulator.config import SimulatorConfig
from resources.simulator.control_routes import ControlRoutes
from resources.simulator.endpoints import EndpointRoutes, endpoints_payload
from resources.simulator.generation_lookup import GenerationLookupRoutes
from resources.simulator.responses import ResponseGenerator
from resources.simulator.state import SimulatorState

__all__ = ["STATE_KEY", "RunningServer", "SimulatorState", "build_app", "endpoints_payload", "start_server"]

STATE_KEY: web.AppKey[SimulatorState] = web.AppKey("simulator_state", SimulatorState)


async def _flush_loop(state: SimulatorState, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        state.flush()


def build_app(config: SimulatorConfig, generator: ResponseGenerator | None = None) -> web.Application:
    """The simulator as an aiohttp app (``app[STATE_KEY]``: its state). Host it with ``handler_cancellation=True``
    (``start_server`` does): billing an abandoned request and dropping a connection rely on it."""
    state = SimulatorState(config)
    chat = ChatCompletions(config, state, generator)
    account = AccountRoutes(config, state)
    lookup = GenerationLookupRoutes(config, state)
    endpoints = EndpointRoutes(config)
    control = ControlRoutes(state, chat)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = state
    api = "/api/v1"
    app.router.add_post(f"{api}/chat/completions", chat.chat_completions)
    app.router.add_get(f"{api}/key", account.key)
    app.router.add_get(f"{api}/auth/key", account.key)
    app.router.add_get(f"{api}/credits", account.credits)
    app.router.add_get(f"{api}/generation", lookup.generation)
    app.router.add_get(f"{api}/models/{{author}}/{{slug}}/endpoints", endpoints.endpoints)
    app.router.add_get("/health", control.health)
    app.router.add_post("/_sim/topup", control.admin_topup)
    app.router.add_post("/_sim/budget", control.admin_budget)
    app.router.add_get("/_sim/stats", control.admin_stats)
    app.router.add_post("/_sim/faults", control.admin_faults)
    app.router.add_post("/_sim/reset_stats", control.admin_reset_stats)
    app.router.add_post("/_sim/generation_window", control.admin_generation_window)
    app.router.add_post("/_sim/request_wide_error", control.admin_request_wide_error)

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
