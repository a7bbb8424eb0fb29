"""every_turn through the real runner and the simulator: each turn one request and one sample, asked only
after the previous turn returned, with the target's own answers as history; resumed from the journal;
prompt ids of every turn equal to the serving path's; prompts too long for the context refused unsent."""

import pytest

from eagle_assets.corpus.tokenize_partition import tokenize_generated
from eagle_assets.datasets.file_readers import RawRow
from eagle_assets.datasets.formats import detect_format
from eagle_assets.datasets.prompts import Conversation, conversation_of
from eagle_assets.datasets.regeneration import turn_request
from eagle_assets.generation.journal import scan
from eagle_assets.generation.partition_output import write_partition_parquet
from eagle_assets.generation.turn_chains import TurnChains, split_turn_id
from eagle_assets.tokenization.chat_encoding import render_kimi_chat
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.simulator.config import DEFAULT_PROVIDERS

SHAREGPT = detect_format(["id", "conversations", "system"], None, "sharegpt")


def conversations(n: int, turns: int = 3, tag: str = "c") -> list[Conversation]:
    out = []
    for i in range(n):
        row = {"id": f"{tag}{i:03d}", "system": "Answer briefly." if i % 2 else None, "conversations": []}
        for k in range(turns):
            row["conversations"] += [
                {"from": "human", "value": f"Conversation {tag}{i} question {k + 1}: tell me about item {i + k}."},
                {"from": "gpt", "value": f"the set's own answer {k + 1} (dropped)"},
            ]
        out.append(conversation_of(RawRow("set.jsonl", i + 1, i, row), SHAREGPT, "every_turn"))
    return out


def record(pid: str, finish: str = "stop", content: str = "ok") -> dict:
    return {"prompt_id": pid, "status": "ok", "content": content, "reasoning": "r", "finish_reason": finish}


def test_chains_advance_resume_and_stop_from_journaled_records():
    convs = conversations(3, turns=5)
    chains = TurnChains(convs)
    assert chains.total == 15 and len(chains) == 3
    # A crash left: c000 at turn 3 of 5 (turns 1-2 journaled), c001 finished, c002 cut at turn 2.
    journal = {
        "c000#t1": record("c000#t1", content="A1"),
        "c000#t2": record("c000#t2", content="A2"),
        **{f"c001#t{k}": record(f"c001#t{k}") for k in range(1, 6)},
        "c002#t1": record("c002#t1"),
        "c002#t2": record("c002#t2", finish="length"),
    }
    ready, owed = chains.resume(journal)
    assert [p.prompt_id for p in ready] == ["c000#t3"]
    assert ready[0].messages == turn_request(convs[0].turns, [journal["c000#t1"], journal["c000#t2"]])
    assert [m["content"] for m in ready[0].messages if m["role"] == "assistant"] == ["A1", "A2"]
    assert [r["prompt_id"] for r in owed] == ["c002#t3", "c002#t4", "c002#t5"]
    assert {r["error_class"] for r in owed} == {"previous_turn_cut"} and all(r["status"] == "skipped" for r in owed)
    assert chains.done_count(journal) == 9 and chains.running == 1
    nxt, more = chains.on_committed(record("c000#t3"))
    assert nxt is not None and nxt.prompt_id == "c000#t4" and not more
    assert chains.on_committed(record("c000#t3")) == (None, [])  # a repeat changes nothing
    chains.attempt_finished("c000#t4")  # retries exhausted: no record will come
    assert chains.open == 1 and chains.reap() == 1 and chains.open == 0
    assert chains.turns_after_dead() == 1  # turn 5 waits behind the failed turn 4
    assert split_turn_id("a#b#t12") == ("a#b", 11) and split_turn_id("plain") is None


def serving_ids(tok, rec):
    # The serving stack's path: the rendered prompt encoded with every special allowed.
    text = render_kimi_chat(tok.chat_template, rec["messages"], rec.get("tools"), add_generation_prompt=True)
    return tok.encode_with_special(text)


