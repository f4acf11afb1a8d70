"""The results page, ``docs/benchmarks.md``, written from the raw runs in ``benchmarks/results/``.

    python -m benchmarks.analysis.results_page            # rewrite the page
    python -m benchmarks.analysis.results_page --check    # exit 1 when the page on disk is not what it would write

A run is a ``run`` record and the records carrying its ``run_id`` (``benchmarks.lib.common.ResultLog``);
``history.jsonl`` holds older runs transcribed one record per run, which enter as runs of their benchmark at their
recorded date, so a newer real run supersedes them (and one dated as a run the files hold is dropped). Each table
shows, per machine, variant (the values of the command options it names) and row key, the newest run that
measured that row, one number a cell. A benchmark of the results that no table shows and ``NOT_SHOWN`` does not
list, a table without runs, or a newest run from which its table reads nothing is an error: results are never
dropped silently.

A column reads a record field with a path ``kind[field=value,...]:dotted.path`` (the first record of that kind,
or of one of ``kind|kind``, with those fields; ``field=None`` picks records without the field), ``min kind[...]:path``
(the least over all of them), or ``A / B`` (a ratio of two paths); ``{}`` takes the row key (``{},{}`` keys carry
two, shown in columns of their own). A history record's metrics are read with a plain dotted path.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.common import RESULTS_DIR, read_results
from benchmarks.lib.voice_client import STAGE_NAMES, STAGES, TURN_DETECTIONS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MAX_LINES = 250
MISSING = "–"

Record = dict[str, Any]
Getter = Callable[[Sequence[Record], str], float | None]


class PageError(ValueError):
    """The results hold something the page cannot show, or a table reads nothing from its newest run."""


@dataclass(frozen=True)
class Run:
    benchmark: str
    machine: str
    date: str  # "YYYY-MM-DD HH:MM" (UTC) or "YYYY-MM-DD"
    command: str
    order: int  # position among all runs read: ties of date go to the later one
    history: bool
    records: tuple[Record, ...]


@dataclass(frozen=True)
class Col:
    header: str
    real: str | Getter | None = None  # path into a run's records (its run record first)
    hist: str | Getter | None = None  # path into a history record's metrics, transcribed in the column's unit
    scale: float = 1.0  # from a run record's unit to the column's


@dataclass(frozen=True)
class Table:
    area: str
    benchmark: str
    cols: tuple[Col, ...]
    key: str = ""  # header of the row-key column; "" for one row per run
    rows: tuple[str, ...] = ("",)
    variant: tuple[str, ...] = ()  # command options whose values tell runs apart
    needs: tuple[str, ...] = ()  # options a run's command must hold to belong here
    skips: tuple[str, ...] = ()  # options it must not hold


def _ms(header: str, real: str | None = None, hist: str | None = None) -> Col:
    """A column of milliseconds from seconds in the run's records."""
    return Col(header, real, hist, scale=1e3)


# --------------------------------------------------------------------------- getters for what a path cannot say


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


def _cases(records: Sequence[Record], _key: str) -> float | None:
    return len(_copy_shares(records)) or None


def _cases_at_80(records: Sequence[Record], _key: str) -> float | None:
    shares = _copy_shares(records)
    return sum(s >= 0.8 for s in shares) if shares else None


def _best_share(records: Sequence[Record], _key: str) -> float | None:
    return max(_copy_shares(records), default=None)


def _gemv_ratios(records: Sequence[Record]) -> list[float]:
    shapes = [r for r in records if r.get("kind") == "shape"] + [s for r in records for s in r.get("shapes", [])]
    return [s["cublas_us"] / s.get("default_us", s.get("best_us")) for s in shapes if "cublas_us" in s]


def _gemv_min(records: Sequence[Record], _key: str) -> float | None:
    return min(_gemv_ratios(records), default=None)


def _gemv_max(records: Sequence[Record], _key: str) -> float | None:
    return max(_gemv_ratios(records), default=None)


def _gemv_shapes(records: Sequence[Record], _key: str) -> float | None:
    return len(_gemv_ratios(records)) or None


def _server_vad(key: str) -> bool:
    return key.rsplit(",", 1)[-1] == "server_vad"


