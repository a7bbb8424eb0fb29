"""A Hugging Face Hub stand-in on 127.0.0.1 serving dataset repos with several commits.

It answers the routes ``snapshot_download`` uses for a dataset, in the shapes the real Hub sends:

- ``GET /api/datasets/{repo}/revision/{rev}``: ``{"id", "sha", "siblings": [{"rfilename"}], ...}``
  (404 with ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound``);
- ``GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=true``: files and folders as
  ``{"type", "oid", "size", "path"[, "lfs": {"oid", "size", "pointerSize"}]}``;
- ``HEAD``/``GET /datasets/{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (the git blob
  id) and, for LFS files (Parquet), ``X-Linked-Etag`` (their sha256) and ``X-Linked-Size``, as the
  Hub sends before redirecting to its CDN; ``X-Error-Code: EntryNotFound`` for a missing file.

A revision is a branch name (``main``), or a commit sha. Every request is recorded, so tests can
check that a cached or offline run asked nothing. ``GET`` on a file honours one ``Range`` (``bytes=a-b``,
``bytes=a-``, ``bytes=-n``) with a 206, as the Hub's CDN does, and every file's body bytes sent are counted
in its repo's ``served`` (repo path → bytes), so tests can tell a footer read from a download.
"""

import asyncio
import hashlib
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

LFS_SUFFIXES = (".parquet", ".zst", ".gz")


@dataclass
class FakeDatasetRepo:
    repo_id: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha → {path: bytes}
    branches: dict[str, str] = field(default_factory=dict)  # name → sha
    served: Counter[str] = field(default_factory=Counter)  # repo path → body bytes sent (all commits)

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        sha = hashlib.sha1(repr(sorted((p, hashlib.sha256(b).hexdigest()) for p, b in files.items())).encode())
        digest = sha.hexdigest()
        self.commits[digest] = dict(files)
        self.branches[branch] = digest
        return digest

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.branches.get(revision)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _entry(path: str, data: bytes) -> dict:
    out = {"type": "file", "oid": _blob_id(data), "size": len(data), "path": path}
    if path.endswith(LFS_SUFFIXES):
        out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return out


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end)`` (end exclusive) of a single-range ``Range`` header, or None for the whole file."""
    if not header:
        return None
    m = _RANGE.match(header.strip())
    if m is None or not (m.group(1) or m.group(2)):
        raise ValueError(f"unsupported Range {header!r}")
    if not m.group(1):
        return max(0, size - int(m.group(2))), size
    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    return int(m.group(1)), end


def _not_found(code: str, message: str) -> web.Response:
    """A 404 as the Hub answers it: the error in the body, its kind in ``X-Error-Code`` (what huggingface_hub reads)."""
    return web.json_response({"error": message}, status=404, headers={"X-Error-Code": code})


def _revision_info(repo: FakeDatasetRepo, sha: str) -> dict[str, Any]:
    """The Hub's ``/revision/{rev}`` body for one commit: the fields huggingface_hub reads, files as siblings."""
    return {
        "_id": "0" * 24,
        "id": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": sha,
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])],
        "lastModified": "2026-01-01T00:00:00.000Z",
    }


def _tree_listing(files: dict[str, bytes], prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """The Hub's ``/tree/{rev}/{path}`` listing: the folders and files under ``prefix``, one level or all."""
    out: list[dict[str, Any]] = []
    folders: set[str] = set()
    for path in sorted(files):
        if prefix and not path.startswith(prefix + "/"):
            continue
        rest = path[len(prefix) + 1 :] if prefix else path
        parts = rest.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(([prefix] if prefix else []) + parts[:depth])
            if folder not in folders and (recursive or depth == 1):
                folders.add(folder)
                out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": folder})
        if recursive or len(parts) == 1:
            out.append(_entry(path, files[path]))
    return out


def build_app(repos: dict[str, FakeDatasetRepo], requests: list[str]) -> web.Application:
    def lookup(request: web.Request) -> tuple[FakeDatasetRepo | None, str | None, web.Response | None]:
        repo = repos.get(f"{request.match_info['owner']}/{request.match_info['name']}")
        if repo is None:
            return None, None, _not_found("RepoNotFound", "Repository not found")
        sha = repo.resolve(request.match_info["revision"])
        if sha is None:
            return repo, None, _not_found("RevisionNotFound", f"Invalid rev id: {request.match_info['revision']}")
        return repo, sha, None

    async def revision(request: web.Request) -> web.Response:
        requests.append(f"{request.method} {request.path}")
        repo, sha, error = lookup(request)
        if error is not None:
            return error
        assert repo is not None and sha is not None
        return web.json_response(_revision_info(repo, sha))

    async def tree(request: web.Request) -> web.Response:
        requests.append(f"{request.method} {request.path_qs}")
        repo, sha, error = lookup(request)
        if error is not None:
            return error
        assert repo is not None and sha is not None
        prefix = request.match_info.get("path", "").strip("/")
        recursive = request.query.get("recursive", "false").lower() == "true"
        return web.json_response(_tree_listing(repo.commits[sha], prefix, recursive))

    async def resolve(request: web.Request) -> web.StreamResponse:
        requests.append(f"{request.method} {request.path}")
        repo, sha, error = lookup(request)
        if error is not None:
            return web.Response(status=404, headers={"X-Error-Code": "RevisionNotFound" if repo else "RepoNotFound"})
        assert repo is not None and sha is not None
        path = request.match_info["path"]
        data = repo.commits[sha].get(path)
        if data is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha})
        entry = _entry(path, data)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        if "lfs" in entry:
            headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Size"] = str(len(data))
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(status=200, headers=headers)
        try:
            span = _byte_range(request.headers.get("Range"), len(data))
        except ValueError:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        if span is None:
            repo.served[path] += len(data)
            return web.Response(status=200, body=data, headers=headers)
        start, end = span
        if start >= len(data) or start >= end:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        repo.served[path] += end - start
        return web.Response(status=206, body=data[start:end], headers=headers)

    app = web.Application()
    base = "/api/datasets/{owner}/{name}"
    app.router.add_get(base + "/revision/{revision}", revision)
    app.router.add_get(base + "/tree/{revision}", tree)
    app.router.add_get(base + "/tree/{revision}/{path:.+}", tree)
    app.router.add_route("*", "/datasets/{owner}/{name}/resolve/{revision}/{path:.+}", resolve)
    return app


@contextmanager
def serve_datasets(*repos: FakeDatasetRepo) -> Iterator[tuple[str, list[str]]]:
    """Yield the endpoint URL and the list of requests seen; the server lives on a thread of its own."""
    requests: list[str] = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, object] = {}

    async def start() -> None:
        runner = web.AppRunner(build_app({r.repo_id: r for r in repos}, requests))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("fake dataset hub did not start")
    try:
        yield f"http://127.0.0.1:{holder['port']}", requests
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
