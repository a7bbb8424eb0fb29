"""Target features for EAGLE-3 training: aux-layer hidden states and the last hidden state, on disk.

Which file decides what:

- ``layers``: which target layers feed the draft (HF ``output_hidden_states`` indices) and each engine's spelling.
- ``samples``: what one input row is (ids, loss mask) and the fingerprint that marks a shard's inputs.
- ``store_format``: what a store is: its files, settings (``StoreMeta``), dtypes and errors.
- ``store_space``: how many bytes a store takes and whether the disk has them.
- ``shard_file``: one shard file's byte layout, its streaming writer, and whether a file on disk is whole.
- ``store_writer``: ``index.json``: settings check, which shards are done, what was committed.
- ``store``: reading a store (``HiddenStateStore``); ``store_set``: several partitions' stores read as one.
- ``pipeline``: the backend-independent extraction loop (batches, resume, streaming into the store).
- ``extract_hf``: backend 1, a Hugging Face model in this process.
- ``extract_sglang``: backend 2, SGLang engines with tensor parallelism (SGLang optional): config, client, passes.
- ``sglang_wire``: what an SGLang engine is sent and how its answer becomes rows.
- ``capture_draft``: the zero-weight EAGLE-3 draft that makes SGLang capture the aux layers.
- ``fidelity_spec``: the checks' names and settings (torch-free); ``fidelity``: what the checks share (positions,
  signatures, figures, the calibration file).
- ``calibration`` / ``calibration_sglang``: the target run in full on a few samples, in process / through SGLang.
- ``fidelity_checks``: the three checks over a store; ``store_shard``: a shard as they read it; ``check_verdict``:
  figures against thresholds; ``check_alignment``, ``check_aux_layers``, ``check_next_token``: one check each.
- ``online_features`` / ``online_fidelity``: the per-batch features of an online run and its fidelity gate.

What the draft shares with the extraction about the target (sizes, decoder and final norm, the aux-id rule) is in
``eagle_assets.target.architecture``; the frozen head that recomputes logits from the store is
``eagle_assets.draft.target.TargetHead``.

Submodules are imported explicitly (``from eagle_assets.hidden_states.store import ...``) so that
importing the package does not load torch-heavy code.
"""
