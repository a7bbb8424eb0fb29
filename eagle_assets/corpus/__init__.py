"""The training corpus: tokenized partitions, their validation, and the merged, shuffled, sharded corpus.

Modules stay import-light (pyarrow, polars, duckdb, numpy; no tokenizer, no torch) so that Dagster
asset checks and the benchmark can use them without loading the tokenization stack.
"""
