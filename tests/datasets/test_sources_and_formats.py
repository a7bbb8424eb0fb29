"""Local prompt sources in every file type and every conversation format, read lazily into conversations.

Fixture files are written here, in the shapes the published sets use (ShareGPT from/value with
function calls, UltraChat's alternating ``data``, Alpaca, plain prompts, OpenAI ``messages``)."""

import gzip
import io

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from eagle_assets.datasets.file_readers import PromptFileError
from eagle_assets.datasets.formats import FormatError, RowError, detect_format, read_row
from eagle_assets.datasets.prompts import content_prompt_id, conversation_of
from eagle_assets.datasets.sources import SourceSpec, resolve_source
from tests.datasets.prompt_files import load_prompts

SHAREGPT = {
    "id": "sg-1",
    "system": "Be brief.",
    "tools": '[{"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}]',
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
        {"from": "observation", "value": '{"temp": 21}'},
        {"from": "gpt", "value": "21 degrees."},
        {"from": "human", "value": "And tomorrow?"},
        {"from": "gpt", "value": "No idea."},
    ],
}
ROWS_BY_FORMAT = {
    "openai": {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    },
    "sharegpt": SHAREGPT,
    "conversations": {"conversations": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},
    "ultrachat": {"id": "u-7", "data": ["first question", "first answer", "second question", "second answer"]},
    "alpaca": {"instruction": "Translate to French", "input": "cheese", "output": "fromage"},
    "prompt": {"prompt": "Write a haiku about tests."},
}


def columns_of(row):
    return list(row), row


def test_each_format_is_detected_from_its_columns_and_read_into_messages():
    for name, row in ROWS_BY_FORMAT.items():
        fmt = detect_format(*columns_of(row))
        assert fmt.name == name, (name, fmt)
        read = read_row(row, fmt)
        assert read.messages and any(m["role"] == "user" for m in read.messages)
    sg = read_row(SHAREGPT, detect_format(*columns_of(SHAREGPT)))
    assert [m["role"] for m in sg.messages] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    call = sg.messages[2]["tool_calls"][0]
    assert call["id"] == "functions.get_weather:0" and orjson.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert sg.messages[3] == {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "functions.get_weather:0"}
    assert sg.tools == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}},
        }
    ]
    assert sg.given_id == "sg-1"
    uc = read_row(ROWS_BY_FORMAT["ultrachat"], detect_format(*columns_of(ROWS_BY_FORMAT["ultrachat"])))
    assert [m["role"] for m in uc.messages] == ["user", "assistant", "user", "assistant"] and uc.given_id == "u-7"
    alp = read_row(ROWS_BY_FORMAT["alpaca"], detect_format(*columns_of(ROWS_BY_FORMAT["alpaca"])))
    assert alp.messages == [{"role": "user", "content": "Translate to French\n\ncheese"}]  # the output is ignored


def test_column_mapping_forced_format_and_unknown_formats_name_the_columns():
    row = {"question": "What is 2+2?", "task_id": "gsm-3", "answer": "4"}
    with pytest.raises(FormatError, match=r"columns \['answer', 'question', 'task_id'\]"):
        detect_format(*columns_of(row))
    fmt = detect_format(*columns_of(row), name="prompt", mapping={"prompt": "question", "id": "task_id"})
    read = read_row(row, fmt)
    assert read.messages == [{"role": "user", "content": "What is 2+2?"}] and read.given_id == "gsm-3"
    with pytest.raises(FormatError, match="needs a 'messages' column"):
        detect_format(*columns_of(row), name="openai")
    with pytest.raises(FormatError, match="unknown format 'csv'"):
        detect_format(*columns_of(row), name="csv")
    # MT-Bench style: a list of user turns in one prompt column.
    mt = {"prompt": ["Write a poem.", "Now make it rhyme."], "prompt_id": 81}
    read = read_row(mt, detect_format(*columns_of(mt)))
    assert [m["content"] for m in read.messages] == ["Write a poem.", "Now make it rhyme."] and read.given_id == "81"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"conversations": [{"from": "alien", "value": "x"}]}, "unknown_role"),
        ({"conversations": []}, "empty"),
        ({"conversations": "nope"}, "bad_field"),
        ({"conversations": [{"from": "gpt", "value": "only an answer"}]}, "no_user_turn"),
        ({"conversations": [{"from": "human", "value": 5}]}, "bad_field"),
        ({"conversations": [{"from": "function_call", "value": "not json"}]}, "bad_message"),
    ],
)
def test_bad_sharegpt_rows_raise_with_a_reason(row, reason):
    fmt = detect_format(["conversations"], None, "sharegpt")
    with pytest.raises(RowError) as exc:
        read_row(row, fmt)
    assert exc.value.reason == reason


