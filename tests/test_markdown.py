"""The one Markdown-table helper: what Dagster's UI shows as a table, escaped by one rule."""

import pytest

from eagle_assets.markdown import cell, table


def test_a_table_is_header_rule_and_rows_in_the_projects_form():
    assert table(("name", "count"), [("a", 1), ("b", 2)]) == "| name | count |\n|---|---|\n| a | 1 |\n| b | 2 |"


def test_a_pipe_in_a_cell_is_escaped_so_it_stays_one_column():
    text = table(["provider"], [["A|B"]])
    assert text.splitlines()[2] == "| A\\|B |"
    assert cell("a|b|c") == "a\\|b\\|c"


@pytest.mark.parametrize("value", ["first line\nsecond", "first line\r\nsecond", "first line\rsecond"])
def test_a_line_break_in_a_cell_does_not_end_the_row(value):
    text = table(["prompt"], [[value]])
    assert text.splitlines() == ["| prompt |", "|---|", "| first line second |"]


def test_headers_are_escaped_too_and_cells_may_be_any_value():
    assert table(["a|b", 3], [[None, 1.5]]).splitlines() == ["| a\\|b | 3 |", "|---|---|", "| None | 1.5 |"]


def test_no_rows_is_the_header_alone_and_empty_cells_stay_cells():
    assert table(["a", "b"], []) == "| a | b |\n|---|---|"
    assert table(["a", "b", "c"], [["**total**", "", "x"], ["y"]]).splitlines()[2:] == [
        "| **total** | | x |",
        "| y | | |",  # a short row is padded with empty cells
    ]


def test_a_row_longer_than_the_header_is_refused():
    with pytest.raises(ValueError, match="a row of 3 cells under a header of 2"):
        table(["a", "b"], [[1, 2, 3]])