def _voice(
    header: str, new: str | None = None, old: str | None = None, hist: str | None = None, ms: bool = True
) -> Col:
    """A column of a voice table whose row key ends in the turn detector: ``new`` reads a run's records of that
    detector; ``old`` (paths to records without ``turn_detection``) and ``hist`` read runs from before
    ``--turn-detection``, whose one detector was server VAD with 500 ms of silence, in the server_vad rows alone."""

    def real(records: Sequence[Record], key: str) -> float | None:
        value = _read(records, new, key, history=False)
        return _read(records, old, key, history=False) if value is None and _server_vad(key) else value

    def history(records: Sequence[Record], key: str) -> float | None:
        return _read(records, hist, key, history=True) if _server_vad(key) else None

    return Col(header, real, history, scale=1e3 if ms else 1.0)


def _wait_cols(summary: str) -> tuple[Col, ...]:
    """The wait from the end of speech to the first audio delta, its stages (means, which add up to the mean wait)
    and the replies' underruns, from the ``summary`` records of a run per turn detector."""
    return (
        _voice("end of speech → first audio p50 ms", f"{summary}:latency_p50_s"),
        _voice("p90 ms", f"{summary}:latency_p90_s"),
        _voice("p99 ms", f"{summary}:latency_p99_s"),
        *(_voice(f"{STAGE_NAMES[stage]} mean ms", f"{summary}:{stage}_mean_s") for stage in STAGES),
        _voice("underruns", f"{summary}:underruns", ms=False),
    )


# --------------------------------------------------------------------------- the tables

_OMNI = "result[system=omni-gateway,concurrency={}]"
_VL = "summary[turn_detection={}]"
_VS = "summary[sessions={},turn_detection={}]"
_VS_OLD = "summary[sessions={},turn_detection=None]"  # a run from before --turn-detection
_IDLE = "batch_result[load=idle,rows=1]"
_BUSY = "batch_result[load=busy neighbour,rows=1]"


def _turn_variant(field: str) -> Getter:
    """A turn_decisions figure of the variant named by the row key (the name up to its colon: the eagerness, or
    "before"): the names hold commas, which a path's filter cannot."""

    def read(records: Sequence[Record], key: str) -> float | None:
        found = [r.get(field) for r in records if r.get("kind") == "variant" and r["variant"].split(":")[0] == key]
        return _number(found[0]) if found else None

    return read


def _sweep(shape: str) -> Col:
    best = f"min decode|final[shape={shape},variant={{}},rows=1,ok=True]"
    return Col(f"{shape} vs bf16", f"{best}:bf16_us / {best}:us")


