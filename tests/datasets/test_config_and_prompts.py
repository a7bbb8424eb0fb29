"""Dataset declarations and prompt files: clear errors before anything is spent, bad rows reported
with file and line while the rest is kept, shards cut on row ordinals."""

import subprocess
import sys

import orjson
import pytest

from eagle_assets.datasets.config import DatasetConfigError, load_datasets
from eagle_assets.datasets.file_readers import PromptFileError
from eagle_assets.datasets.samples import BUILDERS, sample_rows
from eagle_assets.generation.partition_inputs import partition_inputs
from eagle_assets.settings import REPO_ROOT
from tests.datasets.prompt_files import load_prompts


def write_yaml(tmp_path, text):
    p = tmp_path / "datasets.yaml"
    p.write_text(text)
    return p


def test_default_config_declares_b1_to_b8_with_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path))
    specs = load_datasets()
    assert list(specs) == [f"B{i}" for i in range(1, 9)]
    for spec in specs.values():
        assert spec.path.is_file() and spec.output_token_budget == 10_000_000
        prompts, problems = load_prompts(spec.path)
        assert prompts and not problems
    assert any(p.tools for p in load_prompts(specs["B4"].path)[0])
    assert sample_rows("B3", 5) == sample_rows("B3", 5)  # deterministic


def test_the_default_b5_regenerates_every_turn_of_its_conversations(tmp_path, monkeypatch):
    """The demo's multi-turn set is declared every_turn and is read into chains with later turns (``#t2``),
    not one request per row."""
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path))
    b5 = load_datasets()["B5"]
    assert b5.regenerate == "every_turn"
    inputs = partition_inputs(b5, "0000", tmp_path / "cache")
    assert inputs.chains is not None and not inputs.prompts
    ids = list(inputs.chains.prompt_ids())
    assert {i.rsplit("#t", 1)[1] for i in ids} >= {"1", "2"} and inputs.requests == len(ids) > len(inputs.chains)
    assert inputs.scan.requests >= inputs.requests  # the whole set's count (budgets, targets) has every turn too


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("datasets:\n  B1: {path: x.jsonl, output_token_budget: -5}\n", "output_token_budget must be >= 0"),
        ("datasets:\n  B1: {path: x.jsonl, shard_size: 0}\n", "shard_size must be positive"),
        ("datasets:\n  B1: {}\n", "needs a 'path'"),
        ("datasets:\n  'bad name': {path: x.jsonl}\n", "name must match"),
        ("datasets:\n  B1: {path: 'sample:B99'}\n", "unknown sample set"),
        ("datasets: [\n", "not valid YAML"),
        ("nothing: here\n", "'datasets' must map"),
        ("datasets:\n  B1: {path: x.jsonl, regenrate: every_turn}\n", "unknown key 'regenrate'"),
        ("datasets:\n  B1: {path: x.jsonl, regenerate: all}\n", "regenerate must be one of last_user"),
        ("defaults: {shard: 5}\ndatasets:\n  B1: {path: x.jsonl}\n", "defaults: unknown key 'shard'"),
        ("datasets:\n  B1: {path: x.jsonl}\nextra: 1\n", "unknown key 'extra'"),
        ("datasets:\n  B1: {path: x.jsonl, format: csv}\n", "format must be one of openai"),
        ("datasets:\n  B1: {path: x.jsonl, columns: {question: q}}\n", r"unknown field\(s\) \['question'\]"),
        ("datasets:\n  B1: {path: x.jsonl, split: train}\n", "apply to Hub datasets"),
        ("datasets:\n  B1: {path: 'hf:no-slash'}\n", "not a Hub dataset id"),
        ("datasets:\n  B1: {path: x.jsonl, max_bad_fraction: 2}\n", r"max_bad_fraction must be a number in \[0, 1\]"),
    ],
)
def test_config_errors_name_the_file_and_entry(tmp_path, text, message):
    path = write_yaml(tmp_path, text)
    with pytest.raises(DatasetConfigError, match=message) as exc:
        load_datasets(path)
    assert str(path) in str(exc.value) or "sample" in message


