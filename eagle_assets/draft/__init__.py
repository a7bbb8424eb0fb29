"""EAGLE-3 draft model: vocabulary map, model, training-time test, training, export, speculative decoding.

Plain torch (no Dagster here): the asset layer wraps these functions. See ``docs/eagle3.md`` for the
algorithm; module docstrings record the conventions chosen where the spec leaves room.
"""
