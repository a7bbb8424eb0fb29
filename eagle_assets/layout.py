"""Where everything lives under the eagle-forge home (``EAGLE_FORGE_HOME``, read by ``settings``).

One home for the paths, so that a step finds what another wrote (a tokenized partition, a corpus shard, a
hidden-state store, the published draft) without importing the module that wrote it. Every function takes
the home as ``home`` (default: the configured home now) and what names the file: a dataset and shard,
a corpus shard's partition key. The files a component keeps inside its own folder (a store's index, a
training run's checkpoints, the simulator's pid file) are that component's business, named where it writes
them.

Scratch is the one exception to "everything under the home": with a home shared by several hosts, each host
keeps its scratch on its own disk. Hidden-state staging and checkpoints in progress are not scratch: they are
renamed into place, and a rename stays on one file system, so they live beside what they become.
"""

from pathlib import Path

from eagle_assets.settings import current_settings


def root(home: Path | None = None) -> Path:
    """``home`` if given, else the configured eagle-forge home."""
    return current_settings().forge_home() if home is None else home


# --- inputs --------------------------------------------------------------------------------------------------------


def samples_dir(*, home: Path | None = None) -> Path:
    return root(home) / "samples"


# --- generation ----------------------------------------------------------------------------------------------------


def journal_dir(*, home: Path | None = None) -> Path:
    return root(home) / "journal"


def generated_dir(*, home: Path | None = None) -> Path:
    return root(home) / "generated"


def journal_path(dataset: str, shard: str, *, home: Path | None = None) -> Path:
    return journal_dir(home=home) / dataset / f"{shard}.journal"


def generated_path(dataset: str, shard: str, *, home: Path | None = None) -> Path:
    return generated_dir(home=home) / dataset / f"{shard}.parquet"


def partition_paths(dataset: str, shard: str, *, home: Path | None = None) -> tuple[Path, Path]:
    """The generation partition's journal and its Parquet output."""
    return journal_path(dataset, shard, home=home), generated_path(dataset, shard, home=home)


def allowed_providers_path(dataset: str, shard: str, *, home: Path | None = None) -> Path:
    """Beside the Parquet: the providers the policy allowed when this partition's responses were bought."""
    return generated_dir(home=home) / dataset / f"{shard}.providers.json"


def native_counts_path(dataset: str, shard: str, *, home: Path | None = None) -> Path:
    """Beside the Parquet: the provider's own completion counts for a sample of its responses."""
    return generated_dir(home=home) / dataset / f"{shard}.native.json"


# --- tokens and corpus ---------------------------------------------------------------------------------------------


def tokenized_path(dataset: str, shard: str, *, home: Path | None = None) -> Path:
    return root(home) / "tokenized" / dataset / f"{shard}.parquet"


def corpus_dir(*, home: Path | None = None) -> Path:
    return root(home) / "corpus"


def shard_partition_key(file: str) -> str:
    """A corpus shard's partition key from its file in the index: ``train/shard-00003.parquet`` → ``train-00003``
    (partition keys may not contain slashes); ``shard_file`` is the reverse."""
    split, name = file.split("/", 1)
    return f"{split}-{name.removeprefix('shard-').removesuffix('.parquet')}"


def corpus_split_dir(split: str, *, home: Path | None = None) -> Path:
    """The shards of one split (``train``, ``eval``): ``shard-N.parquet``."""
    return corpus_dir(home=home) / split


def shard_file(partition_key: str, *, home: Path | None = None) -> Path:
    """The corpus shard of a hidden-state partition: ``train-00003`` → ``corpus/train/shard-00003.parquet``."""
    split, number = partition_key.split("-", 1)
    return corpus_split_dir(split, home=home) / f"shard-{number}.parquet"


# --- hidden states and the draft -----------------------------------------------------------------------------------


def hidden_states_root(*, home: Path | None = None) -> Path:
    return root(home) / "hidden_states"


def store_dir(partition_key: str, *, home: Path | None = None) -> Path:
    """One store per corpus shard (see ``hidden_states.store_set``)."""
    return hidden_states_root(home=home) / partition_key


def handoff_dir(name: str, *, home: Path | None = None) -> Path:
    """Where a vLLM engine hands each prompt's states over (``extract_vllm``), one folder per engine, emptied when
    it starts: on this host's scratch, since every byte of features passes through it once (``EAGLE_FORGE_SCRATCH``
    on a RAM disk such as /dev/shm keeps them off the disk)."""
    return scratch_root(home=home) / "vllm-handoff" / name


def draft_runs_dir(*, home: Path | None = None) -> Path:
    """Training runs, each in a folder named by its inputs (``assets.draft.run_identity``)."""
    return root(home) / "draft" / "runs"


def latest_export_dir(*, home: Path | None = None) -> Path:
    """The published draft: ``export/`` (and the ``export-vllm`` alias), replaced as a whole."""
    return root(home) / "draft" / "latest"


def benchmark_runs_dir(*, home: Path | None = None) -> Path:
    """The serving benchmark's runs (server logs, per-set results), one folder per run."""
    return root(home) / "draft" / "benchmarks"


# --- state ---------------------------------------------------------------------------------------------------------


def state_dir(*, home: Path | None = None) -> Path:
    return root(home) / "state"


def ledger_path(*, home: Path | None = None) -> Path:
    """The budget ledger's SQLite file (when no database URL is set: ``ledger_location``)."""
    return state_dir(home=home) / "ledger.sqlite"


def ledger_location() -> str | Path:
    """Where the budget ledger lives: ``EAGLE_FORGE_DATABASE_URL`` if set, else the SQLite file in the home."""
    return current_settings().database_url or ledger_path()


def plan_path(*, home: Path | None = None) -> Path:
    """The latest generation plan (``generation.plan_file``)."""
    return state_dir(home=home) / "generation_plan.json"


def dataset_cache_dir(*, home: Path | None = None) -> Path:
    """What the datasets' whole-set scans found, cached per source."""
    return state_dir(home=home) / "datasets"


# --- models and scratch --------------------------------------------------------------------------------------------


def tiny_target_dir(seed: int = 0, *, home: Path | None = None) -> Path:
    """Where the demo keeps the tiny target it builds."""
    return root(home) / "models" / f"tiny-kimi-seed{seed}"


def scratch_root(*, home: Path | None = None) -> Path:
    """This host's scratch: ``EAGLE_FORGE_SCRATCH`` when set (a local path, outside the shared home), else the
    home itself, as on one machine."""
    return current_settings().scratch or root(home)


def simulator_dir(*, home: Path | None = None) -> Path:
    """The embedded simulator's pid file, state and log: per host, since the simulator listens on this host's
    127.0.0.1 and its pid is this host's."""
    return scratch_root(home=home) / "simulator"


def duckdb_tmp_dir(*, home: Path | None = None) -> Path:
    """DuckDB's spill directory unless the resource names one: per host, on its local disk."""
    return scratch_root(home=home) / "duckdb_tmp"


def dagster_home(*, home: Path | None = None) -> Path:
    """``DAGSTER_HOME`` unless the user set one (``instance.ensure_dagster_home``)."""
    return root(home) / "dagster_home"
