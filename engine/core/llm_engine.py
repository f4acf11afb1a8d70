"""The synchronous engine: requests in, one scheduled step at a time, stream deltas out.

Not thread-safe: exactly one thread drives it (the caller of ``LLM`` or ``AsyncEngine``'s loop thread).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.detokenizer import IncrementalDetokenizer
from omni_gateway.engine.core.intake import check_inputs, check_prompt, check_spans, sample_params
from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.output_processor import OutputProcessor
from omni_gateway.engine.core.pipelining import launchable
from omni_gateway.engine.core.request_state import EngineRequest, stream_delta
from omni_gateway.engine.core.runner_protocol import Runner, RunnerFactory, Step
from omni_gateway.engine.core.scheduler import Scheduler
from omni_gateway.engine.core.sequence import EmbedSpan, FinishReason, ScheduledBatch, Sequence
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.frontend.chat_template import render_chat
from omni_gateway.engine.outputs import RequestOutput, StreamDelta
from omni_gateway.engine.runner.host_memory import return_free_heap
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from omni_gateway.engine.lora.registry import LoraRegistry

log = logging.getLogger(__name__)


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
        self.outputs = OutputProcessor(self._release, getattr(model, "pooling", "last"))
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
    def pooling(self) -> str:
        """How this checkpoint pools a prompt into one vector (``engine.core.pooling``)."""
        return self.outputs.pooling

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
        if request_id in self.outputs.requests:
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
        self.outputs.add(EngineRequest(request_id, prompt_text, token_ids, params, seqs, detoks))

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
        req = self.outputs.requests.get(request_id)
        if req is None:
            return []
        aborted = self.scheduler.abort(request_id)
        self._release([s.seq_id for s in aborted])
        deltas = [stream_delta(req, i, "", ()) for i, s in enumerate(req.seqs) if s.finish_reason is FinishReason.ABORT]
        self.outputs.retire(req)
        return deltas

    def abort_all(self) -> list[StreamDelta]:
        return [d for rid in list(self.outputs.requests) for d in self.abort(rid)]

    def _num_layers(self) -> int | None:
        """The decoder's layer count where the runner's model tells it (a remote runner may not)."""
        shape = getattr(getattr(self.runner, "model", None), "shape", None)
        return getattr(shape, "num_layers", None)

    def has_unfinished(self) -> bool:
        return bool(self.outputs.requests)

    def waits_for_input(self) -> bool:
        """Whether every unfinished request waits for input rows (``step`` would do nothing)."""
        return bool(self.outputs.requests) and self.scheduler.all_wait_for_input() and self._in_flight is None

    def partly_waits_for_input(self) -> bool:
        """Whether ``step`` would run some requests while others wait for their input rows."""
        return self._in_flight is None and self.scheduler.some_wait_for_input()

    def admits_streamed(self) -> bool:
        """Whether ``step`` would schedule afresh (no step in flight) with requests that bring input streams
        waiting to be admitted."""
        return self._in_flight is None and self.scheduler.streamed_waiting()

    def pop_finished(self) -> list[RequestOutput]:
        """RequestOutputs of requests that finished since the last call (the caller must drain this)."""
        return self.outputs.pop_finished()

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
            return self.outputs.absorb(batch, results, self.scheduler, self._grammars)
        from omni_gateway.engine.spec.speculator import merge_deltas

        deltas = [
            d
            for sub, tokens in self.speculator.rounds(batch, results)
            for d in self.outputs.absorb(sub, tokens, self.scheduler, self._grammars)
        ]
        self.speculator.settle(batch, results, self.scheduler.kv)
        return merge_deltas(deltas)

    def _release(self, seq_ids: list[int]) -> None:
        self.runner.release(seq_ids)
        if self.speculator is not None:
            self.speculator.release(seq_ids)

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
            "requests": len(self.outputs.requests),
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
            **(self.speculator.stats() if self.speculator is not None else {}),
        }
