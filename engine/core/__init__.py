"""The core loop: requests in, one scheduled step at a time (token budget, paged KV blocks, prefix cache), stream
deltas out. Pure logic except ``llm_engine``, which drives a runner.
"""
