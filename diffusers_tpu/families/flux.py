"""Flux (``FluxPipeline``): sharding, the true-CFG pair as one dp-sharded batch, FLOPs.

Flux's transformer has the double-/single-stream layout of HunyuanVideo (same parameter names), so it shares that
sharding table. The model is guidance-distilled; real classifier-free guidance (``true_cfg_scale > 1`` with a
negative prompt) calls it twice per step in the "cond"/"uncond" cache contexts, with the negative embeddings and
pooled projections from a second ``encode_prompt`` call: those are batched with the positive ones over ``dp``
(the rebuilt ``timestep / 1000`` and text ids are compared by value). Images come out of the on-device
postprocessing as uint8.
"""

from __future__ import annotations

import diffusers

from ..runtime.registry import CFGBatching, Family, Planning, register
from . import hunyuan_video


def forward_flops(config, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one forward for one sample (``hunyuan_video.forward_flops`` over image tokens)."""
    tokens = (latent_height // 2) * (latent_width // 2)  # the pipeline packs 2x2 latent patches
    dim = config.num_attention_heads * config.attention_head_dim
    total, mlp = tokens + text_tokens, 4 * dim
    double = 8 * total * dim**2 + 4 * total**2 * dim + 4 * total * dim * mlp
    single = 6 * total * dim**2 + 4 * total**2 * dim + 2 * total * dim * mlp + 2 * total * (dim + mlp) * dim
    edges = 2 * tokens * config.in_channels * dim * 2 + 2 * text_tokens * config.joint_attention_dim * dim
    return config.num_layers * double + config.num_single_layers * single + edges


def on_packed_latents(flops):
    """``Planning.forward_flops`` of a pipeline that packs 2x2 patches of its latents (Flux, Qwen-Image):
    ``flops(config, latent_height, latent_width, text_tokens)`` at the latent size the VAE makes of ``h`` x ``w``."""

    def forward_flops(pipe, h, w, f, text):
        packed = pipe.vae_scale_factor * 2
        return flops(pipe.transformer.config, 2 * (h // packed), 2 * (w // packed), text)

    return forward_flops


FAMILY = register(
    Family(
        name="flux",
        pipelines=(diffusers.FluxPipeline,),
        denoisers=("transformer",),
        shard_rules=hunyuan_video.SHARD_RULES,
        activation_rules=hunyuan_video.ACTIVATION_RULES,
        # encode_prompt -> (embeddings, pooled, text ids); called a second time for the negative prompt
        cfg=CFGBatching(
            negative=lambda encoded: (encoded[0], encoded[1]),
            condition_args=("encoder_hidden_states", "pooled_projections"),
            negative_call=1,
            batched_args=("hidden_states", "timestep", "guidance"),
        ),
        planning=Planning(forward_flops=on_packed_latents(forward_flops)),
    )
)
