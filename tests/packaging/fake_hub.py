"""A Hugging Face Hub stand-in on 127.0.0.1: the two routes ``hf_hub_download`` uses for one repo.

``HEAD``/``GET /{owner}/{name}/resolve/{revision}/{file}`` answer with the headers the real Hub sends
(``X-Repo-Commit``, ``ETag``, ``Content-Length``; ``X-Error-Code: EntryNotFound`` for a missing file),
so the real ``huggingface_hub`` client, cache layout and offline mode are what the tests exercise.
"""

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build_app(repo_id: str, folder: Path, requests: list[str]) -> web.Application:
    async def resolve(request: web.Request) -> web.StreamResponse:
        requests.append(f"{request.method} {request.path}")
        owner, name = request.match_info["owner"], request.match_info["name"]
        path = folder / request.match_info["file"]
        if f"{owner}/{name}" != repo_id:
            return web.Response(status=404, headers={"X-Error-Code": "RepoNotFound"})
        if not path.is_file():
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        data = path.read_bytes()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(status=200, headers=headers)
        return web.Response(status=200, body=data, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{owner}/{name}/resolve/{revision}/{file}", resolve)
    return app


@contextmanager
def serve_repo(repo_id: str, folder: Path) -> Iterator[tuple[str, list[str]]]:
    """Yield the endpoint URL and the list of requests seen; the server lives on a thread of its own."""
    requests: list[str] = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, object] = {}

    async def start() -> None:
        runner = web.AppRunner(build_app(repo_id, folder, requests))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("fake hub did not start")
    try:
        yield f"http://127.0.0.1:{holder['port']}", requests
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
