"""The dollar and token ledger shared by every process that spends money.

Dagster runs each step in its own process, so in-memory counters cannot hold a budget: these are tables every
generation step opens (a SQLite file, or PostgreSQL shared by several hosts). A request is admitted only once
*reserved* here, and its actual cost *settles* it; what a reservation holds is ``admission``'s to say, the ledger
keeps what that needs across processes and restarts, and the account-wide in-flight cap (``lease_slots``).
``BudgetLedger`` is the one public face, joined as mixins from one role a module. The named leases
(``partition_fence``, ``database_lease``) live outside the package; the ledger frees a gone owner's leases itself.
"""

import os
import time
import uuid
from pathlib import Path

from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.ledger.account import AccountSettingsConflict
from eagle_assets.generation.ledger.database import open_database
from eagle_assets.generation.ledger.key_usage import KeyUsageRole
from eagle_assets.generation.ledger.owners import LedgerLeaseLost
from eagle_assets.generation.ledger.records import (
    NANO,
    AccountSettings,
    Denial,
    KeyUsageCheck,
    Outlook,
    Reservation,
    ReservationRequest,
    Settlement,
    Totals,
    UncertainAttempt,
)
from eagle_assets.generation.ledger.reservations import ReservationsRole
from eagle_assets.generation.ledger.schema import ADDED_COLUMNS, INDEXES, SCHEMA
from eagle_assets.generation.ledger.uncertain import UncertainRole
from eagle_assets.generation.liveness import Heartbeat, host_id, lease_seconds
from eagle_assets.generation.partition_fence import PartitionFence

__all__ = [
    "NANO",
    "AccountSettings",
    "AccountSettingsConflict",
    "BudgetLedger",
    "Denial",
    "KeyUsageCheck",
    "LedgerLeaseLost",
    "Outlook",
    "Reservation",
    "ReservationRequest",
    "Settlement",
    "Totals",
    "UncertainAttempt",
]


class BudgetLedger(ReservationsRole, UncertainRole, KeyUsageRole):
    """One connection per process; every public method is one short transaction.

    ``lease_s``: how long this owner counts as alive without a heartbeat (``EAGLE_FORGE_LEASE_S``), renewed every
    ``lease_s / 6``. ``account``: the budget and in-flight cap this run spends under, checked against the live
    runs'; None for a process that only reads or settles (the plan, an observer).
    """

    def __init__(
        self,
        location: str | Path,
        owner: str | None = None,
        policy: AdmissionPolicy | None = None,
        lease_s: float | None = None,
        account: AccountSettings | None = None,
    ) -> None:
        self.db = open_database(location)
        self.location = self.db.description
        self.policy = policy or AdmissionPolicy()
        self.lease_s = lease_s or lease_seconds()
        self.host = host_id()
        self.account = account
        self.account_change = None
        self.owner = owner or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            self.db.create_schema(SCHEMA, ADDED_COLUMNS, INDEXES)
            self._register()
        except BaseException:
            self.db.close()
            raise
        self._last_dead_check = time.monotonic()
        self._model_cache = None
        self._beat_db = self.db.another()
        self.heartbeat = Heartbeat(self._beat, interval_s=self.lease_s / 6)
        self.recover_dead_owners()

    def partition_fence(self, partition: str) -> PartitionFence:
        """The database lease that makes this process the only writer of ``partition``'s journal."""
        return PartitionFence(self, partition)
