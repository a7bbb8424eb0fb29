"""The three benchmark prompt sets as Hub dataset repos, written here in the sets' published layouts.

Each repo has a dataset card with the ``configs:`` block its Hub page declares and a Parquet shard with
the set's columns: ``openai/gsm8k`` (config ``main``: ``question``, ``answer``), ``openai/openai_humaneval``
(config ``openai_humaneval``: ``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``),
``HuggingFaceH4/mt_bench_prompts`` (``prompt`` as the two turns, ``prompt_id``, ``category``,
``reference``). Each repo answers at the commit the benchmark pins; MT-Bench's ``main`` has moved on
since (a later commit with other questions, as a branch does), so a benchmark that read the branch
instead of the pin would show it. The rows are ours, a few per set; GSM8K has five more, its few-shot
examples.
"""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS
from tests.datasets.fake_dataset_hub import FakeDatasetRepo


def hub_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline mode off for this test, in the environment and in ``huggingface_hub``'s constant.

    The target modules set ``HF_HUB_OFFLINE=1`` when imported (before transformers reads it), and
    ``huggingface_hub`` fixes its constant at its own import: in a worker that imported a target first, the loopback
    Hub would be refused ("offline mode is enabled") whatever the environment says now."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _parquet(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _card(configs: str) -> bytes:
    return f"---\nlicense: mit\nconfigs:\n{configs}---\n# fixture\n".encode()


def _pinned(repo_id: str, sha: str, files: dict[str, bytes]) -> FakeDatasetRepo:
    repo = FakeDatasetRepo(repo_id)
    repo.commits[sha] = files
    repo.branches["main"] = sha
    return repo


GSM8K_SHOTS = 5


def mtbench_rows(n: int, topic: str = "the number") -> list[dict]:
    return [
        {
            "prompt": [f"Write a short poem about {topic} {i}.", "Now rewrite it for a child."],
            "prompt_id": 1000 + i,
            "category": "writing",
            "reference": [],
        }
        for i in range(n)
    ]


def _mtbench_files(rows: list[dict]) -> dict[str, bytes]:
    return {
        "README.md": _card("- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"),
        "data/train-00000-of-00001-5bf7ea9ab2b9a9c0.parquet": _parquet(rows),
        "raw/question.jsonl": b'{"question_id": 81, "category": "writing", "turns": ["a", "b"]}\n',
    }


def benchmark_repos(n: int = 6) -> list[FakeDatasetRepo]:
    """``n`` questions per set (GSM8K: ``n`` after its five examples)."""
    gsm8k = [
        {"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"}
        for i in range(GSM8K_SHOTS + n)
    ]
    humaneval = [
        {
            "task_id": f"HumanEval/{i}",
            "prompt": f'def f{i}(x):\n    """Return x plus {i}."""\n',
            "canonical_solution": f"    return x + {i}\n",
            "test": f"def check(candidate):\n    assert candidate(1) == {i + 1}\n",
            "entry_point": f"f{i}",
        }
        for i in range(n)
    ]
    g, h = PROMPT_SETS["gsm8k"].hub, PROMPT_SETS["humaneval"].hub
    assert g is not None and h is not None
    gsm = _pinned(
        g.repo_id,
        g.revision,
        {
            "README.md": _card(
                "- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
                "  - split: test\n    path: main/test-*\n"
                "- config_name: socratic\n  data_files:\n  - split: test\n    path: socratic/test-*\n"
            ),
            "main/train-00000-of-00001.parquet": _parquet(gsm8k[:2]),
            "main/test-00000-of-00001.parquet": _parquet(gsm8k),
            "socratic/test-00000-of-00001.parquet": _parquet(gsm8k[:1]),
        },
    )
    he = _pinned(
        h.repo_id,
        h.revision,
        {
            "README.md": _card(
                "- config_name: openai_humaneval\n  data_files:\n  - split: test\n    path: openai_humaneval/test-*\n"
                "  default: true\n"
            ),
            "openai_humaneval/test-00000-of-00001.parquet": _parquet(humaneval),
        },
    )
    m = PROMPT_SETS["mtbench"].hub
    assert m is not None
    mt = _pinned(m.repo_id, m.revision, _mtbench_files(mtbench_rows(n)))
    mt.commit(_mtbench_files(mtbench_rows(n + 1, "the moved branch")))  # main, after the pinned commit
    return [gsm, he, mt]
