"""A lean HTTP/1.1 transport for streamed completions: bytes in, one wake-up per answer.

Why not aiohttp here: a stream is one HTTP chunk per SSE event (thousands per Kimi answer), and aiohttp does
Python work and a task wake-up for every chunk, many times the CPU of a non-streaming request. Here each socket
read is only appended, the chunked framing is undone once at the end, and the caller wakes once. When data events
come densely, reading pauses for ``read_interval_s`` so the kernel gathers the next chunks into one read (the
answer is used whole; an interval is nothing against answers of tens of seconds). ``idle_timeout_s`` counts
silence and ``: OPENROUTER PROCESSING`` comments alike, with one timer per idle period, not per read. Nothing here
logs or raises with the request's headers: the key is only in the bytes written to the socket.
"""

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import cast
from urllib.parse import urlparse

_KEPT = ("content-type", "retry-after", "x-ratelimit-reset", "x-generation-id")
_END = b"\r\n0\r\n\r\n"


@dataclass
class StreamResult:
    status: int | None
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names, the few that matter
    body: bytes = b""  # de-chunked; a prefix when ``error`` is set
    error: str | None = None  # None | "timeout" | "stalled" | "connection"


def dechunk(data: bytes) -> tuple[bytes, bool]:
    """Undo ``Transfer-Encoding: chunked``: (body, whether the terminal chunk was reached).

    Fast path, no Python per chunk: when no chunk carries a CRLF of its own (SSE from OpenRouter
    ends lines with LF; JSON has no raw CR), splitting at CRLF alternates size lines and chunks,
    which the sum of the sizes confirms. Otherwise the chunks are walked one by one.
    """
    parts = data.split(b"\r\n")
    if len(parts) >= 3 and parts[-3:] == [b"0", b"", b""] and len(parts) % 2 == 1:
        sizes, chunks = parts[0:-3:2], parts[1:-3:2]
        body = b"".join(chunks)
        try:
            if sum(map(int, sizes, repeat(16))) == len(body) and all(map(len, chunks)):
                return body, True
        except ValueError:
            pass
    out: list[bytes] = []
    pos, n = 0, len(data)
    while pos < n:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            break
        try:
            size = int(data[pos:eol].split(b";", 1)[0], 16)
        except ValueError:
            break
        if size == 0:
            return b"".join(out), True
        start = eol + 2
        out.append(data[start : min(start + size, n)])
        pos = start + size + 2
    return b"".join(out), False


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    # The state of the request being answered, set by ``start`` (declared here: the callbacks above it read it).
    on_generation_id: Callable[[str], None] | None
    on_accepted: Callable[[], None] | None
    parts: list[bytes]
    head: bool
    status: int | None
    headers: dict[str, str]
    chunked: bool
    length: int | None
    keep_alive: bool
    size: int
    tail: bytes
    paused: bool
    interval: float
    dense_gap: float
    idle: float
    last_data: float
    error: str | None
    _resume_handle: asyncio.TimerHandle | None
    _total_handle: asyncio.TimerHandle
    _idle_handle: asyncio.TimerHandle

    def __init__(self, pool: "StreamPool") -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.active = False  # a request is being answered
        self._done: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's transport is a Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self._done is None:
            return
        if not self._done.done():
            if self.head and not self.chunked and self.length is None:
                self._finish(None)  # a close-delimited body ends here
            else:
                self._finish("connection")
        elif self.active:  # the caller was cancelled mid-answer: drop its timers too
            self._finish("connection")

    def data_received(self, data: bytes) -> None:
        # Runs once per socket read: kept to a handful of operations (no copies of ``data``).
        if not self.active:
            return
        if not self.head:
            self.parts.append(data)
            joined = b"".join(self.parts)
            cut = joined.find(b"\r\n\r\n")
            if cut < 0:
                return
            self._parse_head(joined[:cut])
            data = joined[cut + 4 :]
            self.parts = []
        self.parts.append(data)
        self.size += len(data)
        if self.chunked:
            # The terminal chunk ends the body; a short read may hold only part of it.
            done = (
                data.endswith(_END)
                if len(data) >= len(_END)
                else (self.tail[-len(_END) :] + data).endswith(_END) or (self.size == 5 and data == b"0\r\n\r\n")
            )
            self.tail = data
        elif self.length is not None:
            done = self.size >= self.length
        else:
            done = False  # close-delimited: connection_lost ends it
        if done:
            self._finish(None)
            return
        if b"data:" in data:
            now = self.loop.time()
            dense = now - self.last_data < self.dense_gap  # data came soon after the last: more is coming
            self.last_data = now
            if dense and not self.paused and b'"finish_reason":"' not in data:
                # Let the kernel gather the next chunks and take them in one read. Only when chunks
                # come densely (pausing between sparse ones costs more than it saves), and not once
                # the finish is in (the end is a read away).
                self.paused = True
                assert self.transport is not None  # data only arrives once connection_made has set it
                self.transport.pause_reading()
                self._resume_handle = self.loop.call_later(self.interval, self._resume)

    # -- one request -----------------------------------------------------------------------
    def start(
        self,
        request: bytes,
        total_s: float,
        idle_s: float,
        interval_s: float,
        on_generation_id: Callable[[str], None] | None = None,
        on_accepted: Callable[[], None] | None = None,
    ) -> asyncio.Future[None]:
        assert self.transport is not None
        self.on_generation_id = on_generation_id
        self.on_accepted = on_accepted
        self.parts = []
        self.head = False
        self.status = None
        self.headers = {}
        self.chunked = False
        self.length = None
        self.keep_alive = True
        self.size = 0
        self.tail = b""
        self.paused = False
        self.active = True
        self.interval = min(interval_s, idle_s / 4)
        # Chunks closer than this are "dense" (tokens stream every 10-100 ms); sparse ones, or a lag of
        # the event loop under load, must not trigger pauses.
        self.dense_gap = self.interval / 2
        self.idle = idle_s
        self.last_data = self.loop.time()
        self.error = None
        self._resume_handle = None
        self._done = self.loop.create_future()
        self._total_handle = self.loop.call_later(total_s, self._abort, "timeout")
        self._idle_handle = self.loop.call_later(idle_s, self._idle_check)
        self.transport.write(request)
        return self._done

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            value = value.strip()
            if key == "transfer-encoding":
                self.chunked = "chunked" in value.lower()
            elif key == "content-length":
                self.length = int(value) if value.isdigit() else None
            elif key == "connection":
                self.keep_alive = value.lower() != "close"
            elif key in _KEPT:
                self.headers[key] = value
        self.head = True
        gen_id = self.headers.get("x-generation-id")
        if gen_id and self.status == 200 and self.on_generation_id is not None:
            self.on_generation_id(gen_id)  # before the first chunk: the caller may write it down now
        if self.status == 200 and self.on_accepted is not None:
            self.on_accepted()

    def _resume(self) -> None:
        self._resume_handle = None
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def _idle_check(self) -> None:
        if self._done is None or self._done.done():
            return
        due = self.last_data + self.idle
        if self.loop.time() >= due:
            self._abort("stalled" if self.head else "timeout")
        else:
            self._idle_handle = self.loop.call_at(due, self._idle_check)

    def _abort(self, why: str) -> None:
        if self._done is not None and not self._done.done():
            self._finish(why)
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, error: str | None) -> None:
        self.active = False
        self.error = error
        self._total_handle.cancel()
        self._idle_handle.cancel()
        if self._resume_handle is not None:
            self._resume_handle.cancel()
        self._resume()
        assert self._done is not None
        if not self._done.done():
            self._done.set_result(None)

    def result(self) -> StreamResult:
        raw = b"".join(self.parts)
        if self.chunked:
            body, complete = dechunk(raw)
            error = self.error or (None if complete else "connection")
        else:
            body, error = raw, self.error
        return StreamResult(self.status if self.head else None, self.headers, body, error)

    @property
    def reusable(self) -> bool:
        return not self.closed and self.error is None and self.keep_alive and self.head


