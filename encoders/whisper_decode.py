"""Greedy Whisper decoding over a static KV cache, a fixed number of fixed-shape steps per launch: CUDA-graph
capturable.

The Hugging Face decoder grows its cache a token at a time and drops finished rows, so every step is a new
shape and several hundred kernel launches issued from Python: on a GPU the host is the bottleneck for a
decoder this small (four layers in large-v3-turbo), and in a server whose interpreter also runs the event
loop and the TTS worker every launch and every read of a token may wait for the interpreter lock (24 steps
of a batch took 2.5 s beside a busy Python thread, against 17 ms alone). Here a batch is padded to a bucket
(1, 2, 4, ... rows) whose buffers live as long as the decoder: self-attention keys and values for every
position, the cross-attention keys and values, the encoder states they are computed from, the token ids
of every position, and the position of the next step. Every bucket is a view of the largest one's
buffers (``max_rows``), so they cost the memory of one.

A step reads the token at its position, writes that position's keys and values, and writes the token of
the next position: the prefix's own token while the prefix lasts (so the prefix is fed one step at a time
and needs no pass of its own), else the greedy choice. It then advances the position, all on the device.
``STEPS`` steps run per launch, and the host reads the new tokens once per launch to see which rows
reached end-of-text. On CUDA the cross-attention projections and the ``STEPS`` steps are each captured
once per bucket in a CUDA graph; on CPU the same code runs eagerly. Finished rows stay in the batch (their
tokens are ignored) so the shapes never change, and the steps of a launch past the end are ignored too.

Every graph is captured when the decoder is built, before it serves: a capture while other threads use
the device (the TTS head's sampling, cuBLAS on the legacy stream) breaks their work and the capture, so
nothing is captured later. Where a capture fails the decoder runs eagerly.

Greedy output equals ``TorchWhisperRecognizer``'s dynamic-cache decode (``tests/encoders/test_whisper_decode.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omni_gateway.encoders.whisper_encode import capture_or_eager

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
STEPS = 8  # decode steps per launch: one read of the tokens per 8 steps; at most 7 steps wasted per batch


@dataclass
class _Bucket:
    rows: int
    self_k: list[Any]  # per layer [rows, heads, max_positions, head_dim]
    self_v: list[Any]
    cross_k: list[Any]  # per layer [rows, heads, source_positions, head_dim]
    cross_v: list[Any]
    encoded: Any  # [rows, source_positions, d_model] the encoder states the cross keys and values come from
    ids: Any  # [rows, max_positions] the prefix, then the decoded tokens
    position: Any  # [1] the next step's input position
    prefix: Any  # [1] the prefix's length: the first position the decoder chooses
    cross_graph: Any = None
    steps_graph: Any = None


class StaticWhisperDecoder:
    """Greedy decoding for one ``WhisperForConditionalGeneration`` in eval mode (``graphs``: capture on CUDA)."""

    def __init__(
        self,
        model: Any,
        *,
        suppress: list[int],
        begin_suppress: list[int],
        eos: int,
        graphs: bool,
        max_rows: int = BUCKETS[-1],
    ) -> None:
        import torch
        from omni_gateway.kernels.host_copies import to_host

        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1; got {max_rows}")

        self._torch = torch
        self._to_host = to_host
        self.model = model
        self.decoder = model.model.decoder
        config = model.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
        self.d_model = config.d_model
        self.max_positions = config.max_target_positions
        self.source_positions = config.max_source_positions
        self.eos = eos
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.graphs = graphs and self.device.type == "cuda"
        vocab = config.vocab_size
        self._barred = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self._barred[[t for t in suppress if t < vocab]] = True
        self._begin_barred = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        self._begin_barred[[t for t in begin_suppress if t < vocab]] = True
        self.buckets = tuple(b for b in BUCKETS if b < max_rows) + (max_rows,)
        self._positions = torch.arange(self.max_positions, device=self.device)
        self._buckets = self._make_buckets(max_rows)
        if self.graphs:
            self._capture_all()

    def decode(self, encoded: Any, prefix: list[int], budget: int) -> list[list[int]]:
        """Up to ``budget`` tokens per row of ``encoded`` after ``prefix``, end-of-text excluded."""
        rows = encoded.shape[0]
        if not prefix:
            raise ValueError("the decoder prompt is empty; expected at least the start-of-transcript token")
        if len(prefix) + budget > self.max_positions:
            raise ValueError(f"{len(prefix)} prefix tokens and {budget} new ones exceed {self.max_positions} positions")
        out: list[list[int]] = []
        most = self.buckets[-1]
        for start in range(0, rows, most):
            out += self._decode_bucket(encoded[start : start + most], prefix, budget)
        return out

    def _decode_bucket(self, encoded: Any, prefix: list[int], budget: int) -> list[list[int]]:
        torch = self._torch
        rows = encoded.shape[0]
        bucket = self._buckets[next(b for b in self.buckets if b >= rows)]
        # rows past ``rows`` keep an earlier batch's states: decoded, never read
        bucket.encoded[:rows].copy_(encoded)
        self._run(bucket.cross_graph, lambda: self._cross(bucket))
        bucket.ids[:, : len(prefix)].copy_(torch.tensor(prefix, device=self.device))
        bucket.prefix.fill_(len(prefix))
        bucket.position.zero_()
        # the step at position p chooses the token of p + 1: the first chosen one comes from the prefix's last
        steps = len(prefix) - 1 + budget
        done = 0
        decoded: list[list[int]] = [[] for _ in range(rows)]
        while done < steps:
            self._run(bucket.steps_graph, lambda: self._steps(bucket))
            done += STEPS
            chosen = min(done - (len(prefix) - 1), budget)
            if chosen <= 0:
                continue
            decoded = self._to_host(bucket.ids[:rows, len(prefix) : len(prefix) + chosen])[0].tolist()
            if all(self.eos in row for row in decoded):
                break
        return [row[: row.index(self.eos)] if self.eos in row else row for row in decoded]

    @staticmethod
    def _run(graph: Any, eager: Any) -> None:
        if graph is None:
            eager()
        else:
            graph.replay()

    def _capture_all(self) -> None:
        if capture_or_eager("the decoder steps", lambda: self._capture_each(self._torch), self._forget_graphs):
            log.info("Whisper: captured the decoder steps for %s rows", ", ".join(map(str, self.buckets)))

    def _forget_graphs(self) -> None:
        self.graphs = False
        for bucket in self._buckets.values():
            bucket.cross_graph = bucket.steps_graph = None

    def _capture_each(self, torch: Any) -> None:
        # no autograd: the decoder is built outside inference mode, and the steps write their buffers in place
        with torch.no_grad():
            for bucket in self._buckets.values():
                bucket.prefix.fill_(1)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up outside the capture (allocator, cuBLAS workspaces)
                for bucket in self._buckets.values():
                    for _ in range(2):
                        bucket.position.zero_()
                        self._cross(bucket)
                        self._steps(bucket)
            torch.cuda.current_stream().wait_stream(stream)
            pool = torch.cuda.graph_pool_handle()
            for bucket in self._buckets.values():
                bucket.position.zero_()
                graphs = []
                for work in (self._cross, self._steps):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                        work(bucket)
                    graphs.append(graph)
                bucket.cross_graph, bucket.steps_graph = graphs
            torch.cuda.synchronize()

    def _make_buckets(self, max_rows: int) -> dict[int, _Bucket]:
        """One bucket per size in ``self.buckets``, each a view of the first rows of the largest's buffers."""
        torch = self._torch

        def zeros(*shape: int, dtype: Any = None) -> Any:
            return torch.zeros(shape, dtype=dtype or self.dtype, device=self.device)

        layers = range(len(self.decoder.layers))
        self_k = [zeros(max_rows, self.heads, self.max_positions, self.head_dim) for _ in layers]
        self_v = [zeros(max_rows, self.heads, self.max_positions, self.head_dim) for _ in layers]
        cross_k = [zeros(max_rows, self.heads, self.source_positions, self.head_dim) for _ in layers]
        cross_v = [zeros(max_rows, self.heads, self.source_positions, self.head_dim) for _ in layers]
        encoded = zeros(max_rows, self.source_positions, self.d_model)
        ids = zeros(max_rows, self.max_positions, dtype=torch.long)
        return {
            rows: _Bucket(
                rows=rows,
                self_k=[t[:rows] for t in self_k],
                self_v=[t[:rows] for t in self_v],
                cross_k=[t[:rows] for t in cross_k],
                cross_v=[t[:rows] for t in cross_v],
                encoded=encoded[:rows],
                ids=ids[:rows],
                # per bucket: a graph reads its own position and prefix length
                position=zeros(1, dtype=torch.long),
                prefix=zeros(1, dtype=torch.long),
            )
            for rows in self.buckets
        }

    def _split(self, x: Any) -> Any:
        """[rows, positions, d_model] -> [rows, heads, positions, head_dim]"""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def _cross(self, bucket: _Bucket) -> None:
        """Every layer's cross-attention keys and values of the bucket's encoder states."""
        for layer, k, v in zip(self.decoder.layers, bucket.cross_k, bucket.cross_v):
            k.copy_(self._split(layer.encoder_attn.k_proj(bucket.encoded)))
            v.copy_(self._split(layer.encoder_attn.v_proj(bucket.encoded)))

    def _steps(self, bucket: _Bucket) -> None:
        for _ in range(STEPS):
            self._step(bucket)

    def _step(self, bucket: _Bucket) -> None:
        """One token per row through the decoder at the bucket's position: its keys and values written into
        the cache, the next position's token written into ``ids``, the position advanced. Only tensor ops on
        fixed buffers."""
        torch = self._torch
        functional = torch.nn.functional
        decoder = self.decoder
        position = bucket.position
        # past the last position a launch's surplus steps repeat the last one: their output is never read
        after = torch.clamp(position + 1, max=self.max_positions - 1)
        x = decoder.embed_tokens(bucket.ids.index_select(1, position)) + decoder.embed_positions.weight[position]
        # the position attends to cache positions up to itself; positions not yet written are masked out
        visible = self._positions[None, :] <= position[:, None]
        for layer, k_cache, v_cache, cross_k, cross_v in zip(
            decoder.layers, bucket.self_k, bucket.self_v, bucket.cross_k, bucket.cross_v
        ):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            k_cache.index_copy_(2, position, self._split(attn.k_proj(h)))
            v_cache.index_copy_(2, position, self._split(attn.v_proj(h)))
            a = functional.scaled_dot_product_attention(
                self._split(attn.q_proj(h)), k_cache, v_cache, attn_mask=visible
            )
            x = x + attn.out_proj(a.transpose(1, 2).reshape(x.shape))
            cross = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            a = functional.scaled_dot_product_attention(self._split(cross.q_proj(h)), cross_k, cross_v)
            x = x + cross.out_proj(a.transpose(1, 2).reshape(x.shape))
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        logits = self.model.proj_out(decoder.layer_norm(x[:, -1])).float()
        barred = self._barred | (self._begin_barred & (after == bucket.prefix))
        chosen = torch.argmax(logits.masked_fill(barred, -float("inf")), dim=-1)
        forced = bucket.ids.index_select(1, after)[:, 0]
        bucket.ids.index_copy_(1, after, torch.where(after < bucket.prefix, forced, chosen)[:, None])
        position.copy_(torch.clamp(position + 1, max=self.max_positions - 2))
