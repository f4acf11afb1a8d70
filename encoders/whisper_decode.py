"""Greedy Whisper decoding over a static KV cache, one fixed-shape step per token: CUDA-graph capturable.

The Hugging Face decoder grows its cache a token at a time and drops finished rows, so every step is a new
shape and several hundred kernel launches issued from Python: on a GPU the host is the bottleneck for a
decoder this small (four layers in large-v3-turbo). Here a batch is padded to a bucket (1, 2, 4, ... rows)
whose buffers live as long as the decoder: self-attention keys and values for every position, the
cross-attention keys and values computed once per batch, the step's token ids and position. Every bucket
is a view of the largest one's buffers (``max_rows``), so they cost the memory of one. One decode step
reads and writes only those buffers, so on CUDA it is captured once per bucket in a CUDA graph and
replayed (one launch per token); on CPU the same step runs eagerly. Finished rows stay in the batch
(their tokens are ignored) so the shapes never change. The weights are the model's own modules.

Every graph is captured when the decoder is built, before it serves: a capture while other threads use
the device (the TTS head's sampling, cuBLAS on the legacy stream) breaks their work and the capture, so
nothing is captured later. Where a capture fails the decoder runs eagerly.

Greedy output equals ``TorchWhisperRecognizer``'s dynamic-cache decode (``tests/encoders/test_whisper_decode.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class _Bucket:
    rows: int
    self_k: list[Any]  # per layer [rows, heads, max_positions, head_dim]
    self_v: list[Any]
    cross_k: list[Any]  # per layer [rows, heads, source_positions, head_dim]
    cross_v: list[Any]
    token: Any  # [rows, 1] the step's input token
    position: Any  # [1] the step's position
    first: Any  # [rows] bool: the step is the first decoded one (begin-suppressed tokens are barred)
    next_token: Any = None  # [rows] the step's output, read after a replay
    graph: Any = None


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

        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1; got {max_rows}")

        self._torch = torch
        self.model = model
        self.decoder = model.model.decoder
        config = model.config
        self.heads = config.decoder_attention_heads
        self.head_dim = config.d_model // self.heads
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
        self._buckets = self._make_buckets(max_rows)
        if self.graphs:
            self._capture_all()

    def decode(self, encoded: Any, prefix: list[int], budget: int) -> list[list[int]]:
        """Up to ``budget`` tokens per row of ``encoded`` after ``prefix``, end-of-text excluded."""
        torch = self._torch
        rows = encoded.shape[0]
        if len(prefix) + budget > self.max_positions:
            raise ValueError(f"{len(prefix)} prefix tokens and {budget} new ones exceed {self.max_positions} positions")
        out: list[list[int]] = []
        most = self.buckets[-1]
        for start in range(0, rows, most):
            out += self._decode_bucket(encoded[start : start + most], prefix, budget, torch)
        return out

    def _decode_bucket(self, encoded: Any, prefix: list[int], budget: int, torch: Any) -> list[list[int]]:
        rows = encoded.shape[0]
        bucket = self._buckets[next(b for b in self.buckets if b >= rows)]
        padded = (
            encoded if rows == bucket.rows else torch.cat([encoded, encoded[:1].expand(bucket.rows - rows, -1, -1)])
        )
        for layer, k, v in zip(self.decoder.layers, bucket.cross_k, bucket.cross_v):
            k.copy_(self._split(layer.encoder_attn.k_proj(padded)))
            v.copy_(self._split(layer.encoder_attn.v_proj(padded)))
        # the prefix in one eager pass (its length varies), then one fixed-shape step per token
        ids = torch.tensor([prefix] * bucket.rows, device=self.device)
        positions = torch.arange(len(prefix), device=self.device)
        bucket.first.fill_(True)
        token = self._step(bucket, ids, positions)
        generated: list[list[int]] = [[] for _ in range(rows)]
        live = [True] * rows
        for step in range(budget):
            tokens = token.tolist()
            for row in range(rows):
                if live[row]:
                    if tokens[row] == self.eos:
                        live[row] = False
                    else:
                        generated[row].append(tokens[row])
            if not any(live) or step == budget - 1:
                break
            bucket.token.copy_(token[:, None])
            bucket.position.fill_(len(prefix) + step)
            bucket.first.fill_(False)
            token = self._replay(bucket)
        return generated

    def _replay(self, bucket: _Bucket) -> Any:
        if bucket.graph is None:
            return self._step(bucket, bucket.token, bucket.position)
        bucket.graph.replay()
        return bucket.next_token

    def _capture_all(self) -> None:
        torch = self._torch
        try:
            self._capture_each(torch)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: decode eagerly
            log.warning("Whisper: CUDA graph capture of the decoder step failed (%s); it runs eagerly", exc)
            self.graphs = False
            for bucket in self._buckets.values():
                bucket.graph = bucket.next_token = None
            return
        log.info("Whisper: captured the decoder step for %s rows", ", ".join(map(str, self.buckets)))

    def _capture_each(self, torch: Any) -> None:
        # no autograd: the decoder is built outside inference mode, and the step writes its caches in place
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up outside the capture (allocator, cuBLAS workspaces)
                for bucket in self._buckets.values():
                    for _ in range(2):
                        self._step(bucket, bucket.token, bucket.position)
            torch.cuda.current_stream().wait_stream(stream)
            pool = torch.cuda.graph_pool_handle()
            for bucket in self._buckets.values():
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    bucket.next_token = self._step(bucket, bucket.token, bucket.position)
                bucket.graph = graph
            torch.cuda.synchronize()

    def _make_buckets(self, max_rows: int) -> dict[int, _Bucket]:
        """One bucket per size in ``self.buckets``, each a view of the first rows of the largest's buffers."""
        torch = self._torch

        def zeros(positions: int) -> Any:
            shape = (max_rows, self.heads, positions, self.head_dim)
            return torch.zeros(shape, dtype=self.dtype, device=self.device)

        layers = range(len(self.decoder.layers))
        self_k = [zeros(self.max_positions) for _ in layers]
        self_v = [zeros(self.max_positions) for _ in layers]
        cross_k = [zeros(self.source_positions) for _ in layers]
        cross_v = [zeros(self.source_positions) for _ in layers]
        token = torch.zeros((max_rows, 1), dtype=torch.long, device=self.device)
        return {
            rows: _Bucket(
                rows=rows,
                self_k=[t[:rows] for t in self_k],
                self_v=[t[:rows] for t in self_v],
                cross_k=[t[:rows] for t in cross_k],
                cross_v=[t[:rows] for t in cross_v],
                token=token[:rows],
                # per bucket: a graph reads its own position and first-step flag
                position=torch.zeros(1, dtype=torch.long, device=self.device),
                first=torch.zeros((), dtype=torch.bool, device=self.device),
            )
            for rows in self.buckets
        }

    def _split(self, x: Any) -> Any:
        """[rows, positions, d_model] -> [rows, heads, positions, head_dim]"""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def _step(self, bucket: _Bucket, ids: Any, positions: Any) -> Any:
        """Tokens ``ids`` [rows, T] at ``positions`` [T] through the decoder, writing their keys and values
        into the cache; returns the greedy next token of each row. Only tensor ops on fixed buffers."""
        torch = self._torch
        functional = torch.nn.functional
        decoder = self.decoder
        x = decoder.embed_tokens(ids) + decoder.embed_positions.weight[positions]
        # position p attends to cache positions <= p; positions not yet written are masked out
        visible = torch.arange(self.max_positions, device=self.device)[None, :] <= positions[:, None]
        for layer, k_cache, v_cache, cross_k, cross_v in zip(
            decoder.layers, bucket.self_k, bucket.self_v, bucket.cross_k, bucket.cross_v
        ):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            k_cache.index_copy_(2, positions, self._split(attn.k_proj(h)))
            v_cache.index_copy_(2, positions, self._split(attn.v_proj(h)))
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
        barred = self._barred | (self._begin_barred & bucket.first)
        return torch.argmax(logits.masked_fill(barred, -float("inf")), dim=-1)
