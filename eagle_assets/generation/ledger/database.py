"""Where the ledger's tables live: one SQLite file (the embedded default) or PostgreSQL (several hosts).

The ledger's SQL is written once in what both engines speak; this module owns what differs: connecting (the
password never shown); serializing every writer, as admission needs (it decides on everything open), with
``BEGIN IMMEDIATE`` or a transaction-scoped advisory lock, so no two hosts decide on the same snapshot; DDL types
(PostgreSQL's 32-bit ``INTEGER`` and 4-byte ``REAL`` cannot hold nano-dollars and moment sums); the clock leases
expire on, the one every host shares; and a connection that breaks (keepalives and server timeouts so a half-open
socket or a stuck writer cannot hang every host, bounded reconnection, and ``LedgerConnectionLost`` saying whether
the commit may have happened, so the ledger reruns only what cannot count twice: ``retrying``).
"""

import logging
import re
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from eagle_assets.errors import ConfigError, GenerationError, Systemic
from eagle_assets.settings import current_settings

log = logging.getLogger(__name__)
T = TypeVar("T")

POSTGRES_SCHEMES = ("postgresql", "postgres")
# libpq connection parameters, each unless the URL sets it: keepalives find a dead peer within about a minute
# (idle 30 s, then 3 probes 10 s apart), and tcp_user_timeout bounds how long sent data may stay unacknowledged,
# so a half-open socket fails instead of hanging a transaction (both apply to TCP, not to Unix sockets).
CONNECT_DEFAULTS = {
    "connect_timeout": "30",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}
# Server settings, each unless the URL's ``options`` sets it. A writer holds the ledger's lock for milliseconds:
# one whose client vanished mid-transaction is ended after 60 s (releasing the lock), so a waiter gives up only
# after twice that, and no statement runs longer than three minutes.
SERVER_TIMEOUTS = {
    "idle_in_transaction_session_timeout": "60s",
    "lock_timeout": "120s",
    "statement_timeout": "180s",
}
# Waits before each attempt to connect again once the connection broke; after the last, the ledger fails loudly.
RECONNECT_DELAYS_S = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
MAX_RUNS = 4  # how many times a transaction that lost its connection is run in all, at most
# Server errors after which a transaction was rolled back, so that running it again is safe: a statement or lock
# timeout, the idle-in-transaction timeout, a terminated backend, a deadlock or serialization failure.
_ROLLED_BACK_SQLSTATES = {"57014", "55P03", "25P03", "57P01", "57P02", "57P03", "40P01", "40001"}
# Any 64-bit number will do; it only has to be the same in every process that opens the ledger.
LEDGER_LOCK_KEY = 0x6561676C65  # "eagle"


class DatabaseConfigError(ConfigError, ValueError):
    """The database setting names nothing this ledger can open."""


class SQLiteLedgerRefused(DatabaseConfigError):
    """A SQLite ledger where it cannot hold one account's budget: on a network file system, or under a pod per step."""


# File systems a SQLite ledger must not live on: its locks and WAL's shared memory are per client there (NFS,
# Lustre, EFS, SMB, most FUSE file systems), so hosts sharing the file would each see their own budget, or
# corrupt it. ``fuseblk`` is a local block device behind FUSE (ntfs-3g) and is not among them.
NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "efs", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "9p")
_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")


def mount_of(path: Path, mounts: str) -> tuple[str, str] | None:
    """The (mount point, file-system type) that holds absolute ``path``, from a ``/proc/mounts`` text: the
    longest mount point above it (the last one listed wins when one is mounted over another)."""
    best: tuple[str, str] | None = None
    target = path.as_posix()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[1])  # "\040" is a space
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2])
    return best


def network_mount(path: Path, mounts: str) -> tuple[str, str] | None:
    """The (mount point, type) of ``path``'s file system if it is a network or FUSE one, else None."""
    found = mount_of(path, mounts)
    if found is None:
        return None
    kind = found[1].lower()
    if kind in NETWORK_FILE_SYSTEMS or kind == "fuse" or kind.startswith("fuse."):
        return found
    return None


