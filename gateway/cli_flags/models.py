"""``omni serve``'s model flags: the model of each stage (LLM, speech recognition and synthesis, vision, images)
and how a speaking Omni checkpoint's speech head chunks and runs its audio."""

from __future__ import annotations

from omni_gateway.gateway.cli_flags.flag import Flag, _positive


def _stage(value: str | None) -> str | None:
    """``none`` disables a model stage; anything else is passed through ("default" or a path)."""
    return None if value is None or value.lower() == "none" else value


def model_flags() -> tuple[Flag, ...]:
    # Imported here: omni.config names the engine's config type, and importing the CLI stays light.
    from omni_gateway.omni.config import EngineConfig, OmniConfig

    eng, om = EngineConfig, OmniConfig
    return (
        Flag(
            "--model",
            eng,
            "model",
            "LLM: 'default' (packaged SmolLM2), a Hugging Face directory or a .gguf file",
            "models",
        ),
        Flag("--served-model-name", om, "served_model_name", "model name reported to clients", "models"),
        Flag("--asr", om, "asr", "speech recognition: 'default', a path, or 'none'", "models", to_field=_stage),
        Flag("--tts", om, "tts", "speech synthesis: 'default', a path, or 'none'", "models", to_field=_stage),
        Flag(
            "--no-asr-batches-alone",
            om,
            "asr_batches_alone",
            "let an engine in the server's process keep stepping while a speech recognition batch runs (by "
            "default it waits: transcripts sooner, the other sessions' steps later)",
            "models",
            switch=True,
            to_field=lambda v: not v,
        ),
        Flag(
            "--no-vad",
            om,
            "vad",
            "no server-side voice activity detection (realtime clients must commit turns themselves)",
            "models",
            switch=True,
            to_field=lambda v: not v,
        ),
        Flag(
            "--no-vision",
            om,
            "vision",
            "ignore the LLM's vision tower",
            "models",
            switch=True,
            to_field=lambda v: not v,
        ),
        Flag("--image-model", om, "image_model", "local diffusers pipeline directory for image output", "models"),
        Flag(
            "--speech-model",
            om,
            "speech_model",
            "Qwen2.5-Omni or Qwen3-Omni checkpoint whose talker and token2wav (code2wav) speak for the LLM (audio "
            "in the model's own voice instead of --tts): 'auto' (the --model directory when it has them), a path, "
            "or 'none' "
            "(default %(default)s)",
            "models",
            to_field=_stage,
        ),
        Flag(
            "--speech-first-chunk-codes",
            om,
            "speech_first_chunk_codes",
            "codes (20 ms of audio each) before a speaking model's first audio: the latency knob; Qwen3-Omni "
            "takes the code2wav frames (80 ms each) covering as much (default: the speech head's: Qwen2.5-Omni 4, "
            "Qwen3-Omni 4 frames)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-chunk-codes",
            om,
            "speech_chunk_codes",
            "codes (20 ms each) in each later audio chunk; Qwen3-Omni takes the code2wav frames covering as much "
            "(default: the speech head's: Qwen2.5-Omni 48, Qwen3-Omni 25 frames)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-max-codes",
            om,
            "speech_max_codes",
            "codes (20 ms each) of the longest spoken reply; Qwen3-Omni takes the code2wav frames covering as "
            "much (default: the speech head's, about 82 s: Qwen2.5-Omni 4096, Qwen3-Omni 1024 frames)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-ode-steps",
            om,
            "speech_ode_steps",
            "flow-matching steps of each audio chunk, Qwen2.5-Omni's token2wav only (default: the speech head's, "
            "Qwen's)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-first-chunk-steps",
            om,
            "speech_first_chunk_steps",
            "flow-matching steps of the first audio chunk alone, Qwen2.5-Omni's token2wav only: fewer start the "
            "audio sooner, coarser (default: as --speech-ode-steps)",
            "models",
            type=_positive,
        ),
        Flag(
            "--no-speech-cuda-graphs",
            om,
            "speech_cuda_graphs",
            "run Qwen2.5-Omni's token2wav chunk calls eagerly, not from CUDA graphs captured at load (CUDA only)",
            "models",
            switch=True,
            to_field=lambda v: False if v else None,
        ),
        Flag(
            "--no-speech-first-chunks-alone",
            om,
            "speech_first_chunks_alone",
            "let the engines keep stepping while Qwen2.5-Omni's token2wav runs a first audio chunk (by default "
            "they wait: first audio sooner, the other sessions' steps later)",
            "models",
            switch=True,
            to_field=lambda v: False if v else None,
        ),
        Flag(
            "--speech-dit-dtype",
            om,
            "speech_dit_dtype",
            "precision of Qwen2.5-Omni's token2wav DiT: float32 as the checkpoint's authors run it, or bfloat16 "
            "(tensor cores: keeps up with many more streams; the vocoder stays float32) "
            "(default: the speech head's, float32)",
            "models",
            choices=("float32", "bfloat16"),
        ),
        Flag(
            "--speech-lanes",
            om,
            "speech_lanes",
            "Qwen2.5-Omni's token2wav worker threads, each on its own CUDA stream; with 2 one runs first audio "
            "chunks alone, so they never wait behind another session's later chunk (default: the speech head's, 2)",
            "models",
            type=_positive,
        ),
    )
