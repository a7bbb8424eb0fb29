"""Validation of generated and tokenized partitions, as DuckDB scans straight over the Parquet files.

Each check is one function returning a ``CheckOutcome`` so that a Dagster asset check is a thin
wrapper (``AssetCheckResult(passed=o.passed, metadata={**o.metadata, "summary": o.summary})``).
Why DuckDB rather than polars: it streams Parquet column by column with a hard ``memory_limit`` and
spills when it must, so a check over a whole dataset (60M tokens and more) costs a bounded amount of
memory, and only the columns a check names are ever read.

Every call opens its own connection (in memory, or on a given database file) so that checks can run
in parallel processes without sharing state; paths, ids and sets are always bound parameters.
A source is a glob (``".../tokenized/B1/*.parquet"``), one path, or a list of paths.
"""

import os
import re
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from eagle_assets.corpus.outcome import CheckOutcome, MetadataValue
from eagle_assets.corpus.tokenized_schema import EOT_ID

ParquetSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

KNOWN_FINISH_REASONS: frozenset[str] = frozenset({"stop", "tool_calls", "length", "content_filter"})
# Mirrors ``tokenization.reconstruction.ENDED_FINISH_REASONS`` (not imported: that pulls in the
# tokenizer). After these the model ended its turn itself, so the rebuilt sample ends in exactly one
# ``<|im_end|>``; after any other reason it was cut off and has none.
ENDED_FINISH_REASONS: frozenset[str] = frozenset({"stop", "tool_calls", "function_call", "eos"})
DEFAULT_TOKEN_DIFF_BOUND = 0.0004


@dataclass(frozen=True, slots=True)
class DuckDBSettings:
    """Resource limits of one check's connection; ``database`` may be a file to keep DuckDB's spill next to it."""

    database: str | Path = ":memory:"
    memory_limit: str = "2GB"
    threads: int = 2
    temp_directory: str | Path | None = None
    max_examples: int = 5


DEFAULT_SETTINGS = DuckDBSettings()


@contextmanager
def duckdb_connection(settings: DuckDBSettings = DEFAULT_SETTINGS) -> Iterator[duckdb.DuckDBPyConnection]:
    config: dict[str, Any] = {
        "memory_limit": settings.memory_limit,
        "threads": settings.threads,
        # Row order of a scan is never needed here; dropping it lets DuckDB stream with less buffering.
        "preserve_insertion_order": False,
    }
    if settings.temp_directory is not None:
        config["temp_directory"] = str(settings.temp_directory)
    con = duckdb.connect(str(settings.database), config=config)
    try:
        yield con
    finally:
        con.close()


def source_paths(source: ParquetSource) -> list[str]:
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    paths = [os.fspath(p) for p in source]
    if not paths:
        raise ValueError("no Parquet files to check")
    return paths


# Not user data: the only text spliced into SQL. Everything variable is a ``$name`` parameter.
_SRC = "read_parquet($paths, filename = true)"
_PARAM = re.compile(r"\$([A-Za-z_]\w*)")