TABLES: tuple[Table, ...] = (
    Table(
        "Engine on the CPU, against HF",
        "engine_cpu",
        (
            Col("ours tok/s", "result:ours_tok_s", "ours_tok_s"),
            Col("HF batched tok/s", "result:hf_batched_tok_s", "hf_batched_tok_s"),
            Col("vs HF batched", "result:ratio_vs_hf_batched", "ratio_vs_hf_batched"),
            Col("vs HF sequential", "result:ratio_vs_hf_sequential", "ratio_vs_hf_sequential"),
        ),
        variant=("--threads",),
    ),
    Table(
        "Engine host time per step",
        "host_step",
        (
            Col("µs per step", "step[batch={}]:us_per_step", "us_per_step.{}"),
            Col("through the wrapper µs", "step[batch={}]:wrapper_us_per_step", "wrapper_us_per_step.{}"),
            Col("wrapper / ours", "step[batch={}]:ratio", "wrapper_ratio.{}"),
        ),
        key="requests",
        rows=("1", "8", "64"),
    ),
    Table(
        "GGUF on the CPU, against llama.cpp",
        "gguf_cpu",
        (
            Col("decode tok/s", "engine:decode_tok_s"),
            Col("vs llama.cpp", "engine:decode_tok_s / llama.cpp:decode_tok_s"),
            Col("16 concurrent tok/s", "engine:concurrent_tok_s"),
            Col("vs llama.cpp ", "engine:concurrent_tok_s / llama.cpp:concurrent_tok_s"),
            Col("TTFT, llama.cpp / ours", "llama.cpp:ttft_s / engine:ttft_s"),
        ),
        variant=("--threads",),
    ),
    Table(
        "Cold start",
        "cold_start",
        (
            Col("start-up s", "startup:startup_s"),
            Col("cold p99 TTFT s", "summary:cold.p99"),
            Col("warm p99 TTFT s", "summary:warm.p99"),
            Col("cold / warm p99", "summary:ratio.p99"),
        ),
        variant=("--model", "--warmup"),
    ),
    Table(
        "Engine on the GPU, against HF `generate`",
        "engine_gpu",
        (
            Col("ours tok/s", "model:ours_tok_s", "ours_tok_s"),
            Col("HF tok/s", "model:hf_useful_tok_s", "hf_useful_tok_s"),
            Col("vs HF", "model:ratio_useful", "ratio_useful"),
        ),
        variant=("--model",),
        needs=("--model",),
        skips=("--skip-hf", "--b1-only"),
    ),
    Table(
        "Batch-1 decode against the HBM roofline",
        "engine_gpu",
        (
            Col("ms/token", "model:b1_ms_per_token", "b1_ms_per_token"),
            Col("share of 4.8 TB/s", "model:b1_fraction_of_roofline", "b1_share_of_4800_gbps"),
            Col("share of copy bandwidth", "model:b1_fraction_of_copy_bw", "b1_share_of_copy"),
        ),
        variant=("--model", "--no-row-fusion"),
        needs=("--b1-only",),
    ),
    Table(
        "Paged decode attention",
        "kernels",
        (
            Col("cases", _cases, _cases),
            Col("cases at 80% of copy", _cases_at_80, _cases_at_80),
            Col("best share of copy", _best_share, _best_share),
            Col("copy GB/s", "copy:bandwidth", "copy_gbps", scale=1e-9),
        ),
        variant=("--kv-cache-dtype",),
    ),
    Table(
        "One-row linear layers",
        "gemv",
        (
            Col("shapes", _gemv_shapes, _gemv_shapes),
            Col("least vs cuBLAS", _gemv_min, _gemv_min),
            Col("most vs cuBLAS", _gemv_max, _gemv_max),
        ),
        skips=("--pdl",),
    ),
    Table(
        "End-of-turn decisions (semantic_vad, Piper voice)",
        "turn_decisions",
        (
            Col("finished question, end of speech → turn end p50 ms", _turn_variant("finished_p50_ms")),
            Col("p90 ms", _turn_variant("finished_p90_ms")),
            Col("finished early (of 20)", _turn_variant("finished_early")),
            Col("unfinished ended early (of 25)", _turn_variant("false_early_commits")),
        ),
        key="variant",
        rows=("before", "auto", "high", "low"),
    ),
    Table(
        "Voice loop latency",
        "voice_loop",
        (
            *_wait_cols(_VL),
            # from speech_stopped to the first audio: the one wait runs from before the end of speech was timed measured
            _voice("from speech_stopped p50 ms", f"{_VL}:stopped_to_audio_p50_s", hist="p50_ms"),
            _voice("from speech_stopped p90 ms", hist="p90_ms"),
            _voice("ASR ms", hist="asr_ms"),
            _voice("LLM ms", hist="llm_ms"),
            _voice("TTS ms", hist="tts_ms"),
            _voice("turns", f"{_VL}:turns", ms=False),
            _voice("lost", f"{_VL}:lost", ms=False),
        ),
        key="turn detection",
        rows=TURN_DETECTIONS,
    ),
    Table(
        "Concurrent voice sessions",
        "voice_sessions",
        (
            *_wait_cols(_VS),
            _voice("from speech_stopped p50 ms", f"{_VS}:stopped_to_audio_p50_s", f"{_VS_OLD}:p50_s", "n{}_p50_ms"),
            _voice("from speech_stopped p99 ms", old=f"{_VS_OLD}:p99_s", hist="n{}_p99_ms"),
            _voice("stalled", old=f"{_VS_OLD}:turns_stalled", hist="n{}_turns_stalled", ms=False),
            _voice("turns", f"{_VS}:turns", f"{_VS_OLD}:turns", ms=False),
            _voice("lost", f"{_VS}:lost", f"{_VS_OLD}:lost", "n{}_lost", ms=False),
        ),
        key="sessions,turn detection",
        rows=tuple(f"{n},{mode}" for n in ("4", "64", "128") for mode in TURN_DETECTIONS),
        variant=("--engine-in-process",),
    ),
    Table(
        "TTS schedule (stand-in VITS with the H200's costs)",
        "tts_schedule",
        (
            Col("stall p50 ms", "median[streams={},design=current]:stall_p50_ms"),
            Col("stall p90 ms", "median[streams={},design=current]:stall_p90_ms"),
            Col("previous p90 ms", "median[streams={},design=previous]:stall_p90_ms"),
            Col("first audio p50 ms", "median[streams={},design=current]:first_p50_ms"),
        ),
        key="streams",
        rows=("32", "64"),
        variant=("--run-on",),
    ),
    Table(
        "VITS model pass, eager against CUDA graphs",
        "vits_graphs",
        (
            Col("idle eager ms", f"{_IDLE}:eager_pass_ms", "idle_pass_ms_1row.0"),
            Col("idle graphs ms", f"{_IDLE}:graphs_pass_ms", "idle_pass_ms_1row.1"),
            Col("busy eager ms", f"{_BUSY}:eager_pass_ms", "busy_pass_ms_1row.0"),
            Col("busy graphs ms", f"{_BUSY}:graphs_pass_ms", "busy_pass_ms_1row.1"),
            Col(
                "busy eager / graphs",
                f"{_BUSY}:eager_pass_ms / {_BUSY}:graphs_pass_ms",
                "busy_pass_ms_1row.0 / busy_pass_ms_1row.1",
            ),
        ),
    ),
    Table(
        "Whisper batch beside a busy Python thread",
        "whisper_batch",
        (
            Col("encode eager ms", "batch[encoder=eager,neighbour=thread,rows={}]:encode"),
            Col("encode graphs ms", "batch[encoder=graphs,neighbour=thread,rows={}]:encode"),
            Col("decode eager ms", "batch[encoder=eager,neighbour=thread,rows={}]:decode"),
            Col("decode graphs ms", "batch[encoder=graphs,neighbour=thread,rows={}]:decode"),
            Col("idle graphs whole ms", "batch[encoder=graphs,neighbour=none,rows={}]:whole_ms"),
        ),
        key="rows",
        rows=("1", "32"),
        variant=("--encoder",),
    ),
    Table(
        "Whisper decode, static cache against dynamic",
        "whisper_decode",
        (
            Col("dynamic ms", "rows[rows={}]:dynamic_ms"),
            Col("static ms", "rows[rows={}]:static_ms"),
            Col("speed-up", "rows[rows={}]:speedup"),
        ),
        key="rows",
        rows=("1", "32"),
    ),
    Table(
        "Quantized weights, 8B batch-1 decode",
        "quant_gpu",
        (
            Col("ms/token", "engine[variant={}]:b1_ms_per_token", "{}_b1_ms_per_token"),
            Col("vs bf16", "engine[variant={}]:b1_ms_per_token_vs_bf16", "{}_vs_bf16"),
            Col("workload tok/s", "engine[variant={}]:workload_tok_s"),
        ),
        key="weights",
        rows=("bf16", "fp8-channel", "fp8-channel-head", "int4", "int4-head"),
    ),
    Table(
        "Quantized one-row linears",
        "quant_sweep",
        tuple(_sweep(shape) for shape in ("gate_up", "down", "qkv", "o", "lm_head")),
        key="format",
        rows=("int4", "fp8-channel"),
    ),
    Table(
        "Speech from Qwen2.5-Omni-7B shapes",
        "omni_speech",
        (
            _ms("first audio ms", f"{_OMNI}:first_audio.median"),
            Col("RTF", f"{_OMNI}:rtf_mean"),
            _ms("transformers ms", "result[system=transformers,concurrency={}]:first_audio_s"),
            Col(
                "vs transformers",
                f"result[system=transformers,concurrency={{}}]:first_audio_s / {_OMNI}:first_audio.median",
            ),
        ),
        key="concurrency",
        rows=("1", "8", "32"),
    ),
    Table(
        "Structured outputs",
        "structured",
        (
            Col("JSON fails, constrained", "failure_rate[case=json_schema,constrained=True]:failed"),
            Col("unconstrained", "failure_rate[case=json_schema,constrained=False]:failed"),
            Col("tool call fails, constrained", "failure_rate[case=tool_call_required,constrained=True]:failed"),
            Col("unconstrained ", "failure_rate[case=tool_call_required,constrained=False]:failed"),
            Col(
                "batch 64 step, all / none constrained",
                "step[batch=64,constrained_rows=64]:median_s / step[batch=64,constrained_rows=0]:median_s",
            ),
        ),
        variant=("--pipeline-decode",),
    ),
    Table(
        "Vision input",
        "vision",
        (
            Col("image tokens", "run:image_tokens", "image_tokens"),
            Col("encode ms", "frame[frame=1]:encode_ms", "encode_ms"),
            Col("prefill ms", "frame[frame=1]:prefill_ms", "prefill_ms"),
            Col("repeat prefill ms", "frame[frame=repeat]:prefill_ms", "repeat_prefill_ms"),
        ),
        variant=("--family",),
    ),
    Table(
        "Image head (DiT)",
        "dit",
        (
            Col("plain, one s", "result:plain_single_s", "plain_single_s"),
            Col("head, one s", "result:head_single_s", "head_single_s"),
            Col("first preview s", "result:head_single_first_preview_s", "head_single_first_preview_s"),
            Col("head, concurrent s", "result:head_concurrent_s", "head_concurrent_s"),
            Col("plain batch s", "result:plain_batch_s", "plain_batch_s"),
        ),
    ),
    Table(
        "Engine core in its own process",
        "engine_ipc",
        (
            Col("message µs", "message[batch={}]:encode_decode_us"),
            Col("thread step ms", "stream[model=default,layout=thread,streams={}]:step_ms"),
            Col("process step ms", "stream[model=default,layout=process,streams={}]:step_ms"),
            Col(
                "process / thread",
                "stream[model=default,layout=process,streams={}]:step_ms"
                " / stream[model=default,layout=thread,streams={}]:step_ms",
            ),
        ),
        key="streams",
        rows=("1", "8"),
    ),
    Table(
        "A torch stage beside the event loop (GIL convoy)",
        "gil_convoy",
        (
            Col("alone ms", "interval_result[switch_interval_ms={}]:alone_ms"),
            Col("beside a busy thread ms", "interval_result[switch_interval_ms={}]:beside_ms"),
            Col("slowdown", "interval_result[switch_interval_ms={}]:slowdown"),
        ),
        key="switch interval ms",
        rows=("5.0", "0.5"),
    ),
    Table(
        "Host copies beside a graph replay",
        "host_copy_stall",
        (
            Col("pageable ms", "way_result[way=pageable]:median_ms"),
            Col("pinned ms", "way_result[way=pinned]:median_ms"),
            Col("no copy ms", "way_result[way=none]:median_ms"),
            Col("pageable / pinned", "way_result[way=pageable]:median_ms / way_result[way=pinned]:median_ms"),
        ),
    ),
    Table(
        "Realtime sessions under load",
        "realtime_load",
        (
            Col("responses", "load:responses", "responses"),
            Col("lost events", "load:lost_events", "lost_events"),
            Col("failed", "load:failed_responses", "failed_responses"),
            Col("TTFD p50 s", "load:ttfd_p50_ms", "ttfd_p50_s", scale=1e-3),
            Col("TTFD p99 s", "load:ttfd_p99_ms", "ttfd_p99_s", scale=1e-3),
        ),
        variant=("--sessions",),
    ),
    Table(
        "A burst of spoken audio",
        "audio_burst",
        (
            Col("loop stall max ms", "run_result[compression=False]:max_stall_ms"),
            Col("loop µs per delta", "run_result[compression=False]:loop_us_per_delta"),
            Col("compressed µs per delta", "run_result[compression=True]:loop_us_per_delta"),
            Col("compressed / plain", "ratio:compression_on_over_off"),
        ),
    ),
    Table(
        "Spoken audio in (VAD)",
        "voice_ingest",
        (
            Col("server cores", "sessions[sessions={}]:server_cores"),
            Col("loop lag p99 ms", "sessions[sessions={}]:loop_lag_p99_ms"),
            Col("loop lag max ms", "sessions[sessions={}]:loop_lag_max_ms"),
        ),
        key="sessions",
        rows=("32",),
        variant=("--vad",),
    ),
    Table(
        "Memory: soak",
        "soak_rss",
        (
            Col("cycles", "summary:cycles"),
            Col("idle MiB", "summary:idle_rss_mib"),
            Col("end MiB", "summary:rss_end_mib"),
            Col("after trim MiB", "summary:rss_after_malloc_trim_mib"),
            Col("cycles unexpected", "summary:cycles_with_unexpected"),
        ),
    ),
    Table(
        "Memory: idle RSS",
        "idle_rss",
        (
            Col("adds MiB", "stage[stage={}]:stage_mib"),
            Col("RSS MiB", "stage[stage={}]:loaded_mib", "{}_rss_mib"),
            Col("after trim MiB", "stage[stage={}]:after_trim_mib"),
            Col("PSS MiB", None, "{}_pss_mib"),
        ),
        key="stage",
        rows=("imports", "llm", "vad", "asr", "tts", "server", "omni_serve"),
    ),
    Table(
        "Hostile client fields",
        "fuzz_fields",
        (
            Col("cases", "figures:cases", "cases"),
            Col("server errors", "figures:server_errors", "server_errors"),
            Col("exceptions", "figures:exceptions", "exceptions"),
            Col("closed connections", "figures:connections_closed", "connections_closed"),
        ),
    ),
    Table(
        "Instructions per weight in the linears' loops (SASS, sm_90)",
        "kernel_sass",
        tuple(Col(shape, f"loop[shape={shape},format={{}}]:per_weight") for shape in ("gate_up", "down", "qkv", "o")),
        key="format",
        rows=("bf16", "fp8-channel", "int4"),
        skips=("--attention", "--rows"),
    ),
    Table(
        "Prompt counting",
        "prompt_count",
        (
            Col("4 turns ms", "count[turns=4]:median_ms", "counts.0.ms"),
            Col("16 turns ms", "count[turns=16]:median_ms", "counts.1.ms"),
            Col("64 turns ms", "count[turns=64]:median_ms", "counts.2.ms"),
        ),
    ),
    Table(
        "Token2Wav chunk call, against transformers",
        "token2wav_chunk",
        (
            Col("ours ms", "chunk[steps={},rows={}]:ours_ms"),
            Col("transformers ms", "chunk[steps={},rows={}]:transformers_ms"),
            Col("speed-up", "chunk[steps={},rows={}]:speedup"),
        ),
        key="steps,rows",
        rows=("10,1", "4,8"),
    ),
)

