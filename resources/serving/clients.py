"""HTTP clients for the two engines' real APIs: what the benchmark sends and what it reads back.

Both are sent token ids with ``skip_special_tokens: false`` (so ``</think>`` stays in the text); why, and which
sources these follow: docs/draft-and-benchmark.md. A refused or torn connection raises
:class:`ServerDiedError` (the caller knows whether it started the server and can say why it died).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from resources.serving.acceptance import AcceptanceTally
from resources.serving.errors import EngineResponseError, ServerDiedError
from resources.serving.sglang_meta import completion_tokens, meta_info_warnings, tally_from_meta_info
from resources.serving.vllm_metrics import SpecDecodeCounters


@dataclass
class EngineAnswer:
    text: str
    completion_tokens: int
    finish_reason: str
    tally: AcceptanceTally | None  # this request's acceptance (SGLang); None where only the server counts (vLLM)
    meta: dict[str, Any]
    warnings: list[str] = field(default_factory=list)  # shape differences that leave the counts right


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]


class EngineClient:
    """Shared plumbing: one aiohttp session per run, errors turned into the serving errors."""

    engine = ""

    def __init__(self, base_url: str, request_timeout_s: float = 3600.0, max_connections: int = 256) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=30)
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EngineClient:
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=aiohttp.TCPConnector(limit=self._limit))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, path: str, json: Any = None) -> tuple[int, Any]:
        if self._session is None:
            raise RuntimeError("use the client as 'async with'")
        url = self.base_url + path
        try:
            async with self._session.request(method, url, json=json) as resp:
                if resp.content_type == "application/json":
                    try:
                        body: Any = await resp.json()
                    except ValueError as exc:
                        raise EngineResponseError(
                            f"{self.engine} {method} {path}: a body that is not JSON: {exc}"
                        ) from exc
                else:
                    body = await resp.text()
                return resp.status, body
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ServerDiedError(
                f"{self.engine} at {self.base_url} stopped answering ({type(exc).__name__}: {exc})"
            ) from exc
        except TimeoutError as exc:
            raise ServerDiedError(f"{self.engine} at {self.base_url}: no answer to {path} within the timeout") from exc

    async def _ok(self, method: str, path: str, json: Any = None) -> Any:
        status, body = await self._request(method, path, json)
        if status != 200:
            raise EngineResponseError(f"{self.engine} {method} {path}: HTTP {status}: {_error_message(body)}")
        return body

    async def generate(
        self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float
    ) -> EngineAnswer:  # pragma: no cover - overridden
        raise NotImplementedError


class SGLangClient(EngineClient):
    engine = "sglang"

    def __init__(self, base_url: str, num_steps: int, num_draft_tokens: int, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.num_steps = num_steps
        self.num_draft_tokens = num_draft_tokens

    async def server_info(self) -> dict[str, Any]:
        body = await self._ok("GET", "/get_server_info")
        if not isinstance(body, dict):
            raise EngineResponseError(f"sglang /get_server_info is not an object: {body!r:.200}")
        return body

    async def flush_cache(self) -> None:
        await self._ok("POST", "/flush_cache")

    async def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float) -> EngineAnswer:
        payload = {
            "input_ids": list(prompt_ids),
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": temperature,
                "skip_special_tokens": False,
            },
        }
        body = await self._ok("POST", "/generate", payload)
        if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
            raise EngineResponseError(f"sglang /generate answered without meta_info: {body!r:.300}")
        meta = body["meta_info"]
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type", "") if isinstance(finish, dict) else str(finish)
        if reason == "abort":
            raise EngineResponseError(f"sglang aborted the request: {finish}")
        tally = tally_from_meta_info(meta, self.num_steps)
        notes = meta_info_warnings(meta, self.num_draft_tokens)
        return EngineAnswer(str(body.get("text") or ""), completion_tokens(meta), reason, tally, meta, notes)


class VLLMClient(EngineClient):
    engine = "vllm"

    def __init__(self, base_url: str, model: str = "", **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self.model = model

    async def served_model(self) -> str:
        body = await self._ok("GET", "/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not data:
            raise EngineResponseError(f"vllm /v1/models lists no model: {body!r:.200}")
        return str(data[0]["id"])

    async def version(self) -> str:
        body = await self._ok("GET", "/version")
        return str(body.get("version", "")) if isinstance(body, dict) else ""

    async def counters(self) -> SpecDecodeCounters:
        text = await self._ok("GET", "/metrics")
        return SpecDecodeCounters.from_metrics_text(str(text))

    async def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float) -> EngineAnswer:
        if not self.model:
            self.model = await self.served_model()
        payload = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "skip_special_tokens": False,
        }
        body = await self._ok("POST", "/v1/completions", payload)
        try:
            choice = body["choices"][0]
            usage = body["usage"]
            n = int(usage["completion_tokens"])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineResponseError(f"vllm /v1/completions answer has no choices/usage: {body!r:.300}") from exc
        return EngineAnswer(str(choice.get("text") or ""), n, str(choice.get("finish_reason") or ""), None, usage)
