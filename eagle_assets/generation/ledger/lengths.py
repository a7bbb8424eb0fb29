"""The completion-length statistics admission stands on: each dataset's answers folded into moments once every
earlier admission of the dataset has closed (``admission.cohort_moments``), and the model each dataset names."""

from dataclasses import astuple

from eagle_assets.generation.admission import AdmissionPolicy, LengthModel, Moments, cohort_moments
from eagle_assets.generation.ledger.base import LedgerBase, reconnecting
from eagle_assets.generation.ledger.database import Cursor


class LengthsRole(LedgerBase):
    _model_cache: tuple[tuple[Moments, int, AdmissionPolicy], LengthModel | None] | None

    @reconnecting(idempotent=True)
    def length_moments(self, dataset: str) -> Moments:
        """The completion-length statistics admission uses for ``dataset`` (completed cohorts only)."""
        with self.db.read() as cur:
            return self._moments(cur, dataset)

    @reconnecting(idempotent=True)
    def note_model(self, dataset: str, model: str) -> None:
        """Record which model answers ``dataset``: other datasets of that model may seed its statistics."""
        with self.db.tx() as cur:
            cur.execute("INSERT INTO lengths(dataset) VALUES (?) ON CONFLICT DO NOTHING", (dataset,))
            cur.execute("UPDATE lengths SET model = ? WHERE dataset = ?", (model, dataset))

    @reconnecting(idempotent=True)
    def dataset_lengths(self) -> dict[str, tuple[str, Moments]]:
        """dataset → (model, the completed-cohort moments admission uses), for every dataset on the ledger."""
        with self.db.read() as cur:
            rows = cur.execute("SELECT dataset, model, eff_n, eff_s1, eff_s2, eff_s3, eff_s4 FROM lengths").fetchall()
        return {d: (model, Moments(*m)) for d, model, *m in rows}

    @staticmethod
    def _seed_moments(cur: Cursor, dataset: str) -> Moments:
        """The pooled answers of the other datasets of ``dataset``'s model (empty if its model is unknown)."""
        row = cur.execute("SELECT model FROM lengths WHERE dataset = ?", (dataset,)).fetchone()
        if not row or not row[0]:
            return Moments()
        n, s1, s2, s3, s4 = cur.execute(
            "SELECT COALESCE(SUM(eff_n), 0), COALESCE(SUM(eff_s1), 0), COALESCE(SUM(eff_s2), 0),"
            " COALESCE(SUM(eff_s3), 0), COALESCE(SUM(eff_s4), 0) FROM lengths WHERE model = ? AND dataset != ?",
            (row[0], dataset),
        ).fetchone()
        return Moments(int(n), s1, s2, s3, s4)

    def length_model(self, dataset: str, max_tokens: int) -> LengthModel | None:
        return LengthModel.from_moments(self.length_moments(dataset), self.policy, max_tokens)

    @staticmethod
    def _moments(cur: Cursor, dataset: str) -> Moments:
        row = cur.execute(
            "SELECT eff_n, eff_s1, eff_s2, eff_s3, eff_s4 FROM lengths WHERE dataset = ?", (dataset,)
        ).fetchone()
        return Moments(*row) if row else Moments()

    def _model(self, moments: Moments, max_tokens: int) -> LengthModel | None:
        """``LengthModel.from_moments``, remembered: a chunk of requests asks the same question many times."""
        key = (moments, max_tokens, self.policy)
        if self._model_cache is None or self._model_cache[0] != key:
            self._model_cache = (key, LengthModel.from_moments(moments, self.policy, max_tokens))
        return self._model_cache[1]

    def _refresh_lengths(self, cur: Cursor, dataset: str) -> None:
        """Fold answers below the oldest open admission into the dataset's statistics (see ``cohort_moments``)."""
        row = cur.execute("SELECT next_seq, n, s1, s2, s3, s4 FROM lengths WHERE dataset = ?", (dataset,)).fetchone()
        if row is None:
            return
        next_seq, *folded_row = row
        (frontier,) = cur.execute("SELECT MIN(seq) FROM reservations WHERE dataset = ?", (dataset,)).fetchone()
        frontier = next_seq if frontier is None else frontier
        n, s1, s2, s3, s4 = cur.execute(
            "SELECT COUNT(*), COALESCE(SUM(tokens * 1.0), 0), COALESCE(SUM(tokens * tokens * 1.0), 0),"
            " COALESCE(SUM(tokens * tokens * tokens * 1.0), 0),"
            " COALESCE(SUM(tokens * tokens * 1.0 * tokens * tokens), 0) FROM answers WHERE dataset = ? AND seq < ?",
            (dataset, frontier),
        ).fetchone()
        folded = Moments(*folded_row)
        if n:
            folded = folded + Moments(n, s1, s2, s3, s4)
            cur.execute("DELETE FROM answers WHERE dataset = ? AND seq < ?", (dataset, frontier))
        effective = folded
        if folded.n < self.policy.min_samples:
            settled = cur.execute("SELECT seq, tokens FROM answers WHERE dataset = ?", (dataset,)).fetchall()
            open_ = cur.execute("SELECT seq, tokens FROM reservations WHERE dataset = ?", (dataset,)).fetchall()
            effective = cohort_moments(folded, settled, open_, self.policy.cohort_slack)
        cur.execute(
            "UPDATE lengths SET n=?, s1=?, s2=?, s3=?, s4=?, eff_n=?, eff_s1=?, eff_s2=?, eff_s3=?, eff_s4=?"
            " WHERE dataset = ?",
            (*astuple(folded), *astuple(effective), dataset),
        )