def check_sqlite_location(path: Path, mounts: str, executor: str) -> None:
    """Refuse a SQLite ledger that several hosts would split or share unsafely (``SQLiteLedgerRefused``).

    ``mounts``: a ``/proc/mounts`` text ("" where there is none); ``executor``: ``EAGLE_FORGE_EXECUTOR``.
    """
    if executor.strip().lower() == "k8s":
        raise SQLiteLedgerRefused(
            f"EAGLE_FORGE_EXECUTOR=k8s runs every step in a pod of its own, but the budget ledger is the SQLite file"
            f" {path}: each pod would keep its own budget and in-flight cap. Set EAGLE_FORGE_DATABASE_URL (or the"
            " openrouter resource's database_url) to the PostgreSQL database every pod shares."
        )
    found = network_mount(path, mounts)
    if found is not None:
        point, kind = found
        raise SQLiteLedgerRefused(
            f"the budget ledger's SQLite file {path} lies on a {kind} mount ({point}): SQLite's locks do not hold"
            " across its clients, so hosts sharing it would overspend or corrupt it. Set EAGLE_FORGE_DATABASE_URL"
            " to a PostgreSQL database for several hosts, or to sqlite:////a/local/path/ledger.sqlite for one."
        )


def _proc_mounts() -> str:
    try:
        return Path("/proc/mounts").read_text()
    except OSError:  # not Linux: nothing to check against
        return ""


class LedgerDatabaseUnavailable(GenerationError, Systemic, ConnectionError):
    """The ledger's database could not be reached again after a connection broke, within the bounded retries."""


class LedgerConnectionLost(GenerationError, ConnectionError):
    """The connection broke under a transaction. ``commit_unknown``: it broke while the commit was on its way,
    so the transaction may have committed; otherwise it certainly did not, and running it again is safe."""

    def __init__(self, message: str, commit_unknown: bool) -> None:
        super().__init__(message)
        self.commit_unknown = commit_unknown


class Cursor(Protocol):
    def execute(self, sql: str, params: Any = ...) -> "Cursor": ...
    def executemany(self, sql: str, rows: Any) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


def redact_url(url: str) -> str:
    """The URL with any password replaced, for logs and errors (the password must never appear)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable database URL>"
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def is_postgres_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.split(":", 1)[0].lower() in POSTGRES_SCHEMES


def sqlite_path(location: str | Path) -> Path:
    """A plain path, or ``sqlite:///relative`` / ``sqlite:////absolute`` as SQLAlchemy spells them."""
    if isinstance(location, Path):
        return location
    if location.startswith("sqlite:"):
        rest = location[len("sqlite:") :]
        if not rest.startswith("///"):
            raise DatabaseConfigError(f"a SQLite URL is sqlite:///path, got {location!r}")
        return Path(rest[3:])
    if "://" in location:
        scheme = location.split("://", 1)[0]
        raise DatabaseConfigError(
            f"database URL scheme {scheme!r} is not supported: use postgresql://… or a SQLite path"
            f" ({redact_url(location)})"
        )
    return Path(location)