# Benchmarks of the results that no table shows, and why; a name ending in "*" covers every name it begins.
NOT_SHOWN: dict[str, str] = {
    "experiments.*": "results of experiments whose modules are gone, history only",
    "pdl_chain": "an experiment whose module is gone, history only",
    "one-row int4*": "A/B scripts over the int4 linears, history only",
    "8B batch-1 decode, int4*": "transcribed quant_gpu runs, which quant_gpu.jsonl holds",
    "quant_gpu + one-row int4 A/B": "transcribed quant_gpu runs, which quant_gpu.jsonl holds",
    "token2wav *": "one-off scripts over Token2Wav, since measured by token2wav_chunk",
    "VITS call*": "one-off scripts over the VITS synthesizer, since measured by vits_graphs",
}

_MACHINE_ORDER = ("CPU", "H100", "H200")


# --------------------------------------------------------------------------- reading the runs


def _date(text: str) -> str:
    match = re.match(r"(\d{4}-\d{2}-\d{2})(?: (\d{2}:\d{2}))?", text or "")
    if not match:
        raise PageError(f"a run's date should start YYYY-MM-DD, got {text!r}")
    return " ".join(g for g in match.groups() if g)


def _machine(header: Record, date: str) -> str:
    gpu = header.get("gpu") or ""
    for name in ("H100", "H200"):
        if name in gpu:
            return name
    if header.get("cpus") == 2:
        return "CPU"
    # Before 2026-12-05 the H200's 16-core host was the only other machine, and runs that had not imported torch
    # when they wrote their run record did not name its GPU.
    if date < "2026-12-05":
        return "H200"
    return f"{header.get('cpus')}-core host"


