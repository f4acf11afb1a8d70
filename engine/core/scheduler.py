"""Token-budget scheduler: one budget per step shared by decodes and (chunked) prefills.

There are no prefill or decode phases. Every sequence has ``num_computed_tokens``; each step hands
out tokens so that it catches up with ``len(seq)``. Running sequences go first, then waiting ones by
(priority, arrival). When blocks run out, the lowest-priority latest running sequence is preempted
by recompute. Pure Python: no torch, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence as Seq

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.pipelining import continues_after_next_token, may_run_ahead
from omni_gateway.engine.core.sequence import FinishReason, ScheduledBatch, Sequence, SequenceStatus
from omni_gateway.engine.errors import EngineOverloaded


def _order(seq: Sequence) -> tuple[int, bool, float, int]:
    # Preempted sequences go ahead of never-started ones of the same priority: they were admitted before.
    return (seq.priority, seq.num_preemptions == 0, seq.arrival_time, seq.seq_id)


def token_stop(seq: Sequence) -> tuple[FinishReason, int | None] | None:
    """Whether the last appended token ends the sequence: (reason, stop token id or None), else None."""
    params = seq.params
    token = seq.last_token_id
    if seq.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token in seq.eos_token_ids:
            return FinishReason.STOP, None
        if token in params.stop_token_ids:
            return FinishReason.STOP, token
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return FinishReason.LENGTH, None
    if seq.max_model_len is not None and len(seq) >= seq.max_model_len:
        return FinishReason.LENGTH, None
    return None


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: list[Sequence] = []  # kept sorted by _order
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def all_wait_for_input(self) -> bool:
        """Whether nothing waits for admission and every running sequence waits for its input rows."""
        return not self.waiting and all(seq.waits_for_input(1) for seq in self.running)

    def streamed_waiting(self) -> bool:
        """Whether a sequence that brings an input stream waits for admission."""
        return any(seq.input_stream is not None for seq in self.waiting)

    def some_wait_for_input(self) -> bool:
        """Whether some running sequence waits for its input rows while others could step."""
        waiting = sum(seq.waits_for_input(1) for seq in self.running)
        return 0 < waiting and (waiting < len(self.running) or bool(self.waiting))

    def add(self, seq: Sequence, *, enforce_limit: bool = True) -> None:
        """Queue a new sequence. ``enforce_limit=False`` is for siblings of an admitted request (n > 1)."""
        limit = self.config.max_waiting_requests
        if enforce_limit and len(self.waiting) >= limit:
            raise EngineOverloaded(
                f"waiting queue is full ({len(self.waiting)} of max_waiting_requests={limit}); retry later"
            )
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_order)

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        seqs: list[Sequence] = []
        counts: list[int] = []
        preempted: list[Sequence] = []

        # Pass 1: running sequences, most important first, so any victim comes from the unscheduled tail.
        queue = sorted(self.running, key=_order)
        i = 0
        while i < len(queue) and budget > 0:
            seq = queue[i]
            n = min(seq.num_uncomputed_tokens, budget)
            if seq.waits_for_input(n):
                queue.pop(i)  # its input rows are still on their way; it keeps its blocks meanwhile
                continue
            while not self.kv.allocate_slots(seq, n):
                victim = queue.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                seqs.append(seq)
                counts.append(n)
                budget -= n
                i += 1

        # Pass 2: admit waiting sequences, unless this step had to preempt (no room to grow into).
        if not preempted:
            # Blocks that this step fills: a waiting sequence whose next block is among them waits one
            # step and then reuses it, instead of computing the same prefix twice (shared system prompts).
            filling = {h for seq, n in zip(seqs, counts) for h in self.kv.hashes_filled_by(seq, n)}
            admitted: list[Sequence] = []
            # Every step fits the adapter slots (engine/lora): the running sequences use at most max_loras.
            adapters = {s.lora.uid for s in self.running if s.lora is not None}
            for seq in self.waiting:
                if budget <= 0 or len(self.running) + len(admitted) >= self.config.max_num_seqs:
                    break
                lora = seq.lora
                if lora is not None and lora.uid not in adapters and len(adapters) >= self.config.max_loras:
                    continue  # waits until a running adapter's last sequence leaves
                prefix = self.kv.find_cached_prefix(seq)
                if filling and self.kv.next_block_hash(seq, prefix) in filling:
                    continue
                n = min(len(seq) - prefix.num_tokens, budget)
                if not self.kv.allocate_slots(seq, n, prefix):
                    break  # stop, rather than let smaller later requests starve this one
                seq.num_computed_tokens = prefix.num_tokens
                # After a preemption the hit may cover generated tokens; report prompt tokens only.
                seq.num_cached_tokens = min(prefix.num_tokens, seq.num_prompt_tokens)
                seq.status = SequenceStatus.RUNNING
                seqs.append(seq)
                counts.append(n)
                budget -= n
                admitted.append(seq)
                if lora is not None:
                    adapters.add(lora.uid)
                filling.update(self.kv.hashes_filled_by(seq, n))
            if admitted:
                self.running.extend(admitted)
                self.waiting = [s for s in self.waiting if s.status is SequenceStatus.WAITING]

        return ScheduledBatch(seqs=seqs, num_new_tokens=counts, preempted=preempted)

    def schedule_lookahead(self, in_flight: ScheduledBatch) -> ScheduledBatch | None:
        """The step to launch behind ``in_flight`` (a launchable step whose tokens the host has not
        read; see ``engine.core.pipelining``), with the KV slot of each sequence's next position allocated;
        None when the host must see ``in_flight``'s tokens first."""
        if self.waiting:
            return None  # the host's schedule would admit them
        live = [seq for seq in in_flight.seqs if not seq.is_finished]
        if len(live) != len(self.running):
            return None  # some running sequence was left out of the step in flight; it must not starve
        seqs = [seq for seq in live if continues_after_next_token(seq)]
        if any(seq.input_stream is not None and not seq.input_stream.ready(len(seq) + 1) for seq in seqs):
            return None
        if not seqs or not all(may_run_ahead(seq) for seq in seqs):
            return None
        for seq in seqs:
            # The slot of the position after the one in flight. Blocks taken before a refusal stay with
            # their sequence, which the next scheduled step would have allocated anyway.
            if not self.kv.allocate_slots(seq, 2):
                return None
        return ScheduledBatch(seqs=seqs, num_new_tokens=[1] * len(seqs), preempted=[])

    def update_from_output(self, batch: ScheduledBatch, token_ids: Seq[int | None]) -> list[Sequence]:
        """Advance computed counts, append sampled tokens and finish sequences on token-level stops.

        ``token_ids`` is aligned with ``batch.seqs``: None where a prefill chunk did not reach the end.
        Returns the sequences that received a token this step (finished ones included)."""
        if len(token_ids) != len(batch.seqs):
            raise ValueError(f"runner returned {len(token_ids)} results for a batch of {len(batch.seqs)}")
        grown: list[Sequence] = []
        for seq, n, token in zip(batch.seqs, batch.num_new_tokens, token_ids):
            if seq.is_finished:  # aborted while the step ran
                continue
            seq.num_computed_tokens += n
            self.kv.cache_full_blocks(seq)
            if token is None:
                continue
            seq.token_ids.append(token)
            grown.append(seq)
            stop = token_stop(seq)
            if stop is not None:
                self.finish(seq, stop[0], stop[1])
        return grown

    def finish(self, seq: Sequence, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sequence of ``request_id`` wherever it is; returns them."""
        found = [s for s in (*self.running, *self.waiting) if s.request_id == request_id]
        for seq in found:
            self.finish(seq, FinishReason.ABORT)
        return found

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq, enforce_limit=False)
