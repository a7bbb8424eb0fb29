"""The benchmark sets read from a loopback Hub through the datasets loader, at the pinned revisions."""

import pytest

from eagle_assets.assets.draft_benchmark import BenchmarkConfig, load_prompt_sets
from eagle_assets.benchmarks.hub_sets import load_hub_set
from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS, HubSet, PromptSetError, conversations_from_rows
from tests.datasets.fake_dataset_hub import serve_datasets
from tests.serving.hub_fixtures import benchmark_repos, hub_reachable


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub_reachable(monkeypatch)
    repos = benchmark_repos()
    with serve_datasets(*repos) as (url, requests):
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield {r.repo_id: r for r in repos}, requests


def test_each_set_from_its_pinned_revision_in_its_columns(hub):
    repos, _ = hub
    gsm = PROMPT_SETS["gsm8k"].hub
    rows, source = load_hub_set(gsm)
    assert source == f"openai/gsm8k@{gsm.revision} (split test, config main)" and len(rows) == 11
    first = conversations_from_rows("gsm8k", rows, 3)[0]
    assert first.id == "gsm8k-5" and first.user_turns[0].startswith("Question: Tom has 0 apples")
    assert first.user_turns[0].endswith("Question: Tom has 5 apples and buys 2. How many?\nAnswer:")
    he = PROMPT_SETS["humaneval"].hub
    rows, source = load_hub_set(he)
    assert source.startswith(f"openai/openai_humaneval@{he.revision}") and rows[0]["entry_point"] == "f0"
    assert [c.id for c in conversations_from_rows("humaneval", rows, 164)][:2] == ["HumanEval/0", "HumanEval/1"]
    rows, source = load_hub_set(PROMPT_SETS["mtbench"].hub)
    assert PROMPT_SETS["mtbench"].hub.revision == "e3a795c5e9a82ee40611c416b8a7786c73198991"
    assert repos["HuggingFaceH4/mt_bench_prompts"].branches["main"] != PROMPT_SETS["mtbench"].hub.revision
    assert source.startswith("HuggingFaceH4/mt_bench_prompts@e3a795c5e9a82ee40611c416b8a7786c73198991")
    convs = conversations_from_rows("mtbench", rows, 80)
    assert len(convs) == 6 and convs[0].turns == 2 and convs[0].id == "mtbench-1000"
    assert "the number 0" in convs[0].user_turns[0]  # the pinned questions, not the moved branch's


def test_the_config_reads_another_revision_of_a_set_and_refuses_one_for_a_set_off_the_hub(hub):
    repos, _ = hub
    moved = repos["HuggingFaceH4/mt_bench_prompts"].branches["main"]
    lines: list[str] = []
    (plan,), sources = load_prompt_sets(BenchmarkConfig(revisions={"mtbench": moved}), ["mtbench"], lines.append)
    assert sources["mtbench"].startswith(f"HuggingFaceH4/mt_bench_prompts@{moved}")
    assert len(plan.conversations) == 7 and "the moved branch 0" in plan.conversations[0].user_turns[0]
    assert plan.max_new_tokens == 2048 and "MT-Bench: 7 conversations, 14 turns" in lines[0]
    (pinned,), _ = load_prompt_sets(BenchmarkConfig(), ["mtbench"], lines.append)
    assert len(pinned.conversations) == 6
    with pytest.raises(PromptSetError, match=r"revisions name \['heldout'\], which are not Hub sets"):
        load_prompt_sets(BenchmarkConfig(revisions={"heldout": moved}), ["mtbench"], lines.append)


def test_a_revision_or_split_the_hub_does_not_have_fails_naming_it(hub):
    with pytest.raises(PromptSetError, match="openai/gsm8k@0000"):
        load_hub_set(HubSet("openai/gsm8k", "0" * 40, "main", "test"))
    with pytest.raises(PromptSetError, match="no split 'validation'"):
        load_hub_set(HubSet("openai/gsm8k", PROMPT_SETS["gsm8k"].hub.revision, "main", "validation"))
