"""GPU kernels and their pure-torch twins, one module per kernel family.

``kernels.reference`` is the spec (pure torch, runs anywhere). The Triton modules
(``paged_attention``, ``kv_cache``, ``norm``, ``rotary``, ``activation``, ``argmax``, ``gemv``) share its
signatures.
Importing this package imports nothing, so machines without Triton or a GPU can use the reference.
"""
