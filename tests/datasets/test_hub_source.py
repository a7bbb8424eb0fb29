"""Hub datasets through the real ``huggingface_hub`` client against a loopback fake of the Hub: a dataset repo
with Parquet shards and two revisions, its dataset card's configs, pinned commits, and offline reuse."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.datasets.hub_source import HubSourceError
from eagle_assets.datasets.sources import SourceSpec, resolve_source
from eagle_assets.settings import REPO_ROOT
from tests.datasets.fake_dataset_hub import FakeDatasetRepo, serve_datasets

CARD = b"""---
license: mit
configs:
- config_name: default
  default: true
  data_files:
  - split: train_sft
    path: data/train_sft-*
  - split: test_sft
    path: data/test_sft-*
- config_name: tiny
  data_files: tiny/*.jsonl
---
# A chat set
"""


def parquet_bytes(rows, row_group_size=3):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=row_group_size)
    return buf.getvalue()


def chat_rows(n, tag):
    return [
        {
            "prompt_id": f"{tag}-{i}",
            "prompt": f"question {i}",
            "messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer"}],
        }
        for i in range(n)
    ]


@pytest.fixture
def repo():
    repo = FakeDatasetRepo("acme/ultrachat-mini")
    old = chat_rows(10, "old")
    repo.old = repo.commit(  # type: ignore[attr-defined]
        {
            "README.md": CARD,
            "data/train_sft-00000-of-00002.parquet": parquet_bytes(old[:6]),
            "data/train_sft-00001-of-00002.parquet": parquet_bytes(old[6:]),
            "data/test_sft-00000-of-00001.parquet": parquet_bytes(old[:2]),
            "tiny/a.jsonl": b'{"prompt": "tiny one"}\n{"prompt": "tiny two"}\n',
        }
    )
    new = chat_rows(7, "new")
    repo.new = repo.commit(  # type: ignore[attr-defined]
        {
            "README.md": CARD,
            "data/train_sft-00000-of-00001.parquet": parquet_bytes(new),
            "data/test_sft-00000-of-00001.parquet": parquet_bytes(new[:1]),
        }
    )
    return repo


@pytest.fixture
def hf_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "hf"


def test_revisions_configs_and_splits_resolve_to_pinned_files(repo, hf_env, monkeypatch):
    with serve_datasets(repo) as (url, requests):
        monkeypatch.setenv("HF_ENDPOINT", url)
        latest = resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", split="train_sft"))
        assert latest.commit == repo.new and latest.count_rows() == 7 and latest.config == "default"
        assert str(hf_env / "hub" / "datasets--acme--ultrachat-mini" / "snapshots" / repo.new) in str(latest.files[0])
        assert latest.description == f"acme/ultrachat-mini@{repo.new} (split train_sft, config default)"
        pinned = resolve_source(SourceSpec.parse(f"hf:acme/ultrachat-mini@{repo.old}", split="train_sft"))
        assert pinned.commit == repo.old and pinned.count_rows() == 10
        assert [p.split("/")[-1] for p in pinned.labels] == [
            "train_sft-00000-of-00002.parquet",
            "train_sft-00001-of-00002.parquet",
        ]
        rows = list(pinned.iter_rows(wanted={0, 8}))
        assert [r.value["prompt_id"] for r in rows] == ["old-0", "old-8"]
        assert pinned.where(rows[1]).startswith(f"acme/ultrachat-mini@{repo.old[:12]} split train_sft row 8")
        test = resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", split="test_sft", revision=repo.old))
        assert test.count_rows() == 2
        tiny = resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", config="tiny", revision=repo.old))
        assert tiny.count_rows() == 2 and tiny.split == "train"
        files = resolve_source(
            SourceSpec.parse("hf:acme/ultrachat-mini", revision=repo.old, data_files=["data/test_sft-*"])
        )
        assert files.count_rows() == 2
        with pytest.raises(HubSourceError, match=r"no split 'validation'; it has \['test_sft', 'train_sft'\]"):
            resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", split="validation"))
        with pytest.raises(HubSourceError, match=r"no config 'big'; the dataset card lists \['default', 'tiny'\]"):
            resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", config="big", split="train_sft"))
        with pytest.raises(HubSourceError, match=r"RevisionNotFound|RepositoryNotFound|refused"):
            resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", revision="no-such-branch"))
        with pytest.raises(HubSourceError):
            resolve_source(SourceSpec.parse("hf:acme/missing"))
        # A second resolution of a cached commit downloads nothing again.
        before = sum(r.startswith("GET /datasets/") for r in requests)
        resolve_source(SourceSpec.parse("hf:acme/ultrachat-mini", split="train_sft", revision=repo.old))
        assert sum(r.startswith("GET /datasets/") for r in requests) == before


def test_file_names_give_the_split_when_the_card_has_no_configs(hf_env, monkeypatch):
    repo = FakeDatasetRepo("acme/plain")
    repo.commit(
        {
            "README.md": b"# no front matter\n",
            "data/train-00000-of-00001.parquet": parquet_bytes(chat_rows(4, "t")),
            "data/validation-00000-of-00001.parquet": parquet_bytes(chat_rows(2, "v")),
            "notes.txt": b"not data",
        }
    )
    flat = FakeDatasetRepo("acme/flat")
    flat.commit({"prompts.jsonl": b'{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n'})
    with serve_datasets(repo, flat) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert resolve_source(SourceSpec.parse("hf:acme/plain")).count_rows() == 4
        assert resolve_source(SourceSpec.parse("hf:acme/plain", split="validation")).count_rows() == 2
        assert resolve_source(SourceSpec.parse("hf:acme/flat")).count_rows() == 3  # no split named: all is train
        with pytest.raises(HubSourceError, match="no data files for split 'test'"):
            resolve_source(SourceSpec.parse("hf:acme/plain", split="test"))


def test_json_files_on_the_hub_are_read_as_named_or_as_the_train_split(hf_env, monkeypatch):
    """ShareGPT-style sets ship ``train.json`` (JSON Lines or one array); ``dataset_info.json`` is not data."""
    line = b'{"id": "%d", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}\n'
    lines = FakeDatasetRepo("acme/sg-lines")
    lines.commit({"train.json": b"".join(line % i for i in range(3)), "README.md": b"# x\n"})
    array = FakeDatasetRepo("acme/sg-array")
    array.commit(
        {
            "sharegpt_part1.json": b"[" + b",\n".join(line.strip() % i for i in range(4)) + b"]",
            "dataset_info.json": b'{"features": {}}',
        }
    )
    with serve_datasets(lines, array) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert resolve_source(SourceSpec.parse("hf:acme/sg-lines")).count_rows() == 3
        named = resolve_source(SourceSpec.parse("hf:acme/sg-lines", data_files=["train.json"]))
        assert named.labels == ("acme/sg-lines/train.json",) and named.count_rows() == 3
        whole = resolve_source(SourceSpec.parse("hf:acme/sg-array"))  # no split named: all is train
        assert whole.labels == ("acme/sg-array/sharegpt_part1.json",) and whole.count_rows() == 4
        assert [r.value["id"] for r in whole.iter_rows()] == ["0", "1", "2", "3"]


_CHILD = """
import json, sys
from eagle_assets.datasets.sources import SourceSpec, resolve_source
from eagle_assets.datasets.hub_source import HubSourceError
for spec in sys.argv[1:]:
    try:
        s = resolve_source(SourceSpec.parse(spec, split="train_sft"))
        print(json.dumps({"commit": s.commit, "rows": s.count_rows()}))
    except HubSourceError as exc:
        print(json.dumps({"error": str(exc)}))
"""


def _child(env: dict[str, str], *specs: str) -> list[dict]:
    """One fresh process (``HF_HUB_OFFLINE`` is read at import) resolving ``specs`` in turn: one answer each."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *specs], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(specs) :]]


def test_offline_after_one_fetch(repo, hf_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(hf_env)
    with serve_datasets(repo) as (url, _):
        env["HF_ENDPOINT"] = url
        online, main = _child(env, f"hf:acme/ultrachat-mini@{repo.old}", "hf:acme/ultrachat-mini")
    assert online == {"commit": repo.old, "rows": 10} and main == {"commit": repo.new, "rows": 7}
    # The Hub is gone: with HF_HUB_OFFLINE=1 (read at import, as huggingface_hub does) both come from the cache,
    # the branch through the ref the first fetch recorded. A process of its own: nothing held from the fetches.
    offline = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    again, again_main, never = _child(
        offline,
        f"hf:acme/ultrachat-mini@{repo.old}",
        "hf:acme/ultrachat-mini",
        "hf:acme/ultrachat-mini@0123456789012345678901234567890123456789",
    )
    assert again == online and again_main == main
    assert "not in the local Hugging Face cache" in never["error"] and "HF_HUB_OFFLINE" in never["error"]
    assert Path(hf_env / "hub" / "datasets--acme--ultrachat-mini" / "refs" / "main").read_text() == repo.new


def test_benchmark_prompt_sets_load_through_this_loader(repo, hf_env, monkeypatch):
    """The draft benchmark's Hub sets (MT-Bench, GSM8K, HumanEval) are read by this same loader, pinned."""
    from eagle_assets.benchmarks.hub_sets import load_hub_set
    from eagle_assets.benchmarks.prompt_sets import HubSet

    with serve_datasets(repo) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        rows, where = load_hub_set(HubSet("acme/ultrachat-mini", repo.old, None, "train_sft"))
    assert [r["prompt_id"] for r in rows] == [f"old-{i}" for i in range(10)]
    assert where == f"acme/ultrachat-mini@{repo.old} (split train_sft, config default)"


def test_loading_a_target_leaves_the_process_able_to_reach_the_hub():
    """The target's modules load local folders with ``local_files_only``; they set nothing process-wide. They used to
    set ``HF_HUB_OFFLINE=1`` on import, so a process that imported them before huggingface_hub (a Dagster run
    executing a hidden-state step and a Hub dataset in one process) refused every Hub request for good."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    code = (
        "import os, eagle_assets.target.loader, eagle_assets.target.tiny, eagle_assets.hidden_states.extract_hf\n"
        "import huggingface_hub.constants as hub\n"
        "print(hub.HF_HUB_OFFLINE, os.environ.get('HF_HUB_OFFLINE'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "None"]
