"""``draft_benchmark`` materialized through a serving backend on a real Dagster instance, against the stand-ins."""

import dagster as dg
import polars as pl
import pytest

from eagle_assets.assets.draft import draft_benchmark
from eagle_assets.layout import corpus_dir, latest_export_dir
from resources.serving.resource import ServingEngineResource
from resources.target.resource import TargetModelResource
from tests.serving.conftest import FAKE_LAUNCHER, write_draft


@pytest.fixture
def forge_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    write_draft(latest_export_dir() / "export")
    (corpus_dir() / "eval").mkdir(parents=True)
    prompts = [[163587, 2482, 163601, 100 + i, 163586, 163588, 69702, 163601, 163606] for i in range(3)]
    pl.DataFrame(
        {"input_ids": [[*p, 7, 8, 163586] for p in prompts], "prompt_len": [len(p) for p in prompts]}
    ).write_parquet(corpus_dir() / "eval" / "shard-00000.parquet")
    return tmp_path / "home"


def _plot_title(markdown_image: str) -> str:
    """The alt text of a Markdown image, which is the plot's title."""
    return markdown_image[2 : markdown_image.index("](")]


def serving(engine, target_model, **kw):
    return ServingEngineResource(
        backend=engine, model_path=str(target_model), tp_size=1, launcher=FAKE_LAUNCHER[engine], health_poll_s=0.2, **kw
    )


def materialize(instance, engine, target_model, config, **raise_kw):
    return dg.materialize(
        [draft_benchmark],
        instance=instance,
        resources={"target": TargetModelResource(), "serving": serving(engine, target_model)},
        run_config={"ops": {"draft_benchmark": {"config": config}}},
        **raise_kw,
    )


def test_every_set_from_the_hub_through_sglang_with_settings_and_reference(
    forge_home, target_model, fake_behaviour, tmp_path, monkeypatch
):
    from tests.datasets.fake_dataset_hub import serve_datasets
    from tests.serving.hub_fixtures import benchmark_repos, hub_reachable

    fake_behaviour(step_time_s=0.001)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    hub_reachable(monkeypatch)
    limits = {"mtbench_prompts": 2, "gsm8k_prompts": 3, "humaneval_prompts": 2, "num_prompts": 2}
    with serve_datasets(*benchmark_repos()) as (url, _), dg.instance_for_test() as instance:
        monkeypatch.setenv("HF_ENDPOINT", url)
        r = materialize(
            instance, "sglang", target_model, {**limits, "max_new_tokens": 24, "thinking": False, "batch_size": 2}
        )
        md = r.asset_materializations_for_node("draft_benchmark")[0].metadata
    rows = {row["set"]: row for row in md["per_set"].value}
    assert list(rows) == ["mtbench", "gsm8k", "humaneval", "heldout"]
    assert rows["mtbench"]["requests"] == 4 and rows["mtbench"]["conversations"] == 2  # both turns
    assert [rows[s]["requests"] for s in ("gsm8k", "humaneval", "heldout")] == [3, 2, 2]
    assert all(row["tau"] > 1 and row["speedup"] for row in rows.values())
    assert md["acceptance_length"].value == rows["mtbench"]["tau"]
    ours = md["reference"].value.splitlines()[2].split(" | ")
    assert ours[1:4] == [f"{rows[s]['tau']:.3f}" for s in ("mtbench", "gsm8k", "humaneval")]
    sources = md["settings"].value["sources"]
    assert sources["gsm8k"].startswith("openai/gsm8k@e53f048856ff4f594e959d75785d2c2d37b678ee")
    assert sources["mtbench"].startswith("HuggingFaceH4/mt_bench_prompts@e3a795c5e9a82ee40611c416b8a7786c73198991")
    assert md["settings"].value["thinking"] is False
    assert md["settings"].value["max_new_tokens"] == {"mtbench": 24, "gsm8k": 24, "humaneval": 24, "heldout": 24}
    assert rows["heldout"]["tau_definition"] == "output_per_verification" and rows["mtbench"]["complete"]
    assert md["acceptance_length_gsm8k"].value == rows["gsm8k"]["tau"]
    assert md["speedup_humaneval"].value == rows["humaneval"]["speedup"]
    assert len(md["per_position_accept_rate"].value) == 3
    assert "MT-Bench" in md["acceptance"].value and "tok/s without" in md["acceptance"].value
    ref = md["reference"].value
    assert "lightseekorg/kimi-k2.5-eagle3 | 2.687 | 3.201 | 3.285 | reference (published)" in ref
    assert "AQ-MedAI Kimi-K2 (SpecBundle) | 2.390 | 3.270 | 3.360 | reference (published); questions per set not" in ref
    # 3/1/4 and greedy, but 2 questions of 24 tokens: never to be read against the published figures
    ours = next(line for line in ref.splitlines() if line.startswith("| this draft (sglang)"))
    assert "this run; not comparable: " in ours
    for why in (
        "2 of the 80 MT-Bench questions",
        "MT-Bench max_new_tokens 24, not 2048",
        "3 of the 500 GSM8K questions",
        "2 of the 164 HumanEval questions",
        "HumanEval max_new_tokens 24, not 1024",
    ):
        assert why in ours and why in md["comparability"].value
    assert "held-out" not in md["comparability"].value  # no published figure: not judged
    assert "whether the target was thinking (this run: thinking off)" in ours  # no reference says
    assert md["comparable"].value is False
    assert "not comparable: 2 of the 80 MT-Bench questions (+" in _plot_title(md["acceptance_plot"].value)
    assert md["acceptance_plot"].value.startswith("![") and "data:image/png;base64," in md["per_position_plot"].value
    assert _plot_title(md["throughput_plot"].value) == "output tokens/s, sglang 3/1/4, batch 2"
    assert md["tokens_per_s_gsm8k"].value == pytest.approx(rows["gsm8k"]["tokens_per_s"], abs=0.01)
    assert md["warnings"].value == {}
    s = md["settings"].value
    assert (s["backend"], s["num_steps"], s["eagle_topk"], s["num_draft_tokens"], s["batch_size"]) == (
        "sglang",
        3,
        1,
        4,
        2,
    )
    assert s["temperature"] == 0.0 and s["engine_version"] == "0.5.0-fake" and s["mode"] == "start"
    assert s["sources"]["heldout"] == "corpus eval split"


def test_vllm_failure_names_the_cause_and_shows_the_partial_results(forge_home, target_model, fake_behaviour):
    fake_behaviour(step_time_s=0.002, die_after_requests=2)
    with dg.instance_for_test() as instance:
        r = materialize(
            instance, "vllm", target_model, {"sets": ["heldout"], "max_new_tokens": 40}, raise_on_error=False
        )
        assert not r.success
        (failure,) = [e for e in r.all_events if e.is_step_failure]
        data = failure.step_failure_data.user_failure_data
    assert "2 requests were answered" in data.description and "exited with code 3" in data.description
    assert "(incomplete)" in data.metadata["partial_results"].value
    assert data.metadata["journal"].value.endswith("requests.jsonl")


def test_settings_the_engine_cannot_run_fail_before_any_server(forge_home, target_model, fake_behaviour):
    with dg.instance_for_test() as instance:
        r = materialize(
            instance,
            "vllm",
            target_model,
            {"sets": ["heldout"], "eagle_topk": 4, "num_draft_tokens": 8},
            raise_on_error=False,
        )
        (failure,) = [e for e in r.all_events if e.is_step_failure]
    assert "chains only" in failure.step_failure_data.user_failure_data.description