def test_every_turn_through_the_simulator_then_resumes_buying_nothing_twice(harness):
    convs = conversations(12, turns=3)
    report = harness.run([], chains=TurnChains(convs), max_in_flight=16, max_tokens=4096)
    assert report.total == 36 and report.complete and report.stop_reason == "completed", report.summary()
    result = scan(harness.journal())
    recs = result.records
    assert len(recs) == 36 == len({r["prompt_id"] for r in recs}) and report.requests == 36
    position = {r["prompt_id"]: i for i, r in enumerate(recs)}
    by_id = {r["prompt_id"]: r for r in recs}
    for conv in convs:
        cid = conv.conversation_id
        answers = []
        for k in range(3):
            rec = by_id[f"{cid}#t{k + 1}"]
            if k:
                assert position[f"{cid}#t{k}"] < position[rec["prompt_id"]]  # asked only once the previous returned
            assert rec["messages"] == turn_request(conv.turns, answers)  # exactly what was sent, own answers in it
            answers.append(rec)
        history = [m for m in by_id[f"{cid}#t3"]["messages"] if m["role"] == "assistant"]
        assert [m["content"] for m in history] == [by_id[f"{cid}#t{k}"]["content"] for k in (1, 2)]
        assert all("dropped" not in m["content"] for m in history)
        assert all(
            m.get("reasoning_content") == by_id[f"{cid}#t{k}"]["reasoning"]
            for k, m in zip((1, 2), history, strict=True)
        )
    stats = harness.sim.stats(0)
    assert stats["hashes_billed_more_than_once"] == [] and stats["requests_received"] == 36
    # Every turn's prompt ids, as the tokenized partition rebuilds them, are the serving path's (transformers'
    # apply_chat_template over the Kimi tokenizer) and what the simulator billed as usage.prompt_tokens.
    parquet = harness.tmp / "gen.parquet"
    assert write_partition_parquet(harness.journal(), parquet) == 36
    tok = load_kimi_tokenizer(resolve_tokenizer_dir())
    rows, summary = tokenize_generated(parquet, "T1", "0000", tok)
    assert summary.samples == 36 and summary.prompt_nonzero_diffs == 0
    for row in rows:
        rec = by_id[row["prompt_id"]]
        prompt_len = row["n_tokens"] - row["completion_len"]
        assert row["input_ids"][:prompt_len] == serving_ids(tok, rec)
        assert prompt_len == rec["prompt_tokens"]
    # Rerun: everything is journaled, nothing is asked again.
    again = harness.run([], chains=TurnChains(convs))
    assert again.already_done == 36 and again.requests == 0 and harness.sim.stats(0)["requests_received"] == 36


def test_a_cut_off_turn_ends_its_chain_and_the_rest_is_marked(harness):
    convs = conversations(4, turns=3, tag="cut")
    report = harness.run([], chains=TurnChains(convs), max_tokens=8)  # every answer stops at max_tokens
    assert report.complete and report.stop_reason == "completed"
    recs = {r["prompt_id"]: r for r in harness.records()}
    assert {pid for pid, r in recs.items() if r["status"] == "ok"} == {f"{c.conversation_id}#t1" for c in convs}
    later = [r for pid, r in recs.items() if not pid.endswith("#t1")]
    assert len(later) == 8 and {r["error_class"] for r in later} == {"previous_turn_cut"}
    assert harness.sim.stats(0)["requests_received"] == 4


SMALL_CONTEXT = tuple(type(p)(**{**p.__dict__, "context_length": 2048}) for p in DEFAULT_PROVIDERS)


@pytest.mark.sim(providers=SMALL_CONTEXT)
def test_a_prompt_longer_than_the_context_is_refused_before_it_is_sent(harness):
    convs = conversations(3, turns=2, tag="ctx")
    long_row = {"id": "huge", "conversations": [{"from": "human", "value": "word " * 5000}]}
    convs.append(conversation_of(RawRow("set.jsonl", 9, 9, long_row), SHAREGPT, "every_turn"))
    report = harness.run([], chains=TurnChains(convs), max_tokens=256)
    recs = {r["prompt_id"]: r for r in harness.records()}
    assert recs["huge#t1"]["status"] == "skipped" and recs["huge#t1"]["error_class"] == "prompt_too_long"
    assert "exceeds the context (2,048)" in recs["huge#t1"]["message"]
    assert report.errors["prompt_too_long"] == 1 and report.complete
    assert harness.sim.stats(0)["requests_received"] == 6  # the long prompt never went out


def test_the_token_target_counts_every_turn_and_the_rest_resumes(harness):
    convs = conversations(10, turns=4, tag="tok")
    first = harness.run([], chains=TurnChains(convs), max_tokens=400, token_budget=2000, max_in_flight=8)
    assert first.stop_reason == "tokens" and 0 < first.done < 40, first.summary()
    done = harness.records()
    assert first.output_tokens == sum(r["completion_tokens"] for r in done if r["status"] == "ok")
    assert harness.ledger_totals().tokens_spent == first.output_tokens  # each turn reserved and settled alone
    assert any(r["prompt_id"].endswith("#t2") for r in done)  # later turns count against the target too
    rest = harness.run([], chains=TurnChains(convs), max_tokens=400, max_in_flight=8)
    assert rest.complete and rest.already_done == first.done
    ids = [r["prompt_id"] for r in harness.records()]
    assert len(ids) == len(set(ids)) == 40
    assert harness.sim.stats(0)["hashes_billed_more_than_once"] == []
