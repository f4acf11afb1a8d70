"""The synchronous engine: requests in, one scheduled step at a time, stream deltas out.

Not thread-safe: exactly one thread drives it (the caller of ``LLM`` or ``AsyncEngine``'s loop thread).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any, Protocol

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.detokenizer import IncrementalDetokenizer
from omni_gateway.engine.core.intake import check_inputs, check_prompt, check_spans, sample_params
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.pipelining import launchable
from omni_gateway.engine.core.request_state import EngineRequest, request_output, stream_delta
from omni_gateway.engine.core.scheduler import Scheduler
from omni_gateway.engine.core.sequence import EmbedSpan, FinishReason, ScheduledBatch, Sequence
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.frontend.chat_template import render_chat
from omni_gateway.engine.outputs import Logprob, RequestOutput, StreamDelta
from omni_gateway.engine.runner.host_memory import return_free_heap
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from omni_gateway.engine.lora.registry import LoraRegistry

log = logging.getLogger(__name__)


class Step(Protocol):
    """A step the runner started: its batch, and ``results()``, which waits for its tokens and
    returns one result per sequence (None where it sampled nothing). ``finish()`` queues what a step
    launched ahead held back until the host absorbed the step before it (grammar masks)."""

    batch: ScheduledBatch

    def results(self) -> list[Any]: ...  # SampleResult | None per sequence

    def finish(self) -> None: ...


class Runner(Protocol):
    """What the engine drives (``ModelRunner``): ``execute(batch)`` starts a step; with ``after``,
    a step whose tokens the host has not read, every sequence decodes the position after its last
    known token, with the token ``after`` samples for it (see ``engine.core.pipelining``)."""

    num_kv_blocks: int
    device: Any  # a torch.device: pipelined decode defaults on where launches are asynchronous (CUDA)

    def execute(self, batch: ScheduledBatch, after: Any = None) -> Step: ...

    def release(self, seq_ids: list[int]) -> None: ...


RunnerFactory = Callable[[EngineConfig, Any], Runner]


class LLMEngine:
    """Builds the model (``engine.runner.loader``), the runner (``engine.runner.model_runner``) and the scheduler.

    ``model`` and ``runner_factory`` replace the loader and the runner (tests, alternative backends).
    """

    def __init__(
        self, config: EngineConfig, *, model: Any | None = None, runner_factory: RunnerFactory | None = None
    ) -> None:
        if model is None:
            from omni_gateway.engine.runner.loader import load_model

            model = load_model(config)
        if runner_factory is None and config.tensor_parallel_size > 1:
            from omni_gateway.engine.parallel.executor import TensorParallelRunner

            runner_factory = TensorParallelRunner
        elif runner_factory is None:
            from omni_gateway.engine.runner.model_runner import ModelRunner

            runner_factory = ModelRunner
        if config.device == "auto":
            # Resolved once, here: the config then names its device, and its block size follows it.
            from omni_gateway.engine.runner.device_dtype import pick_device_dtype

            config = dataclasses.replace(config, device=pick_device_dtype(config)[0].type)
        assert config.block_size is not None  # EngineConfig sets it for every named device
        block_size = config.block_size
        self.config = config
        self.tokenizer = model.tokenizer
        self.eos_token_ids: frozenset[int] = frozenset(model.eos_token_ids)
        self.vocab_size: int = model.vocab_size
        self.runner: Runner = runner_factory(config, model)
        # The runner holds what it runs (merged q/k/v and gate/up rows are new tensors): a loaded model's
        # own tensors go, so the weights are in memory once.
        if getattr(model, "weights", None):
            model = dataclasses.replace(model, weights={})
            return_free_heap()
        self.model = model
        # how this checkpoint pools a prompt into one vector (engine.core.pooling)
        self.pooling: str = getattr(model, "pooling", "last")
        num_blocks = self.runner.num_kv_blocks
        self.max_model_len = self._decide_max_model_len(config, model.max_model_len, num_blocks, block_size)
        kv = KVCacheManager(
            num_blocks,
            block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            max_row_blocks=config.hidden_state_cache_blocks,
        )
        self.scheduler = Scheduler(config, kv)
        self.speculator: Any = None  # engine.spec.speculator.Speculator, with a speculative_config
        if config.speculative_config is not None:
            from omni_gateway.engine.spec.build import build_speculator

            self.speculator = build_speculator(config, self.runner)
        self._requests: dict[str, EngineRequest] = {}
        self._owner: dict[int, tuple[EngineRequest, int]] = {}
        self._finished: list[RequestOutput] = []
        self._in_flight: Step | None = None  # a pipelined step whose tokens the host has not read
        self._pipelined = False
        on_cuda = self.runner.device.type == "cuda"
        # Speculation reads each step's tokens before drafting the next: nothing can run ahead of the host.
        pipelined = config.pipeline_decode == "on" or (config.pipeline_decode == "auto" and on_cuda)
        self.pipelined = pipelined and self.speculator is None
        self.num_steps_ahead = 0  # steps launched before the host had read the step in front of them
        self._grammars: Any = None  # engine.core.structured_output.GrammarCache, built on first use
        self._grammars_lock = threading.Lock()
        self.loras: LoraRegistry | None = None  # the adapters served by name (engine.lora), with enable_lora
        slots = getattr(self.runner, "lora", None)
        if config.enable_lora and slots is not None:
            from omni_gateway.engine.lora.registry import LoraRegistry

            self.loras = LoraRegistry(slots.targets, config.max_lora_rank, model.name)
            for name, path in config.lora_modules:
                self.loras.load(name, path)

    @property
    def grammars(self) -> Any:
        """The compiler of this model's constraints (``engine.core.structured_output.GrammarCache``); any
        thread may compile with it, so callers compile before a request reaches the loop."""
        with self._grammars_lock:
            if self._grammars is None:
                from omni_gateway.engine.core.structured_output import GrammarCache  # xgrammar loads on first use

                self._grammars = GrammarCache(
                    self.tokenizer,
                    self.vocab_size,
                    self.eos_token_ids,
                    cache_bytes=self.config.structured_outputs_cache_bytes,
                    timeout_s=self.config.structured_outputs_compile_timeout,
                )
            return self._grammars

    @staticmethod
    def _decide_max_model_len(config: EngineConfig, model_len: int, num_blocks: int, block_size: int) -> int:
        if config.max_model_len is not None and config.max_model_len > model_len:
            raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's context length {model_len}")
        wanted = config.max_model_len or model_len
        capacity = num_blocks * block_size
        if capacity < wanted:
            # A lone sequence must always fit, or preemption could loop forever.
            log.warning(
                "KV cache holds %d tokens (%d blocks); max_model_len lowered from %d", capacity, num_blocks, wanted
            )
            return capacity
        return wanted

    @property
    def pipelined(self) -> bool:
        """Whether decode steps run one step ahead of the host (see ``engine.core.pipelining``)."""
        return self._pipelined

    @pipelined.setter
    def pipelined(self, on: bool) -> None:
        if on and self.speculator is not None:
            raise RuntimeError(
                "pipelined decode cannot run with speculative decoding (each step's drafts need the last)"
            )
        if self._in_flight is not None and not all(seq.is_finished for seq in self._in_flight.batch.seqs):
            raise RuntimeError("cannot switch pipelined decode while a step of unfinished requests is in flight")
        self._in_flight = None
        self._pipelined = on

    # ---- requests -------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        embed_spans: Iterable[EmbedSpan] = (),
        add_special_tokens: bool = True,
        input_stream: InputStream | None = None,
        grammar: Any = None,
    ) -> None:
        """Validate and queue. Raises InvalidRequest or EngineOverloaded; nothing is queued then.

        ``input_stream`` supplies input rows for generated positions as they arrive (the model decides
        how they combine with the token embeddings); the request waits while its next row is missing.
        ``grammar`` is ``params.structured_outputs`` already prepared (``GrammarCache.submit``'s result),
        which callers compile off this loop; without it, the constraint is compiled here."""
        params = params or SamplingParams()
        if params.pooling is not None:
            # the prompt's rows are what a pooling request is for (and they bar prefix-cache reuse)
            params = dataclasses.replace(params, return_hidden_states=True)
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequest(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._requests:
            raise InvalidRequest(f"request_id {request_id!r} is already in use by an unfinished request")
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("prompt is empty; expected text or at least one token id")
            prompt_text: str | None = prompt
            token_ids = list(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        else:
            prompt_text = None
            token_ids = list(prompt)
        check_prompt(
            token_ids, max_model_len=self.max_model_len, vocab_size=self.vocab_size, pooling=params.pooling is not None
        )
        spans = tuple(embed_spans)
        check_spans(spans, len(token_ids))
        check_inputs(params, input_stream, len(token_ids), self.config.tensor_parallel_size, self._num_layers())
        lora = None if params.lora_name is None else self._adapters().get(params.lora_name)
        spec = params.structured_outputs
        if spec is not None:
            grammar = grammar or self.grammars.prepare(spec)
            room = self.max_model_len - len(token_ids)
            self.grammars.check_length(grammar, room if params.max_tokens is None else min(params.max_tokens, room))
        seqs = []
        for seq_params in sample_params(params):
            seqs.append(
                Sequence(
                    request_id,
                    token_ids,
                    seq_params,
                    priority=priority,
                    embed_spans=spans,
                    eos_token_ids=self.eos_token_ids,
                    max_model_len=self.max_model_len,
                )
            )
            seqs[-1].input_stream = input_stream
            seqs[-1].lora = lora
            if spec is not None:
                seqs[-1].grammar = self.grammars.matcher_for(grammar)
        self.scheduler.add(seqs[0])
        for sibling in seqs[1:]:
            # The queue bound counts requests; the scheduler makes siblings reuse the first one's prompt KV.
            self.scheduler.add(sibling, enforce_limit=False)
        detoks = [IncrementalDetokenizer(self.tokenizer, token_ids, s.params) for s in seqs]
        req = EngineRequest(request_id, prompt_text, token_ids, params, seqs, detoks)
        self._requests[request_id] = req
        for i, seq in enumerate(seqs):
            self._owner[seq.seq_id] = (req, i)

    # ---- LoRA adapters (engine.lora) -----------------------------------------------------------------

    def load_lora(self, name: str, path: str) -> None:
        """Serve the PEFT adapter in folder ``path`` as ``name``. Raises InvalidRequest (LoraAdapterError)
        saying what is wrong; a refused adapter changes nothing."""
        self._adapters().load(name, path)

    def unload_lora(self, name: str) -> None:
        """Stop serving ``name`` to new requests; its running sequences finish with it."""
        self._adapters().unload(name)

    def lora_adapters(self) -> dict[str, str]:
        """Served adapter name -> the folder it was loaded from."""
        return self.loras.names() if self.loras is not None else {}

    def _adapters(self) -> LoraRegistry:
        if self.loras is None:
            raise InvalidRequest("LoRA adapters are not enabled on this engine (start it with --enable-lora)")
        return self.loras

    def render_chat(
        self,
        messages: Seq[Mapping[str, Any]],
        *,
        tools: Seq[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> str:
        """Messages to prompt text with the explicit template, else the model's, else the tokenizer's.
        Reads only immutable state, so any thread may call it."""
        prompt: str = render_chat(
            self.tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template or getattr(self.model, "chat_template", None),
        )
        return prompt

    def abort(self, request_id: str) -> list[StreamDelta]:
        """Stop a request wherever it is; returns its final deltas (empty if it is unknown or done)."""
        req = self._requests.get(request_id)
        if req is None:
            return []
        aborted = self.scheduler.abort(request_id)
        self._release([s.seq_id for s in aborted])
        deltas = [stream_delta(req, i, "", ()) for i, s in enumerate(req.seqs) if s.finish_reason is FinishReason.ABORT]
        self._retire(req)
        return deltas

    def abort_all(self) -> list[StreamDelta]:
        return [d for rid in list(self._requests) for d in self.abort(rid)]

    def _num_layers(self) -> int | None:
        """The decoder's layer count where the runner's model tells it (a remote runner may not)."""
        shape = getattr(getattr(self.runner, "model", None), "shape", None)
        return getattr(shape, "num_layers", None)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def waits_for_input(self) -> bool:
        """Whether every unfinished request waits for input rows (``step`` would do nothing)."""
        return bool(self._requests) and self.scheduler.all_wait_for_input() and self._in_flight is None

    def partly_waits_for_input(self) -> bool:
        """Whether ``step`` would run some requests while others wait for their input rows."""
        return self._in_flight is None and self.scheduler.some_wait_for_input()

    def admits_streamed(self) -> bool:
        """Whether ``step`` would schedule afresh (no step in flight) with requests that bring input streams
        waiting to be admitted."""
        return self._in_flight is None and self.scheduler.streamed_waiting()

    def pop_finished(self) -> list[RequestOutput]:
        """RequestOutputs of requests that finished since the last call (the caller must drain this)."""
        out, self._finished = self._finished, []
        return out

    # ---- the loop -------------------------------------------------------------------------------

    def step(self) -> list[StreamDelta]:
        """Run one step and return its deltas. Where decode steps are pipelined (see
        ``engine.core.pipelining``), the step after this one is on the device before this returns."""
        pending, self._in_flight = self._in_flight, None
        if pending is not None and all(seq.is_finished for seq in pending.batch.seqs):
            pending = None  # every row it computes would be discarded
        if pending is None:
            batch = self.scheduler.schedule()
            if not batch:
                if self.scheduler.has_unfinished() and not self.scheduler.all_wait_for_input():
                    raise RuntimeError(
                        f"nothing schedulable with {self.scheduler.num_waiting} waiting and "
                        f"{self.scheduler.num_running} running sequences"
                    )
                return []
            if self.speculator is not None:
                batch = self.speculator.attach(batch, self.scheduler.kv, self.scheduler.num_running)
            pending = self.runner.execute(batch)
            chain = self._pipelined and launchable(batch)
        else:
            chain = True  # a step launched ahead is launchable by construction
        if chain:
            ahead = self.scheduler.schedule_lookahead(pending.batch)
            if ahead is not None:
                self._in_flight = self.runner.execute(ahead, pending)
                self.num_steps_ahead += 1
        deltas = self._absorb(pending.batch, pending.results())
        if self._in_flight is not None:
            self._in_flight.finish()  # its grammar masks, now that the matchers hold this step's tokens
        return deltas

    def _absorb(self, batch: ScheduledBatch, results: list[Any]) -> list[StreamDelta]:
        """Apply one step's sampled tokens to its sequences; the deltas for the caller. A step that scored
        drafts is applied one kept token at a time (``Speculator.rounds``), so stops inside it cut it."""
        if len(results) != len(batch.seqs):
            raise RuntimeError(f"runner returned {len(results)} results for {len(batch.seqs)} sequences")
        if batch.drafts is None:
            return self._absorb_tokens(batch, results)
        from omni_gateway.engine.spec.speculator import merge_deltas

        deltas = [d for sub, tokens in self.speculator.rounds(batch, results) for d in self._absorb_tokens(sub, tokens)]
        self.speculator.settle(batch, results, self.scheduler.kv)
        return merge_deltas(deltas)

    def _absorb_tokens(self, batch: ScheduledBatch, results: list[Any]) -> list[StreamDelta]:
        by_seq = {seq.seq_id: r for seq, r in zip(batch.seqs, results) if r is not None}
        token_ids: list[int | None] = [None if r is None else r.token_id for r in results]
        rejected = self._grammars.accept(batch.seqs, token_ids) if self._grammars is not None else []
        grown = self.scheduler.update_from_output(batch, token_ids)
        pooled = self._pool_finished(batch)

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
                self.scheduler.finish(seq, FinishReason.STOP)  # the grammar accepted its stop token
            lp: tuple[Logprob, ...] = ()
            if seq.params.logprobs is not None and result.logprob is not None:
                seq.output_logprobs.append(result.logprob)
                lp = (result.logprob,)
            text = self._detokenize(seq, req.detoks[index], result.token_id)
            if seq.is_finished:
                done.append(seq)
            deltas.append(stream_delta(req, index, text, (result.token_id,), lp))
        for seq in rejected:  # the grammar cannot continue (every token was masked): end it, token unkept
            req, index = self._owner[seq.seq_id]
            touched[req.request_id] = req
            self.scheduler.finish(seq, FinishReason.ERROR)
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
            self._release([s.seq_id for s in done])
        for req in touched.values():
            if all(s.is_finished for s in req.seqs):
                self._retire(req)
        return deltas

    def _release(self, seq_ids: list[int]) -> None:
        self.runner.release(seq_ids)
        if self.speculator is not None:
            self.speculator.release(seq_ids)

    def _pool_finished(self, batch: ScheduledBatch) -> list[tuple[Sequence, Any]]:
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
            self.scheduler.finish(seq, FinishReason.STOP)
            out.append((seq, pool(rows, method)))
        return out

    def _detokenize(self, seq: Sequence, detok: IncrementalDetokenizer, token_id: int) -> str:
        text: str = detok.add_token(token_id, check_stop=seq.num_output_tokens >= seq.params.min_tokens)
        if detok.stop_string is not None:
            if seq.is_finished:  # a token-level stop in the same step: the stop string came first in the text
                seq.finish_reason, seq.stop_reason = FinishReason.STOP, detok.stop_string
            else:
                self.scheduler.finish(seq, FinishReason.STOP, detok.stop_string)
        elif seq.is_finished:
            text += detok.flush()
        return text

    def _retire(self, req: EngineRequest) -> None:
        for seq in req.seqs:
            self._owner.pop(seq.seq_id, None)
            seq.grammar = None
        del self._requests[req.request_id]
        self._finished.append(request_output(req))

    def shutdown(self) -> None:
        """Release what the runner holds beyond this process (tensor-parallel worker processes)."""
        close = getattr(self.runner, "shutdown", None)
        if close is not None:
            close()

    # ---- observability --------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        kv = self.scheduler.kv
        usage = kv.usage()
        return {
            "running": self.scheduler.num_running,
            "waiting": self.scheduler.num_waiting,
            "requests": len(self._requests),
            "kv_blocks_total": kv.num_blocks,
            "kv_blocks_used": usage.num_used_blocks,
            "kv_blocks_free": usage.num_free_blocks,
            "kv_slots_allocated": usage.allocated_slots,
            "kv_tokens_stored": usage.stored_tokens,
            "kv_waste_fraction": usage.waste_fraction,
            "prefix_cache_query_tokens": kv.prefix_query_tokens,
            "prefix_cache_hit_tokens": kv.prefix_hit_tokens,
            "num_preemptions": self.scheduler.num_preemptions,
            "decode_steps_ahead": self.num_steps_ahead,
            **(self._spec_stats() if self.speculator is not None else {}),
        }

    def _spec_stats(self) -> dict[str, float]:
        spec = self.speculator
        return {
            "spec_draft_tokens": spec.num_drafts,
            "spec_accepted_tokens": spec.num_accepted,
            "spec_verify_steps": spec.num_verify_steps,
            "spec_acceptance_ema": spec.policy.acceptance,
        }
