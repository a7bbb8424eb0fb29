"""The ledger's tables, and the columns an older ledger gains when a newer release opens it (``create_schema`` adds
what is missing, under the write lock)."""

# partition_leases: one table for every named lease (``database_lease``), held by owners. A partition's journal uses
# its partition key as the name (the column's name is historical), folder writers ``dir:<path>``
# (``folder_lease_name``), so the two never meet.
SCHEMA = """
CREATE TABLE IF NOT EXISTS owners (
  owner TEXT PRIMARY KEY, pid INTEGER NOT NULL, create_time REAL NOT NULL, started REAL NOT NULL);
CREATE TABLE IF NOT EXISTS reservations (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, dataset TEXT NOT NULL, partition TEXT NOT NULL,
  prompt_id TEXT NOT NULL, usd INTEGER NOT NULL, tokens INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS spend (
  id TEXT PRIMARY KEY, dataset TEXT NOT NULL, partition TEXT NOT NULL, prompt_id TEXT NOT NULL,
  usd INTEGER NOT NULL, tokens INTEGER NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS totals (
  scope TEXT PRIMARY KEY, usd_spent INTEGER NOT NULL DEFAULT 0, usd_reserved INTEGER NOT NULL DEFAULT 0,
  tokens_spent INTEGER NOT NULL DEFAULT 0, tokens_reserved INTEGER NOT NULL DEFAULT 0,
  in_flight INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS lengths (
  dataset TEXT PRIMARY KEY, next_seq INTEGER NOT NULL DEFAULT 1,
  n INTEGER NOT NULL DEFAULT 0, s1 REAL NOT NULL DEFAULT 0, s2 REAL NOT NULL DEFAULT 0,
  s3 REAL NOT NULL DEFAULT 0, s4 REAL NOT NULL DEFAULT 0,
  eff_n INTEGER NOT NULL DEFAULT 0, eff_s1 REAL NOT NULL DEFAULT 0, eff_s2 REAL NOT NULL DEFAULT 0,
  eff_s3 REAL NOT NULL DEFAULT 0, eff_s4 REAL NOT NULL DEFAULT 0,
  paid REAL NOT NULL DEFAULT 0, priced REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS answers (dataset TEXT NOT NULL, seq INTEGER NOT NULL, tokens INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS slots (owner TEXT PRIMARY KEY, want INTEGER NOT NULL, held INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS uncertain (
  generation_id TEXT PRIMARY KEY, spend_id TEXT NOT NULL, dataset TEXT NOT NULL, partition TEXT NOT NULL,
  prompt_id TEXT NOT NULL, provisional_usd INTEGER NOT NULL, charged_at REAL NOT NULL,
  lookups INTEGER NOT NULL DEFAULT 0, next_lookup REAL NOT NULL);
CREATE TABLE IF NOT EXISTS account (
  id INTEGER PRIMARY KEY, budget_usd INTEGER NOT NULL, max_in_flight INTEGER NOT NULL,
  set_by TEXT NOT NULL, set_host TEXT NOT NULL, set_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS account_changes (
  at REAL NOT NULL, owner TEXT NOT NULL, host TEXT NOT NULL, budget_before INTEGER, budget_after INTEGER NOT NULL,
  max_in_flight_before INTEGER, max_in_flight_after INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS key_usage (id INTEGER PRIMARY KEY, offset_usd BIGINT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS reservations_owner ON reservations(owner);
CREATE INDEX IF NOT EXISTS uncertain_due ON uncertain(next_lookup);
CREATE INDEX IF NOT EXISTS spend_partition ON spend(partition, kind);
CREATE INDEX IF NOT EXISTS answers_seq ON answers(dataset, seq);
CREATE TABLE IF NOT EXISTS partition_leases (
  partition TEXT PRIMARY KEY, holder TEXT, token INTEGER NOT NULL DEFAULT 0, acquired REAL NOT NULL DEFAULT 0);
"""
# Created once the columns they index exist (older ledgers gain those columns first).
INDEXES = "CREATE INDEX IF NOT EXISTS reservations_seq ON reservations(dataset, seq)"
# Columns added to reservations after the first release; rows of an older ledger read as hard
# worst-case reservations (prompt part = everything, no completion price), which is what they were.
ADDED_COLUMNS = {
    "reservations": {
        "seq": "INTEGER NOT NULL DEFAULT 0",
        "hard": "INTEGER NOT NULL DEFAULT 1",
        "prompt_usd": "INTEGER NOT NULL DEFAULT 0",
        "price": "REAL NOT NULL DEFAULT 0",
        # The attempt's generation id once its response head arrived: an orphan with one is settled later.
        "generation_id": "TEXT DEFAULT NULL",
        # Whether a request may have gone out for it (``mark_sent``, written before the send): an orphan that
        # was only reserved ahead is released, not charged. Older rows read as sent, which is the safe side.
        "sent": "INTEGER NOT NULL DEFAULT 1",
    },
    # model: what generated the dataset's answers, so that a fresh dataset of the same model can start from them.
    "lengths": {
        "paid": "REAL NOT NULL DEFAULT 0",
        "priced": "REAL NOT NULL DEFAULT 0",
        "model": "TEXT NOT NULL DEFAULT ''",
    },
    # Owners of an older ledger have no lease (host ''): they are judged by their pid, as they were.
    # budget_usd, max_in_flight: the account settings a spending owner runs with (NULL: one that only reads).
    "owners": {
        "host": "TEXT NOT NULL DEFAULT ''",
        "heartbeat": "REAL NOT NULL DEFAULT 0",
        "lease_s": "REAL NOT NULL DEFAULT 0",
        "budget_usd": "INTEGER DEFAULT NULL",
        "max_in_flight": "INTEGER DEFAULT NULL",
    },
}
