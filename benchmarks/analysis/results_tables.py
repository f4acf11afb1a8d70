"""What the results page shows: its head, a table per area (which benchmark, which columns, which rows and
variants), and the benchmarks of the results it leaves out, with why."""

from __future__ import annotations

from benchmarks.analysis.results_columns import (
    best_share,
    cases,
    cases_at_80,
    gemv_max,
    gemv_min,
    gemv_shapes,
    ms_col,
    sweep,
    turn_variant,
    voice,
    wait_cols,
    where,
)
from benchmarks.analysis.results_paths import Col, Table
from benchmarks.lib.voice_client import TURN_DETECTIONS

HEAD = """\
# Benchmarks

Each benchmark is `python -m benchmarks.NAME` from the checkout root (`--help` says what it measures); it prints
its figures with the ratio to the baseline it runs in the same command, and appends a `run` record (date, command,
commit, machine) and its measurements to `benchmarks/results/NAME.jsonl`, per-turn and per-config records to
`NAME.jsonl.gz`. [`history.jsonl`](../benchmarks/results/history.jsonl) transcribes older runs (before 2026-12-04
they ran as `python demos/bench_X.py`). `python -m benchmarks.analysis.results_page` writes this page from those
files: per area, the newest run per machine, variant and row, one number a cell; `–`: not measured by that run.

Machines: **CPU**, the 2-core development machine (AMD EPYC under KVM, AVX2), torch 2.13.0+cpu, shared with other
work: regression references, not capacity claims; **H200** / **H100**, one NVIDIA H200 / H100 80GB HBM3 (132 SMs),
torch 2.11.0+cu130, Triton 3.6.0, 16 CPU cores; a graph's time differs by up to 3% between machine starts.
"""

