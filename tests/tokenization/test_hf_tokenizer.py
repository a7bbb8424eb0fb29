import pytest
from hypothesis import given, settings
from transformers import PreTrainedTokenizer
from transformers.tokenization_python import PythonBackend

from eagle_assets.tokenization.chat_encoding import encode_chat, render_kimi_chat
from eagle_assets.tokenization.chat_template import render_chat
from eagle_assets.tokenization.hf_tokenizer import KimiHFTokenizer, load_hf_tokenizer
from tests.tokenization.strategies import prompts, texts, tool_lists

KNOWN = "Hello, world! 你好，世界！"
KNOWN_IDS = [19180, 11, 2695, 0, 220, 33845, 378, 2243, 856]


@pytest.fixture(scope="module")
def hf(tok) -> KimiHFTokenizer:
    return load_hf_tokenizer(tok.directory)


def test_basics(hf):
    assert isinstance(hf, PreTrainedTokenizer)
    assert hf.encode(KNOWN) == KNOWN_IDS and hf(KNOWN)["input_ids"] == KNOWN_IDS
    assert hf.decode(KNOWN_IDS) == KNOWN
    assert hf.vocab_size == len(hf) == len(hf.get_vocab()) == 163_840
    assert hf.convert_tokens_to_ids(["<|im_end|>", "</think>", "[PAD]", "Hello"]) == [163586, 163607, 163839, 19180]
    assert hf.convert_ids_to_tokens(KNOWN_IDS[:3]) == ["Hello", ",", "Ġworld"]
    assert hf.convert_tokens_to_string(hf.convert_ids_to_tokens(KNOWN_IDS)) == KNOWN
    assert (hf.eos_token, hf.eos_token_id, hf.pad_token, hf.pad_token_id) == ("[EOS]", 163585, "[PAD]", 163839)
    assert hf.convert_tokens_to_ids("<|reserved_token_163700|>") == 163700


def test_specials_in_plain_encode_follow_hf(hf, tok):
    text = "a<|im_end|>b"
    assert hf.encode(text) == tok.encode_with_special(text)
    assert hf.encode(text, split_special_tokens=True) == tok.encode_ordinary(text)
    assert hf.decode(hf.encode(text), skip_special_tokens=True) == "ab"


@settings(max_examples=80, deadline=None)
@given(text=texts(specials=True))
def test_tokenize_matches_hf_trie_split(hf, text):
    # HF's own slow path (trie split on added tokens, then _tokenize) must give the same tokens.
    assert hf.tokenize(text) == PythonBackend.tokenize(hf, text)
    assert hf.decode(hf.encode(text)) == text


@settings(max_examples=60, deadline=None)
@given(messages=prompts(specials=True))
def test_apply_chat_template(hf, tok, messages):
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # tokenize=False is the base class's HF rendering exactly.
    assert text == PreTrainedTokenizer.apply_chat_template(hf, messages, tokenize=False, add_generation_prompt=True)
    assert text == render_chat(tok.chat_template, messages, add_generation_prompt=True)
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == encode_chat(tok, messages, add_generation_prompt=True)
    # Without tools (and short texts) that is the serving path: the rendered text with every special allowed.
    assert ids == tok.encode_with_special(text)
    out = hf.apply_chat_template(messages, add_generation_prompt=True)
    assert out["input_ids"] == ids and out["attention_mask"] == [1] * len(ids)
    for kwargs in ({"data_specials": "ordinary"}, {"sanitize_control_tokens": True}):
        kept = hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **kwargs)
        assert kept == encode_chat(tok, messages, add_generation_prompt=True, data_specials="ordinary")


@settings(max_examples=40, deadline=None)
@given(messages=prompts(), tools=tool_lists())
def test_apply_chat_template_declares_tools_like_the_release(hf, tok, messages, tools):
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text == render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=True)
    ids = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False)
    assert ids == encode_chat(tok, messages, tools, add_generation_prompt=True)
    # HF's own path (used for continue_final_message) gets the same declaration.
    hf_text = hf.apply_chat_template(
        [*messages, {"role": "assistant", "content": "x"}], tools=tools, tokenize=False, continue_final_message=True
    )
    assert hf_text.startswith(text[: text.index("<|im_end|>")])


def test_apply_chat_template_batch_and_tensors(hf):
    a = [{"role": "user", "content": "hi"}]
    b = [{"role": "user", "content": "a longer message"}]
    out = hf.apply_chat_template([a, b], add_generation_prompt=True, return_tensors="pt")
    assert out["input_ids"].shape[0] == 2 and out["attention_mask"].sum(1).tolist() == [
        len(hf.apply_chat_template(a, add_generation_prompt=True, return_dict=False)),
        len(hf.apply_chat_template(b, add_generation_prompt=True, return_dict=False)),
    ]
    assert hf.apply_chat_template([a, b], tokenize=False) == [hf.apply_chat_template(c, tokenize=False) for c in (a, b)]
    n = len(hf.apply_chat_template(a, add_generation_prompt=True, return_dict=False))
    # Shapes as HF returns them for a single chat.
    assert hf.apply_chat_template(a, add_generation_prompt=True, return_tensors="pt")["input_ids"].shape == (1, n)
    assert hf.apply_chat_template(a, add_generation_prompt=True, return_tensors="pt", return_dict=False).shape == (1, n)
    padded = hf.apply_chat_template(a, add_generation_prompt=True, padding="max_length", max_length=n + 3)
    assert padded["input_ids"][-3:] == [hf.pad_token_id] * 3 and padded["attention_mask"] == [1] * n + [0] * 3


def test_save_and_reload(hf, tmp_path):
    hf.save_pretrained(tmp_path)
    again = KimiHFTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert again.encode(KNOWN) == KNOWN_IDS and again.chat_template == hf.chat_template
    assert again.eos_token == hf.eos_token
