"""One engine request's state (its sequences, one per ``n``, and their detokenizers) and what the engine
reports of it: a ``StreamDelta`` per sequence and step, and the ``RequestOutput`` once it is retired."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omni_gateway.engine.core.detokenizer import IncrementalDetokenizer
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.outputs import CompletionOutput, Logprob, RequestOutput, StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    detoks: list[IncrementalDetokenizer]
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None


def stream_delta(
    req: EngineRequest,
    index: int,
    text: str,
    token_ids: tuple[int, ...],
    logprobs: tuple[Logprob, ...] = (),
    pooled: Any = None,
) -> StreamDelta:
    """Sequence ``index``'s delta of one step: ``text`` and ``token_ids`` new since the last, and the
    hidden-state rows it has not sent yet."""
    seq = req.seqs[index]
    hidden = embeds = None
    start = 0
    if seq.hidden_rows:
        import torch  # only requests that asked for hidden states get here (the runner made tensors)

        # After a preemption the positions are computed again: each one's rows go out once.
        sent = seq.hidden_sent
        rows = [(first, h, e) for first, h, e in seq.hidden_rows if first + len(h) > sent]
        seq.hidden_rows.clear()
        if rows:
            cut = max(sent - rows[0][0], 0)
            start = rows[0][0] + cut
            # one step's rows (the usual case) go out as they are, without a copy
            hidden = (rows[0][1] if len(rows) == 1 else torch.cat([h for _, h, _ in rows]))[cut:]
            embeds = (rows[0][2] if len(rows) == 1 else torch.cat([e for _, _, e in rows]))[cut:]
            seq.hidden_sent = start + len(hidden)
    return StreamDelta(
        request_id=req.request_id,
        text=text,
        token_ids=token_ids,
        finished=seq.is_finished,
        finish_reason=seq.finish_reason.value if seq.finish_reason else None,
        stop_reason=seq.stop_reason,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        num_output_tokens=seq.num_output_tokens,
        logprobs=logprobs,
        index=index,
        hidden_states=hidden,
        input_embeds=embeds,
        hidden_start=start,
        pooled=pooled,
    )


def request_output(req: EngineRequest) -> RequestOutput:
    """The whole request: every sequence's text, tokens and logprobs, and its timings."""
    outputs = [
        CompletionOutput(
            index=i,
            text=req.detoks[i].output_text,
            token_ids=seq.output_token_ids,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            stop_reason=seq.stop_reason,
            logprobs=list(seq.output_logprobs) if req.params.logprobs is not None else None,
        )
        for i, seq in enumerate(req.seqs)
    ]
    finished = all(s.is_finished for s in req.seqs)
    metrics = {"arrival_time": req.arrival}
    if req.first_token is not None:
        metrics["time_to_first_token"] = req.first_token - req.arrival
    if finished:
        metrics["e2e_latency"] = time.monotonic() - req.arrival
    return RequestOutput(
        request_id=req.request_id,
        prompt=req.prompt,
        prompt_token_ids=req.prompt_token_ids,
        outputs=outputs,
        finished=finished,
        num_cached_tokens=req.seqs[0].num_cached_tokens,
        metrics=metrics,
    )