class LedgerDatabase:
    """One connection, shared by a process's threads under a lock; every write is serialized across processes."""

    kind: str
    now_sql: str  # an SQL expression: the database's clock, in seconds since the epoch
    description: str  # where it is, safe to log

    def __init__(self) -> None:
        self._lock = threading.RLock()

    # --- what each backend provides -----------------------------------------------------------
    def tx(self, durable: bool = True) -> AbstractContextManager[Cursor]:
        """A write transaction that no other process's write transaction overlaps.

        ``durable=False``: soft state rewritten within a second anyway (slot leases, heartbeats): PostgreSQL may
        then acknowledge the commit before the WAL reaches the disk, so writers holding the lock do not wait on
        an fsync (SQLite's never do: WAL, synchronous=NORMAL).
        """
        raise NotImplementedError

    def read(self) -> AbstractContextManager[Cursor]:
        """Plain reads, each statement on its own (committed data), serialized with this process's writes."""
        raise NotImplementedError

    def columns(self, cur: Cursor, table: str) -> set[str]:
        raise NotImplementedError

    def ddl(self, statement: str) -> str:
        return statement

    def another(self) -> "LedgerDatabase":
        """A second connection to the same database (a heartbeat thread must not wait behind the loop's lock)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------------
    def retrying(self, call: Callable[[], T], *, idempotent: bool, what: str) -> T:
        """``call`` (one or more transactions), run again on a fresh connection when a connection broke under it.

        Run again only when that cannot count twice: the transaction certainly did not commit, or running it
        twice writes what running it once does (``idempotent``). A lost commit of anything else is raised, as
        are ``MAX_RUNS`` losses in a row (each reconnection already waits up to ``RECONNECT_DELAYS_S``): a run
        stops rather than guess.
        """
        for attempt in range(1, MAX_RUNS + 1):
            try:
                return call()
            except LedgerConnectionLost as exc:
                if exc.commit_unknown and not idempotent:
                    raise LedgerConnectionLost(
                        f"{what}: {exc} It may have committed, and running it again could count it twice: stopping."
                        " Whatever it reserved is this owner's, and is released or charged when the owner closes.",
                        commit_unknown=True,
                    ) from exc
                if attempt == MAX_RUNS:
                    raise LedgerConnectionLost(
                        f"{what}: the ledger connection broke under it {attempt} times in a row ({exc}); giving up",
                        commit_unknown=exc.commit_unknown,
                    ) from exc
                log.warning("%s: %s Running it again on a new connection (run %d)", what, exc, attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    def create_schema(self, schema: str, added_columns: dict[str, dict[str, str]], indexes: str = "") -> None:
        """Create what is missing, under the write lock so that racing first openers agree."""
        with self.tx() as cur:
            for statement in _statements(schema):
                cur.execute(self.ddl(statement))
            for table, cols in added_columns.items():
                have = self.columns(cur, table)
                for name, decl in cols.items():
                    if name not in have:
                        cur.execute(self.ddl(f"ALTER TABLE {table} ADD COLUMN {name} {decl}"))
            for statement in _statements(indexes):
                cur.execute(self.ddl(statement))


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


class SQLiteLedgerDatabase(LedgerDatabase):
    kind = "sqlite"
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: Path) -> None:
        super().__init__()
        check_sqlite_location(path.resolve(), _proc_mounts(), current_settings().executor)
        self.path = path
        self.description = f"SQLite {path}"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
        self._wal()
        self._db.execute("PRAGMA synchronous=NORMAL")

    def _wal(self) -> None:
        """Switch to WAL. SQLite answers "locked" at once, without the busy timeout, while another process
        sets up the same fresh file (B1–B8 starting together): wait for it instead of failing the step."""
        deadline = time.monotonic() + 60.0
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @contextmanager
    def tx(self, durable: bool = True) -> Iterator[Cursor]:
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[Cursor]:
        with self._lock:
            yield self._db.cursor()

    def columns(self, cur: Cursor, table: str) -> set[str]:
        return {row[1] for row in cur.execute(f"PRAGMA table_info({table})")}

    def another(self) -> "SQLiteLedgerDatabase":
        return SQLiteLedgerDatabase(self.path)

    def close(self) -> None:
        with self._lock:
            self._db.close()


_PLACEHOLDER = re.compile(r"\?")
# ``INSERT INTO t (…) VALUES (?,?)``: the head and the one row of placeholders.
_INSERT_VALUES = re.compile(r"^(\s*INSERT\s+INTO\s+[^;]*?\bVALUES\s*)(\((?:\s*\?\s*,)*\s*\?\s*\))\s*$", re.I | re.S)
_PG_TYPES = ((re.compile(r"\bINTEGER\b"), "BIGINT"), (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"))


class _PgCursor:
    """Takes the ledger's ``?`` placeholders, sent as PostgreSQL's own ``$n`` (raw cursors: psycopg parses
    nothing client-side; each statement is translated once and remembered).

    In a pipelined transaction every statement gets a psycopg cursor of its own, and a read first syncs the
    pipeline: psycopg hands a cursor each answer as it is processed, so a read sharing its cursor with earlier
    statements could return one of *their* answers if those were processed after it was sent (seen: a schema
    check that read the advisory lock's row, then added a column that was there).
    """

    __slots__ = ("_conn", "_cur", "_pipeline", "_sql")

    def __init__(self, conn: Any, sql_cache: dict[str, str], pipeline: Any = None) -> None:
        self._conn, self._sql, self._pipeline = conn, sql_cache, pipeline
        self._cur: Any = None

    def _pg(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            numbers = iter(range(1, 1 << 16))
            out = _PLACEHOLDER.sub(lambda _: f"${next(numbers)}", sql)
            if len(self._sql) < 512:  # multi-row inserts of every size would fill it otherwise
                self._sql[sql] = out
        return out

    def execute(self, sql: str, params: Any = None) -> "_PgCursor":
        self._cur = self._conn.cursor()
        self._cur.execute(self._pg(sql), params)
        return self

    def executemany(self, sql: str, rows: Any) -> None:
        """An ``INSERT … VALUES (?, …)`` goes as multi-row statements, one round trip per thousand rows or so
        (psycopg's ``executemany`` pipelines one statement per row: 6× slower for a chunk of 64)."""
        rows = list(rows)
        if not rows:
            return
        insert = _INSERT_VALUES.match(sql)
        if insert is None:
            self._cur = self._conn.cursor()
            self._cur.executemany(self._pg(sql), rows)
            return
        per = max(1, 30_000 // max(1, len(rows[0])))  # PostgreSQL takes at most 65,535 parameters a statement
        for i in range(0, len(rows), per):
            part = rows[i : i + per]
            self.execute(insert.group(1) + ",".join([insert.group(2)] * len(part)), [v for row in part for v in row])

    def _answered(self) -> Any:
        if self._cur is None:
            raise RuntimeError("fetch before any statement")
        if self._pipeline is not None:
            self._pipeline.sync()  # every answer sent so far is in, this statement's included
        return self._cur

    def fetchone(self) -> Any:
        return self._answered().fetchone()

    def fetchall(self) -> list[Any]:
        return self._answered().fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class PostgresLedgerDatabase(LedgerDatabase):
    kind = "postgresql"
    now_sql = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

    def __init__(self, url: str) -> None:
        super().__init__()
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:  # a dependency of the package: only a broken install gets here
            raise DatabaseConfigError("a PostgreSQL ledger needs psycopg (pip install 'psycopg[binary]')") from exc
        self.url = url
        self.description = f"PostgreSQL {redact_url(url)}"
        self.reconnect_delays_s = RECONNECT_DELAYS_S
        self.reconnects = 0  # connections replaced after one broke
        self._sql: dict[str, str] = {}
        self._db = self._connect()

    def _connect(self) -> Any:
        import psycopg
        from psycopg.types.numeric import FloatLoader

        try:
            db = psycopg.connect(connection_string(self.url), autocommit=True, cursor_factory=psycopg.RawCursor)
        except psycopg.Error as exc:
            raise ConnectionError(
                f"cannot connect to the ledger database {redact_url(self.url)}: {type(exc).__name__}"
                f" ({self._detail(exc) or 'no detail'})"
            ) from None
        # SUM over BIGINT is NUMERIC in PostgreSQL; the ledger's arithmetic is in floats and ints, as SQLite's.
        db.adapters.register_loader("numeric", FloatLoader)
        return db

    def _usable(self) -> bool:
        """Whether the connection can take the next transaction. An idle connection in autocommit has nothing to
        read: something readable is the server's goodbye (a terminated backend, a restart) or a closed socket."""
        if self._db.closed or self._db.broken:
            return False
        try:
            readable, _, _ = select.select([self._db.fileno()], [], [], 0)
            if readable:
                self._db.execute("SELECT 1")  # reads what arrived: a notice leaves it usable, a goodbye does not
        except Exception:  # psycopg.Error or OSError: either way it is gone
            return False
        return not (self._db.closed or self._db.broken)

    def _ensure_connected(self) -> None:
        """Replace a broken connection before a transaction, waiting ``reconnect_delays_s`` between attempts."""
        if self._usable():
            return
        with suppress(Exception):  # closing what is already broken
            self._db.close()
        last: Exception | None = None
        for delay in self.reconnect_delays_s:
            time.sleep(delay)
            try:
                self._db = self._connect()
            except ConnectionError as exc:
                last = exc
                continue
            self.reconnects += 1
            log.warning("ledger database %s: connection replaced after it broke", self.description)
            return
        raise LedgerDatabaseUnavailable(
            f"the ledger database {redact_url(self.url)} is unreachable: {len(self.reconnect_delays_s)} attempts to"
            f" connect again over {sum(self.reconnect_delays_s):.0f} s failed ({last})"
        )

    def _detail(self, exc: Exception) -> str:
        """The first line of ``exc``: libpq's message can quote the connection string, never with its password."""
        return str(exc).replace(self.url, redact_url(self.url)).splitlines()[0] if str(exc) else ""

    def _raise_if_lost(self, exc: Exception, commit_sent: bool) -> None:
        """Raise ``exc`` as ``LedgerConnectionLost`` if the connection broke or the server rolled back."""
        import psycopg

        if not isinstance(exc, psycopg.OperationalError):
            return
        rolled_back = getattr(exc, "sqlstate", None) in _ROLLED_BACK_SQLSTATES
        if not (rolled_back or self._db.broken or self._db.closed):
            return
        if rolled_back:
            what = f"the ledger database {redact_url(self.url)} rolled the transaction back"
        else:
            when = "while committing" if commit_sent else "before its commit"
            what = f"the ledger connection to {redact_url(self.url)} broke {when}"
        detail = self._detail(exc) or type(exc).__name__
        raise LedgerConnectionLost(f"{what} ({detail}).", commit_unknown=commit_sent and not rolled_back) from exc

    @contextmanager
    def tx(self, durable: bool = True) -> Iterator[Cursor]:
        """Pipelined: statements go out without waiting for each answer; a fetch waits for what it reads.
        A transaction of the ledger is a dozen statements, most of them writes: one round trip each would
        be most of its time."""
        with self._lock:
            self._ensure_connected()
            commit_sent = False
            try:
                with self._db.pipeline() as pipeline, self._db.transaction():
                    cur = _PgCursor(self._db, self._sql, pipeline)
                    cur.execute("SELECT pg_advisory_xact_lock(?)", (LEDGER_LOCK_KEY,))
                    if not durable:
                        cur.execute("SET LOCAL synchronous_commit = off")
                    yield cur
                    commit_sent = True  # from here the transaction's exit sends COMMIT
            except Exception as exc:
                self._raise_if_lost(exc, commit_sent)
                raise

    @contextmanager
    def read(self) -> Iterator[Cursor]:
        with self._lock:
            self._ensure_connected()
            try:
                yield _PgCursor(self._db, self._sql)
            except Exception as exc:
                self._raise_if_lost(exc, commit_sent=False)  # reads commit nothing
                raise

    def columns(self, cur: Cursor, table: str) -> set[str]:
        rows = cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = ?",
            (table,),
        ).fetchall()
        return {r[0] for r in rows}

    def ddl(self, statement: str) -> str:
        for pattern, replacement in _PG_TYPES:
            statement = pattern.sub(replacement, statement)
        return statement

    def another(self) -> "PostgresLedgerDatabase":
        return PostgresLedgerDatabase(self.url)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def connection_string(url: str) -> str:
    """``url`` with ``CONNECT_DEFAULTS`` and ``SERVER_TIMEOUTS`` added wherever it does not set them itself."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        given = conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError: an unparseable URL; never echo it whole
        raise DatabaseConfigError(
            f"cannot read the ledger database URL {redact_url(url)}: {type(exc).__name__}"
        ) from None
    extra: dict[str, Any] = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    options = str(given.get("options") or "")
    more = " ".join(f"-c {k}={v}" for k, v in SERVER_TIMEOUTS.items() if k not in options)
    if more:
        extra["options"] = f"{options} {more}".strip()
    return make_conninfo(url, **extra)


def open_database(location: str | Path) -> LedgerDatabase:
    """``postgresql://…`` opens PostgreSQL; a path (or ``sqlite:///path``) opens a SQLite file."""
    if is_postgres_url(location):
        return PostgresLedgerDatabase(str(location))
    return SQLiteLedgerDatabase(sqlite_path(location))
