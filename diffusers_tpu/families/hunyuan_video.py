"""HunyuanVideo 1.0 (``HunyuanVideoPipeline``): sharding, the true-CFG pair as one dp-sharded batch, FLOPs.

The transformer has double-stream blocks (video and text, each with q/k/v, output and MLP projections) and
single-stream blocks (q/k/v and an MLP projection over the joined tokens). Its text padding reaches attention as a
``[B, 1, 1, N]`` key mask, which the project's kernel takes as its key mask; the token refiner's square mask runs
through the exact masked reference. The model is guidance-distilled (``guidance_scale`` is an input); real
classifier-free guidance (``true_cfg_scale > 1`` with a negative prompt) calls it twice per step, in the "cond" and
"uncond" cache contexts, with the negative embeddings, mask and pooled projections from a second ``encode_prompt``
call: those three are batched with the positive ones over ``dp``.
"""

from __future__ import annotations

import diffusers

from ..runtime.registry import CFGBatching, Family, Planning, register

_DOUBLE, _SINGLE = r"^transformer_blocks\.\d+\.", r"^single_transformer_blocks\.\d+\."
# Megatron-style tp over whole heads (see wan.py); the per-head-dim q/k norms are shared by all heads.
SHARD_RULES = (
    (_DOUBLE + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.weight$", ("tp", None)),
    (_DOUBLE + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.bias$", ("tp",)),
    (_DOUBLE + r"attn\.(to_out\.0|to_add_out)\.weight$", (None, "tp")),
    (_DOUBLE + r"(ff|ff_context)\.net\.0\.proj\.weight$", ("tp", None)),
    (_DOUBLE + r"(ff|ff_context)\.net\.0\.proj\.bias$", ("tp",)),
    (_DOUBLE + r"(ff|ff_context)\.net\.2\.weight$", (None, "tp")),
    (_SINGLE + r"attn\.(to_q|to_k|to_v)\.weight$", ("tp", None)),
    (_SINGLE + r"attn\.(to_q|to_k|to_v)\.bias$", ("tp",)),
    (_SINGLE + r"proj_mlp\.weight$", ("tp", None)),
    (_SINGLE + r"proj_mlp\.bias$", ("tp",)),
)
ACTIVATION_RULES = ((r"^(transformer_blocks|single_transformer_blocks)\.\d+$", ("dp", "sp", None)),)


def forward_flops(config, latent_frames: int, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one forward for one sample over T = video + text tokens: double blocks q/k/v/out for both
    streams 8*T*d^2, attention 4*T^2*d, both MLPs 4*T*d*m; single blocks q/k/v 6*T*d^2, attention 4*T^2*d, the MLP in
    2*T*d*m and the joint output 2*T*(d+m)*d; plus the patch embedding and the output head."""
    video = (
        (latent_frames // config.patch_size_t)
        * (latent_height // config.patch_size)
        * (latent_width // config.patch_size)
    )
    total = video + text_tokens
    dim = config.num_attention_heads * config.attention_head_dim
    mlp = int(dim * config.mlp_ratio)
    double = 8 * total * dim**2 + 4 * total**2 * dim + 4 * total * dim * mlp
    single = 6 * total * dim**2 + 4 * total**2 * dim + 2 * total * dim * mlp + 2 * total * (dim + mlp) * dim
    patch = config.patch_size_t * config.patch_size**2
    edges = 2 * video * patch * (config.in_channels + config.out_channels) * dim
    return config.num_layers * double + config.num_single_layers * single + edges


def _latent_size(pipe, height: int, width: int, frames: int):
    return (
        (frames - 1) // pipe.vae_scale_factor_temporal + 1,
        height // pipe.vae_scale_factor_spatial,
        width // pipe.vae_scale_factor_spatial,
    )


FAMILY = register(
    Family(
        name="hunyuanvideo",
        pipelines=(diffusers.HunyuanVideoPipeline,),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        # encode_prompt -> (embeddings, pooled, mask); called a second time for the negative prompt
        cfg=CFGBatching(
            negative=lambda encoded: (encoded[0], encoded[2], encoded[1]),
            condition_args=("encoder_hidden_states", "encoder_attention_mask", "pooled_projections"),
            negative_call=1,
            batched_args=("hidden_states", "timestep", "guidance"),
        ),
        planning=Planning(
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config, *_latent_size(pipe, h, w, f), text
            )
        ),
    )
)