def _plain(value: Any) -> Any:
    """DuckDB values as JSON/Dagster-friendly Python (HUGEINT sums are ints already, DECIMAL is not)."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _query(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    sql = sql.replace("{src}", _SRC)
    # DuckDB refuses parameters a statement does not use; checks share one parameter dict.
    used = set(_PARAM.findall(sql))
    cur = con.execute(sql, {k: v for k, v in params.items() if k in used})
    names = [d[0] for d in cur.description]
    return [{n: _plain(v) for n, v in zip(names, row, strict=True)} for row in cur.fetchall()]


def _one(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> dict[str, Any]:
    return _query(con, sql, params)[0]


def _problems(
    con: duckdb.DuckDBPyConnection, classified: str, columns: str, params: dict[str, Any], k: int
) -> tuple[dict[str, int], int, list[dict[str, Any]]]:
    """Counts per ``problem`` of the CTE ``c`` and up to ``k`` examples of each, in one scan.

    One pass matters for the checks that walk every id (``list_filter`` over all tokens); ``min_by``
    keeps only ``k`` rows per problem, so a dataset where everything fails costs no more memory.
    """
    rows = _query(
        con,
        classified
        + f"""SELECT problem, count(*) AS n,
                     min_by({{{columns}}}, filename || chr(0) || prompt_id, $k) FILTER (WHERE problem IS NOT NULL) AS ex
              FROM c GROUP BY problem ORDER BY problem NULLS FIRST""",
        {**params, "k": k},
    )
    counts = {r["problem"]: r["n"] for r in rows if r["problem"] is not None}
    total = sum(r["n"] for r in rows)
    examples = [{"problem": r["problem"], **e} for r in rows if r["problem"] is not None for e in r["ex"] or []]
    return counts, total, examples


def _problem_outcome(
    name: str, counts: dict[str, int], total: int, examples: list[dict[str, Any]], summary: str
) -> CheckOutcome:
    n_bad = sum(counts.values())
    metadata: dict[str, MetadataValue] = {"rows": total, "failing_rows": n_bad}
    metadata.update({f"problem.{p}": n for p, n in counts.items()})
    return CheckOutcome(name, n_bad == 0, summary, metadata, examples)


def check_unique_prompt_ids(source: ParquetSource, settings: DuckDBSettings = DEFAULT_SETTINGS) -> CheckOutcome:
    """A prompt answered twice is trained on twice and makes the merge's choice of copy arbitrary."""
    params = {"paths": source_paths(source)}
    agg = """
        WITH per_file AS (SELECT prompt_id, filename, count(*) AS n FROM {src} GROUP BY prompt_id, filename),
        agg AS (
            SELECT prompt_id, sum(n) AS copies, count(*) AS partitions, max(n) AS max_in_partition,
                   list(filename ORDER BY filename) AS files
            FROM per_file GROUP BY prompt_id
        )
    """
    with duckdb_connection(settings) as con:
        stats = _one(
            con,
            agg
            + """
            SELECT coalesce(sum(copies), 0) AS rows, count(*) AS distinct_ids,
                   count(*) FILTER (WHERE max_in_partition > 1) AS duplicated_within_partition,
                   count(*) FILTER (WHERE partitions > 1) AS duplicated_across_partitions,
                   coalesce(sum(copies) FILTER (WHERE prompt_id IS NULL), 0) AS null_ids
            FROM agg""",
            params,
        )
        examples = _query(
            con,
            agg
            + """
            SELECT prompt_id, copies, max_in_partition, files FROM agg
            WHERE copies > 1 OR prompt_id IS NULL
            ORDER BY copies DESC, prompt_id LIMIT $k""",
            {**params, "k": settings.max_examples},
        )
    extra = stats["rows"] - stats["distinct_ids"]
    passed = extra == 0 and stats["null_ids"] == 0
    summary = (
        f"{stats['rows']} rows, all prompt ids unique"
        if passed
        else f"{extra} extra copies: {stats['duplicated_within_partition']} ids repeated within a partition, "
        f"{stats['duplicated_across_partitions']} across partitions, {stats['null_ids']} null ids"
    )
    return CheckOutcome(
        "unique_prompt_ids", passed, summary, {**stats, "extra_copies": extra}, [] if passed else examples
    )


def check_allowed_providers(
    source: ParquetSource, allowed: Collection[str], settings: DuckDBSettings = DEFAULT_SETTINGS
) -> CheckOutcome:
    """Samples must come from the target served as intended; another provider may serve another quantization.

    Names compare case-insensitively, as the runner compares them: OpenRouter spells a provider one
    way in /endpoints and may spell it another in a response ("BaseTen", "Baseten").
    """
    allowed = sorted({a.lower() for a in allowed if a is not None})  # a null provider is never allowed
    params = {"paths": source_paths(source), "allowed": allowed}
    bad = "(provider IS NULL OR NOT list_contains($allowed, lower(provider)))"
    with duckdb_connection(settings) as con:
        counts = _query(con, "SELECT provider, count(*) AS n FROM {src} GROUP BY provider ORDER BY provider", params)
        examples = _query(
            con,
            f"SELECT prompt_id, provider, filename FROM {{src}} WHERE {bad} ORDER BY filename, prompt_id LIMIT $k",
            {**params, "k": settings.max_examples},
        )
    allowed_set = set(allowed)

    def disallowed(name: str | None) -> bool:
        return name is None or name.lower() not in allowed_set

    n_bad = sum(c["n"] for c in counts if disallowed(c["provider"]))
    metadata: dict[str, MetadataValue] = {
        "rows": sum(c["n"] for c in counts),
        "disallowed_rows": n_bad,
        "allowed": ",".join(sorted(allowed)),
    }
    metadata.update({f"provider.{c['provider']}": c["n"] for c in counts})
    passed = n_bad == 0
    bad_names = sorted(str(c["provider"]) for c in counts if disallowed(c["provider"]))
    summary = "all providers allowed" if passed else f"{n_bad} rows from disallowed providers: {', '.join(bad_names)}"
    return CheckOutcome("allowed_providers", passed, summary, metadata, [] if passed else examples)


