"""The input rows of Qwen3-Omni's talker, built from the thinker's states as Hugging Face's
``Qwen3OmniMoeForConditionalGeneration.generate`` builds them.

Two projections (each ``fc2(act(fc1(x)))``) take the thinker's width to the talker's: ``text_projection`` of
the thinker's input embeddings, ``hidden_projection`` of its hidden state after layer ``accept_hidden_layer``
(Hugging Face's ``hidden_states[accept_hidden_layer]``, the output of that many decoder layers).

The prompt is
- every user turn of the conversation (system turns are left out), from its ``<|im_start|>`` to the next one:
  ``hidden_projection`` at audio/image/video positions, ``text_projection`` elsewhere, no code;
- the last assistant turn's ``<|im_start|>assistant\\n`` (``text_projection``, no code), then four ``tts_pad``
  rows with the codes nothink, think start, think end and the voice's speaker code, ``tts_bos`` with the codec
  pad, and the first reply token's row with the codec start.
Generated position ``i`` (from 0) adds to its frame's code embeddings the projected embedding of reply token
``i + 1``; after the reply's rows comes ``tts_eos``, then ``tts_pad`` for as long as the talker speaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from omni_gateway.engine.models.qwen3_omni_talker import Qwen3TalkerTokens


@dataclass(frozen=True, slots=True)
class ThinkerIds:
    """The thinker-side ids the talker's prompt is cut by (a Qwen3-Omni config's top level)."""

    im_start: int
    user: int
    assistant: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    media: frozenset[int]  # audio, image and video placeholders: their positions are heard through hidden states

    @classmethod
    def from_hf(cls, cfg: Any) -> ThinkerIds:
        thinker = cfg.thinker_config
        return cls(
            im_start=int(cfg.im_start_token_id),
            user=int(cfg.user_token_id),
            assistant=int(cfg.assistant_token_id),
            tts_bos=int(cfg.tts_bos_token_id),
            tts_eos=int(cfg.tts_eos_token_id),
            tts_pad=int(cfg.tts_pad_token_id),
            media=frozenset(int(getattr(thinker, n)) for n in ("audio_token_id", "image_token_id", "video_token_id")),
        )


@dataclass(frozen=True, slots=True)
class _Projection:
    fc1: tuple[torch.Tensor, torch.Tensor]
    fc2: tuple[torch.Tensor, torch.Tensor]
    act: str

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, *self.fc1)
        h = F.silu(h) if self.act == "silu" else F.gelu(h, approximate="tanh" if "tanh" in self.act else "none")
        return F.linear(h, *self.fc2)


def user_positions(ids: list[int], thinker: ThinkerIds) -> list[int]:
    """Positions of ``ids`` inside user turns: from a ``<|im_start|>`` followed by the user role up to the next
    ``<|im_start|>``."""
    out, inside = [], False
    for i, token in enumerate(ids):
        if token == thinker.im_start:
            inside = i + 1 < len(ids) and ids[i + 1] == thinker.user
        if inside:
            out.append(i)
    return out


def assistant_start(ids: list[int], thinker: ThinkerIds) -> int:
    """The position of the last ``<|im_start|>assistant`` of a prompt."""
    for i in range(len(ids) - 2, -1, -1):
        if ids[i] == thinker.im_start and ids[i + 1] == thinker.assistant:
            return i
    raise ValueError("the thinker's prompt has no assistant turn (<|im_start|>assistant) to speak")


class TalkerInputs:
    """The talker's projections and codec embedding, on one device: ``prompt`` and ``text_rows`` build rows."""

    def __init__(
        self,
        tokens: Qwen3TalkerTokens,
        thinker: ThinkerIds,
        weights: dict[str, torch.Tensor],
        *,
        act: str,
        device: Any,
        dtype: torch.dtype,
    ) -> None:
        self.tokens = tokens
        self.thinker = thinker
        self.device = torch.device(device)
        self.dtype = dtype

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=self.device, dtype=dtype).contiguous()

        def projection(prefix: str) -> _Projection:
            return _Projection(
                (w(prefix + "linear_fc1.weight"), w(prefix + "linear_fc1.bias")),
                (w(prefix + "linear_fc2.weight"), w(prefix + "linear_fc2.bias")),
                act,
            )

        self.text_projection = projection("talker.text_projection.")
        self.hidden_projection = projection("talker.hidden_projection.")
        self.codec_embedding = w("talker.model.codec_embedding.weight")

    def text_rows(self, embeds: torch.Tensor) -> torch.Tensor:
        """``text_projection`` of thinker input embeddings ``[N, thinker_hidden]``."""
        return self.text_projection(embeds.to(device=self.device, dtype=self.dtype))

    def prompt(
        self,
        ids: list[int],
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        first_reply: torch.Tensor,
        tts: torch.Tensor,
        voice: str,
    ) -> tuple[list[int], torch.Tensor]:
        """The talker's prompt ids and rows ``[P, talker_hidden]`` (rows add to the ids' code embeddings).

        ``ids``, ``embeds`` and ``hidden`` cover the thinker's prompt: its ids, input embeddings and hidden states
        after layer ``accept_hidden_layer``; ``first_reply`` is the input embedding of the reply's first token and
        ``tts`` the thinker's input embeddings of ``tts_bos``, ``tts_eos``, ``tts_pad`` (``[3, thinker_hidden]``)."""
        if not len(ids) == len(embeds) == len(hidden):
            raise ValueError(f"{len(ids)} prompt ids, {len(embeds)} embedding rows and {len(hidden)} hidden rows")
        speaker = self.tokens.speaker(voice)
        start = assistant_start(ids, self.thinker)
        if start + 3 != len(ids):
            raise ValueError(
                f"the prompt must end with <|im_start|>assistant and one more token; it has {len(ids) - start} "
                "tokens from its last <|im_start|>assistant"
            )
        users = user_positions(ids, self.thinker)
        media = torch.tensor([ids[i] in self.thinker.media for i in users], dtype=torch.bool, device=self.device)
        user = self.text_rows(embeds[users])
        if bool(media.any()):
            heard = self.hidden_projection(hidden[users].to(device=self.device, dtype=self.dtype))
            user = torch.where(media[:, None], heard, user)
        bos, _, pad = self.text_rows(tts).unbind(0)
        rows = torch.cat(
            (
                user,
                self.text_rows(embeds[start:]),
                pad.expand(4, -1),
                bos[None],
                self.text_rows(first_reply.reshape(1, -1)),
            )
        )
        t = self.tokens
        codes = [t.codec_nothink, t.codec_think_bos, t.codec_think_eos, speaker, t.codec_pad, t.codec_bos]
        return [t.silent] * (len(users) + 3) + codes, rows
