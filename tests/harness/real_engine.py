"""The real model side for socket-level tests: AsyncEngine over a tiny random Llama, wrapped by OmniPipeline; and
the OmniConfig the tests load a saved tiny checkpoint with on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_gateway.omni.config import OmniConfig

MAX_MODEL_LEN = 256  # the tiny config's max_position_embeddings


def tiny_pipeline(
    directory: Path,
    max_tokens: int = 200,
    *,
    chat_template: str | None = None,
    omni_args: dict[str, Any] | None = None,
    **engine_args: Any,
) -> Any:
    """An ``OmniPipeline`` (no ASR, TTS, VAD or vision) over a random 2-layer Llama saved into ``directory``;
    ``chat_template`` replaces its tokenizer's, ``omni_args`` go to its ``OmniConfig``."""
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.omni.config import EngineConfig, OmniConfig
    from omni_gateway.omni.pipeline import OmniPipeline

    from tests.harness.checkpoints import save_tiny_checkpoint

    save_tiny_checkpoint("llama", directory)
    if chat_template is not None:
        set_chat_template(directory, chat_template)
    engine_config = EngineConfig(
        model=str(directory), device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN, **engine_args
    )
    config = OmniConfig(
        engine=engine_config,
        asr=None,
        tts=None,
        vad=False,
        vision=False,
        temperature=1.0,
        max_tokens=max_tokens,
        **(omni_args or {}),
    )
    engine = AsyncEngine(engine_config)
    return OmniPipeline(config, engine=engine, model_name="tiny-llama", max_context_tokens=MAX_MODEL_LEN)


def checkpoint_config(
    directory: Path | str, *, max_tokens: int, engine_args: dict[str, Any] | None = None, **fields: Any
) -> OmniConfig:
    """The ``OmniConfig`` that loads the checkpoint saved in ``directory`` on the CPU with greedy sampling and no
    ASR, TTS, VAD or warm-up; ``engine_args`` override its ``EngineConfig``'s fields, ``fields`` its own."""
    from omni_gateway.omni.config import EngineConfig, OmniConfig

    engine = EngineConfig(**{"model": str(directory), "device": "cpu", "num_kv_blocks": 96, **(engine_args or {})})
    defaults: dict[str, Any] = {"asr": None, "tts": None, "vad": False, "temperature": 0.0, "warm_up": False}
    return OmniConfig(engine=engine, max_tokens=max_tokens, **{**defaults, **fields})


def set_chat_template(directory: Path, template: str) -> None:
    """Give the tokenizer saved in ``directory`` another chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(directory)
