"""τ and per-position arithmetic as SGLang's meta_info and vLLM's /metrics report them."""

import math

import pytest

from resources.serving.acceptance import AcceptanceError, AcceptanceTally, reached_from_histogram
from resources.serving.errors import EngineResponseError, SpeculationMissing
from resources.serving.prometheus import MetricsFormatError, matching, parse_metrics
from resources.serving.sglang_meta import meta_info_warnings, tally_from_meta_info
from resources.serving.vllm_metrics import SpecDecodeCounters
from tests.serving.fake_engines import vllm_metrics_text


def sglang_meta(completion, verify, histogram, draft_tokens=4):
    accepted = sum(k * n for k, n in enumerate(histogram))
    proposed = verify * (draft_tokens - 1)
    return {
        "id": "r1",
        "finish_reason": {"type": "length", "length": completion},
        "prompt_tokens": 12,
        "completion_tokens": completion,
        "cached_tokens": 0,
        "spec_accept_rate": accepted / proposed,
        "spec_accept_length": completion / verify,
        "spec_num_correct_drafts": accepted,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify,
        "spec_accepted_drafts": accepted,
        "spec_proposed_drafts": proposed,
        "spec_correct_drafts_histogram": histogram,
        "spec_accept_histogram": histogram,
    }


def test_sglang_tau_is_completion_over_verifications_summed_over_requests():
    # request 1: 10 verifications accepting 0,1,2,3 drafts [1, 2, 3, 4] times -> 20 accepted, 1 prefill token.
    a = tally_from_meta_info(sglang_meta(31, 10, [1, 2, 3, 4]), num_steps=3)
    assert a.tau == pytest.approx(3.1) and a.accepted == 20
    assert a.reached == [9, 7, 4] and a.position_rates == pytest.approx([0.9, 0.7, 0.4])
    # request 2: a short histogram (SGLang grows it on demand) pads with zeros.
    b = tally_from_meta_info(sglang_meta(7, 5, [3, 2]), num_steps=3)
    assert b.reached == [2, 0, 0]
    total = sum([a, b], AcceptanceTally.empty(3, "output_per_verification"))
    assert total.tau == pytest.approx(38 / 15)  # SpecForge: sum(completion_tokens) / sum(spec_verify_ct)
    assert total.position_rates == pytest.approx([11 / 15, 7 / 15, 4 / 15])
    assert total.accept_rate == pytest.approx(22 / 45)


def test_sglang_older_release_without_histogram_keeps_tau_but_no_positions():
    t = tally_from_meta_info({"completion_tokens": 40, "spec_verify_ct": 16}, 3)
    assert t.tau == 2.5 and t.position_rates is None and t.accepted is None
    # a request answered from prefill alone has no verification, and no speculative fields at all
    assert tally_from_meta_info({"completion_tokens": 1}, 3).verifications == 0


def test_sglang_answers_that_cannot_be_right_fail_loudly():
    with pytest.raises(EngineResponseError, match="counts 9 verifications, not 10"):
        tally_from_meta_info({**sglang_meta(31, 10, [1, 2, 3, 4]), "spec_correct_drafts_histogram": [1, 2, 2, 4]}, 3)
    with pytest.raises(EngineResponseError, match="no completion_tokens"):
        tally_from_meta_info({"spec_verify_ct": 3}, 3)
    with pytest.raises(EngineResponseError, match="not a count"):
        tally_from_meta_info({"completion_tokens": -1}, 3)
    with pytest.raises(AcceptanceError, match="more than 3 drafts"):
        reached_from_histogram([0, 0, 0, 0, 1], 3)


