"""The cold-start benchmark's request stream: seeded, within its bounds, prefixes shared, passes disjoint."""

from __future__ import annotations

from benchmarks.cold_start import make_stream, prompt_ids

ARGS = {"seed": 3, "max_concurrency": 64, "min_prompt": 16, "max_prompt": 4000, "shared_prefixes": 4, "cached": 0.5}


def test_the_stream_is_seeded_and_stays_within_its_bounds() -> None:
    requests, prefix_lens = make_stream(300, **ARGS)
    assert (requests, prefix_lens) == make_stream(300, **ARGS)
    assert len(requests) == 300 and [r.index for r in requests] == list(range(300))
    assert all(16 <= r.prompt_len <= 4000 and 1 <= r.concurrency <= 64 for r in requests)
    assert all(r.prefix_len < r.prompt_len for r in requests)
    waves: dict[int, int] = {}
    for r in requests:
        waves[r.wave] = waves.get(r.wave, 0) + 1
    assert all(size <= next(r.concurrency for r in requests if r.wave == w) for w, size in waves.items())
    assert len({r.concurrency for r in requests}) > 5  # batch sizes vary
    assert 0 < sum(r.prefix >= 0 for r in requests) < 300


def test_requests_of_one_prefix_share_it_and_a_shifted_pass_shares_nothing() -> None:
    requests, _ = make_stream(200, **ARGS)
    a, b = [r for r in requests if r.prefix == 0 and r.prefix_len > 20][:2]
    ids_a, ids_b = (prompt_ids(r, seed=3, shift=0, vocab_size=1000) for r in (a, b))
    common = min(a.prefix_len, b.prefix_len)
    assert ids_a[:common] == ids_b[:common] and len(ids_a) == a.prompt_len
    shifted = prompt_ids(a, seed=3, shift=7919, vocab_size=1000)
    assert len(shifted) == len(ids_a) and all(x != y for x, y in zip(shifted, ids_a))
    assert all(3 <= t < 1000 for t in ids_a + shifted)