def check_nonempty_responses(source: ParquetSource, settings: DuckDBSettings = DEFAULT_SETTINGS) -> CheckOutcome:
    """A response with no reasoning, no content and no tool call has nothing to learn from (generated data).

    Whitespace-only text counts as empty: it is a provider glitch, not an answer.
    """
    params = {"paths": source_paths(source)}
    # ``\S`` finds the first non-space character (DuckDB's ``trim`` strips spaces only, not newlines).
    empty = r"""(NOT regexp_matches(coalesce(reasoning, ''), '\S') AND NOT regexp_matches(coalesce(content, ''), '\S')
               AND (tool_calls IS NULL OR trim(tool_calls) IN ('', '[]', 'null')))"""
    with duckdb_connection(settings) as con:
        stats = _one(
            con, f"SELECT count(*) AS rows, count(*) FILTER (WHERE {empty}) AS empty_rows FROM {{src}}", params
        )
        examples = _query(
            con,
            f"""SELECT prompt_id, filename, finish_reason, completion_tokens FROM {{src}} WHERE {empty}
                ORDER BY filename, prompt_id LIMIT $k""",
            {**params, "k": settings.max_examples},
        )
    passed = stats["empty_rows"] == 0
    summary = f"{stats['rows']} rows, none empty" if passed else f"{stats['empty_rows']} of {stats['rows']} empty"
    return CheckOutcome("nonempty_responses", passed, summary, stats, [] if passed else examples)


def check_finish_reasons(source: ParquetSource, settings: DuckDBSettings = DEFAULT_SETTINGS) -> CheckOutcome:
    """An unexpected reason (``error``, ``unknown``, null) means the end of the sample is not understood."""
    params = {"paths": source_paths(source)}
    with duckdb_connection(settings) as con:
        counts = _query(
            con,
            """SELECT finish_reason, count(*) AS n, min(prompt_id) AS example_prompt_id
               FROM {src} GROUP BY finish_reason ORDER BY finish_reason NULLS LAST""",
            params,
        )
    unknown = [c for c in counts if c["finish_reason"] not in KNOWN_FINISH_REASONS]
    metadata: dict[str, MetadataValue] = {"rows": sum(c["n"] for c in counts)}
    metadata.update({f"finish_reason.{c['finish_reason']}": c["n"] for c in counts})
    metadata["unknown_rows"] = sum(c["n"] for c in unknown)
    passed = not unknown
    summary = (
        ", ".join(f"{c['finish_reason']}: {c['n']}" for c in counts) or "no rows"
        if passed
        else f"{metadata['unknown_rows']} rows with unknown finish reasons: "
        + ", ".join(str(c["finish_reason"]) for c in unknown)
    )
    return CheckOutcome("finish_reasons", passed, summary, metadata, unknown[: settings.max_examples])


