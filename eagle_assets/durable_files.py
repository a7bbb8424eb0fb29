"""Crash-safe file replacement and directory publication, shared by every stage that writes results.

Readers must see the old file or the new one, never a torn one, and a rename is only durable once
the directory entry is fsync'd too: write to a temporary sibling, fsync it, rename it over the
target, fsync the directory. Every writer goes through here so that no stage forgets a step.

A folder cannot be renamed over a non-empty folder, so replacing one in place always leaves a moment
(and, after a crash, a state) with no folder at its name. A published folder is therefore never
replaced: each version is a folder of its own under ``<parent>/.published/<name>/`` and the public name
is a relative symlink to the current one, swapped with one ``os.replace``. A reader resolves the name to
one whole version at every moment, and a crash anywhere leaves the previous version published. A
superseded version is kept for ``grace_s`` (a reader that resolved it mid-load is not cut off; the newest
one is kept however old) and removed by a later publication.
"""

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def default_tmp_name(path: Path) -> str:
    return f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "wb", tmp_name: str | None = None) -> Iterator[IO]:
    """Yield a file to write; on a clean exit it replaces ``path`` durably, on an error it vanishes."""
    path = Path(path)
    tmp = path.with_name(tmp_name or default_tmp_name(path))
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        durable_replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_bytes(path: Path, data: bytes, tmp_name: str | None = None) -> None:
    with atomic_file(path, "wb", tmp_name) as f:
        f.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling path for writers that want a path, not a file (Parquet, safetensors).

    Whatever the body leaves there is fsync'd and replaces ``path`` on a clean exit; on an error it vanishes.
    """
    path = Path(path)
    tmp = path.with_name(default_tmp_name(path))
    try:
        yield tmp
        fsync_file(tmp)
        durable_replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def durable_replace(src: Path, dst: Path) -> None:
    """``os.replace`` whose result survives a power cut: the directory entry is fsync'd too."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def fsync_tree(root: Path) -> None:
    """Every file and folder under ``root`` (itself included) on disk; symlinks are not followed."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                fsync_file(p)
        fsync_dir(Path(dirpath))


@contextlib.contextmanager
def directory_lock(directory: Path, name: str) -> Iterator[None]:
    """Exclusive ``flock`` on ``directory/name`` (created with the directory): writers of one directory
    take turns, across processes, and a crashed holder's lock goes with its process."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------
# Directory publication: a public name that always resolves to one complete version

PUBLISHED_DIR = ".published"
PUBLISH_GRACE_S = 600.0
_LOCK_NAME = ".lock"
_VERSION = re.compile(r"^(\d{20})-[0-9a-z]+$")
_STAGED = re.compile(r"^\.tmp-(.+)-(\d+)-[0-9a-f]+$")


def versions_dir(public: Path) -> Path:
    """Where the versions of ``public`` live: beside it, so that every rename stays on one filesystem."""
    public = Path(public)
    return public.parent / PUBLISHED_DIR / public.name


