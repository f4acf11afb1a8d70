"""Loading the configured models, warming them up, and the CPU thread policy of the stages."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.protocol import Message, OmniRequest, TextPart
from omni_gateway.omni.speech_settings import spoken_settings

if TYPE_CHECKING:
    from omni_gateway.encoders.audio_encoder import AudioEncoder
    from omni_gateway.encoders.vision import VisionEncoder
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.omni.heads.tts.head import TtsHead
    from omni_gateway.omni.pipeline import OmniPipeline
    from omni_gateway.omni.qwen3_speech import Qwen3SpeechConfig, Qwen3SpokenModel
    from omni_gateway.omni.speech import SpeechConfig, SpokenModel

log = logging.getLogger(__name__)

_WARM_UP_SENTENCE = "Hello, this sentence only warms up the voice before anyone hears it."

# The stages' worker threads share one interpreter with the server's event loop. Each torch operator a
# stage calls lets go of the interpreter lock while it runs and takes it back after; while another thread
# runs Python, taking it back waits until that thread gives the lock up, at the latest after the switch
# interval (5 ms by default), so a model pass of hundreds of operators waits at every one.
# `python -m benchmarks.gil_convoy` (2-core CPU, otherwise idle): a 7 ms VITS pass beside one thread busy
# framing events took 1,041 ms at 5 ms, 92 ms at 0.5 ms, and the busy thread lost 14% of its rate.
STAGE_SWITCH_INTERVAL_S = 0.0005


def load_pipeline(config: OmniConfig) -> OmniPipeline:
    """Load every configured stage; the slow ones report progress on the log."""
    from omni_gateway.engine.frontend.launch import start_engine
    from omni_gateway.omni.pipeline import OmniPipeline

    t0 = time.monotonic()
    threads = stage_threads(config)
    if sys.getswitchinterval() > STAGE_SWITCH_INTERVAL_S:
        sys.setswitchinterval(STAGE_SWITCH_INTERVAL_S)
        log.info(
            "interpreter switch interval %.1f ms: stage threads get the lock back sooner",
            1000 * STAGE_SWITCH_INTERVAL_S,
        )
    speech_model = resolve_speech_model(config)
    engine_config = config.engine
    if speech_model is not None and engine_config.tensor_parallel_size > 1:
        raise ValueError(
            f"{speech_model} speaks in its own voice: its talker reads the thinker's hidden states, which needs "
            f"tensor_parallel_size 1, got {engine_config.tensor_parallel_size}; serve it on one GPU, or pass "
            "--speech-model none to answer through a TTS voice"
        )
    spoken = spoken_settings(config, speech_model) if speech_model is not None else None
    if speech_model is not None and not engine_config.engine_in_process and engine_config.data_parallel_size == 1:
        # The talker reads the thinker's hidden states every step: in this process they stay on the device,
        # from a core process each step's would be copied to the host and sent over a socket first.
        engine_config = dataclasses.replace(engine_config, engine_in_process=True)
        log.info("engine in this process: the talker of %s reads its hidden states on the device", speech_model)
    # The voice stages load first: the engine sizes its KV cache from the GPU memory still free
    # (``gpu_memory_utilization`` is the share of the whole device), so on a shared GPU it leaves them
    # their room instead of the stages running out of memory after it.
    from omni_gateway.encoders.audio_checkpoint import checkpoint_family as audio_family

    hears = audio_family(config.engine.model) is not None
    asr, tts = _load_voice(config, threads, speech_model, hears=hears)
    # Loaded and warmed before the server listens (and reports healthy); the engine core runs in its
    # own process(es) unless the config keeps it in this one.
    t_engine = time.monotonic()
    try:
        engine = start_engine(engine_config, threads=threads if _engine_on_cpu(config) else None)
    except BaseException:
        close_voice(asr, tts)
        raise
    model_name = engine.model_name
    log.info("LLM %s ready in %.1f s", model_name, time.monotonic() - t_engine)
    vad_session = image_head = vision = audio = speech = None
    try:
        from omni_gateway.encoders.vision import checkpoint_family

        if config.vision and config.engine.load_format == "dummy":
            log.warning("load_format 'dummy': no vision tower (its random weights are not made); images are refused")
        elif config.vision and checkpoint_family(config.engine.model):
            vision = _load_vision(config, engine)
            log.info("vision tower of %s ready", config.engine.model)
        if hears:
            audio = _load_audio(config, engine)
            log.info("audio tower of %s ready: the model hears audio itself", config.engine.model)
        if config.vad:
            from omni_gateway.encoders.vad import load_session

            vad_session = load_session()
        if speech_model is not None and spoken is not None:
            speech = _load_speech(speech_model, str(engine.device_and_dtype[0]), spoken, engine_config)
            log.info("talker and its vocoder of %s ready: the model speaks in its own voice", speech_model)
        if config.image_model is not None:
            from omni_gateway.omni.heads.dit.head import load_image_head

            image_head = load_image_head(config.image_model, device=config.engine.device)
            log.info("image model %s ready", config.image_model)
    except BaseException:
        engine.shutdown()
        if speech is not None:
            speech.shutdown()
        close_voice(asr, tts)
        raise
    advice = mps_advice(
        engine_apart=not engine_config.engine_in_process and not _engine_on_cpu(config),
        stages_on_cuda=_on_cuda(asr) or _on_cuda(tts),
    )
    if advice:
        log.warning(advice)
    pipeline = OmniPipeline(
        config,
        engine=engine,
        model_name=model_name,
        max_context_tokens=engine.max_model_len,
        asr=asr,
        tts=tts,
        vad_session=vad_session,
        image_head=image_head,
        vision=vision,
        audio=audio,
        speech=speech,
    )
    if config.warm_up:
        try:
            warm_up(pipeline)
        except BaseException:
            pipeline.shutdown()
            raise
    log.info("all stages ready in %.1f s", time.monotonic() - t0)
    return pipeline


def _load_speech(
    path: str, device: str, spoken: SpeechConfig | Qwen3SpeechConfig, engine: EngineConfig
) -> SpokenModel | Qwen3SpokenModel:
    """The talker side of a speaking checkpoint with its settings (``spoken_settings``, which read its kind):
    Qwen3-Omni's (talker, code predictor, code2wav; random weights under ``load_format="dummy"``) or
    Qwen2.5-Omni's (talker, token2wav)."""
    from omni_gateway.omni.qwen3_speech import Qwen3SpeechConfig, Qwen3SpokenModel
    from omni_gateway.omni.speech import SpokenModel

    if isinstance(spoken, Qwen3SpeechConfig):
        return Qwen3SpokenModel.load(
            path, device=device, config=spoken, load_format=engine.load_format, seed=engine.seed
        )
    if engine.load_format == "dummy":
        raise ValueError(f"load_format 'dummy' makes Qwen3-Omni's speech side; {path} is another talker")
    return SpokenModel.load(path, device=device, config=spoken)


