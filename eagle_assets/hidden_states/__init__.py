"""Target features for EAGLE-3 training: aux-layer hidden states and the last hidden state, on disk.

- ``layers``: which layers (HF ``output_hidden_states`` indices) and their SGLang / vLLM spellings.
- ``store``: the sharded safetensors store (atomic, resumable) and its reader ``HiddenStateStore``.
- ``pipeline``: the backend-independent extraction loop.
- ``extract_hf``: backend 1, a Hugging Face model in this process.
- ``extract_sglang``: backend 2, an SGLang engine with tensor parallelism (SGLang optional).
- the target's frozen head that recomputes logits from the store: ``eagle_assets.draft.target.TargetHead``.

Submodules are imported explicitly (``from eagle_assets.hidden_states.store import ...``) so that
importing the package does not load torch-heavy code.
"""