def check_end_of_turn(source: ParquetSource, settings: DuckDBSettings = DEFAULT_SETTINGS) -> CheckOutcome:
    """A finished turn ends in exactly one ``<|im_end|>``; a cut-off one has none (tokenized data).

    Counted from ``input_ids`` themselves, and the stored ``ends_with_eot``/``eot_count`` are checked
    against them: a draft trained on a spurious end-of-turn learns to end turns early, and a missing
    one never learns to stop.
    """
    params = {"paths": source_paths(source), "eot": EOT_ID, "ended": sorted(ENDED_FINISH_REASONS)}
    classified = """
        WITH t AS (
            SELECT prompt_id, filename, finish_reason, ends_with_eot, eot_count,
                   coalesce(list_last(input_ids) = $eot, false) AS ids_end,
                   list_count(list_filter(input_ids[prompt_len + 1:], lambda x: x = $eot)) AS ids_count,
                   coalesce(list_contains($ended, finish_reason), false) AS ended
            FROM {src}
        ), c AS (
            SELECT *, CASE
                WHEN ends_with_eot <> ids_end OR eot_count <> ids_count THEN 'stored_columns_disagree_with_ids'
                WHEN ended AND ids_count = 0 THEN 'missing_eot'
                WHEN ended AND ids_count > 1 THEN 'extra_eot'
                WHEN ended AND NOT ids_end THEN 'eot_not_last'
                WHEN NOT ended AND ids_count > 0 THEN 'eot_in_cut_off_sample'
            END AS problem FROM t
        )
    """
    columns = (
        "prompt_id: prompt_id, filename: filename, finish_reason: finish_reason, "
        "eot_count: ids_count, ends_with_eot: ids_end"
    )
    with duckdb_connection(settings) as con:
        counts, total, examples = _problems(con, classified, columns, params, settings.max_examples)
    n_bad = sum(counts.values())
    summary = (
        "every finished sample ends in exactly one end-of-turn, cut-off samples have none"
        if not n_bad
        else f"{n_bad} rows with a wrong end-of-turn: " + ", ".join(f"{p}: {n}" for p, n in counts.items())
    )
    return _problem_outcome("end_of_turn", counts, total, examples, summary)


def check_token_diff(
    source: ParquetSource, bound: float = DEFAULT_TOKEN_DIFF_BOUND, settings: DuckDBSettings = DEFAULT_SETTINGS
) -> CheckOutcome:
    """Rebuilt completions must add up to what the provider counted: |Σ diff| / Σ api tokens ≤ ``bound``.

    The bound is on the aggregate because single samples legitimately differ by a token or two (a
    provider's accounting of a stripped space, a tool-call id), while a systematic reconstruction
    error shows up in the sum.
    """
    params = {"paths": source_paths(source)}
    with duckdb_connection(settings) as con:
        s = _one(
            con,
            """SELECT count(*) AS rows, coalesce(sum(token_diff), 0) AS sum_diff,
                      coalesce(sum(api_completion_tokens), 0) AS sum_api_completion_tokens,
                      coalesce(sum(completion_len), 0) AS sum_completion_len,
                      coalesce(avg(abs(token_diff)), 0) AS mean_abs_diff,
                      coalesce(max(abs(token_diff)), 0) AS max_abs_diff,
                      count(*) FILTER (WHERE token_diff <> 0) AS rows_with_diff,
                      count(native_completion_tokens) AS rows_with_native,
                      coalesce(sum(completion_len - native_completion_tokens), 0) AS sum_native_diff,
                      coalesce(sum(native_completion_tokens), 0) AS sum_native_completion_tokens
               FROM {src}""",
            params,
        )
        ratio = abs(s["sum_diff"]) / s["sum_api_completion_tokens"] if s["sum_api_completion_tokens"] else 0.0
        native = s["sum_native_completion_tokens"]
        native_ratio = abs(s["sum_native_diff"]) / native if native else 0.0
        passed = ratio <= bound and native_ratio <= bound and (s["rows"] == 0 or s["sum_api_completion_tokens"] > 0)
        examples = (
            []
            if passed
            else _query(
                con,
                """SELECT prompt_id, filename, completion_len, api_completion_tokens, token_diff FROM {src}
                   ORDER BY abs(token_diff) DESC, filename, prompt_id LIMIT $k""",
                {**params, "k": settings.max_examples},
            )
        )
    metadata: dict[str, MetadataValue] = {
        **s,
        "relative_diff": ratio,
        "native_relative_diff": native_ratio,
        "bound": bound,
    }
    summary = (
        f"|Σ diff| / Σ api tokens = {ratio:.6f} ({'≤' if passed else '>'} {bound}); max per sample {s['max_abs_diff']}"
    )
    if s["rows_with_native"]:
        summary += f"; against /generation native counts ({s['rows_with_native']} samples): {native_ratio:.6f}"
    return CheckOutcome("token_diff", passed, summary, metadata, examples)


