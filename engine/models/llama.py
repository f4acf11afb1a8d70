"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3, and the mixtures of experts Qwen2-MoE,
Qwen3-MoE and Mixtral, whose sparse layers run engine/models/moe.py) over the paged KV cache.

One forward runs a flattened varlen batch: the tokens of every sequence concatenated, prefill
chunks and decodes together. q/k/v projections are merged into one matmul (gate/up too, on CUDA).
Weights arrive under Hugging Face names (see engine/runner/loader.py). A step runs one of three layer paths:
the per-layer one (engine/models/llama_layers.py), the fused one-row kernels of a batch-1 decode
(engine/models/llama_rows.py) or the fused CPU layers of quantized weights (engine/quant/cpu_layers.py).
"""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.engine.models import llama_rows
from omni_gateway.engine.models.linear import Linear, onednn_prepacks
from omni_gateway.engine.models.llama_layers import LlamaLayer, decode_per_layer
from omni_gateway.engine.models.llama_shape import ModelShape
from omni_gateway.engine.models.moe import build_moe_block
from omni_gateway.engine.models.moe_config import MoeConfig
from omni_gateway.engine.models.rotary_table import rotary_cos_sin_cache
from omni_gateway.engine.parallel.context import SINGLE, ParallelContext
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.quant import cpu_layers
from omni_gateway.engine.quant.cpu_linear import QuantizedLinear, QuantizedWeight, keeps_quantized
from omni_gateway.engine.runner.attention import AttentionMetadata, KernelOps, paged_attention


class LlamaModel:
    """Plain tensors and functions (no nn.Module): the forward is all there is to run.

    Under tensor parallel (``parallel``) the weights are this rank's shards (engine/parallel/weights.py):
    the model holds its own heads, MLP columns and vocabulary rows, sums the outputs of o_proj and
    down_proj over the ranks and gathers the logits.
    """

    uses_mrope = False  # positions are one index per token; M-RoPE models override this

    def __init__(
        self,
        hf_config: Any,
        weights: dict[str, torch.Tensor],
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int,
        parallel: ParallelContext = SINGLE,
    ) -> None:
        self.shape = s = ModelShape.from_hf(hf_config)
        self.ops = ops
        self.device = device
        self.dtype = dtype
        self.parallel = parallel
        layout = ShardLayout.of(hf_config, parallel.rank, parallel.world_size, parallel.expert_parallel)
        self.num_heads, self.num_kv_heads = layout.heads_per_rank, layout.kv_heads_per_rank  # this rank's
        self.vocab_start = layout.vocab_rows()[0]
        self.scale = s.head_dim**-0.5
        self.q_size = self.num_heads * s.head_dim
        self.kv_size = self.num_kv_heads * s.head_dim
        self.intermediate_size = int(hf_config.intermediate_size) // parallel.world_size
        self.lora: Any = None  # engine.lora.slots.LoraSlots once attached (engine.lora.slots.attach_lora)

        # GGUF codes stay quantized where the CPU matmuls run; elsewhere they become float weights here.
        quantized = keeps_quantized(device, dtype)

        def w(name: str) -> Any:
            value = weights[name]
            if isinstance(value, QuantizedWeight):
                if quantized:
                    return value
                value = value.dequantize()
            if not isinstance(value, torch.Tensor):  # a checkpoint's quantized weight (engine/quant): moves itself
                return value.to(device, dtype)
            return value.to(device=device, dtype=dtype).contiguous()

        def opt(name: str) -> torch.Tensor | None:
            return w(name) if name in weights else None

        def merged(names: list[str]) -> Any:
            if not all(n in weights for n in names):
                return None
            first = weights[names[0]]
            if not isinstance(first, (torch.Tensor, QuantizedWeight)):  # checkpoint-quantized: stacks its parts
                return type(first).cat([weights[n] for n in names]).to(device, dtype)
            parts = [w(n) for n in names]
            if all(isinstance(p, QuantizedWeight) for p in parts):
                return parts
            return torch.cat([p.dequantize() if isinstance(p, QuantizedWeight) else p for p in parts]).contiguous()

        # The Triton backend (CUDA, or its CPU interpreter in tests) lays weights out as CUDA does.
        triton_ops = ops.name == "triton"
        prepack = onednn_prepacks(device, dtype) and not triton_ops

        def linear(weight: Any, bias: torch.Tensor | None = None, packed_rows: int = 2) -> Linear | QuantizedLinear:
            assert weight is not None
            if isinstance(weight, (QuantizedWeight, list)):
                return QuantizedLinear.build(weight if isinstance(weight, list) else [weight], bias)
            return Linear.build(weight, bias, ops.linear, prepack=prepack, packed_rows=packed_rows, row=ops.row_linear)

        self.embed = w("model.embed_tokens.weight")
        # A tied head is the embedding, unless the loader quantized a copy of it (``quantize_lm_head``).
        head = weights.get("lm_head.weight")
        tied = s.tie_embeddings and (head is None or isinstance(head, (torch.Tensor, QuantizedWeight)))
        self.lm_head = linear(self.embed if tied else w("lm_head.weight"), None, packed_rows=1)
        self.final_norm = w("model.norm.weight")
        self.layers: list[LlamaLayer] = []
        # On the CPU the [2I, H] merged gate/up matmul was no faster than two [I, H] ones (MKL ran it
        # up to 1.5x slower at decode batch sizes), so they stay apart there unless quantized (one call
        # instead of two); MLP biases take the merged path.
        merge_mlp = (
            device.type == "cuda"
            or triton_ops
            or (quantized and isinstance(weights.get("model.layers.0.mlp.gate_proj.weight"), QuantizedWeight))
            or any(k.endswith("mlp.gate_proj.bias") for k in weights)
        )
        moe_config = MoeConfig.of(hf_config)
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            attn = [f"{p}self_attn.{n}_proj" for n in ("q", "k", "v")]
            mlp = [f"{p}mlp.{n}_proj" for n in ("gate", "up")]
            moe = None
            if moe_config is not None and moe_config.is_sparse(i):
                moe = build_moe_block(
                    weights,
                    i,
                    moe_config,
                    layout,
                    device=device,
                    dtype=dtype,
                    triton=triton_ops,
                    linear=linear,
                    silu_and_mul=ops.silu_and_mul,
                )
            dense = moe is None
            self.layers.append(
                LlamaLayer(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=linear(merged([n + ".weight" for n in attn]), merged([n + ".bias" for n in attn])),
                    o=linear(w(p + "self_attn.o_proj.weight"), opt(p + "self_attn.o_proj.bias")),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=(
                        linear(merged([n + ".weight" for n in mlp]), merged([n + ".bias" for n in mlp]))
                        if merge_mlp and dense
                        else None
                    ),
                    gate=None if merge_mlp or not dense else linear(w(mlp[0] + ".weight")),
                    up=None if merge_mlp or not dense else linear(w(mlp[1] + ".weight")),
                    down=linear(w(p + "mlp.down_proj.weight"), opt(p + "mlp.down_proj.bias")) if dense else None,
                    q_norm=opt(p + "self_attn.q_norm.weight") if s.qk_norm else None,
                    k_norm=opt(p + "self_attn.k_norm.weight") if s.qk_norm else None,
                    moe=moe,
                )
            )
        self.cos_sin_cache = rotary_cos_sin_cache(hf_config, s.head_dim, max_positions, weights.get("rope_freqs")).to(
            device
        )
        self.fused_cpu_layers = cpu_layers.runs_fused(self)
        # Batch-1 decode steps run their layers through the fused one-row kernels where every linear has
        # one (``llama_rows.decode_row``).
        self.row_fusion = llama_rows.fuses_rows(self)
        # The LM head is checked apart: a head without the fused kernel (a per-block FP8 one) still takes
        # the layers' fused residual stream, through the separate final norm.
        self.head_fusion = self.row_fusion and isinstance(self.lm_head, Linear) and self.lm_head.row is not None
        # In those steps, where every layer linear reads and adds into the float32 rows of kernels/int4_row_stream.py
        # (int4 on the tensor cores, bfloat16, no bias past the qkv projection), the residual stream is a float32 row
        # that the o and down projections add their sums into split by split, and the gate/up projection's sums meet in
        # GateSums that the down projection finishes: no split tails (``llama_rows.decode_stream``). The qkv
        # projection's epilogue then also rotates q and k and writes k and v to the cache (no rotary launch) where the
        # model's rotary is the plain one (no M-RoPE, no q/k norms), and the LM head reads the stream where its row
        # kernel can (``compute_logits``).
        self.row_stream = self.row_fusion and llama_rows.streams_rows(self)
        self.rotary_fold = self.row_stream and not self.uses_mrope and not s.qk_norm
        self.head_stream = self.row_stream and self.head_fusion and self.lm_head.row_streams
        # (hidden state, stream) of the last ``llama_rows.decode_stream``: compute_logits reads the float32 stream when
        # it is handed that very hidden state and the head can (``head_stream``).
        self.last_stream: tuple[torch.Tensor, Any] | None = None
        # Decoder layers whose outputs (the residual stream after them) each forward keeps in ``aux_hidden``
        # (``[T, len(aux_layers), hidden]``) for a speculative proposer that reads them (EAGLE-3); empty: none.
        self.aux_layers: tuple[int, ...] = ()
        self.aux_hidden: torch.Tensor | None = None

    def capture_aux_hidden(self, layers: tuple[int, ...]) -> None:
        """Keep the outputs of ``layers`` (0-based decoder layer indices) at every position of each forward.
        The forwards then take the unfused per-layer path, where the residual stream is at hand."""
        bad = [i for i in layers if not 0 <= i < self.shape.num_layers]
        if bad:
            raise ValueError(
                f"hidden states of decoder layers {bad} asked, the model has layers 0..{self.shape.num_layers - 1}"
            )
        self.aux_layers = tuple(layers)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, QuantizedWeight):
            return self.embed.rows(input_ids)
        return self.parallel.embedding(input_ids, self.embed, self.vocab_start)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        embed_rows: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None,
        cos_sin_cache: torch.Tensor | None = None,
        deepstack: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` after the last layer (before the final norm); the final norm
        is applied in ``compute_logits`` to the rows that sample only.

        ``embed_rows``/``embeds`` replace the token embeddings at those flat token indices.
        ``cos_sin_cache`` replaces the rotary table that ``positions`` index (M-RoPE builds one per step).
        ``deepstack`` (rows, ``[layers, rows, hidden]``): added to those rows' hidden states after each of the
        first ``layers`` layers (Qwen3-VL's DeepStack; engine.core.sequence.EmbedSpan).
        """
        rotary_table = self.cos_sin_cache if cos_sin_cache is None else cos_sin_cache
        hidden = self.embed_tokens(input_ids)
        if embed_rows is not None and embeds is not None:
            hidden[embed_rows] = embeds.to(hidden.dtype)
        return self.decode_layers(hidden, positions, meta, kv_caches, rotary_table, deepstack)

    def decode_layers(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        rotary_table: torch.Tensor,
        deepstack: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The decoder layers over input embeddings ``[T, hidden]``; see ``forward``. A step with DeepStack rows
        or captured layers takes the per-layer path (engine/models/llama_layers.py; the fused paths keep no layer
        boundary to add them at or read them from)."""
        aux = self.aux_layers
        if deepstack is not None:
            rows, features = deepstack
            if features.shape[0] > len(self.layers):
                raise ValueError(f"{features.shape[0]} DeepStack layers for a decoder of {len(self.layers)} layers")
        elif self.fused_cpu_layers and not aux:
            return cpu_layers.decode_layers(self, hidden, positions, meta, kv_caches, rotary_table)
        elif self.row_fusion and hidden.shape[0] == 1 and not aux:
            return llama_rows.decode_row(self, hidden, positions, meta, kv_caches, rotary_table)
        return decode_per_layer(self, hidden, positions, meta, kv_caches, rotary_table, deepstack)

    def _attention(
        self,
        layer: LlamaLayer,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rotary_table: torch.Tensor,
    ) -> torch.Tensor:
        """``[T, q_size]`` attention output of one layer; writes this step's K/V into its cache."""
        s, ops = self.shape, self.ops
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.reshape(num_tokens, self.num_heads, s.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, s.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, s.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = ops.rms_norm(q.reshape(-1, s.head_dim), layer.q_norm, s.rms_norm_eps).view_as(q)
            k = ops.rms_norm(k.reshape(-1, s.head_dim), layer.k_norm, s.rms_norm_eps).view_as(k)
        q = ops.rotary_write_kv(q, k, v, positions, rotary_table, k_cache, v_cache, meta.slot_mapping)
        return paged_attention(ops, q, k_cache, v_cache, meta, self.scale).reshape(num_tokens, self.q_size)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[N, vocab]`` for already-selected rows of ``forward``'s output (every
        rank gets them all under tensor parallel; rank 0 samples)."""
        if self.head_fusion and hidden.shape[0] == 1:
            assert isinstance(self.lm_head, Linear)
            last = self.last_stream
            row = last[1] if last is not None and last[0] is hidden else hidden
            return self.lm_head.fused(
                row, norm_weight=self.final_norm, eps=self.shape.rms_norm_eps, out_dtype=torch.float32
            )
        normed = self.ops.rms_norm(hidden, self.final_norm, self.shape.rms_norm_eps)
        if not self.parallel.is_parallel:
            return self.lm_head(normed).float()
        return self.parallel.gather_last_dim(self.lm_head(normed))[:, : self.shape.vocab_size].float()
