"""A SQLite ledger is refused where several hosts would split or share it: a network mount, a pod per step."""

from pathlib import Path

import pytest

from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.ledger.database import SQLiteLedgerRefused, check_sqlite_location, mount_of, network_mount

MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
fs-0123.efs.us-east-1.amazonaws.com:/ /shared nfs4 rw,vers=4.1,hard,proto=tcp 0 0
/dev/nvme0n1 /shared/local-scratch xfs rw 0 0
10.0.0.5@tcp:/lustre /lustre lustre rw 0 0
sshfs#me@host: /mnt/remote\\040home fuse.sshfs rw 0 0
/dev/sdb1 /mnt/usb fuseblk rw 0 0
//nas/share /mnt/nas cifs rw 0 0
127.0.0.1:/efs /efs efs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/shared/home/state/ledger.sqlite", "nfs4"),
        ("/lustre/x/ledger.sqlite", "lustre"),
        ("/mnt/remote home/ledger.sqlite", "fuse.sshfs"),  # /proc/mounts writes the space as \040
        ("/mnt/nas/ledger.sqlite", "cifs"),
        ("/efs/ledger.sqlite", "efs"),
    ],
)
def test_a_sqlite_ledger_on_a_network_mount_is_refused_naming_the_mount_and_the_setting(path, kind):
    assert network_mount(Path(path), MOUNTS) is not None
    with pytest.raises(SQLiteLedgerRefused) as err:
        check_sqlite_location(Path(path), MOUNTS, executor="")
    assert f"a {kind} mount" in str(err.value) and "EAGLE_FORGE_DATABASE_URL" in str(err.value)


@pytest.mark.parametrize(
    "path",
    [
        "/home/me/.eagle_forge/state/ledger.sqlite",  # the root's ext4
        "/shared/local-scratch/ledger.sqlite",  # a local disk mounted inside the shared one: the deeper mount wins
        "/mnt/usb/ledger.sqlite",  # fuseblk: a local block device
        "/sharedother/ledger.sqlite",  # a name that only starts like a mount point
    ],
)
def test_a_sqlite_ledger_on_a_local_disk_is_accepted(path):
    check_sqlite_location(Path(path), MOUNTS, executor="")
    assert network_mount(Path(path), MOUNTS) is None


def test_the_last_mount_over_a_point_wins():
    over = MOUNTS + "tmpfs /shared tmpfs rw 0 0\n"
    assert mount_of(Path("/shared/x"), over) == ("/shared", "tmpfs")
    assert mount_of(Path("/shared/x"), MOUNTS) == ("/shared", "nfs4")


def test_a_pod_per_step_without_a_database_url_is_refused(tmp_path, monkeypatch):
    with pytest.raises(SQLiteLedgerRefused, match=r"EAGLE_FORGE_EXECUTOR=k8s.*EAGLE_FORGE_DATABASE_URL"):
        check_sqlite_location(tmp_path / "ledger.sqlite", "", executor="k8s")
    monkeypatch.setenv("EAGLE_FORGE_EXECUTOR", "k8s")
    with pytest.raises(SQLiteLedgerRefused, match="each pod would keep its own budget"):
        BudgetLedger(tmp_path / "ledger.sqlite")
    assert not (tmp_path / "ledger.sqlite").exists()  # refused before anything was created
    monkeypatch.delenv("EAGLE_FORGE_EXECUTOR")
    BudgetLedger(tmp_path / "ledger.sqlite").close()  # one machine, the embedded default


def test_a_pod_per_step_with_postgres_is_accepted(monkeypatch, fresh_pg_database):
    monkeypatch.setenv("EAGLE_FORGE_EXECUTOR", "k8s")
    BudgetLedger(fresh_pg_database()).close()
