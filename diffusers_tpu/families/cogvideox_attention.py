"""CogVideoX's joint attention with the rotary embedding through ``runtime.rotary`` (the Pallas kernel on TPU).

Why: ``CogVideoXAttnProcessor2_0`` rotates the video tokens' slice of q and k (``query[:, :, text:] = ...``) with
diffusers' ``apply_rotary_emb`` on the pair layout, after the heads transpose. Compiled for TPU that costs every
block two layout copies, a 22 MB all-gather of the tables and ~3 GB of memory traffic at CogVideoX1.5-5B 768p on
v6e-8 (measured by compiling the step with the rotation removed: BENCHMARKS.md). Here the rotation runs on the
projections' ``[B, S, H, D]`` layout over the whole joint sequence, the text tokens' rows of the tables being the
identity (cos 1, sin 0: ``x * 1 + y * 0`` is ``x``), and the heads transpose follows it; the per-head LayerNorms
(over the last dimension) give the same values in either layout. Every other call — cross-attention, an attention
mask, no rotary embedding (CogVideoX-2b) — is the stock method itself.

Installed per instance by ``install`` (``runtime.kernel_processors``: only over the exact stock class, undone by
``pipe.to("cpu")``, only while diffusers' source is the one restated: ``kernel_processors.restates``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

from ..runtime.attention import kernel_processors, rotary


@kernel_processors.restates("a1ecc57eaf6a958b")
class KernelRotaryCogVideoXAttnProcessor(CogVideoXAttnProcessor2_0):
    """``CogVideoXAttnProcessor2_0`` whose rotary self-attention rotates q and k through the kernel."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None, image_rotary_emb=None):
        if image_rotary_emb is None or attention_mask is not None or attn.is_cross_attention:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size = hidden_states.shape[0]
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch_size, -1, attn.heads, head_dim)
        key = key.view(batch_size, -1, attn.heads, head_dim)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        cos, sin = image_rotary_emb
        cos = torch.cat([cos.new_ones(text_seq_length, cos.shape[-1]), cos])
        sin = torch.cat([sin.new_zeros(text_seq_length, sin.shape[-1]), sin])
        query, key = rotary.rotate(query, key, freqs_cos=cos, freqs_sin=sin, tables="lanes")
        hidden_states = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), value, attn_mask=None, dropout_p=0.0, is_causal=False
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


def install(runtime, transformer) -> int:
    """CogVideoX's stock processors of ``transformer`` swapped for the kernel-rotary subclass."""
    return kernel_processors.install(
        runtime, transformer, {CogVideoXAttnProcessor2_0: KernelRotaryCogVideoXAttnProcessor}
    )
