"""Runs one scheduled step: builds the flattened varlen batch, runs the model over the paged KV
cache and samples. Sequence state is read only; the scheduler advances it from the results."""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass

import torch
from omni_gateway.engine.attention import AttentionMetadata, plan_step, select_kernels
from omni_gateway.engine.compile_cache import use_compile_cache
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.graphed_decode import GraphedDecode, Staging, decode_position
from omni_gateway.engine.loader import LoadedModel
from omni_gateway.engine.models import build_model
from omni_gateway.engine.mrope import mrope_positions
from omni_gateway.engine.pending_decode import PendingDecode
from omni_gateway.engine.sampler import Sampler, SampleResult, to_device
from omni_gateway.engine.sequence import ScheduledBatch, Sequence

log = logging.getLogger(__name__)

_CPU_DEFAULT_KV_BYTES = 1 << 30
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} requested but CUDA is not available")
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = _DTYPES[config.dtype]
    return device, dtype


def _zeroed(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros``; on the CPU over an anonymous mapping, whose pages read as zeros and become
    resident only once written, so an idle server does not hold its whole KV cache in RSS."""
    if device.type != "cpu":
        return torch.zeros(shape, device=device, dtype=dtype)
    numel = 1
    for size in shape:
        numel *= size
    return torch.frombuffer(mmap.mmap(-1, numel * dtype.itemsize), dtype=dtype).view(shape)


@dataclass(slots=True)
class _StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # flat token index of each sampling sequence's last token
    sample_seqs: list[Sequence]
    sample_slots: list[int]  # index into batch.seqs of each sampling sequence
    embed_rows: torch.Tensor | None
    embeds: torch.Tensor | None


class ModelRunner:
    def __init__(self, config: EngineConfig, loaded: LoadedModel) -> None:
        self.config = config
        if config.compile_cache_dir is not None:  # before the first kernel compiles
            use_compile_cache(config.compile_cache_dir)
        self.device, self.dtype = pick_device_dtype(config)
        self.ops = select_kernels(config.attention_backend, self.device)
        if config.block_size is None:
            raise ValueError(
                "ModelRunner needs a config with a named device (LLMEngine resolves 'auto'); "
                "got device 'auto' and no block_size"
            )
        self.block_size = config.block_size
        self.max_model_len = loaded.max_model_len
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.model = build_model(
            loaded.hf_config,
            loaded.weights,
            ops=self.ops,
            device=self.device,
            dtype=self.dtype,
            max_positions=self.max_model_len,
        )
        shape = self.model.shape
        self.uses_mrope: bool = self.model.uses_mrope
        self.num_kv_blocks = self._decide_num_blocks(shape.num_layers, shape.num_kv_heads, shape.head_dim)
        # Zeroed, not empty: padded decode positions are masked, but NaN garbage would still leak
        # through the masked softmax weights (0 * NaN).
        self.kv_cache = _zeroed(
            (shape.num_layers, 2, self.num_kv_blocks, self.block_size, shape.num_kv_heads, shape.head_dim),
            self.device,
            self.dtype,
        )
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(shape.num_layers)]
        self.sampler = Sampler(self.device, config.seed)
        self.graphs: GraphedDecode | None = None
        # Graphs need kernels free of host syncs (the Triton ones) and a per-step input layout
        # they can hold fixed (M-RoPE positions and image embeddings change shape per step).
        if (
            self.device.type == "cuda"
            and not config.enforce_eager
            and self.ops.name == "triton"
            and not self.uses_mrope
        ):
            self.graphs = GraphedDecode(
                self.model,
                self.kv_caches,
                max_batch=min(config.max_num_seqs, 256),
                max_blocks_per_seq=self.max_blocks_per_seq,
                block_size=self.block_size,
                device=self.device,
            )
            self.graphs.capture()
        log.info(
            "model runner: %s %s, backend %s, %d KV blocks of %d tokens, decode graphs %s",
            self.device,
            self.dtype,
            self.ops.name,
            self.num_kv_blocks,
            self.block_size,
            self.graphs.buckets if self.graphs else "off",
        )

    def _decide_num_blocks(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        block_bytes = 2 * num_layers * self.block_size * num_kv_heads * head_dim * self.dtype.itemsize
        needed = self.config.max_num_seqs * self.max_blocks_per_seq + 1
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            # Room for activations: the step's hidden states several times over, plus sampling buffers.
            reserve = (512 << 20) + self.config.max_num_seqs * self.model.shape.vocab_size * 4 * 4
            budget = int(total * self.config.gpu_memory_utilization) - (total - free) - reserve
        else:
            budget = self.config.kv_cache_bytes or _CPU_DEFAULT_KV_BYTES
        blocks = min(budget // block_bytes, needed)
        if blocks < 2:
            raise ValueError(
                f"KV cache budget of {budget} bytes holds {blocks} blocks of {block_bytes} bytes; "
                "need at least 2 (raise kv_cache_bytes or gpu_memory_utilization)"
            )
        return int(blocks)

    def release(self, seq_ids: list[int]) -> None:
        self.sampler.release(seq_ids)
        if self.graphs is not None:
            self.graphs.release(seq_ids)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, after: PendingDecode | None = None) -> PendingDecode:
        """Run one step and return it without waiting for its tokens where nothing needs them on the
        host first (no logprobs asked; otherwise it comes back resolved). With ``after``, the step in
        flight whose tokens the host has not read (see ``engine.pipelining``), every sequence decodes
        the position after its last known token, with the token ``after`` samples for it."""
        seqs = batch.seqs
        if not seqs:
            return PendingDecode.resolved_with(batch, [])
        staging: Staging | None = None
        graphed = self.graphs.forward(seqs, after) if self.graphs is not None and self._graph_ready(batch) else None
        if graphed is not None:
            logits, argmax, staging = graphed
            rows = [i for i, seq in enumerate(seqs) if after is not None or seq.num_computed_tokens + 1 == len(seq)]
            if len(rows) < len(seqs):  # one-token prefill chunks sample nothing
                picked = to_device(rows, torch.int64, self.device)
                logits, argmax = logits[picked], argmax[picked]
            chosen: torch.Tensor | None = argmax
        else:
            step = self._prepare(batch, after)
            hidden = self.model.forward(
                step.input_ids, step.positions, step.meta, self.kv_caches, step.embed_rows, step.embeds
            )
            rows = step.sample_slots
            if not rows:
                return PendingDecode.resolved_with(batch, [None] * len(seqs))
            logits, chosen = self.model.compute_logits(hidden[step.sample_rows]), None
        sampling = [seqs[i] for i in rows]
        if any(seq.params.logprobs is not None for seq in sampling):
            results: list[SampleResult | None] = [None] * len(seqs)
            for row, sample in zip(rows, self.sampler(logits, sampling, chosen)):
                results[row] = sample
            return PendingDecode.resolved_with(batch, results)  # the sampler waited for the device
        host = None if staging is None else staging.tokens[: len(rows)]
        pending = PendingDecode.start(batch, rows, self.sampler.choose(logits, sampling, chosen), host)
        if staging is not None:
            staging.copied = pending.ready
        return pending

    # ---- input preparation ----------------------------------------------------------------------

    def _graph_ready(self, batch: ScheduledBatch) -> bool:
        """A step the decode graphs can run: one token per sequence, no image embeddings."""
        return all(n == 1 for n in batch.num_new_tokens) and not any(seq.embed_spans for seq in batch.seqs)

    def _prepare(self, batch: ScheduledBatch, after: PendingDecode | None = None) -> _StepInputs:
        """The flattened inputs of ``batch`` (decodes first, then prefill chunks). With ``after``,
        every sequence decodes the position after its last known token, whose id is on the device."""
        bs = self.block_size
        ahead = after is not None
        if ahead and any(n != 1 for n in batch.num_new_tokens):
            raise ValueError(f"a step launched ahead decodes one token per sequence, got {batch.num_new_tokens}")
        decode = [i for i, n in enumerate(batch.num_new_tokens) if n == 1]
        prefill = [i for i, n in enumerate(batch.num_new_tokens) if n > 1]
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        sample_slots: list[int] = []
        embed_rows: list[int] = []
        embed_parts: list[torch.Tensor] = []
        mrope_parts: list[torch.Tensor] = []
        cu_q = [0]
        decode_lens: list[int] = []
        prefill_lens: list[int] = []
        for i in decode + prefill:
            seq = batch.seqs[i]
            start = decode_position(seq, bs, ahead=True) if ahead else seq.num_computed_tokens
            end = start + batch.num_new_tokens[i]
            if end > len(seq) + ahead:
                raise ValueError(f"sequence {seq.request_id!r} scheduled to compute up to {end} tokens, has {len(seq)}")
            if len(seq.block_table) * bs < end:
                raise ValueError(
                    f"sequence {seq.request_id!r} needs {-(-end // bs)} KV blocks for {end} tokens, "
                    f"block table has {len(seq.block_table)}"
                )
            flat_start = len(ids)
            ids.extend(seq.token_ids[start:end] if not ahead else [0])  # ahead: the id comes from the device
            slots.extend(seq.slot(pos, bs) for pos in range(start, end))
            if self.uses_mrope:
                mrope_parts.append(mrope_positions(seq.embed_spans, start, end))
            else:
                positions.extend(range(start, end))
            if end - start == 1:
                decode_lens.append(end)
            else:
                prefill_lens.append(end)
                cu_q.append(cu_q[-1] + end - start)
            if end == len(seq) + ahead:
                sample_rows.append(len(ids) - 1)
                sample_seqs.append(seq)
                sample_slots.append(i)
            for span in seq.embed_spans:
                lo, hi = max(span.offset, start), min(span.offset + span.length, end)
                if lo < hi:
                    embed_rows.extend(range(flat_start + lo - start, flat_start + hi - start))
                    embed_parts.append(span.embeds[lo - span.offset : hi - span.offset])
        dev = self.device
        num_decode = len(decode)
        decode_seqs = [batch.seqs[i] for i in decode]
        prefill_seqs = [batch.seqs[i] for i in prefill]
        # Every upload is asynchronous (pinned memory): a step launched while another is in flight must
        # not wait for the device.
        meta = AttentionMetadata(
            slot_mapping=to_device(slots, torch.int64, dev),
            num_decode=num_decode,
            decode_seq_lens=to_device(decode_lens, torch.int32, dev),
            decode_block_tables=self._block_tables(decode_seqs, decode_lens),
            prefill_cu_seqlens_q=to_device(cu_q, torch.int32, dev),
            prefill_seq_lens=to_device(prefill_lens, torch.int32, dev),
            prefill_block_tables=self._block_tables(prefill_seqs, prefill_lens),
            num_tokens=len(ids),
        )
        plan_step(self.ops, meta, bs)
        embeds = None
        if embed_parts:
            embeds = torch.cat([p.to(device=dev, dtype=self.dtype) for p in embed_parts], dim=0)
        return _StepInputs(
            input_ids=after.tokens_for(decode_seqs) if after is not None else to_device(ids, torch.int64, dev),
            positions=(
                torch.cat(mrope_parts, dim=1).to(dev) if self.uses_mrope else to_device(positions, torch.int64, dev)
            ),
            meta=meta,
            sample_rows=to_device(sample_rows, torch.int64, dev),
            sample_seqs=sample_seqs,
            sample_slots=sample_slots,
            embed_rows=to_device(embed_rows, torch.int64, dev) if embed_rows else None,
            embeds=embeds,
        )

    def _block_tables(self, seqs: list[Sequence], lengths: list[int]) -> torch.Tensor:
        """int32 ``[len(seqs), max blocks in use]``: only the blocks covering each context."""
        bs = self.block_size
        width = max((-(-n // bs) for n in lengths), default=0)
        if not seqs:
            return torch.zeros(0, width, dtype=torch.int32, device=self.device)
        rows = [seq.block_table[:width] + [0] * (width - min(width, len(seq.block_table))) for seq in seqs]
        # Through pinned memory: a plain torch.tensor(..., device="cuda") would wait for the device,
        # which a step launched while another is in flight must not do.
        return to_device(rows, torch.int32, self.device).reshape(len(seqs), width)
