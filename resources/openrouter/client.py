"""Async OpenRouter client on aiohttp.

Why aiohttp and not httpx's own pool: at 2000 requests in flight httpx's pool is CPU-bound (tens of
ms of CPU per request on 2 cores), while aiohttp's connector costs about a millisecond
(``benchmarks/bench_transport.py`` measures both). The client never raises for what the server
answers: it returns a ``RawResponse`` and ``outcomes.classify`` decides what it means.
"""

import time
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from resources.openrouter.outcomes import RawResponse
from resources.openrouter.secret import ApiKey

_KEPT_HEADERS = ("retry-after", "x-ratelimit-reset", "x-generation-id")


class OpenRouterHTTPError(RuntimeError):
    """An account/metadata call (not a completion) failed; carries status and a short message."""

    def __init__(self, what: str, status: int | None, message: str) -> None:
        super().__init__(f"{what} failed: HTTP {status}: {message[:200]}")
        self.status = status


class OpenRouterClient:
    def __init__(
        self,
        base_url: str,
        api_key: ApiKey,
        *,
        max_connections: int = 2000,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 30.0,
        app_title: str = "eagle-forge",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
        self._headers = {"X-Title": app_title, "Content-Type": "application/json"}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "OpenRouterClient":
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            json_serialize=lambda x: orjson.dumps(x).decode(),
            headers={**self._headers, "Authorization": f"Bearer {self._key.reveal()}"},
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("OpenRouterClient used outside 'async with'")
        return self._session

    async def chat_completion(self, payload: dict[str, Any]) -> RawResponse:
        start = time.monotonic()
        try:
            async with self.session.post(f"{self.base_url}/chat/completions", data=orjson.dumps(payload)) as resp:
                body = await resp.read()
                headers = {k: resp.headers[k] for k in _KEPT_HEADERS if k in resp.headers}
                return RawResponse(resp.status, body, headers, None, time.monotonic() - start)
        except TimeoutError:
            return RawResponse(None, None, {}, "timeout", time.monotonic() - start)
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            aiohttp.ClientConnectionError,
            ConnectionError,
        ):
            return RawResponse(None, None, {}, "connection", time.monotonic() - start)

    async def _get_json(self, what: str, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            async with self.session.get(f"{self.base_url}{path}", params=params) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise OpenRouterHTTPError(what, resp.status, body.decode("utf-8", "replace"))
                return orjson.loads(body.strip())
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise OpenRouterHTTPError(what, None, type(exc).__name__) from None

    async def key_info(self) -> dict[str, Any]:
        """``/key``: ``limit``, ``limit_remaining`` and ``usage`` in USD (``limit`` None = unlimited)."""
        return (await self._get_json("GET /key", "/key")).get("data") or {}

    async def endpoints(self, model: str) -> dict[str, Any]:
        return await self._get_json("GET endpoints", f"/models/{model}/endpoints")

    async def generation(self, generation_id: str) -> dict[str, Any] | None:
        try:
            return (await self._get_json("GET /generation", "/generation", {"id": generation_id})).get("data")
        except OpenRouterHTTPError as exc:
            if exc.status == 404:
                return None
            raise
