"""Deterministic Kimi-style completions and their exact token accounting.

The pipeline rebuilds token ids from response text with the real Kimi tokenizer, so ``usage`` comes from
encoding the text actually returned. Text depends only on (seed, messages, tools), never on attempt or
timing, so a retried prompt is indistinguishable from its first success and a prompt bought twice is
detectable by its content hash. Accounting (``TokenAccountant``) is apart from generation so a model-backed
generator keeps the same usage and truncation rules.
"""

import hashlib
import math
import random
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from eagle_assets.errors import OpenRouterError
from eagle_assets.tokenization.chat_encoding import DataSpecials, configured_data_specials
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer
from eagle_assets.tokenization.reconstruction import prompt_token_ids

_JSON_SORTED = orjson.OPT_SORT_KEYS
T = TypeVar("T")


def request_content_hash(messages: list[Any], tools: list[Any] | None) -> str:
    """Identity of a prompt: the same messages and tools hash alike whatever the key order."""
    blob = orjson.dumps([messages, tools or None], option=_JSON_SORTED)
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


@dataclass(frozen=True)
class ChatRequest:
    """What a generator may look at; routing, billing and faults are none of its business."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    max_tokens: int | None
    content_hash: str


@dataclass(frozen=True)
class ToolCall:
    id: str  # e.g. "functions.get_weather:0"
    name: str
    arguments: str  # a JSON string, as the API carries it


@dataclass(frozen=True)
class Completion:
    """The would-be output before ``max_tokens`` applies: reasoning, then content, then tool calls."""

    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None  # set only by a generator that truncated itself ("length")


class ResponseGenerator(Protocol):
    def generate(self, request: ChatRequest) -> Completion: ...


class PromptRenderError(OpenRouterError, ValueError):
    """The request's messages/tools cannot be rendered by the chat template (the server answers 400)."""


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def prompt_ids(
    tokenizer: KimiTokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    data_specials: DataSpecials = "special",
) -> list[int]:
    """The prompt's ids as the serving stack builds them (Kimi K2.5 template with the generation prompt,
    TypeScript tool declaration), so ``usage.prompt_tokens`` and the pipeline's reconstruction differ by 0."""
    try:
        return prompt_token_ids(tokenizer, messages, tools or None, data_specials=data_specials)
    except Exception as exc:  # jinja errors, malformed messages: the request's fault, not the simulator's
        raise PromptRenderError(f"cannot render the prompt with the Kimi chat template: {exc}") from exc


@dataclass
class PreparedResponse:
    """A completion after ``max_tokens``, with its counts and the JSON pieces every answer reuses."""

    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    exclude_reasoning: bool = False
    message: dict[str, Any] = field(init=False)
    choice: dict[str, Any] = field(init=False)
    _deltas: dict[int, list[dict[str, Any]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        reasoning = None if self.exclude_reasoning else self.reasoning
        msg: dict[str, Any] = {
            "role": "assistant",
            # OpenRouter sends null, not "", next to tool calls when the model wrote no text.
            "content": self.content if (self.content or not self.tool_calls) else None,
            "refusal": None,
            "reasoning": reasoning,
            "reasoning_details": [_reasoning_detail(reasoning)] if reasoning else [],
        }
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": t.id, "index": i, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for i, t in enumerate(self.tool_calls)
            ]
        self.message = msg
        self.choice = {
            "logprobs": None,
            "finish_reason": self.finish_reason,
            "native_finish_reason": self.finish_reason,
            "index": 0,
            "message": msg,
        }

    def stream_deltas(self, chunks_per_part: int) -> list[dict[str, Any]]:
        """SSE deltas whose concatenation is exactly ``message`` (cached per chunk count)."""
        cached = self._deltas.get(chunks_per_part)
        if cached is not None:
            return cached
        deltas: list[dict[str, Any]] = []
        reasoning = self.message["reasoning"]
        if reasoning:
            for piece in split_text(reasoning, chunks_per_part):
                deltas.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "reasoning": piece,
                        "reasoning_details": [_reasoning_detail(piece)],
                    }
                )
        if self.content:
            for piece in split_text(self.content, chunks_per_part):
                deltas.append({"role": "assistant", "content": piece})
        for i, t in enumerate(self.tool_calls):
            deltas.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"index": i, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": ""}}
                    ],
                }
            )
            for piece in split_text(t.arguments, 2):
                deltas.append(
                    {"role": "assistant", "content": "", "tool_calls": [{"index": i, "function": {"arguments": piece}}]}
                )
        if not deltas:
            deltas.append({"role": "assistant", "content": ""})
        self._deltas[chunks_per_part] = deltas
        return deltas


