"""The whole-set scan before anything is spent: bad rows by reason with file and line, the bad-row share
that refuses a set, repeated ids across shards, and shards read in the shuffled asking order."""

import orjson
import pytest

from eagle_assets.datasets.dataset_scan import DatasetQualityError, check_quality, load_or_scan, scan_dataset
from eagle_assets.datasets.formats import detect_format
from eagle_assets.datasets.regeneration import RegenerationModeError
from eagle_assets.datasets.sampling import RowOrder
from eagle_assets.datasets.shard_reader import read_shard
from eagle_assets.datasets.sources import SourceSpec, resolve_source
from eagle_assets.errors import EagleForgeError
from tests.datasets.prompt_files import load_prompts


def good(i):
    return {
        "id": f"g{i}",
        "conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "a"}],
    }


BAD_LINES = [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "not_an_object"),
    (orjson.dumps({"id": "b1", "conversations": []}), "empty"),
    (orjson.dumps({"id": "b2", "conversations": [{"from": "alien", "value": "x"}]}), "unknown_role"),
    (orjson.dumps({"id": "b3", "conversations": [{"from": "gpt", "value": "answer only"}]}), "no_user_turn"),
    (orjson.dumps({"id": "b4"}), "missing_field"),
    (orjson.dumps({"id": "b5", "conversations": "text"}), "bad_field"),
    (orjson.dumps({"id": "b6", "conversations": [{"from": "human", "value": 7}]}), "bad_field"),
    (orjson.dumps({"id": "b7", "conversations": [{"from": "human", "value": "q"}], "tools": "{oops"}), "bad_tools"),
    (orjson.dumps({"id": "g3", "conversations": [{"from": "human", "value": "dup"}]}), "duplicate_id"),
]


def held_out_file(tmp_path):
    """20 good rows (the first behind a byte-order mark), a 3 MB prompt, and 10 bad rows, interleaved."""
    lines = [orjson.dumps(good(i)) for i in range(20)]
    huge = {"id": "huge", "conversations": [{"from": "human", "value": "word " * 600_000}]}
    lines.insert(7, orjson.dumps(huge))
    bad_at = {}
    for k, (line, _) in enumerate(BAD_LINES):
        pos = 2 + 3 * k
        lines.insert(pos, line)
    for lineno, line in enumerate(lines, start=1):
        for bad, reason in BAD_LINES:
            if line == bad:
                bad_at[lineno] = reason
    path = tmp_path / "held_out.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    return path, bad_at


def test_held_out_file_keeps_every_good_row_and_reports_the_bad_with_file_and_line(tmp_path):
    path, bad_at = held_out_file(tmp_path)
    source = resolve_source(SourceSpec.parse(str(path)))
    fmt = detect_format(*source.columns())
    summary = scan_dataset(source, fmt, "every_turn")
    assert summary.rows == 31 and summary.usable == 21  # 20 good + the 3 MB prompt (refused later, by length)
    assert summary.rejected == {
        "invalid_json": 1,
        "not_an_object": 1,
        "empty": 1,
        "unknown_role": 1,
        "no_user_turn": 1,
        "missing_field": 1,
        "bad_field": 2,
        "bad_tools": 1,
    }
    lines_reported = {int(e.split(":")[1]) for e in summary.examples if e.startswith(str(path))}
    assert lines_reported == {ln for ln, r in bad_at.items() if r != "duplicate_id"}
    # The repeated id is counted apart: not a bad row, asked once, and shown with its place and id.
    (dup_line,) = [ln for ln, r in bad_at.items() if r == "duplicate_id"]
    assert len(summary.duplicates) == 1 and summary.bad == 9
    assert summary.duplicate_example == f"{path}:{dup_line}, id 'g3'"
    # The default share (5%) refuses this set before anything is spent, saying why and where.
    with pytest.raises(DatasetQualityError) as exc:
        check_quality(summary, 0.05, "H1")
    text = str(exc.value)
    assert "9 of 31 rows (29.0%)" in text and "nothing was sent" in text and "bad_field 2" in text
    assert "1 rows repeat an earlier row's id, asked once" in text
    assert f"{path}:{min(lines_reported)}" in text
    check_quality(summary, 0.5, "H1")  # a looser share lets the usable rows through
    # Read as shards: every good row once, the repeated id dropped wherever its shard falls, bad rows reported.
    order = RowOrder(summary.rows, seed=0)
    kept, problems = [], []
    for shard in range(4):
        contents = read_shard(source, fmt, order, shard, 8, "every_turn", None, frozenset(summary.duplicates))
        kept += [c.conversation_id for c in contents.conversations]
        problems += contents.problems
    assert sorted(kept) == sorted([f"g{i}" for i in range(20)] + ["huge"])
    assert {p.line for p in problems} == set(bad_at)
    assert all(str(p).startswith(f"{path}:{p.line}: ") for p in problems)


