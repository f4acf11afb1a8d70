"""``omni serve``'s engine flags: device and precision, batching and KV cache, parallelism, warm-up, speculative
decoding and structured outputs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from omni_gateway.gateway.cli_flags.flag import Flag


def _json_object(value: str) -> dict[str, Any]:
    """A flag whose value is a JSON object (vLLM's ``--speculative-config``); the config checks its keys."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}: {exc}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def engine_flags() -> tuple[Flag, ...]:
    # Imported here: omni.config names the engine's config type, and importing the CLI stays light.
    from omni_gateway.omni.config import EngineConfig

    eng = EngineConfig
    return (
        Flag(
            "--device",
            eng,
            "device",
            "'auto', 'cpu' or 'cuda[:N]', for the LLM and every other stage (default %(default)s)",
            "engine",
        ),
        Flag(
            "--dtype",
            eng,
            "dtype",
            "weights and activations (default %(default)s)",
            "engine",
            choices=("auto", "float32", "bfloat16", "float16"),
        ),
        Flag(
            "--load-format",
            eng,
            "load_format",
            "'auto' reads the checkpoint's weights; 'dummy' reads only config.json and the tokenizer and runs seeded "
            "random weights (benchmarks without a download) (default %(default)s)",
            "engine",
            choices=("auto", "dummy"),
        ),
        Flag(
            "--quantization",
            eng,
            "quantization",
            "weight quantization; default: the checkpoint's quantization_config (fp8 also quantizes a float "
            "checkpoint at load)",
            "engine",
            choices=("fp8", "awq", "gptq", "compressed-tensors", "none"),
        ),
        Flag(
            "--quantize-lm-head",
            eng,
            "quantize_lm_head",
            "the LM head quantized too: FP8 per channel with FP8 weights (--quantization fp8 or an FP8 "
            "checkpoint), int4 in the checkpoint's groups with an AWQ or GPTQ one; by default it stays in the "
            "model dtype, as in vLLM",
            "engine",
            switch=True,
        ),
        Flag(
            "--kv-cache-dtype",
            eng,
            "kv_cache_dtype",
            "KV cache storage: 'auto' (the model dtype) or 'fp8' (float8_e4m3fn, scale 1.0) (default %(default)s)",
            "engine",
            choices=("auto", "fp8", "fp8_e4m3"),
        ),
        Flag("--max-model-len", eng, "max_model_len", "context length cap (default: the model's)", "engine", type=int),
        Flag(
            "--max-num-seqs",
            eng,
            "max_num_seqs",
            "sequences decoded together (default %(default)s)",
            "engine",
            type=int,
        ),
        Flag(
            "--max-num-batched-tokens",
            eng,
            "max_num_batched_tokens",
            "tokens one engine step processes, prefill chunks and decodes together (default %(default)s)",
            "engine",
            type=int,
        ),
        Flag(
            "--block-size",
            eng,
            "block_size",
            "tokens per KV-cache block, a power of two (default: 16 on CUDA, 8 on the CPU)",
            "engine",
            type=int,
        ),
        Flag(
            "--gpu-memory-utilization",
            eng,
            "gpu_memory_utilization",
            "fraction of GPU memory the engine may use (default %(default)s)",
            "engine",
            type=float,
        ),
        Flag("--enforce-eager", eng, "enforce_eager", "no CUDA graphs", "engine", switch=True),
        Flag(
            "--tensor-parallel-size",
            eng,
            "tensor_parallel_size",
            "split the model over this many GPUs of this machine, one process each; it must divide the "
            "model's attention heads (default %(default)s)",
            "engine",
            type=int,
            aliases=("-tp",),
        ),
        Flag(
            "--enable-expert-parallel",
            eng,
            "enable_expert_parallel",
            "mixture-of-experts models: each tensor-parallel rank holds its share of the experts whole instead "
            "of a slice of every expert",
            "engine",
            switch=True,
        ),
        Flag(
            "--warmup",
            eng,
            "warmup",
            "step shapes run before the server answers: 'full' compiles every kernel and path a request can "
            "hit, 'minimal' one prefill and decode, 'off' none, 'auto' full on CUDA and minimal on the CPU "
            "or over a --compile-cache-dir a full warm-up of the same configuration filled (default %(default)s)",
            "engine",
            choices=("auto", "full", "minimal", "off"),
        ),
        Flag(
            "--compile-cache-dir",
            eng,
            "compile_cache_dir",
            "directory of compiled Triton kernels; keep it on a volume so restarts skip compiling "
            "(default: Triton's, ~/.triton/cache)",
            "engine",
        ),
        Flag(
            "--pipeline-decode",
            eng,
            "pipeline_decode",
            "launch each decode step before the host has read the one in flight (default %(default)s: on with CUDA)",
            "engine",
            choices=("auto", "on", "off"),
        ),
        Flag(
            "--speculative-config",
            eng,
            "speculative_config",
            'speculative decoding as vLLM takes it, a JSON object: {"method": "ngram", "num_speculative_tokens": '
            '4, "prompt_lookup_max": 5} or {"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}; '
            "it turns pipelined decode off (default: none)",
            "engine",
            type=_json_object,
        ),
        Flag(
            "--structured-outputs-compile-timeout",
            eng,
            "structured_outputs_compile_timeout",
            "seconds a request's output constraint may take to compile before it is refused with a 400 "
            "(default %(default)s)",
            "engine",
            type=float,
        ),
        Flag(
            "--structured-outputs-cache-mb",
            eng,
            "structured_outputs_cache_bytes",
            "memory for compiled output constraints, in MiB (default %(default)s)",
            "engine",
            type=int,
            to_field=lambda mib: mib << 20,
            from_field=lambda n: n >> 20,
        ),
        Flag(
            "--data-parallel-size",
            eng,
            "data_parallel_size",
            "engine replicas, each a whole copy of the model; a realtime session stays on one (default %(default)s)",
            "engine",
            type=int,
        ),
        Flag(
            "--distributed-executor-backend",
            eng,
            "distributed_executor_backend",
            "where replicas run: 'mp' processes on this machine, 'ray' actors on a Ray cluster (default %(default)s)",
            "engine",
            choices=("mp", "ray"),
        ),
        Flag(
            "--engine-in-process",
            eng,
            "engine_in_process",
            "run the engine core in a thread of the server's process, not its own (debugging)",
            "engine",
            switch=True,
        ),
    )
