"""Every validation check passes on good data and fails, with examples, on the defect it guards against."""

from pathlib import Path

import numpy as np
import pytest

from eagle_assets.corpus import validation as v
from eagle_assets.corpus.tokenized_schema import EOT_ID, write_tokenized
from tests.corpus.synthetic import synthetic_tokenized_table

from .helpers import (
    ALLOWED,
    Recon,
    generated_row,
    good_generated,
    tok_row,
    tokenized_dataset,
    write_generated,
    write_rows,
)

SETTINGS = v.DuckDBSettings(memory_limit="256MB", threads=1, max_examples=3)


def _tok_glob(root: Path) -> str:
    return str(root / "tokenized" / "*" / "*.parquet")


def test_generated_suite_passes_on_good_data(tmp_path: Path) -> None:
    paths = good_generated(tmp_path, shards=3)
    outcomes = v.run_generated_checks(paths, ALLOWED, SETTINGS)
    assert [o.name for o in outcomes] == [
        "unique_prompt_ids",
        "allowed_providers",
        "nonempty_responses",
        "finish_reasons",
    ]
    assert all(o.passed for o in outcomes), [o.summary for o in outcomes if not o.passed]
    assert all(not o.failing_examples for o in outcomes)
    assert outcomes[0].metadata["rows"] == 18


def test_tokenized_suite_passes_on_good_data(tmp_path: Path) -> None:
    tokenized_dataset(tmp_path)
    outcomes = v.run_tokenized_checks(_tok_glob(tmp_path), ALLOWED, settings=SETTINGS)
    assert all(o.passed for o in outcomes), [(o.name, o.summary, o.failing_examples) for o in outcomes if not o.passed]
    meta = {o.name: o.metadata for o in outcomes}
    assert meta["end_of_turn"]["rows"] == 240
    assert meta["finish_reasons"]["unknown_rows"] == 0
    for value in (x for m in meta.values() for x in m.values()):
        assert isinstance(value, int | float | str)  # what Dagster metadata takes


def test_duplicate_within_partition(tmp_path: Path) -> None:
    p = write_generated(tmp_path / "B1" / "0.parquet", [generated_row(i) for i in ("a", "b", "a", "c")])
    o = v.check_unique_prompt_ids([p], SETTINGS)
    assert not o.passed
    assert o.metadata["duplicated_within_partition"] == 1 and o.metadata["duplicated_across_partitions"] == 0
    assert o.metadata["extra_copies"] == 1
    assert o.failing_examples == [{"prompt_id": "a", "copies": 2, "max_in_partition": 2, "files": [str(p)]}]


def test_duplicate_across_partitions(tmp_path: Path) -> None:
    p0 = write_rows(tmp_path / "B1" / "0.parquet", [tok_row("a"), tok_row("b")])
    p1 = write_rows(tmp_path / "B1" / "1.parquet", [tok_row("b"), tok_row("c")])
    assert v.check_unique_prompt_ids([p0], SETTINGS).passed
    o = v.check_unique_prompt_ids(str(tmp_path / "B1" / "*.parquet"), SETTINGS)
    assert not o.passed
    assert o.metadata["duplicated_across_partitions"] == 1 and o.metadata["duplicated_within_partition"] == 0
    assert o.failing_examples[0]["prompt_id"] == "b"
    assert o.failing_examples[0]["files"] == [str(p0), str(p1)]


def test_disallowed_provider(tmp_path: Path) -> None:
    rows = [
        tok_row("a"),
        tok_row("b", provider="cheap-quant"),
        tok_row("c", provider="groq"),
        tok_row("d", provider=None),
    ]
    p = write_rows(tmp_path / "t.parquet", rows)
    o = v.check_allowed_providers(p, ALLOWED, SETTINGS)
    assert not o.passed
    assert o.metadata["disallowed_rows"] == 2
    assert o.metadata["provider.groq"] == 1 and o.metadata["provider.cheap-quant"] == 1
    assert {e["prompt_id"]: e["provider"] for e in o.failing_examples} == {"b": "cheap-quant", "d": None}
    assert v.check_allowed_providers(p, [*ALLOWED, "cheap-quant", None], SETTINGS).passed is False  # null never allowed
    assert v.check_allowed_providers(write_rows(tmp_path / "u.parquet", rows[:1]), ALLOWED, SETTINGS).passed


