"""token2wav's DiT evaluation with what does not change across the ODE's steps computed once.

transformers' ``Qwen2_5OmniToken2WavDiTModel.forward`` recomputes, at every one of the ODE's 40
evaluations, things that depend on the chunk only (the speaker encoder over the reference mel, the code
embeddings, their share of the input projection, the rotary positions and the block masks) or on the time
only (the time embedding and every layer's adaptive-norm modulation). That is about 1,000 kernels an
evaluation, and on a GPU a small chunk's call is bound by launching them. Here ``prepare`` computes the
chunk's part once per call; ``velocity`` runs only the layers over ``x``, 12 kernels a layer, with
each layer's modulation looked up by time (computed when the head is built, for the ODE's own times, or on
the spot for any other time) and applied as its norm's affine. q, k and v are one projection, whose weight
the model's three modules now view; head 0's rotary rotation is one small matrix per position, applied to
q's and k's head 0 together, in place. The weights are the model's own; the result equals ``forward`` up to
float rounding (``tests/omni/test_token2wav.py``). A model in bfloat16 computes in bfloat16 from inputs given
in float32, and returns float32.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class PreparedChunk:
    """One call's step-invariant inputs: ``rows`` is the batch (doubled under classifier-free guidance)."""

    rows: int
    fixed_input: torch.Tensor  # [rows, frames, hidden]: the input projection of everything but ``x``, bias included
    rotation: torch.Tensor  # [frames, head_dim, head_dim]: head 0's rotary map at each position
    masks: tuple[torch.Tensor, ...]  # per layer [frames, frames] (or [rows, 1, frames, frames]) bool: what a frame sees
    guided: bool


