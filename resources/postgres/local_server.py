"""A throwaway PostgreSQL from the ``pgserver`` wheel: for tests, benchmarks and trying the multi-host layout
on one box. Production points ``EAGLE_FORGE_DATABASE_URL`` at a real server instead.

As root, pgserver runs PostgreSQL (which refuses root) as a system user ``pgserver`` it creates, opening the
data folder's parents to it. The server listens on a Unix socket in the data folder only (no TCP port: nothing
to collide with), which libpq, psycopg and SQLAlchemy reach with ``?host=<folder>``.
"""

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; the socket is <folder>/.s.PGSQL.5432


@dataclass
class LocalPostgres:
    """A running server; ``url(db)`` is a libpq URL for database ``db`` (``postgres`` is always there)."""

    data_dir: Path
    socket_dir: str
    _server: Any = field(repr=False)

    def url(self, database: str = "postgres", driver: str = "postgresql") -> str:
        return f"{driver}://postgres@/{database}?host={quote(self.socket_dir, safe='/')}"

    def create_database(self, name: str | None = None) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database names here are lower-case identifiers, got {name!r}")
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server and delete its folder (when this process started it)."""
        self._server.cleanup()


def start_local_postgres(data_dir: Path) -> LocalPostgres:
    """Start (or join) the server whose data lives in ``data_dir`` (created; its parent must exist)."""
    try:
        import pgserver
    except ImportError as exc:
        raise RuntimeError("a local PostgreSQL needs the pgserver wheel: pip install pgserver") from exc
    data_dir = Path(data_dir).resolve()
    if len(str(data_dir)) + len("/.s.PGSQL.5432") > SOCKET_PATH_MAX:
        raise ValueError(f"{data_dir} is too long for a Unix socket path; use a shorter folder")
    server = pgserver.get_server(data_dir, cleanup_mode="delete")
    info = server.get_postmaster_info()
    socket_dir = str(info.socket_dir or data_dir)
    return LocalPostgres(data_dir, socket_dir, server)