@pytest.mark.parametrize(
    ("fields", "empty"),
    [
        ({"reasoning": None, "content": None, "tool_calls": None}, True),
        ({"reasoning": "", "content": "  \n", "tool_calls": "[]"}, True),
        ({"reasoning": None, "content": None, "tool_calls": '[{"id": "x", "function": {"name": "f"}}]'}, False),
        ({"reasoning": "thinking only", "content": None}, False),
        ({"reasoning": None, "content": "ok"}, False),
    ],
)
def test_empty_response(tmp_path: Path, fields: dict, empty: bool) -> None:
    p = write_generated(tmp_path / "g.parquet", [generated_row("good"), generated_row("x", **fields)])
    o = v.check_nonempty_responses(p, SETTINGS)
    assert o.passed is not empty
    assert o.metadata["empty_rows"] == int(empty)
    assert [e["prompt_id"] for e in o.failing_examples] == (["x"] if empty else [])


def test_unknown_finish_reason(tmp_path: Path) -> None:
    reasons = ["stop", "stop", "length", "tool_calls", "content_filter", "error", None]
    p = write_generated(
        tmp_path / "g.parquet", [generated_row(f"p{i}", finish_reason=r) for i, r in enumerate(reasons)]
    )
    o = v.check_finish_reasons(p, settings=SETTINGS)
    assert not o.passed
    assert o.metadata["finish_reason.stop"] == 2 and o.metadata["finish_reason.error"] == 1
    assert o.metadata["finish_reason.None"] == 1 and o.metadata["unknown_rows"] == 2
    assert {e["finish_reason"] for e in o.failing_examples} == {"error", None}


def _eot_case(name: str) -> dict:
    if name == "missing":  # finished, but the reconstruction dropped <|im_end|>
        return tok_row(name, "stop", recon=Recon(10, 20, ended=False))
    if name == "double":
        r = Recon(10, 20, ended=True)
        r.input_ids[15] = EOT_ID
        return tok_row(name, "tool_calls", recon=r)
    if name == "not_last":
        r = Recon(10, 20, ended=False)
        r.input_ids[15] = EOT_ID
        return tok_row(name, "stop", recon=r)
    if name == "cut_off_with_eot":
        return tok_row(name, "length", recon=Recon(10, 20, ended=True))
    if name == "stored_lies":
        return tok_row(name, "stop", eot_count=2)
    raise AssertionError(name)


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("missing", "missing_eot"),
        ("double", "extra_eot"),
        ("not_last", "eot_not_last"),
        ("cut_off_with_eot", "eot_in_cut_off_sample"),
        ("stored_lies", "stored_columns_disagree_with_ids"),
    ],
)
def test_end_of_turn_defects(tmp_path: Path, case: str, problem: str) -> None:
    good = [tok_row("s", "stop"), tok_row("t", "tool_calls"), tok_row("l", "length"), tok_row("c", "content_filter")]
    p = write_rows(tmp_path / "t.parquet", good)
    assert v.check_end_of_turn(p, settings=SETTINGS).passed
    p = write_rows(tmp_path / "t.parquet", [*good, _eot_case(case)])
    o = v.check_end_of_turn(p, settings=SETTINGS)
    assert not o.passed
    assert o.metadata["failing_rows"] == 1 and o.metadata[f"problem.{problem}"] == 1
    assert [(e["prompt_id"], e["problem"]) for e in o.failing_examples] == [(case, problem)]


def test_history_eot_in_prompt_is_not_counted(tmp_path: Path) -> None:
    r = Recon(10, 20, ended=True)
    assert r.input_ids[: r.prompt_len].count(EOT_ID) == 1
    row = tok_row("a", "stop", recon=r)
    assert row["eot_count"] == 1 and row["ends_with_eot"]
    assert v.check_end_of_turn(write_rows(tmp_path / "t.parquet", [row]), settings=SETTINGS).passed