def check_token_layout(source: ParquetSource, settings: DuckDBSettings = DEFAULT_SETTINGS) -> CheckOutcome:
    """The row's figures must describe its ids: the other checks (and training) trust them.

    ``n_tokens = len(input_ids) = len(loss_mask) = prompt_len + completion_len``, the mask is 0 on the
    prompt and 1 on the whole completion, and ``token_diff = completion_len - api_completion_tokens``.
    """
    params = {"paths": source_paths(source)}
    classified = """
        WITH c AS (
            SELECT prompt_id, filename, n_tokens, prompt_len, completion_len, CASE
                WHEN len(input_ids) <> n_tokens OR len(loss_mask) <> n_tokens THEN 'length_mismatch'
                WHEN prompt_len < 0 OR completion_len < 0 OR prompt_len + completion_len <> n_tokens
                    THEN 'split_mismatch'
                WHEN coalesce(list_max(loss_mask), 0) > 1 THEN 'mask_not_binary'
                WHEN coalesce(list_sum(loss_mask[1:prompt_len]), 0) <> 0
                  OR coalesce(list_sum(loss_mask), 0) <> completion_len THEN 'mask_not_on_completion'
                WHEN token_diff <> completion_len - api_completion_tokens THEN 'token_diff_mismatch'
            END AS problem
            FROM {src}
        )
    """
    columns = (
        "prompt_id: prompt_id, filename: filename, n_tokens: n_tokens, prompt_len: prompt_len, "
        "completion_len: completion_len"
    )
    with duckdb_connection(settings) as con:
        counts, total, examples = _problems(con, classified, columns, params, settings.max_examples)
    n_bad = sum(counts.values())
    summary = "ids, mask and counts consistent" if not n_bad else f"{n_bad} rows whose counts do not match their ids"
    return _problem_outcome("token_layout", counts, total, examples, summary)


def length_distribution(source: ParquetSource, settings: DuckDBSettings = DEFAULT_SETTINGS) -> CheckOutcome:
    """Sample lengths, for the asset's metadata: they size training batches and the hidden-state store."""
    params = {"paths": source_paths(source)}
    with duckdb_connection(settings) as con:
        s = _one(
            con,
            """SELECT count(*) AS samples, coalesce(sum(n_tokens), 0) AS total_tokens,
                      coalesce(sum(completion_len), 0) AS completion_tokens,
                      coalesce(min(n_tokens), 0) AS min, coalesce(quantile_disc(n_tokens, 0.5), 0) AS p50,
                      coalesce(quantile_disc(n_tokens, 0.9), 0) AS p90,
                      coalesce(quantile_disc(n_tokens, 0.99), 0) AS p99,
                      coalesce(max(n_tokens), 0) AS max, coalesce(avg(n_tokens), 0) AS mean
               FROM {src}""",
            params,
        )
    passed = s["samples"] > 0
    summary = (
        f"{s['samples']} samples, {s['total_tokens']} tokens; n_tokens p50 {s['p50']}, p99 {s['p99']}, max {s['max']}"
        if passed
        else "no samples"
    )
    return CheckOutcome("length_distribution", passed, summary, s)


def run_generated_checks(
    source: ParquetSource,
    allowed_providers: Collection[str],
    settings: DuckDBSettings = DEFAULT_SETTINGS,
) -> list[CheckOutcome]:
    return [
        check_unique_prompt_ids(source, settings),
        check_allowed_providers(source, allowed_providers, settings),
        check_nonempty_responses(source, settings),
        check_finish_reasons(source, settings=settings),
    ]


def run_tokenized_checks(
    source: ParquetSource,
    allowed_providers: Collection[str],
    token_diff_bound: float = DEFAULT_TOKEN_DIFF_BOUND,
    settings: DuckDBSettings = DEFAULT_SETTINGS,
) -> list[CheckOutcome]:
    return [
        check_unique_prompt_ids(source, settings),
        check_allowed_providers(source, allowed_providers, settings),
        check_finish_reasons(source, settings=settings),
        check_token_layout(source, settings),
        check_end_of_turn(source, settings=settings),
        check_token_diff(source, token_diff_bound, settings),
        length_distribution(source, settings),
    ]
