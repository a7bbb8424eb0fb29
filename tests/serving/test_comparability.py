"""When a run's τ may stand beside the published ones, and the reasons shown when it may not."""

from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS
from eagle_assets.benchmarks.reference import REFERENCE_SETTINGS, comparable, published_questions
from eagle_assets.benchmarks.results import SetResult, reference_table
from eagle_assets.benchmarks.serving_run import RequestRecord, SetPass
from resources.serving.acceptance import AcceptanceTally
from resources.serving.commands import SpeculativeSettings

FULL = {"mtbench": 80, "gsm8k": 500, "humaneval": 164}
MAX_NEW = {n: spec.default_max_new_tokens for n, spec in PROMPT_SETS.items()}


def a_pass(name: str, pass_name: str, questions: int, turns: int, complete: bool = True) -> SetPass:
    records = [
        RequestRecord(pass_name, name, f"{name}-{q}", t, 100, 50, "length", 0.1, 20, 30, [15, 10, 5])
        for q in range(questions)
        for t in range(turns)
    ]
    tally = AcceptanceTally(3, "output_per_verification", 20 * len(records), 30 * len(records), None, 50 * len(records))
    return SetPass(name, pass_name, questions, records, 1.0, tally if pass_name == "draft" else None, complete)


def a_result(name: str, questions: int, answered_turns: int | None = None, baseline_complete: bool = True) -> SetResult:
    turns = answered_turns if answered_turns is not None else (2 if name == "mtbench" else 1)
    return SetResult(
        name,
        a_pass(name, "draft", questions, turns),
        a_pass(name, "baseline", questions, turns, baseline_complete),
    )


def full_run() -> list[SetResult]:
    return [a_result(n, q) for n, q in FULL.items()] + [a_result("heldout", 16)]


def facts(results, max_new=MAX_NEW):
    return [r.facts(max_new[r.name]) for r in results]


def test_full_sets_at_the_reference_settings_are_comparable_with_what_is_unknown_said():
    verdict = comparable("sglang", REFERENCE_SETTINGS, 0.0, True, facts(full_run()))
    assert verdict.ok and verdict.reasons == ()
    assert verdict.describe().startswith("comparable (not published by the references: whether the target was")
    assert published_questions("gsm8k") == 500 and published_questions("heldout") is None
    # a run of MT-Bench alone, in full, is comparable on MT-Bench
    assert comparable("sglang", REFERENCE_SETTINGS, 0.0, True, facts([a_result("mtbench", 80)])).ok
    row = reference_table(full_run(), "this draft (sglang)", verdict).splitlines()[2]
    assert "| this run; comparable" in row


def test_each_difference_from_the_reference_is_named():
    short = [a_result("mtbench", 2), a_result("gsm8k", 200), a_result("humaneval", 164)]
    verdict = comparable("vllm", SpeculativeSettings(4, 1, 5), 0.7, True, facts(short, {**MAX_NEW, "gsm8k": 48}))
    assert not verdict.ok
    assert verdict.reasons == (
        "engine vllm, not sglang",
        "steps/topk/draft tokens 4/1/5, not 3/1/4",
        "temperature 0.7, not greedy",
        "2 of the 80 MT-Bench questions",
        "200 of the 500 GSM8K questions",
        "GSM8K max_new_tokens 48, not 512",
    )
    assert verdict.short() == "not comparable: engine vllm, not sglang (+5 more)"


def test_an_incomplete_pass_or_a_missing_second_turn_is_not_comparable():
    cut = [a_result("mtbench", 80), a_result("humaneval", 164, baseline_complete=False)]
    verdict = comparable("sglang", REFERENCE_SETTINGS, 0.0, True, facts(cut))
    assert verdict.reasons == ("HumanEval pass incomplete",)
    one_turn = comparable("sglang", REFERENCE_SETTINGS, 0.0, True, facts([a_result("mtbench", 80, answered_turns=1)]))
    assert one_turn.reasons == ("MT-Bench: 80 answers to 80 questions of 2 turn(s)",)
    held_out_only = comparable("sglang", REFERENCE_SETTINGS, 0.0, True, facts([a_result("heldout", 16)]))
    assert held_out_only.reasons == ("no set with a published figure was run",)
