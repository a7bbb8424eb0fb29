"""What every route of the simulator answers with: JSON bodies, OpenRouter's error envelope, the key check.

Kept apart from the routes so that each answers in the same shapes (``tests/fixtures/openrouter``)
and counts what it answered the same way (``SimulatorStats.by_outcome`` / ``by_status``).
"""

from typing import Any

import orjson
from aiohttp import web

from resources.simulator.config import SimulatorConfig
from resources.simulator.state import SimulatorState

JSON = "application/json"


def seconds_header(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type=JSON, headers=headers)


def error_body(code: int | str, message: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    return {"error": err}


class BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def authorized(config: SimulatorConfig, request: web.Request) -> bool:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return False
    key = header[7:].strip()
    if not key:
        return False
    accepted = config.accepted_keys
    return accepted is None or key in accepted


def answer(
    state: SimulatorState, status: int, outcome: str, payload: Any, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer, counted in the stats by outcome and status."""
    st = state.stats
    st.by_outcome[outcome] += 1
    st.by_status[str(status)] += 1
    return json_response(status, payload, headers)


def unauthorized(state: SimulatorState) -> web.Response:
    return answer(state, 401, "unauthorized", error_body(401, "No auth credentials found"))
