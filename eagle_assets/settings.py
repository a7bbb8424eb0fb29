"""What the environment says: the home folder (``EAGLE_FORGE_HOME``), this host's scratch, the ledger's database,
the tokenizer.

The paths under the home are composed in ``layout``.
"""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _default_home() -> Path:
    # A checkout keeps its state beside the code (the demo and `dagster dev` find it there); an installed
    # wheel must not write into site-packages, so it uses the user's data folder.
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT / ".eagle_forge"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "eagle-forge"


def forge_home() -> Path:
    return Path(os.environ.get("EAGLE_FORGE_HOME") or _default_home()).expanduser().resolve()


def scratch_dir() -> Path | None:
    """``EAGLE_FORGE_SCRATCH``: this host's own scratch folder, on its local disk (DuckDB's spill, the embedded
    simulator's pid file and state), when ``EAGLE_FORGE_HOME`` is shared by several hosts: spill files are
    heavy and short-lived, and one host's simulator pid means nothing on another. Empty: under the home."""
    raw = os.environ.get("EAGLE_FORGE_SCRATCH", "").strip()
    return Path(raw).expanduser().resolve() if raw else None


def database_url() -> str:
    """``EAGLE_FORGE_DATABASE_URL``: the ledger's database when several hosts share one account
    (``postgresql://user@host/db``; the password from ``PGPASSWORD`` or ``~/.pgpass`` keeps it out of the URL).
    Empty: the SQLite file ``layout.ledger_path()``, for one machine."""
    return os.environ.get("EAGLE_FORGE_DATABASE_URL", "").strip()


def ledger_location() -> str | Path:
    """Where the budget ledger lives: the database URL if one is set, else the SQLite file."""
    from eagle_assets.layout import ledger_path  # layout reads the home from here: imported when called

    return database_url() or ledger_path()


def tokenizer_dir(source: str | Path | None = None) -> Path:
    """The Kimi tokenizer folder: ``source``, else ``$EAGLE_FORGE_TOKENIZER``, else the bundled copy."""
    from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir

    return resolve_tokenizer_dir(source)


def switch_on(name: str) -> bool:
    """An on/off environment switch that is on unless set to 0, false, no or off (the flock switches)."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")
