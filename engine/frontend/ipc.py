"""The messages between the gateway process and an engine core process, and their wire format.

Two one-way ZeroMQ PUSH/PULL channels, both bound by the client: commands in (add, abort, a LoRA adapter
loaded or unloaded, stop), outputs out (ready, one batch of deltas per engine step, a refused request, a LoRA
call's answer). Every message carries the
``epoch`` of the core process it belongs to, so a restarted core ignores commands meant for the one
that died, and the client ignores whatever the dead one left in the pipe.

Wire format: pickle (protocol 5). Both ends run the same code, started by the client, and the
messages hold types a schema codec would need one encoder each for: ``SamplingParams`` with its
nested constraint specs, ``StreamDelta`` with logprobs, media embeddings (tensors) of ``EmbedSpan``
and the tokenizer sent once at start-up. Pickling one step's deltas costs microseconds against a
step of milliseconds (``python -m benchmarks.engine_ipc``). Pickle runs code on load, so the
channels are private: ``ipc://`` sockets in a 0700 directory on one machine, and the cluster's own
network between Ray nodes, never a public interface.

This module imports neither torch nor zmq.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams


# ---- client -> core ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AddRequest:
    epoch: int
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int = 0
    embed_spans: tuple[EmbedSpan, ...] = ()
    add_special_tokens: bool = True


@dataclass(frozen=True, slots=True)
class AbortRequest:
    epoch: int
    request_id: str


@dataclass(frozen=True, slots=True)
class LoraCall:
    """Load the LoRA adapter in folder ``path`` as ``name``, or unload ``name`` (``path`` None); answered
    by a ``LoraDone`` of the same ticket."""

    epoch: int
    ticket: int
    name: str
    path: str | None


@dataclass(frozen=True, slots=True)
class Stop:
    """Abort everything in flight and exit."""

    epoch: int


# ---- core -> client ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    """The core loaded and warmed its model; what the client answers for without asking it."""

    epoch: int
    pid: int
    model_name: str
    max_model_len: int
    device: str  # a torch device string: "cpu", "cuda:0"
    dtype: str  # a torch dtype name: "float32", "bfloat16"
    tokenizer: Any
    chat_template: str | None
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StartFailed:
    epoch: int
    error: str


@dataclass(frozen=True, slots=True)
class StepOutput:
    """The deltas of one engine step (or of an abort), as ``delta_rows``, and a fresh stats snapshot when
    one is due."""

    epoch: int
    rows: tuple[tuple[Any, ...], ...]
    stats: dict[str, float] | None = None

    @classmethod
    def of(cls, epoch: int, deltas: list[StreamDelta], stats: dict[str, float] | None) -> StepOutput:
        return cls(epoch, delta_rows(deltas), stats)

    def deltas(self) -> list[StreamDelta]:
        return [StreamDelta(*row) for row in self.rows]


def delta_rows(deltas: list[StreamDelta]) -> tuple[tuple[Any, ...], ...]:
    """Deltas as plain tuples in field order: pickling a slotted dataclass costs ~3x a tuple of its fields
    (``python -m benchmarks.engine_ipc`` measures a step's message)."""
    return tuple(
        (
            d.request_id,
            d.text,
            d.token_ids,
            d.finished,
            d.finish_reason,
            d.stop_reason,
            d.num_prompt_tokens,
            d.num_cached_tokens,
            d.num_output_tokens,
            d.logprobs,
            d.error,
            d.index,
            _on_host(d.hidden_states),
            _on_host(d.input_embeds),
            d.hidden_start,
            _on_host(d.pooled),
        )
        for d in deltas
    )


def _on_host(rows: Any) -> Any:
    """Hidden-state rows stay on the engine's device in its process; a message carries them on the host."""
    return rows.cpu() if hasattr(rows, "cpu") else rows


@dataclass(frozen=True, slots=True)
class Refused:
    """``add_request`` raised: the caller's ``generate`` raises ``error`` before any delta."""

    epoch: int
    request_id: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class LoraDone:
    """A ``LoraCall``'s answer: ``error`` is what the engine raised, None when it succeeded."""

    epoch: int
    ticket: int
    error: BaseException | None


Command = AddRequest | AbortRequest | LoraCall | Stop
Output = Ready | StartFailed | StepOutput | Refused | LoraDone


def encode(message: Command | Output) -> bytes:
    return pickle.dumps(message, protocol=5)


def decode(frame: bytes) -> Any:
    return pickle.loads(frame)  # noqa: S301 - private channel between processes this code started