def test_the_scan_is_cached_by_source_and_reading(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(orjson.dumps(good(i)) + b"\n" for i in range(5)))
    source = resolve_source(SourceSpec.parse(str(path)))
    fmt = detect_format(*source.columns())
    first, cached = load_or_scan(tmp_path / "cache", "S", source, fmt, "last_user")
    assert not cached and first.usable == 5
    again, cached = load_or_scan(tmp_path / "cache", "S", source, fmt, "last_user")
    assert cached and again == first
    _, cached = load_or_scan(tmp_path / "cache", "S", source, fmt, "every_turn")
    assert not cached  # another mode reads rows differently
    with path.open("ab") as f:
        f.write(b"{broken\n")
    changed, cached = load_or_scan(
        tmp_path / "cache", "S", resolve_source(SourceSpec.parse(str(path))), fmt, "last_user"
    )
    assert not cached and changed.rows == 6 and changed.rejected == {"invalid_json": 1}


def test_an_empty_or_wholly_unusable_set_fails(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"\n\n")
    source = resolve_source(SourceSpec.parse(str(path)))
    fmt = detect_format(["prompt"], None)
    with pytest.raises(DatasetQualityError, match="holds no rows"):
        check_quality(scan_dataset(source, fmt, "last_user"), 0.05, "E")
    path.write_bytes(b'{"prompt": 5}\n')
    with pytest.raises(DatasetQualityError, match="1 of 1 rows"):
        check_quality(scan_dataset(resolve_source(SourceSpec.parse(str(path))), fmt, "last_user"), 1.0, "E")


def test_repeated_conversations_are_asked_once_and_are_not_bad_rows(tmp_path):
    """A set where 1 row in 5 repeats an earlier conversation (no ids: the content hash) is smaller, not broken:
    it passes the 5% bad-row share, each repeat is counted and shown, and its turns are not requests."""
    rows = [
        {"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}] * (1 + i % 2)}
        for i in range(16)
    ]
    repeats_of = [0, 1, 2, 3]  # one two-turn and one one-turn conversation each, alternately
    lines = [orjson.dumps(r) for r in rows] + [orjson.dumps(rows[i]) for i in repeats_of]
    path = tmp_path / "repeats.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = resolve_source(SourceSpec.parse(str(path)))
    fmt = detect_format(*source.columns())
    summary = scan_dataset(source, fmt, "every_turn")
    assert summary.rows == 20 and summary.usable == 16 and summary.bad == 0 and summary.rejected == {}
    assert summary.duplicates == [16, 17, 18, 19]
    assert summary.turns == {1: 8, 2: 8} and summary.requests == 24  # the 16 distinct conversations' turns
    assert summary.duplicates_text().startswith("4 rows repeat an earlier row's id, asked once (first:")
    assert f"{path}:17, id " in summary.duplicate_example
    check_quality(summary, 0.05, "R")  # 20% repeats: not a refusal
    contents = read_shard(source, fmt, RowOrder(20, seed=0), 0, 20, "every_turn", None, frozenset(summary.duplicates))
    assert len(contents.conversations) == 16 and contents.rejected() == {"duplicate_id": 4}


def test_an_every_turn_conversation_refuses_a_single_prompt_with_a_named_error(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(orjson.dumps(good(0)) + b"\n")
    with pytest.raises(RegenerationModeError, match="an every_turn conversation has no single prompt"):
        load_prompts(path, mode="every_turn")
    assert issubclass(RegenerationModeError, EagleForgeError)
