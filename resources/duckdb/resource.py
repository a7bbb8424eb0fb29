"""DuckDB as a Dagster resource: the limits every validation query runs under.

Each check opens its own connection (in memory by default) so that checks of different partitions, in
different step processes, never contend for one database file's writer lock.
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from eagle_assets.corpus.validation import DuckDBSettings
from eagle_assets.layout import duckdb_tmp_dir


class DuckDBResource(dg.ConfigurableResource):
    """Limits for the DuckDB validation queries over the Parquet partitions."""

    database: str = Field(default=":memory:", description="DuckDB database; ':memory:' or a file path")
    memory_limit: str = Field(default="2GB", description="per-query memory cap; DuckDB spills beyond it")
    threads: int = Field(default=2, ge=1, description="threads per query")
    temp_directory: str = Field(
        default="",
        description="spill directory (default: duckdb_tmp in $EAGLE_FORGE_SCRATCH, else in $EAGLE_FORGE_HOME)",
    )
    max_examples: int = Field(default=5, ge=0, description="failing rows shown per check")

    def settings(self) -> DuckDBSettings:
        temp = Path(self.temp_directory) if self.temp_directory else duckdb_tmp_dir()
        temp.mkdir(parents=True, exist_ok=True)
        return DuckDBSettings(
            database=self.database,
            memory_limit=self.memory_limit,
            threads=self.threads,
            temp_directory=temp,
            max_examples=self.max_examples,
        )
