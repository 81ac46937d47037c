"""LTX-2 (``LTX2Pipeline``, ``LTX2ImageToVideoPipeline``, ``LTX2ConditionPipeline``): video and audio in one
denoiser. Sharding rules and FLOPs.

The transformer runs two token streams side by side (video and audio), each block with self-attention, text
cross-attention and a feed-forward per stream plus the audio-to-video and video-to-audio cross-attentions. Every one
of them is sharded Megatron-style over whole heads on ``tp`` (so tp must divide both streams' head counts). The
pipelines batch their classifier-free-guidance pair themselves (``torch.cat([latents] * 2)``), which the runtime
shards over ``dp``. The text connectors and the vocoder are compiled whole; the video VAE and the audio VAE through
their decoder/encoder modules. The one jit blocker met, the split rotary embedding's ``addcmul_`` into a slice of its
output, is fixed where it is general (``compat``: in-place ops on views).
"""

from __future__ import annotations

import math

import diffusers

from ..runtime.registry import Family, Planning, register
from .ltx import latent_size  # same VAE compression attributes as LTX-Video

_ATTENTION = (
    r"^transformer_blocks\.\d+\.(attn1|attn2|audio_attn1|audio_attn2|audio_to_video_attn|video_to_audio_attn)\."
)
_FEED_FORWARD = r"^transformer_blocks\.\d+\.(ff|audio_ff)\.net\."
# Megatron-style tp over whole heads (see wan.py); q/k RMS norms span all heads and follow their columns.
SHARD_RULES = (
    (_ATTENTION + r"(to_q|to_k|to_v)\.weight$", ("tp", None)),
    (_ATTENTION + r"(to_q|to_k|to_v)\.bias$", ("tp",)),
    (_ATTENTION + r"(norm_q|norm_k)\.weight$", ("tp",)),
    (_ATTENTION + r"to_out\.0\.weight$", (None, "tp")),
    (_FEED_FORWARD + r"0\.proj\.weight$", ("tp", None)),
    (_FEED_FORWARD + r"0\.proj\.bias$", ("tp",)),
    (_FEED_FORWARD + r"2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^transformer_blocks\.\d+$", ("dp", "sp", None)),)


def num_heads(pipe) -> int:
    """tp must divide the video and the audio stream's head counts (the cross-modal attentions use the audio's)."""
    config = pipe.transformer.config
    return math.gcd(config.num_attention_heads, config.audio_num_attention_heads)


def forward_flops(config, latent_frames: int, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one forward for one sample, video stream only (the audio stream is a few percent of it): per
    block self-attention 8*S*d^2 + 4*S^2*d, text cross-attention 4*S*d^2 + 4*L*d^2 + 4*S*L*d (the connectors already
    project the text to the model width), the MLP 16*S*d^2."""
    tokens = (
        (latent_frames // config.patch_size_t)
        * (latent_height // config.patch_size)
        * (latent_width // config.patch_size)
    )
    dim = config.num_attention_heads * config.attention_head_dim
    block = (
        8 * tokens * dim**2
        + 4 * tokens**2 * dim
        + 4 * tokens * dim**2
        + 4 * text_tokens * dim**2
        + 4 * tokens * text_tokens * dim
        + 16 * tokens * dim**2
    )
    return config.num_layers * block + 2 * tokens * (config.in_channels + config.out_channels) * dim


FAMILY = register(
    Family(
        name="ltx2",
        pipelines=(diffusers.LTX2Pipeline, diffusers.LTX2ImageToVideoPipeline, diffusers.LTX2ConditionPipeline),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        num_heads=num_heads,
        planning=Planning(
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config, *latent_size(pipe, h, w, f), text
            )
        ),
    )
)