def sharegpt_rows(n, tag="c"):
    return [
        {
            "id": f"{tag}{i}",
            "conversations": [
                {"from": "human", "value": f"question {i}"},
                {"from": "gpt", "value": f"answer {i}"},
                {"from": "human", "value": f"follow-up {i}"},
                {"from": "gpt", "value": "done"},
            ],
        }
        for i in range(n)
    ]


def jsonl_bytes(rows, bom=False):
    return (b"\xef\xbb\xbf" if bom else b"") + b"".join(orjson.dumps(r) + b"\n" for r in rows)


def parquet_bytes(rows, row_group_size=4):
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=row_group_size)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "folder"])
def test_every_file_type_reads_the_same_rows_lazily(tmp_path, kind):
    rows = sharegpt_rows(10)
    if kind == "folder":
        path = tmp_path / "shards"
        path.mkdir()
        (path / "part-00000.parquet").write_bytes(parquet_bytes(rows[:6]))
        (path / "part-00001.parquet").write_bytes(parquet_bytes(rows[6:]))
        (path / ".hidden.parquet").write_bytes(b"junk")  # editors' and tools' dot files are not data
    else:
        path = tmp_path / f"set.{kind}"
        data = parquet_bytes(rows) if kind == "parquet" else jsonl_bytes(rows, bom=True)
        if kind.endswith(".gz"):
            data = gzip.compress(data)
        elif kind.endswith(".zst"):
            data = zstandard.ZstdCompressor().compress(data)
        path.write_bytes(data)
    source = resolve_source(SourceSpec.parse(str(path)))
    assert source.count_rows() == 10
    picked = list(source.iter_rows(wanted={2, 7}))
    assert [r.index for r in picked] == [2, 7] and [r.value["id"] for r in picked] == ["c2", "c7"]
    if kind == "folder":
        assert picked[1].file.endswith("part-00001.parquet") and picked[1].line == 2  # row 2 of the second shard
    prompts, problems = load_prompts(path)
    assert not problems and [p.prompt_id for p in prompts] == [f"c{i}" for i in range(10)]
    # last_user: the set's last answer is regenerated, so the request ends at the follow-up.
    assert prompts[0].messages[-1] == {"role": "user", "content": "follow-up 0"} and len(prompts[0].messages) == 3


def test_a_byte_order_mark_keeps_the_first_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(jsonl_bytes(sharegpt_rows(3), bom=True))
    prompts, problems = load_prompts(path)
    assert len(prompts) == 3 and not problems


