"""The EAGLE-3 draft in plain torch (no Dagster: the asset layer wraps it); docs/layout.md names its modules."""