class StreamPool:
    """Keep-alive connections to one origin, for ``POST`` requests whose answers stream."""

    def __init__(self, base_url: str, headers: dict[str, str], *, connect_timeout_s: float, max_idle: int) -> None:
        url = urlparse(base_url)
        self.host = url.hostname or "127.0.0.1"
        self.tls = url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        self._ssl = ssl.create_default_context() if self.tls else None
        host_header = self.host if url.port is None else f"{self.host}:{url.port}"
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host_header, **headers}.items()).encode()
        self._connect_timeout = connect_timeout_s
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._max_idle = max_idle

    def forget(self, conn: _Conn) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Conn(self),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self.tls else None,
            ),
            self._connect_timeout,
        )
        self._all.add(conn)
        return conn

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        total_timeout_s: float,
        idle_timeout_s: float,
        read_interval_s: float,
        on_generation_id: Callable[[str], None] | None = None,
        on_accepted: Callable[[], None] | None = None,
    ) -> StreamResult:
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        try:
            if conn is None:
                conn = await self._connect()
        except (OSError, TimeoutError):
            return StreamResult(None, error="connection")
        request = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n".encode()
            + self._fixed
            + b"Accept: text/event-stream\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        try:
            await conn.start(request, total_timeout_s, idle_timeout_s, read_interval_s, on_generation_id, on_accepted)
        except asyncio.CancelledError:
            if conn.transport is not None:
                conn.transport.abort()
            raise
        result = conn.result()
        if conn.reusable and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        elif conn.transport is not None and not conn.closed:
            conn.transport.close()
        return result

    def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.abort()
        self._idle.clear()
        self._all.clear()