def _load_voice(
    config: OmniConfig, threads: int, speech_model: str | None, *, hears: bool
) -> tuple[Any, TtsHead | None]:
    """The speech recognizer and the TTS voice the config names (None for each one it does not). ``hears``: the
    LLM takes audio itself, so a transcript is a side output its answer never waits for."""
    asr = tts = None
    if config.asr is not None:
        from contextlib import nullcontext

        from omni_gateway.encoders.asr import load_recognizer
        from omni_gateway.engine.runner.step_gate import urgent

        hold = urgent if config.asr_batches_alone and not hears else nullcontext
        asr = load_recognizer(config.asr, device=config.engine.device, hold=hold)
        log.info("ASR %s ready", config.asr)
    if config.tts is not None and speech_model is not None:
        log.info("no TTS voice loaded: %s speaks in its own voice", speech_model)
    elif config.tts is not None:
        from omni_gateway.omni.heads.tts.head import TtsHead

        try:
            tts = TtsHead.load(config.tts, device=config.engine.device, threads=threads)
        except BaseException:
            close_voice(asr, None)
            raise
        log.info("TTS %s ready", config.tts)
    return asr, tts


def close_voice(asr: object | None, tts: object | None) -> None:
    """Stop the speech recognizer's and the TTS voice's batch workers (each one that has any)."""
    for stage in (asr, tts):
        close = getattr(stage, "close", None)
        if close is not None:
            close()


