"""Benchmarks: each module runs as ``python -m benchmarks.NAME`` from the checkout root (``--help`` says how)."""