def _history_machine(text: str) -> str:
    if text.startswith(("CPU", "2-core", "the 2-core")):
        return "CPU"  # what it compiled for may name a GPU
    return next((name for name in ("H100", "H200") if name in text), "CPU")


def _history_benchmark(name: str) -> str:
    """``kernels --kv-cache-dtype fp8`` is a run of ``kernels``; a description stays whole."""
    match = re.fullmatch(r"([\w.]+)(?: --.*)?", name)
    return match.group(1) if match else name


def load_runs(results: Path) -> list[Run]:
    runs: list[Run] = []
    for i, record in enumerate(read_results(results / "history.jsonl")):
        date = _date(record["date"])
        runs.append(
            Run(
                benchmark=_history_benchmark(record["benchmark"]),
                machine=_history_machine(record["machine"]),
                date=date,
                command=record["command"],
                order=i,
                history=True,
                records=({"kind": "history", **record["metrics"]},),
            )
        )
    names = sorted({p.name.removesuffix(".gz") for p in results.glob("*.jsonl*")} - {"history.jsonl"})
    for name in names:
        by_run: dict[str, list[Record]] = {}
        for number, record in enumerate(read_results(results / name), 1):
            if "run_id" not in record or "benchmark" not in record:
                raise PageError(
                    f"{name}: record {number} has no run_id or benchmark; results are written through "
                    f"benchmarks.lib.common.ResultLog, got {json.dumps(record)[:120]}"
                )
            by_run.setdefault(record["run_id"], []).append(record)
        for records in by_run.values():
            header = records[0]
            if header.get("kind") != "run" or "date" not in header:
                raise PageError(f"{name}: run {header['run_id']} does not start with a dated run record")
            date = _date(header["date"])
            runs.append(
                Run(
                    benchmark=header["benchmark"],
                    machine=_machine(header, date),
                    date=date,
                    command=header["command"],
                    order=len(runs),
                    history=False,
                    records=tuple(records),
                )
            )
    # A transcription of a run the files hold (same benchmark, machine and date) is that run, told twice.
    held = {(r.benchmark, r.machine, r.date) for r in runs if not r.history}
    return [r for r in runs if not (r.history and (r.benchmark, r.machine, r.date) in held)]


