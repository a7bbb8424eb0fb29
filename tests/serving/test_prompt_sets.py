"""Benchmark rows in the sets' published layouts, turned into the conversations and token ids that are sent."""

import pytest

from eagle_assets.benchmarks.formatting import assistant_turn, kimi_renderer, prompt_ids, turn_messages
from eagle_assets.benchmarks.prompt_sets import (
    MTBENCH_SYSTEM_PROMPT,
    PromptSetError,
    conversations_from_rows,
    heldout_conversations,
)
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer

MTBENCH_H4 = [
    {"prompt": ["Write a haiku.", "Now make it rhyme."], "prompt_id": 81, "category": "writing", "reference": []},
    {"prompt": ["What is 2+2?", "And times 3?"], "prompt_id": 82, "category": "math", "reference": ["4", "12"]},
]
MTBENCH_FASTCHAT = [{"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]}]
GSM8K = [{"question": f"Q{i}?", "answer": f"step {i}\n#### {i}"} for i in range(8)]
HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": "def add(a, b):\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(c): assert c(1, 2) == 3",
        "entry_point": "add",
    }
]


def test_mtbench_both_layouts_two_turns_with_specforges_system_prompt():
    h4 = conversations_from_rows("mtbench", MTBENCH_H4, 80)
    assert [c.id for c in h4] == ["mtbench-81", "mtbench-82"] and h4[0].turns == 2
    assert h4[0].system == MTBENCH_SYSTEM_PROMPT
    (fc,) = conversations_from_rows("mtbench", MTBENCH_FASTCHAT, 80)
    assert fc.user_turns == h4[0].user_turns and fc.id == h4[0].id
    assert len(conversations_from_rows("mtbench", MTBENCH_H4, 1)) == 1


def test_gsm8k_asks_the_rows_after_its_five_shot_examples_and_humaneval_stubs():
    convs = conversations_from_rows("gsm8k", GSM8K, 3)
    assert [c.id for c in convs] == ["gsm8k-5", "gsm8k-6", "gsm8k-7"]
    text = convs[2].user_turns[0]
    assert text.startswith("Question: Q0?\nAnswer: step 0\n#### 0\n\n") and "Question: Q4?" in text
    assert "Question: Q5?" not in text and text.endswith("Question: Q7?\nAnswer:")
    # no question is asked with its own answer among the examples
    for c in convs:
        asked = c.user_turns[0].rsplit("Question: ", 1)[1]
        assert c.user_turns[0].count(f"Question: {asked.removesuffix(chr(10) + 'Answer:')}") == 1
    assert len(conversations_from_rows("gsm8k", GSM8K, 200)) == 3  # what is left after the examples
    with pytest.raises(PromptSetError, match="5 rows, but its 5-shot prompt takes 5"):
        conversations_from_rows("gsm8k", GSM8K[:5], 3)
    (he,) = conversations_from_rows("humaneval", HUMANEVAL, 164)
    assert he.id == "HumanEval/0" and he.user_turns == ["def add(a, b):\n"] and he.system is None


def test_rows_in_the_wrong_layout_fail_naming_the_columns():
    with pytest.raises(PromptSetError, match=r"has no \['question', 'answer'\] \(columns: \['text'\]\)"):
        conversations_from_rows("gsm8k", [{"text": "x"}] * 6, 3)
    with pytest.raises(PromptSetError, match="must be a list of texts"):
        conversations_from_rows("mtbench", [{"prompt": "one string"}], 3)
    with pytest.raises(PromptSetError, match="no rows"):
        conversations_from_rows("humaneval", [], 3)
    with pytest.raises(PromptSetError, match="unknown prompt set"):
        conversations_from_rows("mmlu", HUMANEVAL, 3)


def test_second_turn_history_and_the_thinking_setting_in_the_ids():
    conv = conversations_from_rows("mtbench", MTBENCH_H4, 1)[0]
    answer = "let me think</think>Autumn moon rises<|im_end|>"
    msgs = turn_messages(conv, 1, [answer])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2] == {"role": "assistant", "reasoning_content": "let me think", "content": "Autumn moon rises"}
    assert assistant_turn("no reasoning") == {"role": "assistant", "content": "no reasoning"}
    with pytest.raises(ValueError, match="needs 1 earlier answers"):
        turn_messages(conv, 1, [])
    tok = load_kimi_tokenizer()
    think, no_think = kimi_renderer(True, tok), kimi_renderer(False, tok)
    on = prompt_ids(conv, 1, [answer], think)
    off = prompt_ids(conv, 1, [answer], no_think)
    assert on[-1] == tok.special_id("<think>")
    assert off[-2:] == [tok.special_id("<think>"), tok.special_id("</think>")]
    text = tok.decode(on)
    assert text.startswith("<|im_system|>system<|im_middle|>You are a helpful") and "Autumn moon rises" in text
    assert "let me think" not in text  # the K2.5 template drops history reasoning
    (held,) = heldout_conversations([[1, 2, 3]])
    assert prompt_ids(held, 0, [], think) == [1, 2, 3]
