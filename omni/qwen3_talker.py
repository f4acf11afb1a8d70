"""Qwen3-Omni's talker side: the MoE talker on the paged engine, its code predictor filling in each frame, and
the input rows that tie them together.

The talker engine runs each utterance with ``return_hidden_states`` and an ``InputStream``: after a step that
chose a frame's first code, ``FrameFeeder.step`` runs the code predictor for every utterance that stepped (one
batch), keeps the frame's codes, and appends the next position's row (the residual codebooks' embedding sum
plus the text row in step with it) to the utterance's stream; the talker waits for that row before its next
step. Text rows come from the thinker as it writes (``SpokenFrames.add_text``/``end_text``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.qwen3_omni_code_predictor import CodePredictor, CodePredictorConfig, FrameSampling
from omni_gateway.engine.models.qwen3_omni_talker import load_talker, read_config, read_talker_tensors, talker_config
from omni_gateway.engine.models.qwen3_omni_talker_inputs import TalkerInputs, ThinkerIds
from omni_gateway.engine.runner.input_stream import InputStream


class SpokenFrames:
    """One utterance's frames so far and the rows its talker reads: generated position ``i`` takes frame
    ``i``'s residual embedding sum plus text row ``i`` (then ``tts_eos``, then ``tts_pad``). ``seed``: the
    request's, from which the code predictor draws the utterance's sampled codes (None: fresh randomness)."""

    def __init__(
        self, stream: InputStream, tts_eos: torch.Tensor, tts_pad: torch.Tensor, *, seed: int | None = None
    ) -> None:
        self.stream = stream
        self.seed = seed
        self.frames: list[list[int]] = []  # num_code_groups codes per frame
        self._eos, self._pad = tts_eos, tts_pad
        self._text: list[torch.Tensor] = []
        self._text_ended = False
        self._residuals: list[torch.Tensor] = []
        self._sent = 0
        self._lock = threading.Lock()

    def add_text(self, rows: torch.Tensor | list[torch.Tensor]) -> None:
        with self._lock:
            if self._text_ended:
                raise RuntimeError("text added after its end")
            self._text += list(rows)
            self._flush()

    def end_text(self) -> None:
        with self._lock:
            self._text_ended = True
            self._flush()

    def add_frame(self, codes: list[int], residual: torch.Tensor) -> None:
        with self._lock:
            self.frames.append(codes)
            self._residuals.append(residual)
            self._flush()

    def _flush(self) -> None:
        rows = []
        while self._sent < len(self._residuals):
            i = self._sent
            if i < len(self._text):
                text = self._text[i]
            elif self._text_ended:
                text = self._eos if i == len(self._text) else self._pad
            else:
                break  # the thinker has not written this far yet
            rows.append(self._residuals[i] + text.to(self._residuals[i].dtype))
            self._sent += 1
        if rows:
            self.stream.append(rows)


@dataclass(frozen=True, slots=True)
class FrameFeeder:
    predictor: CodePredictor
    stop_ids: frozenset[int]

    def step(
        self,
        work: list[tuple[SpokenFrames, torch.Tensor, int]],
        sampling: FrameSampling = FrameSampling(),
    ) -> None:
        """``work``: per utterance that stepped, the talker's final-normed hidden state of the position that chose
        its new first code, and that code. A stop code ends the utterance: it has no frame. A seeded utterance's
        frame ``i`` is drawn from its seed and ``i`` alone."""
        work = [(frames, hidden, code) for frames, hidden, code in work if code not in self.stop_ids]
        if not work:
            return
        hidden = torch.stack([h.reshape(-1) for _, h, _ in work])
        first = torch.tensor([code for _, _, code in work], dtype=torch.long)
        seeds = [None if frames.seed is None else (frames.seed, len(frames.frames)) for frames, _, _ in work]
        residual_codes, sums = self.predictor.predict(hidden, first, sampling, seeds)
        for (frames, _, code), codes, row in zip(work, residual_codes.tolist(), sums):
            frames.add_frame([code, *codes], row)


@dataclass(frozen=True, slots=True)
class Qwen3Talker:
    """What a Qwen3-Omni checkpoint's ``talker.*`` tensors make: the engine's model, the code predictor and the
    input-row builder."""

    loaded: Any  # engine.runner.loader.LoadedModel of the talker decoder
    predictor: CodePredictor
    inputs: TalkerInputs

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_model_len: int | None = None,
        load_format: str = "auto",
        seed: int = 0,
    ) -> Qwen3Talker:
        """``load_format="dummy"``: random weights from the config (``omni.qwen3_dummy``); no weight file is read."""
        root = Path(path)
        hf = read_config(root)
        cfg = talker_config(hf)  # raises for a checkpoint without a Qwen3-Omni talker
        if load_format == "dummy":
            from omni_gateway.omni.qwen3_dummy import talker_decoder_source, talker_tensors

            tensors = talker_tensors(hf, seed, device, dtype)
            loaded = load_talker(root, max_model_len, source=talker_decoder_source(hf, seed))
        elif load_format == "auto":
            tensors = read_talker_tensors(root)
            loaded = load_talker(root, max_model_len, tensors=tensors)
        else:
            raise ModelLoadError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
        sub = hf.talker_config
        prefix = "talker.code_predictor."
        try:
            predictor = CodePredictor(
                CodePredictorConfig.from_hf(sub.code_predictor_config),
                {n[len(prefix) :]: t for n, t in tensors.items() if n.startswith(prefix)},
                tensors["talker.model.codec_embedding.weight"],
                device=device,
                dtype=dtype,
            )
            inputs = TalkerInputs(
                cfg.talker_tokens,
                ThinkerIds.from_hf(hf),
                tensors,
                act=str(sub.text_config.hidden_act),
                device=device,
                dtype=dtype,
            )
        except KeyError as exc:
            name = str(exc.args[0])
            name = name if name.startswith("talker.") else prefix + name
            raise ModelLoadError(f"{str(root)!r} lacks the talker tensor {name}") from exc
        return cls(loaded, predictor, inputs)

    def feeder(self) -> FrameFeeder:
        return FrameFeeder(self.predictor, self.inputs.tokens.stop_ids)