def _reasoning_detail(text: str) -> dict[str, Any]:
    return {"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}


_WORDISH = re.compile(r"\S+\s*|\s+")


def split_text(text: str, n: int) -> list[str]:
    """About ``n`` pieces cut after whitespace; their concatenation is ``text``."""
    if n <= 1 or len(text) < 2 * n:
        return [text] if text else []
    words = _WORDISH.findall(text)
    if len(words) < n:
        step = max(1, len(text) // n)
        return [text[i : i + step] for i in range(0, len(text), step)]
    per = -(-len(words) // n)
    return ["".join(words[i : i + per]) for i in range(0, len(words), per)]


class TokenAccountant:
    """Counts and truncates with the real tokenizer, the way the target's serving stack would."""

    def __init__(self, tokenizer: KimiTokenizer, data_specials: DataSpecials | None = None) -> None:
        self.tokenizer = tokenizer
        self.data_specials = data_specials or configured_data_specials()
        sp = tokenizer.special_tokens
        self._section_begin = sp["<|tool_calls_section_begin|>"]
        self._section_end = sp["<|tool_calls_section_end|>"]
        self._call_begin = sp["<|tool_call_begin|>"]
        self._arg_begin = sp["<|tool_call_argument_begin|>"]
        self._call_end = sp["<|tool_call_end|>"]

    def prompt_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        """``usage.prompt_tokens``: the length of the prompt ids the target is fed (raises ``PromptRenderError``)."""
        return len(prompt_ids(self.tokenizer, messages, tools, self.data_specials))

    def tool_section_ids(self, tool_calls: tuple[ToolCall, ...]) -> list[int]:
        if not tool_calls:
            return []
        enc = self.tokenizer.encode_ordinary
        ids = [self._section_begin]
        for t in tool_calls:
            ids.append(self._call_begin)
            ids.extend(enc(t.id))
            ids.append(self._arg_begin)
            ids.extend(enc(t.arguments))
            ids.append(self._call_end)
        ids.append(self._section_end)
        return ids

    def prepare(
        self, completion: Completion, prompt_tokens: int, max_tokens: int | None, exclude_reasoning: bool = False
    ) -> PreparedResponse:
        enc = self.tokenizer.encode_ordinary
        r_ids = enc(completion.reasoning)
        n_r = len(r_ids)
        if max_tokens is not None and max_tokens <= n_r + 1 and completion.finish_reason != "length":
            # Cut inside the reasoning (or at </think>): the answer is never looked at, so never encoded.
            reasoning = completion.reasoning if max_tokens > n_r else self.tokenizer.decode(r_ids[:max_tokens])
            return PreparedResponse(
                reasoning, "", (), "length", prompt_tokens, max_tokens, min(max_tokens, n_r), exclude_reasoning
            )
        c_ids = enc(completion.content)
        t_ids = self.tool_section_ids(completion.tool_calls)
        n_c, n_t = len(c_ids), len(t_ids)
        whole = (completion.reasoning, completion.content, completion.tool_calls)
        if completion.finish_reason == "length":
            # The generator already stopped at its limit: no end-of-turn token was produced.
            return PreparedResponse(*whole, "length", prompt_tokens, n_r + 1 + n_c + n_t, n_r, exclude_reasoning)
        total = n_r + 1 + n_c + n_t + 1  # </think> and <|im_end|> are one token each
        if max_tokens is None or max_tokens >= total:
            finish = "tool_calls" if completion.tool_calls else "stop"
            return PreparedResponse(*whole, finish, prompt_tokens, total, n_r, exclude_reasoning)
        n = max(0, max_tokens)
        decode = self.tokenizer.decode
        reasoning, content = completion.reasoning, ""
        calls: tuple[ToolCall, ...] = ()
        if n < n_r:
            reasoning = decode(r_ids[:n])
        elif n > n_r + 1:
            keep = n - n_r - 1
            content = completion.content if keep >= n_c else decode(c_ids[:keep])
            if completion.tool_calls and keep >= n_c + n_t:
                calls = completion.tool_calls
        return PreparedResponse(reasoning, content, calls, "length", prompt_tokens, n, min(n, n_r), exclude_reasoning)


class ResponseCache:
    """LRU of prepared responses: a retried or repeated prompt costs a dict lookup, not a tokenization."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[tuple[Any, ...], PreparedResponse] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...]) -> PreparedResponse | None:
        item = self._data.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return item

    def put(self, key: tuple[Any, ...], value: PreparedResponse) -> None:
        self._data[key] = value
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


_REASONING = (
    "The user is asking about {topic}.",
    "Let me think through this step by step.",
    "First, I should pin down exactly what is being requested.",
    "Hmm, there might be an edge case when the input is empty.",
    "Wait, let me double-check that assumption before going further.",
    "I recall that the usual approach here trades memory for speed.",
    "So the answer should cover {topic} and mention the main caveat.",
    "Actually, a simpler explanation would serve the user better.",
    "Let me consider the alternative: what if the data does not fit in memory?",
    "The constraints suggest an O(n log n) solution is acceptable.",
    "I need to be careful with units here; mixing seconds and milliseconds is a classic bug.",
    "Okay, I think I have a clear plan now.",
    "One more check: the example in the question is consistent with this reading.",
    "Should I include code? A short snippet would make it concrete.",
)
_PROSE = (
    "Here is a concise overview of {topic}.",
    "The key idea is that each step depends only on the previous state, which keeps the logic local.",
    "In practice, you would start with the simplest version and measure before optimising.",
    "This works because the invariant holds at the start and is preserved by every iteration.",
    "A common pitfall is to forget the boundary case where the list is empty.",
    "If performance matters, batch the operations instead of issuing them one at a time.",
    "You can verify the result by comparing it against a brute-force reference on small inputs.",
    "Note that {topic} behaves differently under concurrent access, so guard shared state.",
    "For most workloads the default settings are a reasonable starting point.",
    "The trade-off is between latency and throughput, and the right balance depends on your load.",
    "To summarise: keep it simple, test the edges, and document the assumptions.",
    "Let me know if you would like a deeper dive into any part of {topic}.",
    "Historically, this approach became popular because it is easy to reason about.",
    "The second option is more flexible but also harder to debug.",
)
_UNICODE = (
    "Note: naïve café résumé — the accents must survive the round trip.",
    "In Japanese one might write 東京の天気は晴れです。",
    "中文示例：我们需要仔细检查每一个步骤。",
    "Math aside: ∑ᵢ xᵢ² ≥ 0 and ∀ε>0 ∃δ>0 such that |f(x) − f(y)| < ε.",
    "Quick status ✅ done, 🚀 shipped, ⚠️ one warning left.",
    "Русский текст: проверка кодировки прошла успешно.",
    "Ελληνικά: α, β, γ — and the arrow → points to the next step.",
    "Temperature: 21 °C ± 0.5, price: €12.50, ratio ≈ ½.",
)
_SPECIAL_LOOKING = (
    "The chat format ends each turn with the literal marker <|im_end|>, which here is just text.",
    "Some templates wrap thoughts in <think> and </think> tags; quoting them is harmless.",
    "In the raw stream a tool call is framed by <|tool_call_begin|> and <|tool_call_end|>.",
    "A role header looks like <|im_user|>user<|im_middle|> in the serialized prompt.",
)
_CODE = (
    "```python\ndef {name}(values: list[int]) -> int:\n    total = 0\n    for v in values:\n"
    "        total += v * {k}\n    return total\n\n\nprint({name}([1, 2, 3]))\n```",
    "```python\nimport asyncio\n\n\nasync def {name}(urls: list[str]) -> list[int]:\n"
    "    sem = asyncio.Semaphore({k})\n\n    async def one(u: str) -> int:\n        async with sem:\n"
    "            await asyncio.sleep(0.01)\n            return len(u)\n\n"
    "    return await asyncio.gather(*(one(u) for u in urls))\n```",
    "```javascript\nfunction {name}(items) {{\n  return items\n    .filter((x) => x > {k})\n"
    "    .map((x) => x * 2);\n}}\n```",
    '```bash\nfor f in *.log; do\n  grep -c "ERROR" "$f" | awk \'{{ s += $1 }} END {{ print s }}\'\ndone\n```',
    "```sql\nSELECT user_id, COUNT(*) AS n\nFROM events\nWHERE ts > NOW() - INTERVAL '{k} days'\n"
    "GROUP BY user_id\nORDER BY n DESC;\n```",
)
_NAMES = ("compute_total", "fetch_all", "transform", "summarize", "process_batch", "score_items")
_WORD = re.compile(r"[^\W\d_]{4,}")
_CHARS_PER_TOKEN = 4.2


def _pick(rng: random.Random, seq: Sequence[T]) -> T:
    """``rng.choice`` at a third of its cost; generation is on the simulator's per-request path."""
    return seq[int(rng.random() * len(seq))]


def _topic(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            words = _WORD.findall(_text_of(m.get("content"))[:240])
            if words:
                return " ".join(words[:4])
            break
    return "the question"


def _fake_value(schema: Any, rng: random.Random, key: str, depth: int = 0) -> Any:
    if not isinstance(schema, dict):
        return "example"
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return _pick(rng, schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        return 1 + int(rng.random() * 99)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [] if depth > 2 else [_fake_value(schema.get("items"), rng, key, depth + 1)]
    if kind == "object" or "properties" in schema:
        return {} if depth > 2 else _fake_object(schema, rng, depth + 1)
    samples = ("Paris", "北京", "the quick brown fox", f"{key}_value", "São Paulo", "2024-06-01", "hello world")
    return _pick(rng, samples)


def _fake_object(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> dict[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, dict):
        props = {}
    required = set(schema.get("required") or [])
    out: dict[str, Any] = {}
    for key, sub in props.items():
        if key in required or rng.random() < 0.5:
            out[key] = _fake_value(sub, rng, key, depth)
    return out


class KimiStyleGenerator:
    """Seeded template text shaped like Kimi K2.5 output: think first, then answer, maybe call tools."""

    def __init__(self, seed: int = 0, mean_completion_tokens: int = 300, tool_call_probability: float = 0.5) -> None:
        self.seed = seed
        self.mean_completion_tokens = mean_completion_tokens
        self.tool_call_probability = tool_call_probability
        self._sigma = 0.6
        self._mu = math.log(mean_completion_tokens) - self._sigma * self._sigma / 2.0  # mean: the setting

    def _rng(self, content_hash: str) -> random.Random:
        digest = hashlib.blake2b(f"{self.seed}:{content_hash}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big"))

    def generate(self, request: ChatRequest) -> Completion:
        rng = self._rng(request.content_hash)
        topic = _topic(request.messages)
        target = rng.lognormvariate(self._mu, self._sigma)
        target = min(20.0 * self.mean_completion_tokens, max(8.0, target))
        reasoning_share = rng.uniform(0.25, 0.6)
        functions = _function_tools(request.tools, request.tool_choice)
        calls: tuple[ToolCall, ...] = ()
        if functions:
            forced = request.tool_choice == "required" or isinstance(request.tool_choice, dict)
            if forced or rng.random() < self.tool_call_probability:
                calls = self._tool_calls(functions, rng)
        reasoning = self._reasoning(rng, topic, target * reasoning_share, calls)
        if calls:
            content = "" if rng.random() < 0.6 else f"I'll call `{calls[0].name}` to get that."
        else:
            content = self._content(rng, topic, target * (1.0 - reasoning_share))
        return Completion(reasoning, content, calls)

    def _reasoning(self, rng: random.Random, topic: str, tokens: float, calls: tuple[ToolCall, ...]) -> str:
        budget = tokens * _CHARS_PER_TOKEN
        out: list[str] = []
        size = 0
        while size < budget or not out:
            s = _pick(rng, _REASONING).format(topic=topic)
            if rng.random() < 0.04:
                s = _pick(rng, _SPECIAL_LOOKING)
            out.append(s)
            size += len(s) + 1
        if calls:
            out.append(f"I should call the `{calls[0].name}` tool with the right arguments.")
        return " ".join(out)

    def _content(self, rng: random.Random, topic: str, tokens: float) -> str:
        budget = tokens * _CHARS_PER_TOKEN
        paragraphs: list[str] = []
        size = 0
        code_done = False
        while size < budget or not paragraphs:
            roll = rng.random()
            if not code_done and roll < 0.25 and budget > 200:
                block = _pick(rng, _CODE).format(name=_pick(rng, _NAMES), k=2 + int(rng.random() * 8))
                code_done = True
            elif roll < 0.4:
                items = [_pick(rng, _PROSE).format(topic=topic) for _ in range(2 + int(rng.random() * 3))]
                block = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(items))
            else:
                sentences = [_pick(rng, _PROSE).format(topic=topic) for _ in range(2 + int(rng.random() * 3))]
                if rng.random() < 0.3:
                    sentences.insert(int(rng.random() * (len(sentences) + 1)), _pick(rng, _UNICODE))
                if rng.random() < 0.08:
                    sentences.append(_pick(rng, _SPECIAL_LOOKING))
                block = " ".join(sentences)
            paragraphs.append(block)
            size += len(block) + 2
        if rng.random() < 0.3:
            paragraphs[0] = "## " + topic.title() + "\n\n" + paragraphs[0]
        return "\n\n".join(paragraphs)

    def _tool_calls(self, functions: list[dict[str, Any]], rng: random.Random) -> tuple[ToolCall, ...]:
        n = 2 if len(functions) > 1 and rng.random() < 0.2 else 1
        calls = []
        for i in range(n):
            fn = _pick(rng, functions)
            name = str(fn.get("name") or "tool")
            args = _fake_object(fn.get("parameters") or {}, rng)
            calls.append(ToolCall(f"functions.{name}:{i}", name, orjson.dumps(args).decode()))
        return tuple(calls)


def _function_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> list[dict[str, Any]]:
    if not tools or tool_choice == "none":
        return []
    fns = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in fns if f.get("name") == wanted]
        return chosen or fns
    return fns