# --------------------------------------------------------------------------- reading values


def _dig(value: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return value


def _read(records: Sequence[Record], spec: str | Getter | None, key: str, history: bool) -> float | None:
    if spec is None:
        return None
    if callable(spec):
        return spec(records, key)
    if " / " in spec:
        num, den = (_read(records, part, key, history) for part in spec.split(" / "))
        return num / den if num is not None and den else None
    spec = spec.format(*key.split(",")) if "{}" in spec else spec
    if history:
        return _number(_dig(records[0], spec))
    least = spec.startswith("min ")
    head, _, path = spec.removeprefix("min ").partition(":")
    kind, _, where = head.partition("[")
    wanted = [tuple(term.split("=", 1)) for term in where.rstrip("]").split(",") if term]
    values = [
        _number(_dig(r, path))
        for r in records
        if r.get("kind") in kind.split("|") and all(str(r.get(field)) == value for field, value in wanted)
    ]
    values = [v for v in values if v is not None]
    if not values:
        return None
    return min(values) if least else values[0]


def _options(command: str) -> dict[str, str]:
    """``--name value...`` pairs of a command (a flag alone reads ``yes``)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for token in command.split():
        if token.startswith("--"):
            current = found.setdefault(token, [])
        elif current is not None:
            current.append(token)
    return {name: " ".join(values) or "yes" for name, values in found.items()}


def _shown_command(command: str) -> str:
    return re.sub(r" --out \S+", "", command).replace("|", "\\|")


# --------------------------------------------------------------------------- the tables' rows


@dataclass(frozen=True)
class Row:
    machine: str
    variant: tuple[str, ...]
    key: str
    run: Run
    cells: tuple[float | None, ...]


def _cell(run: Run, col: Col, key: str) -> float | None:
    if run.history:
        return _read(run.records, col.hist, key, history=True)
    value = _read(run.records, col.real, key, history=False)
    return None if value is None else value * col.scale


def table_rows(table: Table, runs: Iterable[Run]) -> list[Row]:
    """Per machine, variant and row key, the row of the newest run that measured it."""
    newest: dict[tuple[str, tuple[str, ...], str], Row] = {}
    empty: dict[tuple[str, tuple[str, ...]], Run] = {}
    for run in sorted(runs, key=lambda r: (r.date, not r.history, r.order)):
        options = _options(run.command)
        if run.benchmark != table.benchmark or not all(o in options for o in table.needs):
            continue
        if any(o in options for o in table.skips):
            continue
        variant = tuple(options.get(o, MISSING) for o in table.variant)
        found = False
        for key in table.rows:
            cells = tuple(_cell(run, c, key) for c in table.cols)
            if any(v is not None for v in cells):
                newest[(run.machine, variant, key)] = Row(run.machine, variant, key, run, cells)
                found = True
        if found:
            empty.pop((run.machine, variant), None)
        else:
            empty[(run.machine, variant)] = run
    if empty:
        run = next(iter(empty.values()))
        raise PageError(
            f"{table.area}: the newest {run.benchmark} run on {run.machine} ({run.date}, {run.command!r}) has none "
            f"of the table's columns; give the table a path that reads it, or skip its options"
        )
    order = {key: i for i, key in enumerate(table.rows)}
    return sorted(
        newest.values(),
        key=lambda r: (_MACHINE_ORDER.index(r.machine) if r.machine in _MACHINE_ORDER else 9, r.variant, order[r.key]),
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return MISSING
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def render_table(table: Table, rows: Sequence[Row]) -> list[str]:
    keys = table.key.split(",") if table.key else []
    headers = ["machine", *(o.lstrip("-") for o in table.variant), *keys]
    headers += [c.header for c in table.cols] + ["date (UTC)", "command"]
    lines = [f"## {table.area}", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row.machine, *row.variant, *(row.key.split(",") if table.key else []), *map(_fmt, row.cells)]
        cells += [row.run.date, f"`{_shown_command(row.run.command)}`"]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


HEAD = """\
# Benchmarks

Each benchmark is `python -m benchmarks.NAME` from the checkout root (`--help` says what it measures); it prints
its figures with the ratio to the baseline it runs in the same command, and appends a `run` record (date, command,
commit, machine) and its measurements to `benchmarks/results/NAME.jsonl`, per-turn and per-config records to
`NAME.jsonl.gz`. [`history.jsonl`](../benchmarks/results/history.jsonl) transcribes older runs (before 2026-12-04
they ran as `python demos/bench_X.py`). `python -m benchmarks.analysis.results_page` writes this page from those
files: per area, the newest run per machine, variant and row, one number a cell; `–`: not measured by that run.

Machines:
- **CPU**: the 2-core development machine (AMD EPYC under KVM, AVX2), torch 2.13.0+cpu, shared with other work:
  its latencies are regression references, not capacity claims.
- **H200**: one NVIDIA H200 (132 SMs), torch 2.11.0+cu130, Triton 3.6.0, 16 CPU cores.
- **H100**: one NVIDIA H100 80GB HBM3 (132 SMs), the same software; a graph's time differs by up to 3% between
  machine starts.
"""


def _not_shown(benchmark: str) -> str | None:
    for name, reason in NOT_SHOWN.items():
        if benchmark == name or (name.endswith("*") and benchmark.startswith(name[:-1])):
            return reason
    return None


def render_page(runs: Sequence[Run]) -> str:
    tabled = {t.benchmark for t in TABLES}
    unshown = sorted({r.benchmark for r in runs} - tabled)
    missing = [b for b in unshown if _not_shown(b) is None]
    if missing:
        raise PageError(f"no table shows {missing} and NOT_SHOWN does not list them")
    lines = HEAD.splitlines() + [""]
    for table in TABLES:
        rows = table_rows(table, runs)
        if not rows:
            raise PageError(f"{table.area}: no {table.benchmark} run in the results")
        lines += render_table(table, rows)
    lines.append("Not shown: " + "; ".join(f"`{n}` ({r})" for n, r in NOT_SHOWN.items()) + ".")
    if len(lines) > MAX_LINES:
        raise PageError(f"the page would be {len(lines)} lines, more than {MAX_LINES}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page on disk is stale")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="the results folder")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write or check")
    args = parser.parse_args(argv)
    try:
        page = render_page(load_runs(args.results))
    except PageError as exc:
        print(f"results page: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if not args.page.exists() or args.page.read_text(encoding="utf-8") != page:
            print(f"{args.page} is stale: run python -m benchmarks.analysis.results_page", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(page, encoding="utf-8")
    print(f"wrote {args.page} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
