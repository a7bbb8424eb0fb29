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
from eagle_assets.datasets.prompts import content_prompt_id, conversation_of, load_prompts
from eagle_assets.datasets.sources import SourceSpec, resolve_source

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
    array = tmp_path / "array.jsonl"
    array.write_text('[{"prompt": "a"}]\n')
    with pytest.raises(PromptFileError, match="JSON array"):
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