class FastDiT:
    """``dit``'s forward split into per-chunk and per-evaluation parts (``dit``: transformers' DiT, eval mode)."""

    def __init__(self, dit: Any, times: list[float]) -> None:
        self.dit = dit
        self.mel_dim = int(dit.mel_dim)
        self.heads = int(dit.num_attention_heads)
        attn = dit.transformer_blocks[0].attn
        self.head_dim = attn.inner_dim // self.heads
        hf = sys.modules[type(attn).__module__]
        self._apply_rotary = hf.apply_rotary_pos_emb
        self._deinterleave = getattr(hf, "deinterleave_head_dim", lambda x: x)
        proj = dit.input_embed.proj.weight
        self.dtype = proj.dtype
        self._x_weight = proj[:, : self.mel_dim].t()  # the input projection's columns that see ``x``
        self._fixed_weight = proj[:, self.mel_dim :]  # ... and those that see the chunk's conditions
        self._qkv = [_merge_qkv(layer.attn) for layer in dit.transformer_blocks]
        self._modulations: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.inference_mode():
            for t in times:
                self._modulations[t] = self._modulation(t)

    def prepare(
        self,
        code: torch.Tensor,
        speaker: torch.Tensor,
        ref_mel: torch.Tensor,
        guided: bool,
        valid: torch.Tensor | None = None,
    ) -> PreparedChunk:
        """``code`` [B, n], ``speaker`` [B, frames, enc_emb_dim], ``ref_mel`` [B, ref_frames, mel_dim];
        ``valid`` [B]: each row's real frames, the rest padding that no real frame attends to (None: all)."""
        dit = self.dit
        embed = dit.input_embed
        speaker, ref_mel = speaker.to(self.dtype), ref_mel.to(self.dtype)
        code_embed = dit.text_embed(code, drop_code=False)
        if guided:  # the second half: no speaker, no reference audio, no codes
            code_embed = torch.cat((code_embed, dit.text_embed(code, drop_code=True)))
            speaker = torch.cat((speaker, torch.zeros_like(speaker)))
            ref_mel = torch.cat((ref_mel, torch.zeros_like(ref_mel)))
        rows, frames = code_embed.shape[0], code_embed.shape[1]
        voice = embed.spk_encoder(ref_mel).unsqueeze(1).expand(rows, frames, -1)
        fixed = F.linear(torch.cat((voice, code_embed, speaker), -1), self._fixed_weight, embed.proj.bias)
        positions = torch.arange(frames, device=code.device)
        cos, sin = dit.rotary_embed(fixed, positions[None])
        eye = torch.eye(self.head_dim, device=code.device, dtype=fixed.dtype)
        basis = eye[None, :, None, :].expand(1, self.head_dim, frames, self.head_dim)  # [1, "heads"=D, T, D]
        rotated, _ = self._apply_rotary(self._deinterleave(basis), self._deinterleave(basis), cos, sin)
        rotation = rotated[0].transpose(0, 1)  # [T, D_in, D_out]
        block = positions // dit.block_size
        diff = block[None, :] - block[:, None]
        spans = [(layer.look_backward_block, layer.look_ahead_block) for layer in dit.transformer_blocks]
        masks = {span: (diff >= -float(span[0])) & (diff <= float(span[1])) for span in set(spans)}
        if valid is not None:
            real = positions[None, :] < (torch.cat((valid, valid)) if guided else valid)[:, None]  # [rows, T]
            # A padding frame still attends to itself, so none of its rows is all masked (a NaN there would
            # reach real frames through their zero weights on it).
            own = torch.eye(frames, dtype=torch.bool, device=code.device)
            masks = {span: (mask & real[:, None, None, :]) | own for span, mask in masks.items()}
        return PreparedChunk(rows, fixed, rotation.contiguous(), tuple(masks[span] for span in spans), guided)

    def velocity(self, chunk: PreparedChunk, x: torch.Tensor, t: float) -> torch.Tensor:
        """The DiT's output for ``x`` [B, frames, mel_dim] at time ``t`` ([2B, ...] when guided)."""
        dit = self.dit
        layers, final = self._modulations.get(t) or self._modulation(t)
        given = x.dtype
        x = x.to(self.dtype)
        if chunk.guided:
            x = torch.cat((x, x))
        h = torch.addmm(
            chunk.fixed_input.reshape(-1, chunk.fixed_input.shape[-1]), x.reshape(-1, self.mel_dim), self._x_weight
        ).view(chunk.fixed_input.shape)
        rows, frames, width = h.shape
        for layer, mod, mask, (qkv_weight, qkv_bias) in zip(dit.transformer_blocks, layers, chunk.masks, self._qkv):
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod  # scales hold 1 + scale
            attn = layer.attn
            n = F.layer_norm(h, (width,), scale_msa, shift_msa, eps=1e-6)  # the modulation as the norm's affine
            qkv = F.linear(n, qkv_weight, qkv_bias).view(rows, frames, 3, self.heads, self.head_dim)
            # head 0 of q and k carries the rotary positions (as the checkpoint was trained), the other heads
            # none: rotated together, in place
            head0 = qkv[:, :, :2, 0]
            head0.copy_(torch.matmul(head0, chunk.rotation))
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            h = torch.addcmul(h, gate_msa, attn.to_out[0](a.transpose(1, 2).reshape(rows, frames, width)))
            n = F.layer_norm(h, (width,), scale_mlp, shift_mlp, eps=1e-6)
            ff = layer.ff.ff
            h = torch.addcmul(h, gate_mlp, ff[3](ff[1](ff[0](n))))
        scale, shift = final
        return dit.proj_out(F.layer_norm(h, (width,), scale, shift, eps=1e-6)).to(given)

    def _modulation(self, t: float) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's six modulation vectors at time ``t`` (scales as 1 + scale) and the final norm's two."""
        dit = self.dit
        weight = dit.proj_out.weight
        emb = dit.time_embed(torch.full((1,), t, device=weight.device, dtype=weight.dtype))
        layers = []
        for layer in dit.transformer_blocks:
            norm = layer.attn_norm
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = norm.linear(norm.silu(emb))[0].chunk(6)
            layers.append(torch.stack((shift_msa, 1 + scale_msa, gate_msa, shift_mlp, 1 + scale_mlp, gate_mlp)))
        scale, shift = dit.norm_out.linear(dit.norm_out.silu(emb))[0].chunk(2)
        return layers, (1 + scale, shift)


def _merge_qkv(attn: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``[3 * inner, hidden]`` projection for q, k and v (one matmul instead of three). The modules'
    own weights become views of it, so the model is held once and its forward is unchanged."""
    linears = (attn.to_q, attn.to_k, attn.to_v)
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = all(lin.bias is not None for lin in linears)
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    rows = linears[0].weight.shape[0]
    for i, lin in enumerate(linears):
        lin.weight.data = weight[i * rows : (i + 1) * rows]
        if bias is not None:
            lin.bias.data = bias[i * rows : (i + 1) * rows]
    return weight, bias