def host_tag() -> str:
    """This host's name as it appears in temporary names (a shared filesystem is swept per host)."""
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def pid_alive(pid: int) -> bool:
    """Whether a process of this host still holds ``pid`` (then its temporaries are not leftovers)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_versions_dir(public: Path) -> Path:
    # Made with the public folder's parent's mode, not the umask's: a server running as another user must be
    # able to pass through to a version exactly as it could reach the public name.
    root = versions_dir(public)
    mode = stat.S_IMODE(public.parent.stat().st_mode)
    for d in (root.parent, root):
        if not d.is_dir():
            d.mkdir(exist_ok=True)
            d.chmod(mode)
    return root


def stage_directory(public: Path) -> Path:
    """A new empty folder to fill with the next version of ``public``; hand it to ``publish_directory``.

    Its name carries host and pid, so that a crashed builder's leftover is recognised and swept.
    """
    public = Path(public)
    public.parent.mkdir(parents=True, exist_ok=True)
    staged = _make_versions_dir(public) / f".tmp-{host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staged.mkdir()
    return staged


def discard_staged(staged: Path) -> None:
    """Remove a staged folder that will not be published (no-op once it has been)."""
    shutil.rmtree(staged, ignore_errors=True)


def _version_name(tag: str | None = None, stamp_ns: int | None = None) -> str:
    return f"{time.time_ns() if stamp_ns is None else stamp_ns:020d}-{tag or uuid.uuid4().hex[:8]}"


def _swap_link(public: Path, version: Path) -> None:
    """Point ``public`` at ``version`` in one rename (a relative link: the tree may be moved or mounted)."""
    link = version.parent / f".link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(os.path.relpath(version, public.parent), target_is_directory=True)
    try:
        if public.is_dir() and not public.is_symlink():
            # Stamped just before the new version: it is the previous one, kept like any other.
            _adopt_real_directory(public, link, link.parent / _version_name("legacy", _stamp_ns(version) - 1))
        else:
            os.replace(link, public)
        fsync_dir(public.parent)
    finally:
        if link.is_symlink():
            link.unlink()


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two names (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _adopt_real_directory(public: Path, link: Path, kept_as: Path) -> None:
    """Once, for a layout from before versions: the real folder at ``public`` becomes a kept version.

    Exchanged with the new link in one step where the kernel and filesystem can (then ``public`` never
    goes missing); elsewhere moved aside and replaced, which leaves a moment without it, this once.
    """
    if _exchange(link, public):
        os.rename(link, kept_as)  # ``link`` now names the old folder
    else:
        os.rename(public, kept_as)
        os.replace(link, public)
    fsync_dir(kept_as.parent)


def _stamp_ns(version: Path) -> int:
    m = _VERSION.match(version.name)
    assert m is not None
    return int(m.group(1))


def current_version(public: Path) -> Path | None:
    """The version folder ``public`` points at, or None when it is not a link into its versions."""
    try:
        target = os.readlink(public)
    except OSError:
        return None
    version = (Path(public).parent / target).resolve()
    return version if version.parent == versions_dir(public).resolve() else None


def publish_directory(public: Path, staged: Path, *, grace_s: float = PUBLISH_GRACE_S) -> Path:
    """Make the complete folder ``staged`` (from ``stage_directory``) what ``public`` resolves to; returns
    the version folder it became.

    The folder is fsync'd and renamed to a version name, then the link is swapped; a crash before the swap
    leaves the previous version published (the unpublished folder is swept later). Publishers take turns.
    """
    public, staged = Path(public), Path(staged)
    root = versions_dir(public)
    if staged.parent != root:
        raise ValueError(f"{staged} was not staged for {public} (use stage_directory)")
    fsync_tree(staged)
    with directory_lock(root, _LOCK_NAME):
        prune_versions(public, grace_s=grace_s, locked=True)  # a failed publisher's version first
        version = root / _version_name()
        os.rename(staged, version)
        fsync_dir(root)
        _swap_link(public, version)
        prune_versions(public, grace_s=grace_s, locked=True)
    return version


@contextlib.contextmanager
def publishing_directory(public: Path, *, grace_s: float = PUBLISH_GRACE_S) -> Iterator[Path]:
    """Yield a staged folder to fill; on a clean exit it is published as ``public``, on an error it vanishes."""
    staged = stage_directory(public)
    try:
        yield staged
        publish_directory(public, staged, grace_s=grace_s)
    finally:
        discard_staged(staged)


def prune_versions(public: Path, *, grace_s: float = PUBLISH_GRACE_S, locked: bool = False) -> list[Path]:
    """Remove what no reader can still need: versions superseded more than ``grace_s`` ago beyond the newest
    one before the current one, versions that were never published, and dead builders' staged folders."""
    root = versions_dir(public)
    if not root.is_dir():
        return []
    if not locked:
        with directory_lock(root, _LOCK_NAME):
            return prune_versions(public, grace_s=grace_s, locked=True)
    current = current_version(public)
    now = time.time_ns()
    removed: list[Path] = []
    versions = sorted(p for p in root.iterdir() if _VERSION.match(p.name) and p.is_dir() and not p.is_symlink())
    older = [v for v in versions if current is not None and v.name < current.name]
    kept = set(older[-1:])
    for i, v in enumerate(versions):
        if (current is not None and v.name == current.name) or v in kept:
            continue
        if v in older:  # superseded when the next one was made: a reader may still hold it for a while
            if (now - _stamp_ns(versions[i + 1])) / 1e9 < grace_s:
                continue
        elif current is None and (now - _stamp_ns(v)) / 1e9 < grace_s:
            continue  # nothing published to compare with (the name was removed or is not ours yet): by age
        # else newer than the current one: made by a publisher that failed before its swap (swaps happen under
        # the lock we hold), so never published and nobody's to read
        shutil.rmtree(v, ignore_errors=True)
        removed.append(v)
    for p in root.iterdir():
        if p.name.startswith(".link-"):  # a crash inside a swap (under this lock: nobody is swapping now)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)  # an adopted old folder: no path leads to it any more
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        elif (m := _STAGED.match(p.name)) and m.group(1) == host_tag() and not pid_alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
