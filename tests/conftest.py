"""Fixtures shared across test folders: a real PostgreSQL (from the pgserver wheel) and ledger locations.

The server starts once per session (about 3 s here, as root or not: see ``resources.postgres.local_server``);
each test gets a database of its own, dropped afterwards.

The session's ``EAGLE_FORGE_HOME`` is a temporary folder of its own (tests that need another set theirs): code
that takes a lease or writes state without being given a home would otherwise write into the checkout's (or the
user's) ``.eagle_forge``, and a test must leave nothing behind.
"""

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from resources.postgres.local_server import LocalPostgres, start_local_postgres

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="eagle-forge-tests-home-"))
os.environ["EAGLE_FORGE_HOME"] = str(_SESSION_HOME)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def local_postgres() -> Iterator[LocalPostgres]:
    # A short folder of its own: the server's Unix socket lives in it, and socket paths are short.
    base = Path(tempfile.mkdtemp(prefix="efpg-"))
    pg = start_local_postgres(base / "data")
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_pg_database(local_postgres: LocalPostgres) -> Iterator[Callable[[], str]]:
    """Call it for the URL of a new empty database; all are dropped after the test."""
    made: list[str] = []

    def make() -> str:
        url = local_postgres.create_database()
        made.append(url.split("/")[3].split("?")[0])
        return url

    yield make
    for name in made:
        local_postgres.drop_database(name)


LEDGER_BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=LEDGER_BACKENDS)
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str | Path]:
    """``ledger_at(name)``: where ledger ``name`` lives on this backend (a SQLite file, or its own database)."""
    if request.param == "sqlite":
        return lambda name="ledger": tmp_path / f"{name}.sqlite"
    make = request.getfixturevalue("fresh_pg_database")
    urls: dict[str, str] = {}

    def at(name: str = "ledger") -> str:
        if name not in urls:
            urls[name] = make()
        return urls[name]

    return at
