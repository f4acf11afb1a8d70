"""Runs one scheduled step: builds the flattened varlen batch, runs the model over the paged KV
cache and samples. Sequence state is read only; the scheduler advances it from the results."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence
from omni_gateway.engine.lora.slots import attached_lora
from omni_gateway.engine.models import build_model
from omni_gateway.engine.parallel.context import SINGLE, ParallelContext
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.parallel.weights import shard_weights
from omni_gateway.engine.runner.attention import own_split_counters, select_kernels
from omni_gateway.engine.runner.aux_hidden import DEFAULT_MAX_ROWS, AuxHiddenStore
from omni_gateway.engine.runner.compile_cache import use_compile_cache
from omni_gateway.engine.runner.device_dtype import pick_device_dtype
from omni_gateway.engine.runner.dummy_weights import RandomSource
from omni_gateway.engine.runner.graphed_decode import GraphedDecode, Staging
from omni_gateway.engine.runner.graphed_prefill import GraphedPrefill
from omni_gateway.engine.runner.hidden_rows import keep_hidden
from omni_gateway.engine.runner.kv_cache import decide_num_blocks, zeroed
from omni_gateway.engine.runner.layer_capture import asked_layers, forward_capturing
from omni_gateway.engine.runner.loader import LoadedModel
from omni_gateway.engine.runner.pending_decode import PendingDecode
from omni_gateway.engine.runner.sampler import Sampler, SampleResult
from omni_gateway.engine.runner.step_gate import wait_for_urgent
from omni_gateway.engine.runner.step_inputs import upload_step
from omni_gateway.engine.runner.step_plan import HiddenSpan, StepPlan, build_step_plan
from omni_gateway.kernels.host_copies import to_device

log = logging.getLogger(__name__)

# Rank 0's hook that sends a step to the other tensor-parallel ranks before running it itself:
# an eager step (its plan, and the device token ids of a step launched ahead), or a graph replay
# (the graph's staged inputs).
StepBroadcast = Callable[[str, object, "torch.Tensor | None"], None]


class ModelRunner:
    """Runs steps on one device. Under tensor parallel every rank has one, holding its shard of the
    model and of the KV cache (its KV heads); rank 0 schedules and samples, and ``broadcast`` sends
    each step to the other ranks, which run it through ``run_plan`` / ``replay`` in the same order."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel,
        parallel: ParallelContext = SINGLE,
        broadcast: StepBroadcast | None = None,
    ) -> None:
        self.config = config
        self.parallel = parallel
        self.broadcast = broadcast
        if config.compile_cache_dir is not None:  # before the first kernel compiles
            use_compile_cache(config.compile_cache_dir)
        self.device, self.dtype = pick_device_dtype(config)
        if parallel.device is not None:
            self.device = parallel.device
        # fp8: K/V stored as float8_e4m3fn with scale 1.0 (vLLM's default); attention widens them again.
        self.kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype in ("fp8", "fp8_e4m3") else self.dtype
        self.ops = select_kernels(config.attention_backend, self.device)
        if config.block_size is None:
            raise ValueError(
                "ModelRunner needs a config with a named device (LLMEngine resolves 'auto'); "
                "got device 'auto' and no block_size"
            )
        self.block_size = config.block_size
        self.max_model_len = loaded.max_model_len
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        weights = loaded.weights
        if not weights and loaded.source is None:
            raise ValueError(
                f"the loaded model {loaded.name!r} holds no weights: an engine built from it released them; "
                "load it again (engine.runner.loader.load_model) for another engine"
            )
        if parallel.is_parallel or (not weights and loaded.source is not None):  # read here, this rank's slices
            layout = ShardLayout.of(loaded.hf_config, parallel.rank, parallel.world_size, parallel.expert_parallel)
            if isinstance(loaded.source, RandomSource):  # made on this device as the model reads them
                weights = loaded.source.shard(layout, self.device, self.dtype)
            else:
                weights = shard_weights(loaded.source, layout)
        self.model = build_model(
            loaded.hf_config,
            weights,
            ops=self.ops,
            device=self.device,
            dtype=self.dtype,
            max_positions=self.max_model_len,
            parallel=parallel,
        )
        del weights
        # Before the graphs are captured: they capture the adapters' launches too (engine/lora/slots.py).
        self.lora = attached_lora(config, self.model, self.device, self.dtype) if config.enable_lora else None
        shape = self.model.shape
        num_kv_heads = self.model.num_kv_heads  # this rank's
        self.uses_mrope: bool = self.model.uses_mrope
        # Every rank's cache must hold the same blocks: the scheduler on rank 0 hands out block ids for all.
        block_bytes = 2 * shape.num_layers * self.block_size * num_kv_heads * shape.head_dim * self.kv_dtype.itemsize
        self.num_kv_blocks = parallel.min_int(
            decide_num_blocks(config, self.device, block_bytes, self.max_blocks_per_seq, shape.vocab_size)
        )
        # Zeroed, not empty: padded decode positions are masked, but NaN garbage would still leak
        # through the masked softmax weights (0 * NaN).
        self.kv_cache = zeroed(
            (shape.num_layers, 2, self.num_kv_blocks, self.block_size, num_kv_heads, shape.head_dim),
            self.device,
            self.kv_dtype,
        )
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(shape.num_layers)]
        self.sampler = Sampler(self.device, config.seed)
        self.graphs: GraphedDecode | None = None
        # Graphs need kernels free of host syncs (the Triton ones) and a per-step input layout they can
        # hold fixed: decoded text only (M-RoPE positions past the media agree on all axes, see
        # ``_graph_ready``). Rows streamed into a model that adds them (the talker) go in a static buffer,
        # which the tensor-parallel replay does not carry.
        self._graph_input_rows = bool(getattr(self.model, "adds_input_rows", False)) and broadcast is None
        # Hidden rows computed for requests that ask for them are kept with their cached blocks (KVCacheManager).
        self._keeps_rows = config.hidden_state_cache_blocks > 0
        # This engine's own split-merge counters for the decode attention: no launch of another engine in the
        # process (on another stream) can count on them.
        self._split_counters = own_split_counters(self.ops, self.device)
        if self.device.type == "cuda" and not config.enforce_eager and self.ops.name == "triton":
            self.graphs = GraphedDecode(
                self.model,
                self.kv_caches,
                max_batch=min(config.max_num_seqs, 256),
                max_blocks_per_seq=self.max_blocks_per_seq,
                block_size=self.block_size,
                device=self.device,
                input_rows=self._graph_input_rows,
                split_counters=self._split_counters,
            )
            if broadcast is not None:
                self.graphs.on_replay = lambda inputs: broadcast(
                    "graph",
                    {name: inputs[name].numpy().copy() for name in ("rows", "block_tables")},  # pinned host buffers
                    inputs.get("prev_ids"),
                )
            self.graphs.capture()
        # Target hidden states of chosen layers for a speculative proposer (EAGLE-3); None: none asked.
        self.aux_hidden: AuxHiddenStore | None = None
        self.prefill_graphs: GraphedPrefill | None = None
        # Prefill and mixed steps replay graphs too where one process runs the whole model (a rank's
        # all-reduce is not captured); each rank of a tensor-parallel group runs them eagerly.
        if self.graphs is not None and broadcast is None and not parallel.is_parallel:
            self.prefill_graphs = GraphedPrefill(
                self.model,
                self.kv_caches,
                max_tokens=config.max_num_batched_tokens,
                max_seqs=config.max_num_seqs,
                max_blocks_per_seq=self.max_blocks_per_seq,
                device=self.device,
                split_counters=self._split_counters,
            )
            self.prefill_graphs.capture()
        log.info(
            "model runner: %s %s, backend %s, %d KV blocks of %d tokens, decode graphs %s, prefill graphs %s",
            self.device,
            self.dtype,
            self.ops.name,
            self.num_kv_blocks,
            self.block_size,
            self.graphs.buckets if self.graphs else "off",
            self.prefill_graphs.buckets if self.prefill_graphs else "off",
        )

    def capture_aux_hidden(self, layers: tuple[int, ...], max_rows: int = DEFAULT_MAX_ROWS) -> AuxHiddenStore:
        """From now on keep the outputs of decoder ``layers`` at every computed position, per sequence, for
        a proposer to take (the most recent ``max_rows`` or so of each). Steps then run eagerly: the CUDA
        graphs do not carry the extra rows."""
        if self.parallel.is_parallel:
            raise ValueError("target hidden states for a proposer are kept on one device only (tensor_parallel_size 1)")
        self.model.capture_aux_hidden(layers)
        self.aux_hidden = AuxHiddenStore(max_rows)
        return self.aux_hidden

    def release(self, seq_ids: list[int]) -> None:
        self.sampler.release(seq_ids)
        if self.aux_hidden is not None:
            self.aux_hidden.release(seq_ids)
        if self.graphs is not None:
            self.graphs.release(seq_ids)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, after: PendingDecode | None = None) -> PendingDecode:
        """Run one step and return it without waiting for its tokens where nothing needs them on the
        host first (no logprobs asked; otherwise it comes back resolved). With ``after``, the step in
        flight whose tokens the host has not read (see ``engine.core.pipelining``), every sequence decodes
        the position after its last known token, with the token ``after`` samples for it. On CUDA the
        step first waits while an urgent call of the process runs (``engine.runner.step_gate``)."""
        if self.device.type == "cuda":
            wait_for_urgent()
        seqs = batch.seqs
        if not seqs:
            return PendingDecode.resolved_with(batch, [])
        if self.lora is not None:
            self.lora.set_step([seq.lora for seq in seqs], batch.num_new_tokens)
        if batch.drafts is not None:
            return self._verify(batch)
        staging: Staging | None = None
        graphed = (
            self.graphs.forward(seqs, after)
            if self.graphs is not None and self.aux_hidden is None and self._graph_ready(batch)
            else None
        )
        if graphed is not None:
            logits, argmax, staging = graphed.logits, graphed.argmax, graphed.staging
            spans = [
                (seq, i, i + 1, seq.num_computed_tokens)
                for i, seq in enumerate(seqs)
                if seq.params.return_hidden_states
            ]
            if spans:  # never launched ahead (engine.core.pipelining): num_computed_tokens is the decoded position
                keep_hidden(self.model, spans, graphed.ids, graphed.hidden, None, self._keeps_rows)
            rows = [
                i
                for i, seq in enumerate(seqs)
                if (after is not None or seq.num_computed_tokens + 1 == len(seq)) and seq.params.pooling is None
            ]
            if not rows:  # pooling requests only
                return PendingDecode.resolved_with(batch, [None] * len(seqs))
            if len(rows) < len(seqs):  # one-token prefill chunks sample nothing
                picked = to_device(rows, torch.int64, self.device)
                logits, argmax = logits[picked], argmax[picked]
            chosen: torch.Tensor | None = argmax
        else:
            plan, decode_seqs, rows, hidden_spans = self._plan(batch, after)
            device_ids = after.tokens_for(decode_seqs) if after is not None else None
            if self.broadcast is not None:
                self.broadcast("eager", plan, device_ids)
            logits = self.run_plan(plan, device_ids, hidden_spans)
            self._keep_aux_hidden(batch)
            if logits is None:
                return PendingDecode.resolved_with(batch, [None] * len(seqs))
            chosen = None
        sampling = [seqs[i] for i in rows]
        if any(seq.params.logprobs is not None for seq in sampling):
            results: list[SampleResult | None] = [None] * len(seqs)
            for row, sample in zip(rows, self.sampler(logits, sampling, chosen)):
                results[row] = sample
            return PendingDecode.resolved_with(batch, results)  # the sampler waited for the device
        if after is not None and any(seq.grammar is not None for seq in sampling):
            # The masks follow the tokens of ``after``, which the host absorbs while the device runs this
            # forward; the engine calls finish() then.
            if staging is not None:
                staging.copied = _recorded_event()  # the forward's uploads, until the tokens' copy replaces it
            return PendingDecode.deferred(batch, rows, lambda: self._choose(logits, sampling, chosen), staging)
        return PendingDecode.start(batch, rows, self.sampler.choose(logits, sampling, chosen), staging)

    @torch.inference_mode()
    def step_logits(self, batch: ScheduledBatch) -> torch.Tensor:
        """Run one step in which every sequence reaches its end and return the float32 logits of each one's
        next token, ``[len(batch.seqs), vocab]`` in batch order, unsampled (a draft model drawing its own
        drafts, ``engine.spec.draft_model``)."""
        if self.device.type == "cuda":
            wait_for_urgent()
        seqs = batch.seqs
        graphed = (
            self.graphs.forward(seqs, None)
            if self.graphs is not None and self.aux_hidden is None and self._graph_ready(batch)
            else None
        )
        if graphed is not None:
            # The caller reads these on the host before its next step, so the input buffers' copies are done
            # by then and need no event (``StagingPair``); the logits buffer is the graph's, replayed next step.
            return graphed.logits[: len(seqs)]
        plan, _, rows, hidden_spans = self._plan(batch)
        logits = self.run_plan(plan, None, hidden_spans)
        self._keep_aux_hidden(batch)
        if logits is None or sorted(rows) != list(range(len(seqs))):
            raise ValueError(f"step_logits needs every sequence to reach its end; rows {rows} of {len(seqs)}")
        order = [0] * len(rows)
        for j, i in enumerate(rows):
            order[i] = j
        return logits[to_device(order, torch.int64, self.device)]

    def _verify(self, batch: ScheduledBatch) -> PendingDecode:
        """A step that scores drafts (``engine.spec.verify``): its tokens are read before it returns, since the
        next step's drafts start from them. On CUDA the forward replays a prefill graph where one fits its
        token count (each sequence's 1 + k queries are a varlen chunk over its paged KV), else runs eagerly."""
        from omni_gateway.engine.spec.verify import verify

        plan, _, slots, hidden_spans = self._plan(batch)
        logits = self.run_plan(plan, None, hidden_spans)
        self._keep_aux_hidden(batch)
        if logits is None:
            return PendingDecode.resolved_with(batch, [None] * len(batch.seqs))
        probs = batch.draft_probs or [None] * len(batch.seqs)
        return PendingDecode.resolved_with(batch, verify(self.sampler, logits, batch, slots, probs))  # type: ignore[arg-type]

    @torch.inference_mode()
    def _choose(self, logits: torch.Tensor, seqs: list[Sequence], chosen: torch.Tensor | None) -> torch.Tensor:
        return self.sampler.choose(logits, seqs, chosen)

    @torch.inference_mode()
    def run_plan(
        self, plan: StepPlan, device_ids: torch.Tensor | None = None, hidden_spans: list[HiddenSpan] | None = None
    ) -> torch.Tensor | None:
        """The model forward of one step: float32 logits of its sampling rows (None where none samples).
        ``hidden_spans`` (rank 0's): the sequences whose hidden states are copied out."""
        asked = asked_layers(hidden_spans or [])
        graphs = self.prefill_graphs if self.aux_hidden is None and not asked else None
        replayed = graphs.forward(plan) if graphs is not None else None
        layer_rows: dict[int, torch.Tensor] = {}
        if replayed is not None:
            hidden, input_ids = replayed
            sample_rows = to_device(plan.sample_rows, torch.int64, self.device)
        else:
            step = upload_step(
                plan,
                device_ids,
                ops=self.ops,
                device=self.device,
                block_size=self.block_size,
                split_counters=self._split_counters,
            )
            hidden, layer_rows = forward_capturing(self.model, step, self.kv_caches, asked)
            input_ids, sample_rows = step.input_ids, step.sample_rows
        if hidden_spans:
            keep_hidden(self.model, hidden_spans, input_ids, hidden, layer_rows, self._keeps_rows)
        if not plan.sample_rows:
            return None
        logits: torch.Tensor = self.model.compute_logits(hidden[sample_rows])
        return logits

    def _keep_aux_hidden(self, batch: ScheduledBatch) -> None:
        if self.aux_hidden is None:
            return
        rows = self.model.aux_hidden
        assert rows is not None, "the model kept no hidden states for this step"
        self.aux_hidden.record(batch, rows)
        self.model.aux_hidden = None

    # ---- input preparation ----------------------------------------------------------------------

    def _graph_ready(self, batch: ScheduledBatch) -> bool:
        """A step the decode graphs can run: one token per sequence, each past its media (whose
        embeddings and M-RoPE positions are the prompt's), input rows only where the graphs carry them."""
        if not all(n == 1 for n in batch.num_new_tokens):
            return False
        for seq in batch.seqs:
            if seq.input_stream is not None and not self._graph_input_rows:
                return False
            if any(seq.num_computed_tokens < s.offset + s.length for s in seq.embed_spans):
                return False
            if seq.params.hidden_layer is not None and seq.num_computed_tokens < seq.num_prompt_tokens:
                return False  # a prompt position whose layer output is asked: the per-layer path keeps it
        return True

    def _plan(
        self, batch: ScheduledBatch, after: PendingDecode | None = None
    ) -> tuple[StepPlan, list[Sequence], list[int], list[HiddenSpan]]:
        return build_step_plan(batch, after is not None, self.block_size, self.uses_mrope, self.dtype)


def _recorded_event() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record()
    return event