def test_a_proposed_count_other_than_verifications_times_draft_tokens_is_a_warning_not_a_failure():
    """A newer SGLang may count proposals otherwise; τ and the positions do not depend on that count."""
    meta = sglang_meta(31, 10, [1, 2, 3, 4], draft_tokens=6)  # 50 proposed in 10 verifications
    t = tally_from_meta_info(meta, 3)
    assert t.tau == pytest.approx(3.1) and t.reached == [9, 7, 4]
    (note,) = meta_info_warnings(meta, num_draft_tokens=4)
    assert "spec_num_proposed_drafts is not spec_verify_ct × 3" in note
    assert meta_info_warnings(sglang_meta(31, 10, [1, 2, 3, 4]), 4) == []
    assert meta_info_warnings({"completion_tokens": 40, "spec_verify_ct": 16}, 4) == []  # v0.4: no count at all


def test_in_process_rounds_give_the_same_definition_as_vllm():
    t = AcceptanceTally.from_rounds([3, 0, 2, 1], num_steps=3, output_tokens=11)
    assert t.tau == pytest.approx(1 + 6 / 4)
    assert t.position_rates == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    assert t.tau == pytest.approx(1 + sum(t.position_rates))  # chains: τ = 1 + Σ rate_j
    with pytest.raises(AcceptanceError, match="grow with the position"):
        AcceptanceTally(3, "accepted_per_draft", 4, 3, [1, 2, 0], 9).check()
    assert AcceptanceTally.empty(3, "accepted_per_draft").tau is None


def test_vllm_deltas_around_a_run():
    before = SpecDecodeCounters.from_metrics_text(
        vllm_metrics_text("/m/kimi", drafts=100, accepted_per_pos=[80, 60, 30], generation_tokens=300)
    )
    after = SpecDecodeCounters.from_metrics_text(
        vllm_metrics_text("/m/kimi", drafts=140, accepted_per_pos=[110, 80, 40], generation_tokens=420)
    )
    delta = after.minus(before)
    assert (delta.drafts, delta.accepted, delta.per_position) == (40, 60, (30, 20, 10))
    assert delta.draft_tokens == 120 and delta.generation_tokens == 120
    t = delta.tally(num_steps=3, output_tokens=100)
    assert t.tau == pytest.approx(1 + 60 / 40)  # vLLM: 1 + accepted / drafts
    assert t.position_rates == pytest.approx([0.75, 0.5, 0.25])
    with pytest.raises(EngineResponseError, match="went down"):
        before.minus(after)
    with pytest.raises(SpeculationMissing, match="drafts 3 tokens per step, the benchmark asked for 5"):
        delta.tally(num_steps=5, output_tokens=100)


def test_vllm_counters_summed_over_engines_and_missing_speculation():
    two = vllm_metrics_text("m", drafts=10, accepted_per_pos=[5, 2], generation_tokens=30, engines=2)
    c = SpecDecodeCounters.from_metrics_text(two)
    assert c.drafts == 20 and c.per_position == (10, 4) and c.accepted == 14
    with pytest.raises(SpeculationMissing, match="without --speculative-config"):
        SpecDecodeCounters.from_metrics_text(vllm_metrics_text("m", drafts=None, generation_tokens=5))


def test_prometheus_text_format():
    text = (
        "# HELP a_total Things.\n# TYPE a_total counter\n"
        'a_total{model_name="x \\"q\\" \\\\ y",engine="0"} 3.0\n'
        'a_created{model_name="x",engine="0"} 1.7e9\n'
        "b NaN 1700000000\nc +Inf\n"
        'd{le="0.5",} 2\n'
    )
    s = parse_metrics(text)
    assert [x.name for x in s] == ["a_total", "a_created", "b", "c", "d"]
    assert s[0].label("model_name") == 'x "q" \\ y' and s[0].value == 3.0
    assert math.isnan(s[2].value) and s[3].value == math.inf and s[4].label("le") == "0.5"
    assert len(matching(s, "a_total", {"engine": "0"})) == 1 and not matching(s, "a_total", {"engine": "1"})
    for bad in ("a_total{x=1} 2", "a_total 1 2 3", "0bad 1", 'a{x="1"}2', "a_total"):
        with pytest.raises(MetricsFormatError):
            parse_metrics(bad)