def test_unreadable_sources_fail_as_a_whole_with_the_path(tmp_path):
    with pytest.raises(PromptFileError, match="prompt file not found"):
        resolve_source(SourceSpec.parse(str(tmp_path / "gone.jsonl")))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(PromptFileError, match="unsupported file type"):
        resolve_source(SourceSpec.parse(str(tmp_path / "x.csv")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PromptFileError, match="holds no data files"):
        resolve_source(SourceSpec.parse(str(tmp_path / "empty")))
    broken = tmp_path / "broken.jsonl.zst"
    broken.write_bytes(b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(PromptFileError, match="cannot be decompressed"):
        resolve_source(SourceSpec.parse(str(broken))).count_rows()
    array = tmp_path / "array.json"
    array.write_text('[{"prompt": "a"},\n {"prompt": "b"}\n {"prompt": "c"}]\n')  # a comma missing on line 2
    with pytest.raises(PromptFileError, match=r"JSON array is broken at line 3: expected ',' or '\]'"):
        resolve_source(SourceSpec.parse(str(array))).count_rows()
    with pytest.raises(PromptFileError, match="apply to Hub datasets"):
        SourceSpec.parse(str(tmp_path / "a.jsonl"), split="train")


def test_prompt_ids_are_given_or_a_stable_content_hash(tmp_path):
    rows = [{"prompt": "same text"}, {"prompt": "other text"}, {"prompt": "x", "id": ""}]
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl_bytes(rows))
    source = resolve_source(SourceSpec.parse(str(path)))
    fmt = detect_format(*source.columns())
    convs = [conversation_of(r, fmt) for r in source.iter_rows()]
    assert convs[0].conversation_id == content_prompt_id([{"role": "user", "content": "same text"}], None)
    assert convs[2].conversation_id == content_prompt_id([{"role": "user", "content": "x"}], None)  # blank id: hash
    again = [conversation_of(r, fmt) for r in resolve_source(SourceSpec.parse(str(path))).iter_rows()]
    assert [c.conversation_id for c in again] == [c.conversation_id for c in convs]


def test_the_format_is_decided_by_the_first_rows_with_turns_not_the_first_row(tmp_path):
    """A role/content ``conversations`` set whose first row is an empty list is still read as role/content
    (one empty row, the rest kept), not as ShareGPT with every row refused."""
    rows = [{"id": "e", "conversations": []}] + [
        {"id": f"r{i}", "conversations": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(6)
    ]
    path = tmp_path / "rc.jsonl"
    path.write_bytes(jsonl_bytes(rows))
    source = resolve_source(SourceSpec.parse(str(path)))
    assert detect_format(*source.columns()).name == "conversations"
    prompts, problems = load_prompts(path)
    assert [p.prompt_id for p in prompts] == [f"r{i}" for i in range(6)]
    assert [(p.line, p.reason) for p in problems] == [(1, "empty")]
    # A lone odd row among ShareGPT ones does not flip the set either: the first rows with turns vote.
    odd = {"id": "x", "conversations": [{"role": "user", "content": "q"}]}
    path.write_bytes(jsonl_bytes([odd, *sharegpt_rows(4)]))
    assert detect_format(*resolve_source(SourceSpec.parse(str(path))).columns()).name == "sharegpt"


def test_a_source_without_objects_in_its_first_rows_says_what_it_holds(tmp_path):
    csv = tmp_path / "csvlike.jsonl"
    csv.write_text("id,prompt\n" + "".join(f"{i},question {i}\n" for i in range(60)))
    with pytest.raises(PromptFileError) as exc:
        resolve_source(SourceSpec.parse(str(csv))).columns()
    text = str(exc.value)
    assert "no JSON object among the first 50 rows" in text and "they hold 50 invalid JSON" in text
    assert f"First: {csv}:1: invalid JSON" in text
    arrays = tmp_path / "arrays.jsonl"
    arrays.write_text('["a", "b"]\n["c"]\n7\n')
    with pytest.raises(PromptFileError, match=r"they hold 2 a JSON list, 1 a JSON int\. First: .*arrays.jsonl:1: \["):
        resolve_source(SourceSpec.parse(str(arrays))).columns()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(PromptFileError, match=r"empty\.jsonl: holds no rows"):
        resolve_source(SourceSpec.parse(str(empty))).columns()


def test_a_json_array_file_is_read_element_by_element(tmp_path):
    """ShareGPT's original files are one JSON array: read, streamed, each row located by its line."""
    rows = sharegpt_rows(5)
    rows[2]["conversations"][0]["value"] = "x" * 3_000_000  # larger than a read chunk: parsed across chunks
    pretty = tmp_path / "sharegpt.json"
    pretty.write_bytes(b"\xef\xbb\xbf" + orjson.dumps(rows, option=orjson.OPT_INDENT_2) + b"\n")
    one_line = tmp_path / "one_line.json.gz"
    one_line.write_bytes(gzip.compress(orjson.dumps(rows)))
    for path in (pretty, one_line):
        source = resolve_source(SourceSpec.parse(str(path)))
        assert source.count_rows() == 5
        picked = list(source.iter_rows(wanted={1, 4}))
        assert [r.value for r in picked] == [rows[1], rows[4]]
        prompts, problems = load_prompts(path)
        assert not problems and [p.prompt_id for p in prompts] == [f"c{i}" for i in range(5)]
    starts = [r.line for r in resolve_source(SourceSpec.parse(str(pretty))).iter_rows()]
    text_lines = pretty.read_bytes().split(b"\n")
    assert all(text_lines[n - 1].strip() == b"{" for n in starts) and starts[0] == 2
    assert [r.line for r in resolve_source(SourceSpec.parse(str(one_line))).iter_rows()] == [1] * 5
    # A JSON Lines file whose rows are arrays stays JSON Lines: each row refused on its own.
    lines = tmp_path / "rows.jsonl"
    lines.write_bytes(b"[1, 2]\n" + jsonl_bytes(sharegpt_rows(2)))
    prompts, problems = load_prompts(lines)
    assert len(prompts) == 2 and [(p.line, p.reason) for p in problems] == [(1, "not_an_object")]


def test_json_files_are_data_in_folders_but_dataset_metadata_is_not(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "part1.json").write_bytes(jsonl_bytes(sharegpt_rows(3, "a")))  # JSON Lines named .json
    (folder / "part2.json").write_bytes(orjson.dumps(sharegpt_rows(2, "b")))  # one JSON array
    (folder / "dataset_info.json").write_text('{"features": {}}')
    source = resolve_source(SourceSpec.parse(str(folder)))
    assert [f.name for f in source.files] == ["part1.json", "part2.json"]
    prompts, problems = load_prompts(folder)
    assert not problems and [p.prompt_id for p in prompts] == ["a0", "a1", "a2", "b0", "b1"]
