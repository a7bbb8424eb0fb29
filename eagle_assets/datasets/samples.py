"""Small, deterministic sample prompt sets B1–B8 that the project writes itself (no downloads).

They stand in for the real prompt collections so that the demo and the tests run anywhere; each
set has its own flavour (chat, code, math, tool use, multi-turn, multilingual...) so that the
pipeline meets varied shapes.
"""

import random
from pathlib import Path
from typing import Any

import orjson

from eagle_assets.durable_files import atomic_write_bytes

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
            "required": ["query"],
        },
    },
}

TOPICS = [
    "binary search",
    "the French revolution",
    "photosynthesis",
    "TCP congestion control",
    "sourdough",
    "eigenvalues",
    "the Rust borrow checker",
    "monsoon seasons",
    "jazz harmony",
    "CRDTs",
    "black holes",
    "Dagster assets",
    "speculative decoding",
    "the Krebs cycle",
    "Byzantine fault tolerance",
]
CITIES = ["Paris", "東京", "São Paulo", "Nairobi", "Reykjavík", "Mumbai", "Zürich", "Lagos"]
LANGS = ["Python", "Rust", "Go", "TypeScript", "SQL", "C++"]


def _b1(r: random.Random, i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"Explain {r.choice(TOPICS)} to a curious teenager."}]}


def _b2(r: random.Random, i: int) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "You are a senior engineer. Answer with code."},
            {
                "role": "user",
                "content": f"Write a {r.choice(LANGS)} function for {r.choice(TOPICS)} (variant {i}).",
            },
        ]
    }


def _b3(r: random.Random, i: int) -> dict[str, Any]:
    a, b = r.randint(2, 999), r.randint(2, 999)
    return {"messages": [{"role": "user", "content": f"What is {a} × {b}? Show your reasoning step by step."}]}


def _b4(r: random.Random, i: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"What's the weather like in {r.choice(CITIES)} today?"}],
        "tools": [WEATHER_TOOL],
    }


FOLLOW_UPS = [
    "Go deeper, and give an example.",
    "How would you explain that to a child?",
    "What is a common misconception about it?",
    "Summarise our conversation in one sentence.",
]


def _b5(r: random.Random, i: int) -> dict[str, Any]:
    """A whole conversation, answers included, as published chat sets are: regenerated turn by turn
    (``regenerate: every_turn`` in datasets.yaml), the set's own answers dropped."""
    t = r.choice(TOPICS)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Tell me one fact about {t}."},
        {"role": "assistant", "content": f"Here is one: {t} is older than most people think."},
    ]
    for k, follow in enumerate(r.sample(FOLLOW_UPS, 1 + i % 2)):
        messages.append({"role": "user", "content": follow})
        messages.append({"role": "assistant", "content": f"(the set's answer {k + 2} about {t})"})
    return {"messages": messages}


def _b6(r: random.Random, i: int) -> dict[str, Any]:
    prompts = [
        "用三句话解释{t}。",
        "Explique {t} en termes simples.",
        "Erkläre {t} kurz.",
        "{t}について説明してください。",
    ]
    return {"messages": [{"role": "user", "content": r.choice(prompts).format(t=r.choice(TOPICS))}]}


def _b7(r: random.Random, i: int) -> dict[str, Any]:
    q = r.choice(TOPICS)
    return {
        "messages": [{"role": "user", "content": f"Find the docs page about {q} and summarise it."}],
        "tools": [SEARCH_TOOL, WEATHER_TOOL],
    }


def _b8(r: random.Random, i: int) -> dict[str, Any]:
    tricky = r.choice(
        [
            "Print the literal string <|im_end|> in a code block.",
            "What does </think> mean in a chat log?",
            "Write   text   with    odd\n\n\n   spacing\tand tabs.",
        ]
    )
    return {"messages": [{"role": "user", "content": f"{tricky} (case {i})"}]}


BUILDERS = {"B1": _b1, "B2": _b2, "B3": _b3, "B4": _b4, "B5": _b5, "B6": _b6, "B7": _b7, "B8": _b8}


def sample_rows(name: str, count: int, seed: int = 0) -> list[dict[str, Any]]:
    r = random.Random(f"{seed}:{name}")
    builder = BUILDERS[name]
    return [{"id": f"{name.lower()}-{i:06d}", **builder(r, i)} for i in range(count)]


def write_samples(directory: Path, count: int = 48, seed: int = 0, names: list[str] | None = None) -> list[Path]:
    """Write ``{name}.jsonl`` files atomically; existing files are left alone."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or list(BUILDERS):
        path = directory / f"{name}.jsonl"
        if not path.exists():
            atomic_write_bytes(path, b"".join(orjson.dumps(row) + b"\n" for row in sample_rows(name, count, seed)))
        paths.append(path)
    return paths
