"""LTX-Video (``LTXPipeline``, ``LTXImageToVideoPipeline``): sharding rules and FLOPs.

The pipelines batch their classifier-free-guidance pair themselves (``torch.cat([latents] * 2)``), which the runtime
shards over ``dp``. Self- and cross-attention go through the kernel seam (the text padding arrives as an additive
bias, which runs through the exact masked reference over the short text); the VAE's decoder and encoder are compiled
(decoded in one call, no frame loop). Nothing in the stock code needs a jit fix.
"""

from __future__ import annotations

import diffusers

from ..runtime.registry import Family, Planning, register

_BLOCK = r"^transformer_blocks\.\d+\."
# Megatron-style tp over whole heads (see wan.py); q/k RMS norms span all heads and follow their columns.
SHARD_RULES = (
    (_BLOCK + r"attn[12]\.(to_q|to_k|to_v)\.weight$", ("tp", None)),
    (_BLOCK + r"attn[12]\.(to_q|to_k|to_v)\.bias$", ("tp",)),
    (_BLOCK + r"attn[12]\.(norm_q|norm_k)\.weight$", ("tp",)),
    (_BLOCK + r"attn[12]\.to_out\.0\.weight$", (None, "tp")),
    (_BLOCK + r"ff\.net\.0\.proj\.weight$", ("tp", None)),
    (_BLOCK + r"ff\.net\.0\.proj\.bias$", ("tp",)),
    (_BLOCK + r"ff\.net\.2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^transformer_blocks\.\d+$", ("dp", "sp", None)),)


def forward_flops(config, latent_frames: int, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one forward for one sample: per block self-attention 8*S*d^2 + 4*S^2*d, cross-attention
    4*S*d^2 + 4*L*c*d + 4*S*L*d, the MLP 4*S*d*4d; plus the input/output projections and the caption projection."""
    tokens = (
        (latent_frames // config.patch_size_t)
        * (latent_height // config.patch_size)
        * (latent_width // config.patch_size)
    )
    dim = config.num_attention_heads * config.attention_head_dim
    text, cross = text_tokens, config.cross_attention_dim
    block = (
        8 * tokens * dim**2
        + 4 * tokens**2 * dim
        + 4 * tokens * dim**2
        + 4 * text * cross * dim
        + 4 * tokens * text * dim
        + 16 * tokens * dim**2
    )
    edges = 2 * tokens * (config.in_channels + config.out_channels) * dim + 2 * text * config.caption_channels * dim
    return config.num_layers * block + edges


def latent_size(pipe, height: int, width: int, frames: int):
    return (
        (frames - 1) // pipe.vae_temporal_compression_ratio + 1,
        height // pipe.vae_spatial_compression_ratio,
        width // pipe.vae_spatial_compression_ratio,
    )


FAMILY = register(
    Family(
        name="ltx",
        pipelines=(diffusers.LTXPipeline, diffusers.LTXImageToVideoPipeline),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        planning=Planning(
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config, *latent_size(pipe, h, w, f), text
            )
        ),
    )
)
