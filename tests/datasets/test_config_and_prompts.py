"""Dataset declarations and prompt files: clear errors before anything is spent, bad rows reported
with file and line while the rest is kept, shards cut on row ordinals."""

import subprocess
import sys

import orjson
import pytest

from eagle_assets.datasets.config import DatasetConfigError, get_dataset, load_datasets
from eagle_assets.datasets.prompts import PromptFileError, load_prompts
from eagle_assets.datasets.samples import BUILDERS, sample_rows
from eagle_assets.settings import REPO_ROOT


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
    ],
)
def test_config_errors_name_the_file_and_entry(tmp_path, text, message):
    path = write_yaml(tmp_path, text)
    with pytest.raises(DatasetConfigError, match=message) as exc:
        load_datasets(path)
    assert str(path) in str(exc.value) or "sample" in message


def test_unknown_dataset_and_missing_file(tmp_path):
    path = write_yaml(tmp_path, f"datasets:\n  B1: {{path: {tmp_path / 'missing.jsonl'}}}\n")
    specs = load_datasets(path)
    with pytest.raises(DatasetConfigError, match="unknown dataset 'B9'; configured: B1"):
        get_dataset("B9", specs)
    assert specs["B1"].shard_keys() == ["0000"]  # a placeholder shard; the run itself says what is missing
    with pytest.raises(PromptFileError, match="prompt file not found"):
        load_prompts(specs["B1"].path)


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
    assert prompts[0].prompt_id == "a" and len(prompts) == 2
    assert [p.line for p in prompts] == [1, 9]
    assert [p.index for p in prompts] == [0, 7]  # ordinals skip the blank line: shards never shift
    by_line = {p.line: p.problem for p in problems}
    assert set(by_line) == {2, 3, 4, 5, 7, 8}
    assert "invalid JSON" in by_line[2] and "non-empty list" in by_line[3] and "role 'robot'" in by_line[4]
    assert "last message is from the assistant" in by_line[5] and "duplicate prompt id 'a'" in by_line[7]
    assert all(str(f) in str(p) for p in problems)
    # A content-derived id is stable across reads.
    assert load_prompts(f)[0][1].prompt_id == prompts[1].prompt_id


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


def test_definitions_validate(tmp_path):
    import os

    env = {**os.environ, "EAGLE_FORGE_HOME": str(tmp_path), "DAGSTER_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Validation successful" in out.stdout + out.stderr


def test_loading_definitions_stays_light(tmp_path):
    """Every step process and the code server import the definitions; torch and matplotlib wait for the steps."""
    import os

    code = "import sys, eagle_assets.definitions as d; print(sorted(m for m in ('torch', 'transformers', "
    code += "'matplotlib') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EAGLE_FORGE_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_every_builtin_sample_set_is_valid():
    for name in BUILDERS:
        assert len(sample_rows(name, 3)) == 3
