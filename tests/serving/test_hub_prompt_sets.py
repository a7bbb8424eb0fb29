"""The benchmark sets read from a loopback Hub through the datasets loader, at the pinned revisions."""

import pytest

from eagle_assets.benchmarks.hub_sets import load_hub_set
from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS, HubSet, PromptSetError, conversations_from_rows
from tests.datasets.fake_dataset_hub import serve_datasets
from tests.serving.hub_fixtures import benchmark_repos


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    repos = benchmark_repos()
    with serve_datasets(*repos) as (url, requests):
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield {r.repo_id: r for r in repos}, requests


def test_each_set_from_its_pinned_revision_in_its_columns(hub):
    repos, _ = hub
    gsm = PROMPT_SETS["gsm8k"].hub
    rows, source = load_hub_set(gsm)
    assert source == f"openai/gsm8k@{gsm.revision} (split test, config main)" and len(rows) == 6
    assert conversations_from_rows("gsm8k", rows, 3)[0].user_turns[0].startswith("Question: Tom has 0 apples")
    he = PROMPT_SETS["humaneval"].hub
    rows, source = load_hub_set(he)
    assert source.startswith(f"openai/openai_humaneval@{he.revision}") and rows[0]["entry_point"] == "f0"
    assert [c.id for c in conversations_from_rows("humaneval", rows, 164)][:2] == ["HumanEval/0", "HumanEval/1"]
    rows, source = load_hub_set(PROMPT_SETS["mtbench"].hub)
    mt_commit = repos["HuggingFaceH4/mt_bench_prompts"].branches["main"]
    assert source.startswith(f"HuggingFaceH4/mt_bench_prompts@{mt_commit}")  # "main", recorded as its commit
    convs = conversations_from_rows("mtbench", rows, 80)
    assert len(convs) == 6 and convs[0].turns == 2 and convs[0].id == "mtbench-1000"


def test_a_revision_or_split_the_hub_does_not_have_fails_naming_it(hub):
    with pytest.raises(PromptSetError, match="openai/gsm8k@0000"):
        load_hub_set(HubSet("openai/gsm8k", "0" * 40, "main", "test"))
    with pytest.raises(PromptSetError, match="no split 'validation'"):
        load_hub_set(HubSet("openai/gsm8k", PROMPT_SETS["gsm8k"].hub.revision, "main", "validation"))
