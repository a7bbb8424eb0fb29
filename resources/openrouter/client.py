"""Async OpenRouter client on aiohttp.

Why aiohttp and not httpx's pool: at 2000 in flight httpx's pool costs tens of ms of CPU per request, aiohttp's
connector about one (``benchmarks/bench_transport.py``). The client never raises for what the server answers:
``outcomes.classify`` decides what a ``RawResponse`` means. The generation id is taken from the response head's
``X-Generation-Id`` (sent before the padding, so a timeout in it keeps the id) and handed to ``on_generation_id``
at once, so a caller can write it down before the answer (or a crash) comes; else from a cut body's first bytes
or a stream's first chunk. ``"stream": true`` goes through ``stream_transport`` and is reassembled by ``sse``.
"""

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from eagle_assets.errors import OpenRouterError, Systemic
from resources.openrouter.outcomes import RawResponse, generation_id_from_prefix
from resources.openrouter.secret import ApiKey
from resources.openrouter.sse import assemble_sse
from resources.openrouter.stream_transport import StreamPool

_KEPT_HEADERS = ("retry-after", "x-ratelimit-reset", "x-generation-id")
_CONNECT_TIMEOUT_S = 30.0
_STREAM_READ_INTERVAL_S = 0.25
_TRANSPORT_ERRORS = (
    aiohttp.ClientPayloadError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientConnectionError,
    ConnectionError,
)


class OpenRouterHTTPError(OpenRouterError, Systemic, RuntimeError):
    """An account/metadata call (not a completion) failed. Systemic: every partition makes the same calls with
    the same key."""

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
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=_CONNECT_TIMEOUT_S)
        self._pool: StreamPool | None = None
        self._headers = {"X-Title": "eagle-forge", "Content-Type": "application/json"}
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
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("OpenRouterClient used outside 'async with'")
        return self._session

    async def chat_completion(
        self,
        payload: dict[str, Any],
        *,
        idle_timeout_s: float | None = None,
        on_generation_id: Callable[[str], None] | None = None,
        on_accepted: Callable[[], None] | None = None,
    ) -> RawResponse:
        """One attempt. ``payload["stream"]`` selects SSE; ``idle_timeout_s`` bounds the gap between data
        events; ``on_generation_id`` gets the ``X-Generation-Id`` of a 200 response head when it arrives, and
        ``on_accepted`` is called then, id or not: the request passed OpenRouter's checks and is being answered."""
        if payload.get("stream"):
            timeout = idle_timeout_s or self._timeout.total or 600.0
            return await self._stream(payload, timeout, on_generation_id, on_accepted)
        start = time.monotonic()
        parts: list[bytes] = []
        headers: dict[str, str] = {}
        gen_id: str | None = None
        try:
            async with self.session.post(f"{self.base_url}/chat/completions", data=orjson.dumps(payload)) as resp:
                # The head comes before any padding or body: keep what it says before reading on.
                headers = {k: resp.headers[k] for k in _KEPT_HEADERS if k in resp.headers}
                gen_id = headers.get("x-generation-id") or None
                if gen_id and resp.status == 200 and on_generation_id is not None:
                    on_generation_id(gen_id)  # a generation started (an error's id names nothing billed)
                if resp.status == 200 and on_accepted is not None:
                    on_accepted()
                content = resp.content
                while chunk := await content.readany():
                    parts.append(chunk)
                return RawResponse(
                    resp.status, b"".join(parts), headers, None, time.monotonic() - start, generation_id=gen_id
                )
        except TimeoutError:
            latency = time.monotonic() - start
            return RawResponse(None, b"".join(parts) or None, headers, "timeout", latency, generation_id=gen_id)
        except _TRANSPORT_ERRORS:
            latency = time.monotonic() - start
            return RawResponse(None, b"".join(parts) or None, headers, "connection", latency, generation_id=gen_id)

    async def _stream(
        self,
        payload: dict[str, Any],
        idle_timeout_s: float,
        on_generation_id: Callable[[str], None] | None,
        on_accepted: Callable[[], None] | None,
    ) -> RawResponse:
        start = time.monotonic()
        if self._pool is None:
            self._pool = StreamPool(
                self.base_url,
                {**self._headers, "Authorization": f"Bearer {self._key.reveal()}"},
                connect_timeout_s=_CONNECT_TIMEOUT_S,
                max_idle=self._max_connections,
            )
        res = await self._pool.post(
            "/chat/completions",
            orjson.dumps(payload),
            total_timeout_s=self._timeout.total or 600.0,
            idle_timeout_s=idle_timeout_s,
            read_interval_s=_STREAM_READ_INTERVAL_S,
            on_generation_id=on_generation_id,
            on_accepted=on_accepted,
        )
        latency = time.monotonic() - start
        headers = {k: res.headers[k] for k in _KEPT_HEADERS if k in res.headers}
        head_id = headers.get("x-generation-id") or None
        if res.error is not None:
            gen_id = head_id or generation_id_from_prefix(res.body)
            return RawResponse(None, res.body or None, headers, res.error, latency, generation_id=gen_id)
        if res.status != 200 or not res.headers.get("content-type", "").startswith("text/event-stream"):
            # An error comes whole, as without stream.
            return RawResponse(res.status, res.body, headers, None, latency, generation_id=head_id)
        done = assemble_sse(res.body)
        gen_id = head_id or done.generation_id
        if not done.complete or done.body is None:
            return RawResponse(200, None, headers, "connection", latency, generation_id=gen_id)
        return RawResponse(200, None, headers, None, latency, parsed=done.body, generation_id=gen_id)

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

    async def credits(self) -> dict[str, Any]:
        """``/credits``: ``total_credits`` and ``total_usage`` (USD); a normal key gets 403 (management keys only)."""
        return (await self._get_json("GET /credits", "/credits")).get("data") or {}

    async def endpoints(self, model: str) -> dict[str, Any]:
        return await self._get_json("GET endpoints", f"/models/{model}/endpoints")

    async def generation(self, generation_id: str) -> dict[str, Any] | None:
        try:
            return (await self._get_json("GET /generation", "/generation", {"id": generation_id})).get("data")
        except OpenRouterHTTPError as exc:
            if exc.status == 404:
                return None
            raise