def test_token_diff_bound(tmp_path: Path) -> None:
    rows = [tok_row(f"p{i}", recon=Recon(10, 1000, True, seed=i)) for i in range(10)]  # 10,000 api tokens
    rows[0] = tok_row("p0", recon=Recon(10, 1000, True), api_completion_tokens=1003)  # -3: 0.0003 ≤ 0.0004
    rows[1] = tok_row("p1", recon=Recon(10, 1000, True), api_completion_tokens=999)
    p = write_rows(tmp_path / "t.parquet", rows)
    o = v.check_token_diff(p, settings=SETTINGS)
    assert o.passed, o.summary
    assert o.metadata["sum_diff"] == -2 and o.metadata["max_abs_diff"] == 3
    assert o.metadata["mean_abs_diff"] == pytest.approx(0.4)
    assert not o.failing_examples
    rows[2] = tok_row("p2", recon=Recon(10, 1000, True), api_completion_tokens=1010)
    o = v.check_token_diff(write_rows(tmp_path / "t.parquet", rows), settings=SETTINGS)
    assert not o.passed
    assert o.metadata["relative_diff"] == pytest.approx(12 / 10_012)
    assert o.failing_examples[0] == {
        "prompt_id": "p2",
        "filename": str(tmp_path / "t.parquet"),
        "completion_len": 1000,
        "api_completion_tokens": 1010,
        "token_diff": -10,
    }
    assert v.check_token_diff(tmp_path / "t.parquet", bound=0.01, settings=SETTINGS).passed


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"n_tokens": 31}, "length_mismatch"),
        ({"prompt_len": 11}, "split_mismatch"),
        ({"loss_mask": [0] * 10 + [2] * 20}, "mask_not_binary"),
        ({"loss_mask": [1] * 30}, "mask_not_on_completion"),
        ({"loss_mask": [0] * 10 + [1] * 19 + [0]}, "mask_not_on_completion"),
        ({"token_diff": 5}, "token_diff_mismatch"),
    ],
)
def test_token_layout_defects(tmp_path: Path, overrides: dict, problem: str) -> None:
    p = write_rows(tmp_path / "t.parquet", [tok_row("good"), tok_row("bad", **overrides)])
    o = v.check_token_layout(p, SETTINGS)
    assert not o.passed
    assert [(e["prompt_id"], e["problem"]) for e in o.failing_examples] == [("bad", problem)]


def test_length_distribution_matches_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(200, 8000, 500)
    write_tokenized(tmp_path / "a.parquet", synthetic_tokenized_table(rng, 300, lengths=lengths[:300]))
    write_tokenized(tmp_path / "b.parquet", synthetic_tokenized_table(rng, 200, shard="1", lengths=lengths[300:]))
    o = v.length_distribution(str(tmp_path / "*.parquet"), SETTINGS)
    assert o.passed
    m = o.metadata
    assert (m["samples"], m["total_tokens"], m["min"], m["max"]) == (500, lengths.sum(), lengths.min(), lengths.max())
    for q in (50, 90, 99):
        assert m[f"p{q}"] == np.percentile(lengths, q, method="inverted_cdf")
    assert m["mean"] == pytest.approx(lengths.mean())


def test_many_failures_keep_examples_bounded(tmp_path: Path) -> None:
    rows = [tok_row(f"p{i:03d}", "stop", recon=Recon(5, 5, ended=False, seed=i)) for i in range(200)]
    o = v.check_end_of_turn(write_rows(tmp_path / "t.parquet", rows), settings=SETTINGS)
    assert o.metadata["problem.missing_eot"] == 200
    assert [e["prompt_id"] for e in o.failing_examples] == ["p000", "p001", "p002"]


def test_database_file_and_limits_are_applied(tmp_path: Path) -> None:
    settings = v.DuckDBSettings(database=tmp_path / "checks.duckdb", memory_limit="128MB", threads=1)
    with v.duckdb_connection(settings) as con:
        limit, threads = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
    assert limit.startswith("122") and threads == 1  # 128 MB shown in MiB
    assert (tmp_path / "checks.duckdb").exists()
    paths = tokenized_dataset(tmp_path, datasets=("B1",), shards=1, n=10)
    assert v.check_token_layout(paths, settings).passed


def test_no_files_is_an_error_not_a_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        v.check_unique_prompt_ids([], SETTINGS)
    with pytest.raises(Exception, match="No files found"):
        v.check_unique_prompt_ids(str(tmp_path / "*.parquet"), SETTINGS)
