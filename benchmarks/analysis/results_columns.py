"""The results page's columns that a path alone cannot say: getters that compute a figure from a run's records,
and builders of columns several tables share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.analysis.results_paths import Col, Getter, Record, number, read_path
from benchmarks.lib.voice_client import STAGE_NAMES, STAGES


def ms_col(header: str, real: str | None = None, hist: str | None = None) -> Col:
    """A column of milliseconds from seconds in the run's records."""
    return Col(header, real, hist, scale=1e3)


def _copy_shares(records: Sequence[Record]) -> list[float]:
    """Per attention case, the best share of copy bandwidth over the configs the run swept."""
    best: dict[Any, float] = {}
    for r in records:
        if r.get("kind") == "decode":
            case = (r["hq"], r["hkv"], r["batch"], r["ctx"])
            best[case] = max(best.get(case, 0.0), r["frac_copy"])
        for i, case in enumerate(r.get("decode", []) if r.get("kind") == "history" else []):
            best[i] = case["frac_copy"]
    return list(best.values())


def cases(records: Sequence[Record], _key: str) -> float | None:
    """kernels: the attention cases the run measured."""
    return len(_copy_shares(records)) or None


def cases_at_80(records: Sequence[Record], _key: str) -> float | None:
    """kernels: the cases whose best config reached 80% of copy bandwidth."""
    shares = _copy_shares(records)
    return sum(s >= 0.8 for s in shares) if shares else None


def best_share(records: Sequence[Record], _key: str) -> float | None:
    """kernels: the best share of copy bandwidth over all cases."""
    return max(_copy_shares(records), default=None)


def _gemv_ratios(records: Sequence[Record]) -> list[float]:
    shapes = [r for r in records if r.get("kind") == "shape"] + [s for r in records for s in r.get("shapes", [])]
    return [s["cublas_us"] / s.get("default_us", s.get("best_us")) for s in shapes if "cublas_us" in s]


def gemv_min(records: Sequence[Record], _key: str) -> float | None:
    """gemv: the least ratio of cuBLAS's time to ours over the shapes."""
    return min(_gemv_ratios(records), default=None)


def gemv_max(records: Sequence[Record], _key: str) -> float | None:
    """gemv: the greatest ratio of cuBLAS's time to ours over the shapes."""
    return max(_gemv_ratios(records), default=None)


def gemv_shapes(records: Sequence[Record], _key: str) -> float | None:
    """gemv: the shapes timed against cuBLAS."""
    return len(_gemv_ratios(records)) or None


def _server_vad(key: str) -> bool:
    return key.rsplit(",", 1)[-1] == "server_vad"


def voice(header: str, new: str | None = None, old: str | None = None, hist: str | None = None, ms: bool = True) -> Col:
    """A column of a voice table whose row key ends in the turn detector: ``new`` reads a run's records of that
    detector; ``old`` (paths to records without ``turn_detection``) and ``hist`` read runs from before
    ``--turn-detection``, whose one detector was server VAD with 500 ms of silence, in the server_vad rows alone."""

    def real(records: Sequence[Record], key: str) -> float | None:
        value = read_path(records, new, key, history=False)
        return read_path(records, old, key, history=False) if value is None and _server_vad(key) else value

    def history(records: Sequence[Record], key: str) -> float | None:
        return read_path(records, hist, key, history=True) if _server_vad(key) else None

    return Col(header, real, history, scale=1e3 if ms else 1.0)


def wait_cols(summary: str) -> tuple[Col, ...]:
    """The wait from the end of speech to the first audio delta, its stages (means, which add up to the mean wait)
    and the replies' underruns, from the ``summary`` records of a run per turn detector."""
    return (
        voice("end of speech → first audio p50 ms", f"{summary}:latency_p50_s"),
        voice("p90 ms", f"{summary}:latency_p90_s"),
        voice("p99 ms", f"{summary}:latency_p99_s"),
        *(voice(f"{STAGE_NAMES[stage]} mean ms", f"{summary}:{stage}_mean_s") for stage in STAGES),
        voice("underruns", f"{summary}:underruns", ms=False),
    )


def turn_variant(field: str) -> Getter:
    """A turn_decisions figure of the variant named by the row key (the name up to its colon: the eagerness, or
    "before"): the names hold commas, which a path's filter cannot."""

    def read(records: Sequence[Record], key: str) -> float | None:
        found = [r.get(field) for r in records if r.get("kind") == "variant" and r["variant"].split(":")[0] == key]
        return number(found[0]) if found else None

    return read


def sweep(shape: str) -> Col:
    """A quant_sweep column: bf16's least time on ``shape`` over the least of the row key's format, one-row
    calls that ran correctly."""
    best = f"min decode|final[shape={shape},variant={{}},rows=1,ok=True]"
    return Col(f"{shape} vs bf16", f"{best}:bf16_us / {best}:us")


def where(kind: str, field: str, **match: str) -> Getter:
    """``field`` of the first ``kind`` record whose fields equal ``match`` (values that hold commas, which a
    path's filter cannot)."""

    def read(records: Sequence[Record], _key: str) -> float | None:
        found = [
            r.get(field) for r in records if r.get("kind") == kind and all(r.get(k) == v for k, v in match.items())
        ]
        return number(found[0]) if found else None

    return read