def test_hub_entries_and_reading_settings(tmp_path):
    path = write_yaml(
        tmp_path,
        "defaults: {regenerate: every_turn, max_turns: 4}\n"
        "datasets:\n"
        "  U: {path: 'hf:HuggingFaceH4/ultrachat_200k', revision: 8049631, split: train_sft, shard_size: 500}\n"
        "  S: {path: sharegpt.jsonl.zst, format: sharegpt, order: file, seed: 3, regenerate: last_user}\n"
        "  G: {path: gsm.parquet, format: prompt, columns: {prompt: question, id: task_id}}\n",
    )
    specs = load_datasets(path)
    u, s, g = specs["U"], specs["S"], specs["G"]
    assert u.path is None and u.source.hub.repo_id == "HuggingFaceH4/ultrachat_200k"
    assert (u.source.hub.revision, u.source.hub.split, u.regenerate, u.max_turns) == (
        "8049631",
        "train_sft",
        "every_turn",
        4,
    )
    assert s.path == tmp_path / "sharegpt.jsonl.zst" and s.format == "sharegpt" and s.order == "file"
    assert s.regenerate == "last_user" and s.seed == 3
    assert dict(g.columns) == {"prompt": "question", "id": "task_id"} and g.source_label == str(
        tmp_path / "gsm.parquet"
    )


def test_missing_file(tmp_path):
    path = write_yaml(tmp_path, f"datasets:\n  B1: {{path: {tmp_path / 'missing.jsonl'}}}\n")
    specs = load_datasets(path)
    assert specs["B1"].shard_keys() == ["0000"]  # a placeholder shard; the run itself says what is missing
    with pytest.raises(PromptFileError, match="prompt file not found"):
        load_prompts(specs["B1"].path)
    assert specs["B1"].regenerate == "last_user" and specs["B1"].order == "shuffled"


def test_malformed_rows_are_reported_with_file_and_line_and_the_rest_kept(tmp_path):
    f = tmp_path / "p.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}]}
    lines = [
        orjson.dumps({"id": "a", **good}),
        b"{not json",
        orjson.dumps({"id": "b", "messages": []}),
        orjson.dumps({"id": "c", "messages": [{"role": "robot", "content": "x"}]}),
        orjson.dumps(
            {"id": "d", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
        ),
        b"",
        orjson.dumps({"id": "a", **good}),
        orjson.dumps({"id": "e", **good, "tools": "nope"}),
        orjson.dumps(good),
    ]
    f.write_bytes(b"\n".join(lines) + b"\n")
    prompts, problems = load_prompts(f)
    assert [p.prompt_id for p in prompts][:2] == ["a", "d"] and len(prompts) == 3
    assert [p.line for p in prompts] == [1, 5, 9]
    assert [p.index for p in prompts] == [0, 4, 7]  # ordinals skip the blank line: shards never shift
    # A row that ends with the assistant has that answer regenerated (last_user): it is cut after the user.
    assert prompts[1].messages == [{"role": "user", "content": "q"}]
    by_line = {p.line: p for p in problems}
    assert set(by_line) == {2, 3, 4, 7, 8}
    assert "invalid JSON" in by_line[2].problem and "empty list" in by_line[3].problem
    assert "role 'robot'" in by_line[4].problem and "duplicate prompt id 'a'" in by_line[7].problem
    assert {p.reason for p in problems} == {"invalid_json", "empty", "unknown_role", "duplicate_id", "bad_tools"}
    assert all(str(f) in str(p) for p in problems)
    # A content-derived id is stable across reads.
    assert load_prompts(f)[0][2].prompt_id == prompts[2].prompt_id


def test_parquet_prompt_files(tmp_path):
    import polars as pl

    rows = sample_rows("B4", 6)
    path = tmp_path / "p.parquet"
    pl.DataFrame(
        {
            "id": [r["id"] for r in rows],
            "messages": [orjson.dumps(r["messages"]).decode() for r in rows],
            "tools": [orjson.dumps(r["tools"]).decode() for r in rows],
        }
    ).write_parquet(path)
    prompts, problems = load_prompts(path)
    assert not problems and len(prompts) == 6 and prompts[0].tools[0]["function"]["name"] == "get_weather"


_LIGHT_THEN_VALIDATE = """
import runpy, sys
import eagle_assets.definitions
print(sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules), flush=True)
sys.argv = ["dagster", "definitions", "validate", "-w", "workspace.yaml"]
runpy.run_module("dagster", run_name="__main__")
"""


def test_definitions_load_light_and_validate(tmp_path):
    """Every step process and the code server import the definitions; torch and matplotlib wait for the steps.
    Then ``dagster definitions validate`` (what ``python -m dagster`` runs) in that same fresh process: one Python
    start instead of two, the import check done before dagster's CLI imports anything more."""
    import os

    env = {**os.environ, "EAGLE_FORGE_HOME": str(tmp_path), "DAGSTER_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _LIGHT_THEN_VALIDATE],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == "[]"
    assert "Validation successful" in out.stdout + out.stderr


def test_every_builtin_sample_set_is_valid():
    for name in BUILDERS:
        assert len(sample_rows(name, 3)) == 3
