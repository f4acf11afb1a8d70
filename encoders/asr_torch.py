"""The torch Whisper backend: any local Hugging Face Whisper checkpoint, on CPU or GPU.

A batch's 30 s windows are encoded together (on a GPU replayed from CUDA graphs: ``whisper_encode``);
windows with the same decoder prompt decode greedily together, over Hugging Face's dynamic KV cache on a
CPU or over fixed buffers replayed from CUDA graphs on a GPU (``whisper_decode``). torch is imported when a
recognizer is built, so that importing this module costs nothing where only faster-whisper runs.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any

import numpy as np
from omni_gateway.encoders.asr import (
    SAMPLE_RATE,
    WINDOW_S,
    AsrJob,
    AsrResult,
    AsrUsage,
    OneAsABatch,
    english_only_check,
    to_model_input,
)


class TorchWhisperRecognizer(OneAsABatch):
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
        encoder_graphs: bool | None = None,
        max_batch: int = 32,
    ) -> None:
        """``static_cache``: decode over fixed buffers (``whisper_decode``), each step a CUDA graph on CUDA;
        default on CUDA only (on a CPU the dynamic cache, which attends to written positions only, costs less).
        ``encoder_graphs``: replay the encoder from CUDA graphs (``whisper_encode``); default on CUDA.
        ``max_batch``: the most windows decoded together (the static buffers' rows; larger batches run in parts)."""
        import torch
        from omni_gateway.kernels.host_copies import to_host
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self._torch = torch
        self._to_host = to_host
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
        from omni_gateway.encoders.whisper_encode import GraphedWhisperEncoder
        from omni_gateway.encoders.whisper_features import WhisperLogMel

        self._log_mel = WhisperLogMel(self.processor.feature_extractor, self.device)

        self._encoder = GraphedWhisperEncoder(
            self.model.get_encoder(),
            max_rows=max_batch,
            graphs=encoder_graphs if encoder_graphs is not None else self.device.type == "cuda",
        )
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
        # Its own CUDA stream: on the thread's default stream, which the engines step on in the server's
        # process, a synchronization here would wait for their queued steps and theirs for a batch's encoder.
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the weights, loaded on that one

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
        with self._on_stream(), torch.inference_mode():
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
        """On CUDA, compute the spectrogram of a batch of every size up to ``max_batch`` once: cuFFT plans the
        transform per batch size (up to 1.5 s for a first batch). An encoder that runs eagerly (no graphs) also
        encodes each: cuDNN plans its attention and convolutions for every batch size it has not seen (a first
        call of a size took 0.05-0.12 s longer than the next for Whisper large-v3-turbo on an H200), plans
        that torch keeps per thread. A replayed encoder has nothing left to plan (its graphs were captured
        when the recognizer was built)."""
        if self.device.type != "cuda":
            return
        torch = self._torch
        silence = np.zeros(SAMPLE_RATE, np.float32)
        with self._on_stream(), torch.inference_mode():
            for rows in range(1, max_batch + 1):
                features = self._features([silence] * rows)
                if not self._encoder.graphs:
                    self._encode(features)
            torch.cuda.current_stream(self.device).synchronize()

    def _on_stream(self, after_caller: bool = False) -> Any:
        """On the recognizer's stream; ``after_caller``: behind the caller's queued work too (device inputs)."""
        if self._stream is None:
            return contextlib.nullcontext()
        if after_caller:
            self._stream.wait_stream(self._torch.cuda.current_stream(self.device))
        return self._torch.cuda.stream(self._stream)

    def _features(self, samples: np.ndarray | list[np.ndarray]):
        return self._log_mel(samples).to(self.model.dtype)

    def _encode(self, features):
        return self._encoder(features)

    def detect_language(self, features) -> str:
        with self._on_stream(after_caller=True), self._torch.inference_mode():
            return self._detect_languages(self._encode(features))[0]

    def _detect_languages(self, encoded) -> list[str]:
        torch = self._torch
        start = torch.full((encoded.shape[0], 1), self._sot, device=self.device)
        logits = self.model(encoder_outputs=(encoded,), decoder_input_ids=start).logits[:, -1]
        names = list(self._languages)
        best = self._to_host(torch.argmax(logits[:, [self._languages[n] for n in names]], dim=-1))[0].tolist()
        return [names[b][2:-2] for b in best]

    def greedy_decode(self, features, prefix: list[int]) -> list[int]:
        """Generated token ids after ``prefix``, end-of-text excluded."""
        with self._on_stream(after_caller=True), self._torch.inference_mode():
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
            tokens = self._to_host(torch.argmax(logits, dim=-1))[0].tolist()
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