def mps_advice(*, engine_apart: bool, stages_on_cuda: bool, environ: Mapping[str, str] = os.environ) -> str | None:
    """What to tell an operator whose voice stages share the GPU with an engine core in another process while
    no CUDA MPS daemon runs (None when that is not the case). Without MPS the GPU time-slices the two
    processes' kernels, and every voice stage waits for the LLM's slices."""
    if not (engine_apart and stages_on_cuda):
        return None
    pipe = Path(environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    if (pipe / "control").exists():
        return None
    return (
        f"the voice stages run on the GPU beside an engine core in another process, and no CUDA MPS daemon "
        f"answers at {pipe}: the GPU will time-slice the two processes (64 voice sessions on an H100: median "
        "first audio 424 ms without MPS, 274 ms with it; docs/deployment.md). Start `nvidia-cuda-mps-control -d` "
        "before `omni serve`"
    )


def _on_cuda(stage: object | None) -> bool:
    """Whether a loaded stage, or the model it wraps, runs on a CUDA device."""
    for _ in range(4):  # a batcher over a head over a model
        if stage is None:
            return False
        device = getattr(stage, "device", None)
        if device is not None:
            return str(device).startswith("cuda")
        stage = getattr(stage, "recognizer", None) or getattr(stage, "synthesizer", None)
    return False


def resolve_speech_model(config: OmniConfig) -> str | None:
    """The checkpoint whose talker and token2wav speak: ``speech_model`` as given, or for "auto" the LLM's
    own directory when it is a speaking checkpoint (``speaks``)."""
    if config.speech_model != "auto":
        return config.speech_model
    return config.engine.model if speaks(config.engine.model) else None


def speaks(model: str) -> bool:
    """Whether ``model`` is a local directory of a model that speaks in its own voice: Qwen2.5-Omni with its
    talker and token2wav, or Qwen3-Omni with its talker and code2wav."""
    root = Path(model)
    try:
        hf = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if hf.get("enable_audio_output", True) is False or "talker_config" not in hf:
        return False
    if hf.get("model_type") == "qwen3_omni_moe":
        return "code2wav_config" in hf
    return hf.get("model_type") == "qwen2_5_omni" and (root / "spk_dict.pt").is_file()


def _load_vision(config: OmniConfig, engine: Any) -> VisionEncoder:
    """The checkpoint's vision tower, on the engine's device and in its dtype."""
    from omni_gateway.encoders.vision import load_vision_encoder

    device, dtype = engine.device_and_dtype
    return load_vision_encoder(config.engine.model, device=device, dtype=dtype)


def _load_audio(config: OmniConfig, engine: Any) -> AudioEncoder:
    """The checkpoint's audio tower, on the engine's device and in its dtype."""
    from omni_gateway.encoders.audio_tower import load_audio_encoder

    device, dtype = engine.device_and_dtype
    fill = None
    if config.engine.load_format == "dummy":
        from omni_gateway.omni.qwen3_dummy import audio_fill

        fill = audio_fill(config.engine.seed, device, dtype)
    return load_audio_encoder(config.engine.model, device=device, dtype=dtype, fill=fill)


def warm_up(pipeline: OmniPipeline) -> None:
    """One short pass through the LLM, ASR and TTS. The LLM's step shapes were warmed when it loaded
    (``engine.runner.warmup``); this prompt starts as every conversation's does (system prompt included), so
    those full KV blocks stay in the prefix cache for later turns."""
    from concurrent.futures import ThreadPoolExecutor

    from omni_gateway.engine.sampling_params import SamplingParams

    ids = pipeline.prompt_ids(OmniRequest(request_id="warm-up", messages=(Message("user", (TextPart("Hello."),)),)))

    async def a_few_tokens() -> None:  # prefill and decode steps both pay their first-call costs here
        async for _ in pipeline.engine.generate(
            ids, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), request_id="warm-up"
        ):
            pass

    with ThreadPoolExecutor(1) as pool:  # its own event loop: load() may be called from inside one
        pool.submit(asyncio.run, a_few_tokens()).result()
    if pipeline.asr is not None:
        pipeline.asr.transcribe(bytes(16000), sample_rate=16000)  # 0.5 s of silence
    if pipeline.speech is not None:
        pipeline.speech.warm_up(pipeline.engine, ids)
    if pipeline.tts is not None:
        # Longer than a first segment: the voice model's buffers grow once, here, to fit those too.
        pipeline.tts.synthesize(_WARM_UP_SENTENCE)


def stage_threads(config: OmniConfig) -> int:
    """CPU threads for each model stage: the configured count, else half the cores (at least one)."""
    if config.stage_threads is not None:
        if config.stage_threads < 1:
            raise ValueError(f"stage_threads must be >= 1; got {config.stage_threads}")
        return config.stage_threads
    return max(1, (os.cpu_count() or 1) // 2)


def _engine_on_cpu(config: OmniConfig) -> bool:
    device = config.engine.device
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"
