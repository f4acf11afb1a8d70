"""A step's sampled tokens applied to the requests they belong to: stops, grammar ends, logprobs, text and pooled
vectors per sequence; stream deltas for the caller, and the final output of each request that finishes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omni_gateway.engine.core.detokenizer import IncrementalDetokenizer
from omni_gateway.engine.core.request_state import EngineRequest, request_output, stream_delta
from omni_gateway.engine.core.scheduler import Scheduler
from omni_gateway.engine.core.sequence import FinishReason, ScheduledBatch, Sequence
from omni_gateway.engine.outputs import Logprob, RequestOutput, StreamDelta

if TYPE_CHECKING:
    from omni_gateway.engine.core.structured_output import GrammarCache


class OutputProcessor:
    """The engine's unfinished requests, by id and by sequence. ``release`` frees what finished sequences hold
    beyond the scheduler (the runner's and the speculator's state); ``pooling`` is how the checkpoint pools a
    prompt into one vector (``engine.core.pooling``)."""

    def __init__(self, release: Callable[[list[int]], None], pooling: str) -> None:
        self.release = release
        self.pooling = pooling
        self.requests: dict[str, EngineRequest] = {}
        self._owner: dict[int, tuple[EngineRequest, int]] = {}
        self._finished: list[RequestOutput] = []

    def add(self, req: EngineRequest) -> None:
        self.requests[req.request_id] = req
        for i, seq in enumerate(req.seqs):
            self._owner[seq.seq_id] = (req, i)

    def pop_finished(self) -> list[RequestOutput]:
        """RequestOutputs of requests that finished since the last call (the caller must drain this)."""
        out, self._finished = self._finished, []
        return out

    def retire(self, req: EngineRequest) -> None:
        for seq in req.seqs:
            self._owner.pop(seq.seq_id, None)
            seq.grammar = None
        del self.requests[req.request_id]
        self._finished.append(request_output(req))

    def absorb(
        self, batch: ScheduledBatch, results: list[Any], scheduler: Scheduler, grammars: GrammarCache | None
    ) -> list[StreamDelta]:
        """Apply one step's results (one per sequence of ``batch``, None where it sampled nothing) through
        ``scheduler``; ``grammars`` advances the matchers, where any constraint was ever compiled."""
        by_seq = {seq.seq_id: r for seq, r in zip(batch.seqs, results) if r is not None}
        token_ids: list[int | None] = [None if r is None else r.token_id for r in results]
        rejected = grammars.accept(batch.seqs, token_ids) if grammars is not None else []
        grown = scheduler.update_from_output(batch, token_ids)
        pooled = self._pool_finished(batch, scheduler)

        deltas: list[StreamDelta] = []
        done: list[Sequence] = []
        touched: dict[str, EngineRequest] = {}
        now = time.monotonic()
        for seq in grown:
            req, index = self._owner[seq.seq_id]
            touched[req.request_id] = req
            req.first_token = req.first_token or now
            result = by_seq[seq.seq_id]
            if not seq.is_finished and seq.grammar is not None and seq.grammar.is_terminated():
                scheduler.finish(seq, FinishReason.STOP)  # the grammar accepted its stop token
            lp: tuple[Logprob, ...] = ()
            if seq.params.logprobs is not None and result.logprob is not None:
                seq.output_logprobs.append(result.logprob)
                lp = (result.logprob,)
            text = self._detokenize(seq, req.detoks[index], result.token_id, scheduler)
            if seq.is_finished:
                done.append(seq)
            deltas.append(stream_delta(req, index, text, (result.token_id,), lp))
        for seq in rejected:  # the grammar cannot continue (every token was masked): end it, token unkept
            req, index = self._owner[seq.seq_id]
            touched[req.request_id] = req
            scheduler.finish(seq, FinishReason.ERROR)
            done.append(seq)
            # An error, not only a finish reason: a stream must not end as if the answer were whole.
            failed = stream_delta(req, index, req.detoks[index].flush(), ())
            error = f"the output constraint allowed no next token after {len(seq.output_token_ids)} tokens"
            deltas.append(dataclasses.replace(failed, error=error))
        for seq, vector in pooled:
            req, index = self._owner[seq.seq_id]
            touched[req.request_id] = req
            done.append(seq)
            deltas.append(stream_delta(req, index, "", (), pooled=vector))
        if done:
            self.release([s.seq_id for s in done])
        for req in touched.values():
            if all(s.is_finished for s in req.seqs):
                self.retire(req)
        return deltas

    def _pool_finished(self, batch: ScheduledBatch, scheduler: Scheduler) -> list[tuple[Sequence, Any]]:
        """Pooling requests whose prompt is now computed: each ends with its vector (its KV freed)."""
        out = []
        for seq in batch.seqs:
            if seq.params.pooling is None or seq.is_finished or seq.num_computed_tokens < len(seq):
                continue
            import torch  # only pooling requests get here: the runner made their rows tensors
            from omni_gateway.engine.core.pooling import pool

            # a preempted request computed its prompt again from position 0: its last pass is the one to pool
            last_pass = max(i for i, (first, _, _) in enumerate(seq.hidden_rows) if first == 0)
            rows = torch.cat([h for _, h, _ in seq.hidden_rows[last_pass:]])
            seq.hidden_rows.clear()
            method = self.pooling if seq.params.pooling == "model" else seq.params.pooling
            scheduler.finish(seq, FinishReason.STOP)
            out.append((seq, pool(rows, method)))
        return out

    @staticmethod
    def _detokenize(seq: Sequence, detok: IncrementalDetokenizer, token_id: int, scheduler: Scheduler) -> str:
        text: str = detok.add_token(token_id, check_stop=seq.num_output_tokens >= seq.params.min_tokens)
        if detok.stop_string is not None:
            if seq.is_finished:  # a token-level stop in the same step: the stop string came first in the text
                seq.finish_reason, seq.stop_reason = FinishReason.STOP, detok.stop_string
            else:
                scheduler.finish(seq, FinishReason.STOP, detok.stop_string)
        elif seq.is_finished:
            text += detok.flush()
        return text
