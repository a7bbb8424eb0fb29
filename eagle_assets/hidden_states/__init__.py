"""Target features for EAGLE-3 training: aux-layer hidden states and the last hidden state, on disk.

Submodules are imported explicitly, so that importing the package does not load torch (docs/layout.md maps them).
"""