_OMNI = "result[system=omni-gateway,concurrency={}]"
_VL = "summary[turn_detection={}]"
_VS = "summary[sessions={},turn_detection={}]"
_PF = "summary[sessions={{}},turn_detection=semantic_vad,prefill_while_speaking={}]"
_VS_OLD = "summary[sessions={},turn_detection=None]"  # a run from before --turn-detection
_IDLE = "batch_result[load=idle,rows=1]"
_BUSY = "batch_result[load=busy neighbour,rows=1]"

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
            Col("cases", cases, cases),
            Col("cases at 80% of copy", cases_at_80, cases_at_80),
            Col("best share of copy", best_share, best_share),
            Col("copy GB/s", "copy:bandwidth", "copy_gbps", scale=1e-9),
        ),
        variant=("--kv-cache-dtype",),
    ),
    Table(
        "One-row linear layers",
        "gemv",
        (
            Col("shapes", gemv_shapes, gemv_shapes),
            Col("least vs cuBLAS", gemv_min, gemv_min),
            Col("most vs cuBLAS", gemv_max, gemv_max),
        ),
        skips=("--pdl",),
    ),
    Table(
        "Hostile constraints: six compiling beside a normal constrained request",
        "hostile_constraints",
        (
            Col("normal request alone, worst s", where("normal_wait", "worst_s", setup="alone (baseline)")),
            Col(
                "one compile thread, no limits, worst s",
                where("normal_wait", "worst_s", setup="one compile thread, no limits; 240-level anyOf"),
            ),
            Col("pool and limits, worst s", where("normal_wait", "worst_s", setup="pool and limits; 240-level anyOf")),
            Col("depth 100 compile s", "compile_depth[depth=100]:compile_s"),
            Col(
                "40 large schemas, RSS growth MiB, unbounded",
                where("memory", "grown_mib", setup="unbounded (baseline)"),
            ),
            Col("bounded (256 MiB)", where("memory", "grown_mib", setup="default bound")),
        ),
    ),
    Table(
        "WebRTC calls against the WebSocket (end of speech → first audio, loopback)",
        "webrtc_latency",
        (
            ms_col("WebSocket p50 ms", "summary[transport=websocket,calls=1]:latency_p50_s"),
            ms_col("WebRTC p50 ms", "summary[transport=webrtc,calls=1]:latency_p50_s"),
            ms_col("WebRTC's cost p50 ms", "transport_cost:cost_p50_s"),
            ms_col("of it receiving ms", "transport_cost:receive_p50_s"),
            ms_col("sending ms", "transport_cost:send_p50_s"),
            ms_col("16 calls p50 ms", "summary[transport=webrtc,calls=16]:latency_p50_s"),
            Col("16 calls, turns lost", "summary[transport=webrtc,calls=16]:lost"),
        ),
        variant=("--ignore-ptime", "--model"),
    ),
    Table(
        "End-of-turn decisions (semantic_vad, Piper voice)",
        "turn_decisions",
        (
            Col("finished question, end of speech → turn end p50 ms", turn_variant("finished_p50_ms")),
            Col("p90 ms", turn_variant("finished_p90_ms")),
            Col("finished early (of 20)", turn_variant("finished_early")),
            Col("unfinished ended early (of 25)", turn_variant("false_early_commits")),
        ),
        key="variant",
        rows=("before", "auto", "high"),
    ),
    Table(
        "Concurrent voice sessions",
        "voice_sessions",
        (
            *wait_cols(_VS),
            voice("from speech_stopped p50 ms", f"{_VS}:stopped_to_audio_p50_s", f"{_VS_OLD}:p50_s", "n{}_p50_ms"),
            voice("from speech_stopped p99 ms", old=f"{_VS_OLD}:p99_s", hist="n{}_p99_ms"),
            voice("stalled", old=f"{_VS_OLD}:turns_stalled", hist="n{}_turns_stalled", ms=False),
            voice("turns", f"{_VS}:turns", f"{_VS_OLD}:turns", ms=False),
            voice("lost", f"{_VS}:lost", f"{_VS_OLD}:lost", "n{}_lost", ms=False),
        ),
        key="sessions,turn detection",
        rows=tuple(f"{n},{mode}" for n in ("1", "4", "64", "128") for mode in TURN_DETECTIONS),
        variant=("--engine-in-process",),
    ),
    Table(
        "Prefill while speaking (semantic_vad)",
        "voice_sessions",
        (
            ms_col("speech_stopped → first token p50 ms, on", f"{_PF.format('on')}:commit_to_token_p50_s"),
            ms_col("off", f"{_PF.format('off')}:commit_to_token_p50_s"),
            ms_col("end of speech → first audio p50 ms, on", f"{_PF.format('on')}:latency_p50_s"),
            ms_col("off ", f"{_PF.format('off')}:latency_p50_s"),
        ),
        key="sessions",
        rows=("1", "4", "64"),
        needs=("--prefill-while-speaking",),
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
        tuple(sweep(shape) for shape in ("gate_up", "down", "qkv", "o", "lm_head")),
        key="format",
        rows=("int4", "fp8-channel"),
    ),
    Table(
        "Speech from Qwen2.5-Omni-7B shapes",
        "omni_speech",
        (
            ms_col("first audio ms", f"{_OMNI}:first_audio.median"),
            Col("RTF", f"{_OMNI}:rtf_mean"),
            ms_col("transformers ms", "result[system=transformers,concurrency={}]:first_audio_s"),
            Col(
                "vs transformers",
                f"result[system=transformers,concurrency={{}}]:first_audio_s / {_OMNI}:first_audio.median",
            ),
        ),
        key="concurrency",
        rows=("1", "8", "32", "64"),
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
        "Multi-LoRA (Llama-3.1-8B shape, rank 16), against the base model",
        "lora",
        (
            Col("base tok/s", "result:base_tok_s"),
            Col("1 adapter / base", "result:ratio_adapters_1_vs_base"),
            Col("4 / base", "result:ratio_adapters_4_vs_base"),
            Col("16 / base", "result:ratio_adapters_16_vs_base"),
            Col("batch 1 base ms/token", "result:base_b1_ms"),
            Col("one adapter ms/token", "result:lora_b1_ms"),
            Col("adapter / base", "result:ratio_b1_adapter_vs_base"),
        ),
    ),
    Table(
        "Fused MoE layer (Qwen3-30B-A3B shape), against a per-expert loop and transformers",
        "moe",
        (
            Col("fused µs", "layer[tokens={}]:fused_us"),
            Col("vs per-expert loop", "layer[tokens={}]:speedup_vs_loop"),
            Col("vs transformers", "layer[tokens={}]:speedup_vs_transformers"),
            Col("experts read", "layer[tokens={}]:experts_read"),
            Col("share of HBM peak", "layer[tokens={}]:hbm_share"),
        ),
        key="tokens",
        rows=("1", "8", "64", "512", "2048"),
        skips=("--sweep",),
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
    "voice_loop": "one session's voice loop, which voice_sessions measures at N=1 with the stage split",
    "vits_graphs": "the check behind the VITS head's CUDA graphs (raw results in benchmarks/results)",
    "gil_convoy": "the check behind running torch stages off the event loop (raw results in benchmarks/results)",
    "host_copy_stall": "the check behind the pinned host copies (raw results in benchmarks/results)",
    "audio_prefill": "a hearing model's commit -> first token with and without prefill while speaking, CPU only "
    "(the README's turn detection section quotes it; raw results in benchmarks/results)",
    "spec_decode": "speculative decoding; only its CPU n-gram run is recorded so far, which the README's "
    "speculative decoding section quotes (raw results in benchmarks/results)",
    "whisper_decode": "the check behind Whisper's static decode cache (raw results in benchmarks/results)",
    "prompt_count": "the check behind counting a prompt's tokens turn by turn, history only",
    "experiments.*": "results of experiments whose modules are gone, history only",
    "pdl_chain": "an experiment whose module is gone, history only",
    "one-row int4*": "A/B scripts over the int4 linears, history only",
    "8B batch-1 decode, int4*": "transcribed quant_gpu runs, which quant_gpu.jsonl holds",
    "quant_gpu + one-row int4 A/B": "transcribed quant_gpu runs, which quant_gpu.jsonl holds",
    "token2wav *": "one-off scripts over Token2Wav, since measured by token2wav_chunk",
    "VITS call*": "one-off scripts over the VITS synthesizer, since measured by vits_graphs",
}
